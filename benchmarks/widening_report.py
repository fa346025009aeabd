"""The stable learned router's row-count model (``moe.route_widening``) against every logged
development run of ``steps_third.py`` (issue 10): how many expert-GEMM row counts and kernel
bands new to a rank each rank-step of the measured window (steps 4-9) meets, counted, and what
the simulator's streams give for the run's workload.

Usage: ``python benchmarks/widening_report.py [--scan]``. The logs read: the ``expert_rows``
files of ``calibrate.routes`` (diagnosis9, expert-rows, expert-rows2; ``expert-rows2``'s
``eval/`` is not read) and the learned processes (``a``) of ``firstseen_report.CALLS``. Per run:

* ``counted``: new row counts and new kernel bands a rank-step (ranks' mean,
  ``firstseen_report.events``), and each step's correlation (mean over the ranks);
* ``model``: the workload's ``new_shape_share x calls x local experts`` and
  ``first_launch_drains`` (the shipped widening);
* ``oracle``: the same streams drawn i.i.d. at each step's *counted* correlation: what any
  rule for the correlation's growth could give at best with the beta-binomial streams;
* ``x opt``: the factor on ``ROUTE_WIDENING_PER_HIDDEN2`` that gives the counted new counts.

``--scan`` adds how each expert's load moves between steps (:func:`persistence`), the growth forms (``t^2`` shipped, ``t``, saturating ``min(t, 3)^2``), each with
its constant set to zero count bias over the runs, and the log of each case-layout's ``x opt``
regressed on one or two shape variables (leave-one-out residuals)."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import firstseen_report as fr  # noqa: E402
from simulator.calibrate import routes  # noqa: E402
from simulator.config.load import load_workload  # noqa: E402
from simulator.config.schema import ROUTE_WIDENING_PER_HIDDEN2  # noqa: E402
from simulator.model import kernel_first, shape_cache  # noqa: E402
from simulator.model import moe as moe_math  # noqa: E402


def logged_runs(script: str = routes.STABLE) -> list[tuple[str, str, list[dict]]]:
    """``[(case, source, rank logs)]``: every logged run of ``script``, rank logs in
    ``firstseen_report.events``'s form."""
    out = []
    for src, where in (("diagnosis9", routes.DIAG), ("expert-rows", routes.ROWS),
                       ("expert-rows2", routes.ROWS2)):
        for c in routes.cases(where):
            if c.script != script:
                continue
            logs = [{"variants": {"learned": {"local_rows": c.rows[r].tolist()}},
                     "calls_per_step": c.rows.shape[1] * c.micro_batches, "warmup": c.warmup}
                    for r in range(c.rows.shape[0])]
            out.append((c.name, src, logs))
    for where in fr.CALLS:
        _, logs = fr.load(Path(where))
        for (case, tag), lg in sorted(logs.items()):
            name = "steps_third.py" if lg[0]["script"] == "third" else "steps_alt.py"
            if tag == "a" and name == script:
                out.append((case, f"{Path(where).parent.name}/{Path(where).name}", lg))
    return out


def model_events(case: str, overrides: dict | None = None) -> tuple[float, float]:
    """(new row counts, new kernel bands) a rank-step of the simulator's streams for the case's
    workload in its measured window."""
    wl = load_workload(fr.workload_path(case), overrides or {}).workload
    mdl, tr, ep = wl.model, wl.training, wl.parallelism.ep
    loc = moe_math.moe_local(mdl, tr.micro_batch, 1, 1, ep, 1, tr.moe_expert_load)
    calls = mdl.layers * tr.global_batch // (tr.micro_batch * ep)
    share = moe_math.new_shape_share(mdl, tr, loc, calls, ep)
    return (share * calls * loc.local_experts,
            moe_math.first_launch_drains(mdl, tr, loc, calls, ep))


def step_correlations(logs: list[dict], n: int) -> np.ndarray:
    """Each logged step's correlation of a rank's counts (mean over the ranks)."""
    rows = np.array([d["variants"]["learned"]["local_rows"] for d in logs])
    ranks, layers, calls, _ = rows.shape
    mb = logs[0]["calls_per_step"] // layers
    return np.array([np.mean([shape_cache.correlation(rows[r][:, k * mb:(k + 1) * mb].ravel(), n)
                              for r in range(ranks)]) for k in range(calls // mb)])


def events_at(case: str, rhos, overrides: dict | None = None) -> tuple[float, float]:
    """:func:`model_events` with every stream drawn at ``rhos[s - 1]`` in step ``s``."""
    orig = shape_cache.step_weights

    def weights(s, steps):
        return [(float(rhos[min(k, len(rhos)) - 1]), float(s.calls))
                for k in range(1, int(np.floor(steps)) + 1)]

    shape_cache.step_weights = kernel_first.step_weights = weights
    try:
        return model_events(case, overrides)
    finally:
        shape_cache.step_weights = kernel_first.step_weights = orig


def opt_factor(case: str, counted: float) -> float:
    """The factor on ``ROUTE_WIDENING_PER_HIDDEN2`` at which the model's new counts equal
    ``counted`` (bisection in log; 0 when even no widening gives more)."""
    def f(x):
        return model_events(case, {"training.moe_route_widening": x * ROUTE_WIDENING_PER_HIDDEN2}
                            )[0] - counted
    lo, hi = 1e-3, 100.0
    if f(lo) >= 0.0:
        return 0.0
    if f(hi) <= 0.0:
        return hi
    for _ in range(25):
        mid = (lo * hi) ** 0.5
        lo, hi = (lo, mid) if f(mid) > 0.0 else (mid, hi)
    return (lo * hi) ** 0.5


def table(with_opt: bool = True) -> list[dict]:
    """One record a logged stable-router run (module docstring; ``opt`` nan without
    ``with_opt``)."""
    out = []
    for case, src, logs in logged_runs():
        wl = load_workload(fr.workload_path(case)).workload
        m, tr, ep = wl.model, wl.training, wl.parallelism.ep
        n = tr.micro_batch * m.seq_len * ep
        e = fr.events(logs)
        w = slice(e["warmup"], e["steps"])
        rho = step_correlations(logs, n)
        counted = float(e["counts"][w].mean())
        out.append({"case": case, "source": src, "n": n, "hidden": m.hidden, "seq": m.seq_len,
                    "experts": m.moe.experts, "top_k": m.moe.top_k, "ep": ep,
                    "global_batch": tr.global_batch, "rho": rho,
                    "counted": (counted, float(e["bands"][w].mean())),
                    "model": model_events(case), "oracle": events_at(case, rho),
                    "opt": opt_factor(case, counted) if with_opt else float("nan")})
    return out


def _growth_scan(rows: list[dict]) -> list[str]:
    cc = np.array([r["counted"][0] for r in rows])
    cb = np.array([r["counted"][1] for r in rows])
    forms = {"t^2 (shipped)": lambda t: t * t, "t": lambda t: t,
             "min(t, 3)^2": lambda t: min(t, 3) ** 2}
    out, orig = [], shape_cache.step_rho
    for name, g in forms.items():
        shape_cache.step_rho = lambda rho, widen, step, g=g: min(1.0, rho + widen * g(step - 1))
        try:
            best = None
            for f in (0.5, 0.7, 1.0, 1.4, 2.0, 2.8, 4.0, 5.6, 8.0):
                ev = np.array([model_events(r["case"], {
                    "training.moe_route_widening": f * ROUTE_WIDENING_PER_HIDDEN2}) for r in rows])
                bias = float(np.mean(ev[:, 0] / cc - 1))
                if best is None or abs(bias) < abs(best[1]):
                    best = (f, bias, float(np.mean(abs(ev[:, 0] / cc - 1))),
                            float(np.mean(abs(ev[:, 1] - cb))))
        finally:
            shape_cache.step_rho = orig
        out.append(f"growth {name}: x{best[0]} counts MAPE {best[2] * 100:.1f} % bias "
                   f"{best[1] * 100:+.1f} %, bands MAE {best[3]:.2f} a rank-step")
    return out


def _shape_regression(rows: list[dict]) -> list[str]:
    """log(x opt) of each case-layout (mean over its runs; runs at x opt 0, whose counts do
    not depend on the widening, left out) on one or two log shape variables."""
    by: dict = {}
    for r in rows:
        if r["opt"] > 0.01:
            by.setdefault(r["case"], []).append(r)
    keys = sorted(by)
    y = np.array([np.mean([np.log(x["opt"]) for x in by[k]]) for k in keys])
    var = {"hidden": lambda r: r["hidden"], "seq/tokens": lambda r: r["seq"] / r["n"],
           "global_batch": lambda r: r["global_batch"], "experts": lambda r: r["experts"],
           "top_k": lambda r: r["top_k"], "ep": lambda r: r["ep"],
           "mean rows": lambda r: r["n"] * r["top_k"] / r["experts"],
           "p": lambda r: r["top_k"] / r["experts"]}
    out = [f"case-layouts {len(keys)}: " + " ".join(
        f"{k}:{np.exp(v):.2f}" for k, v in zip(keys, y, strict=True))]

    def loo(x):
        res = []
        for i in range(len(y)):
            keep = np.arange(len(y)) != i
            c = np.linalg.lstsq(x[keep], y[keep], rcond=None)[0]
            res.append(y[i] - x[i] @ c)
        c = np.linalg.lstsq(x, y, rcond=None)[0]
        return c, float(np.sqrt(np.mean((y - x @ c) ** 2))), float(np.sqrt(np.mean(np.square(res))))

    c, rms, lo = loo(np.ones((len(y), 1)))
    out.append(f"shipped form, one constant: rms {rms:.2f} leave-one-out {lo:.2f} (log)")
    for k in (1, 2):
        fits = []
        for names in itertools.combinations(var, k):
            x = np.array([[1.0] + [np.log(var[v](by[key][0])) for v in names] for key in keys])
            c, rms, lo = loo(x)
            fits.append((lo, rms, names, c))
        for lo, rms, names, c in sorted(fits)[:3]:
            out.append(f"x opt ~ {' '.join(f'{v}^{e:+.2f}' for v, e in zip(names, c[1:], strict=True))}: "
                       f"rms {rms:.2f} leave-one-out {lo:.2f} (log)")
    return out


def persistence(logs: list[dict], first: int = 3) -> tuple[float, float, float]:
    """How each local expert's load moves between steps from step ``first + 1`` on: (lag-1
    autocorrelation of its step means about their layer-step mean, mean |change| of a step
    mean a step, standard deviation of the step means over those steps), rows."""
    rows = np.array([d["variants"]["learned"]["local_rows"] for d in logs], dtype=float)
    ranks, layers, calls, local = rows.shape
    mb = logs[0]["calls_per_step"] // layers
    means = rows.reshape(ranks, layers, calls // mb, mb, local).mean(axis=3)[:, :, first:]
    dev = means - means.mean(axis=3, keepdims=True)
    ac = float(np.corrcoef(dev[:, :, :-1].ravel(), dev[:, :, 1:].ravel())[0, 1])
    return (ac, float(np.abs(np.diff(means, axis=2)).mean()),
            float(np.sqrt(means.var(axis=2).mean())))


def report(scan: bool = False) -> str:
    rows = table()
    out = ["| run | source | tokens a call | mean rows | counted counts / bands | model | "
           "oracle | x opt | correlation a step (1e-4) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['case']} | {r['source']} | {r['n']} | "
                   f"{r['n'] * r['top_k'] / r['experts']:.0f} | "
                   f"{r['counted'][0]:.1f} / {r['counted'][1]:.2f} | "
                   f"{r['model'][0]:.1f} / {r['model'][1]:.2f} | "
                   f"{r['oracle'][0]:.1f} / {r['oracle'][1]:.2f} | {r['opt']:.2f} | "
                   + " ".join(f"{x * 1e4:.1f}" for x in r["rho"]) + " |")
    cc = np.array([r["counted"][0] for r in rows])
    cb = np.array([r["counted"][1] for r in rows])
    for key in ("model", "oracle"):
        ev = np.array([r[key] for r in rows])
        out.append(f"{key}: counts MAPE {np.mean(abs(ev[:, 0] / cc - 1)) * 100:.1f} % bias "
                   f"{np.mean(ev[:, 0] / cc - 1) * 100:+.1f} %, bands MAE "
                   f"{np.mean(abs(ev[:, 1] - cb)):.2f} bias {np.mean(ev[:, 1] - cb):+.2f} a rank-step")
    if scan:
        out += _growth_scan(rows) + _shape_regression(rows)
        for case, src, logs in logged_runs():
            ac, move, spread = persistence(logs)
            out.append(f"{case} ({src}): lag-1 autocorrelation of an expert's step mean "
                       f"{ac:+.2f}, its move a step {move:.0f} rows, spread {spread:.0f}")
    return "\n".join(out)


if __name__ == "__main__":
    print(report("--scan" in sys.argv[1:]))
