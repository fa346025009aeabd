"""Read a ``firstseen`` device call (``route_replay.py``'s ``a``/``b``/``c`` processes of each case,
issue 10): what a fresh process pays for the expert-GEMM row counts a learned router draws,
split into cuBLAS's part and the rest, beside the events counted in the learned counts.

Usage: ``python benchmarks/firstseen_report.py DIR [--sim]`` (``DIR``: ``replay.jsonl`` and
``replay-CASE-TAG-rN.json``, as ``data/measured/firstseen-h100x4/call1``), or
``python benchmarks/firstseen_report.py --fit`` (every call of :data:`CALLS`: the least-squares
fits below, with their residuals). Per case:

* step times (median of the timed steps, slowest rank): ``learned`` (a: cold, counts logged),
  ``replay`` (a: the same counts, warm), ``prewarm`` (b: the counts replayed in a fresh
  process after each of their expert GEMM shapes ran once, allocator emptied), ``replay`` (b),
  ``replay_cold`` (c: the counts replayed first in a fresh process);
* the events of the learned counts in the timed steps (each rank's history from its first
  call, a row count new to the rank, a kernel band new to it (:func:`simulator.model.
  kernel_first.band_of`)), a rank-step: mean over ranks, and coupled (each MoE call's
  largest over the EP ranks, summed: the group waits for its slowest rank at the exchange);
* the prewarm calls' host time (an expert forward and backward at one row count, the GPU
  idle): median at a count whose band was met before in the prewarm, and at a new band;
* with ``--sim``: the simulator's step time for the case's workload, as shipped and without a
  fresh process's costs (``training.measured_steps`` null), and its new counts / bands a
  rank-step.

The fits (``--fit``; ``tests/test_firstseen.py`` checks them against the shipped costs):

* :func:`fit_steps`: the fresh-process part of each learned step (``learned - replay`` of one
  process, s) against its events a step, least squares through the origin with two unknowns,
  a cost per new row count and one per new kernel band, over every case of :data:`CALLS`;
  events coupled (each MoE call pays its slowest EP rank's, as the engine charges them) or the
  ranks' mean;
* :func:`fit_prewarm`: each rank's prewarm, the host time its calls took beyond their repeats,
  summed (the process's first call left out: cuBLAS's own start), against its distinct row
  counts and kernel bands (least squares, two unknowns);
* :func:`engine_scale`: the engine's price of each case's counted events (the simulator's step
  with the counted new-count share and new bands in place of its own, less its step without a
  fresh process's costs) against the measured part: the least-squares factor.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.model.kernel_first import band_of  # noqa: E402

#: the calls read by the fits: this experiment's two, and routerdiag's second (``a``
#: processes with learned, replay and the counts logged)
CALLS = (ROOT / "data/measured/firstseen-h100x4/call1",
         ROOT / "data/measured/firstseen-h100x4/call2",
         ROOT / "data/measured/routerdiag-h100x4/call2")


def workload_path(case: str) -> Path:
    n = re.match(r"h(\d+)t?_", case).group(1)
    return ROOT / "validation" / f"heldout{n}" / f"{case}.yaml"


def load(where: Path) -> tuple[dict, dict]:
    """({case: {(tag, variant): record}}, {(case, tag): [rank logs]})."""
    times: dict = {}
    for line in (where / "replay.jsonl").read_text().splitlines():
        r = json.loads(line)
        times.setdefault(r["case"], {})[(r.get("tag", ""), r["variant"])] = r
    logs: dict = {}
    for f in sorted(where.glob("replay-*-r*.json")):
        d = json.loads(f.read_text())
        stem = f.name[len("replay-"):f.name.rindex("-r")]
        case, tag = stem.rsplit("-", 1) if stem.count("-") else (stem, "")
        logs.setdefault((case, tag), []).append(d)
    for v in logs.values():
        v.sort(key=lambda d: d["rank"])
    return times, logs


def events(logs: list[dict], variant: str = "learned") -> dict:
    """Per step (1-based) of ``variant`` (the first of its process), the events of each rank:
    ``counts[s][r]`` row counts new to rank ``r``, ``bands[s][r]`` kernel bands new to it,
    ``calls[s]`` expert calls a rank-step, and the coupled sums ``counts_max[s]`` /
    ``bands_max[s]`` (per MoE call the largest over the ranks, summed over the step's calls).
    Zero-row calls launch no GEMM and count nothing."""
    rows = np.array([d["variants"][variant]["local_rows"] for d in logs])  # [r][layer][call][e]
    ranks, layers, calls, local = rows.shape
    mb = logs[0]["calls_per_step"] // layers
    steps = calls // mb
    cnt = np.zeros((steps, ranks))
    bnd = np.zeros((steps, ranks))
    cmax = np.zeros(steps)
    bmax = np.zeros(steps)
    bands = {int(m): int(band_of(np.array([max(m, 1)]))[0]) for m in np.unique(rows)}
    seen_m = [set() for _ in range(ranks)]
    seen_b = [set() for _ in range(ranks)]
    for call in range(calls):  # time order: step, micro-batch, layer
        s = call // mb
        for layer in range(layers):
            nc, nb = np.zeros(ranks), np.zeros(ranks)
            for r in range(ranks):
                for e in range(local):
                    m = int(rows[r, layer, call, e])
                    if m <= 0:
                        continue
                    if m not in seen_m[r]:
                        seen_m[r].add(m)
                        nc[r] += 1
                    b = bands[m]
                    if b not in seen_b[r]:
                        seen_b[r].add(b)
                        nb[r] += 1
            cnt[s] += nc
            bnd[s] += nb
            cmax[s] += nc.max()
            bmax[s] += nb.max()
    return {"counts": cnt, "bands": bnd, "counts_max": cmax, "bands_max": bmax,
            "calls": layers * mb * local, "steps": steps, "warmup": logs[0]["warmup"]}


def prewarm_costs(logs: list[dict]) -> tuple[float, float, int, int]:
    """(median host s a prewarm count's first call took beyond its repeat, at a band met before
    in the prewarm, at a new band; counts of each), over the ranks."""
    old, new = [], []
    for d in logs:
        seen: set = set()
        for _layer, m, *t in d.get("prewarm", []):
            if m <= 0:
                continue
            b = int(band_of(np.array([m]))[0])
            (old if b in seen else new).append(t[0] - (t[1] if len(t) > 1 else 0.0))
            seen.add(b)
    med = lambda x: statistics.median(x) if x else float("nan")  # noqa: E731
    return med(old), med(new), len(old), len(new)


def step_s(times: dict, tag: str, variant: str) -> float:
    r = times.get((tag, variant))
    return r["step_time_s"] if r else float("nan")


def sim_figures(case: str) -> tuple[float, float, float, float]:
    """(shipped step s, warm step s, new counts a rank-step, new bands a rank-step) of the
    simulator for the case's workload."""
    from simulator.config.load import load_workload
    from simulator.model import moe as moe_math
    from simulator.run import simulate

    full = simulate(load_workload(workload_path(case))).summary["step_time_s"]
    warm = simulate(load_workload(workload_path(case), {"training.measured_steps": None})
                    ).summary["step_time_s"]
    wl = load_workload(workload_path(case)).workload
    mdl, tr, ep = wl.model, wl.training, wl.parallelism.ep
    loc = moe_math.moe_local(mdl, tr.micro_batch, 1, 1, ep, 1, tr.moe_expert_load)
    calls = mdl.layers * tr.global_batch // (tr.micro_batch * ep)
    share = moe_math.new_shape_share(mdl, tr, loc, calls, ep)
    bands = moe_math.first_launch_drains(mdl, tr, loc, calls, ep)
    return full, warm, share * calls * loc.local_experts, bands


def runs(calls=CALLS) -> list[dict]:
    """Every case of ``calls`` with a learned step and its counts: ``case``, the step times
    ``learned``, ``replay`` (a), ``prewarm``, ``replay_b`` (b; nan without), and the events a
    step in the timed steps, ranks' mean (``counts``, ``bands``) and coupled (``counts_max``,
    ``bands_max``)."""
    out = []
    for where in calls:
        times, logs = load(Path(where))
        for case in sorted(times):
            if (case, "a") not in logs:
                continue
            t = times[case]
            e = events(logs[(case, "a")])
            w = slice(e["warmup"], e["steps"])
            out.append({"case": case, "call": f"{Path(where).parent.name}/{Path(where).name}",
                        "learned": step_s(t, "a", "learned"), "replay": step_s(t, "a", "replay"),
                        "prewarm": step_s(t, "b", "prewarm"), "replay_b": step_s(t, "b", "replay"),
                        "counts": float(e["counts"][w].mean()),
                        "bands": float(e["bands"][w].mean()),
                        "counts_max": float(e["counts_max"][w].mean()),
                        "bands_max": float(e["bands_max"][w].mean()),
                        "calls": e["calls"], "prewarm_logs": logs.get((case, "b"))})
    return out


def _lstsq(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    return coef, y - x @ coef


def _stderr(x: np.ndarray, res: np.ndarray) -> np.ndarray:
    """Standard errors of a least-squares fit's coefficients."""
    dof = max(1, len(res) - x.shape[1])
    return np.sqrt(np.diag(np.linalg.inv(x.T @ x)) * float(res @ res) / dof)


def fit_steps(coupled: bool = True, calls=CALLS) -> tuple[float, float, np.ndarray]:
    """(s a new row count, s a new kernel band, residuals s): ``learned - replay`` of every
    run against its events a step (coupled: each MoE call's largest over the EP ranks)."""
    rs = runs(calls)
    c, b = ("counts_max", "bands_max") if coupled else ("counts", "bands")
    x = np.array([[r[c], r[b]] for r in rs])
    y = np.array([r["learned"] - r["replay"] for r in rs])
    coef, res = _lstsq(x, y)
    return float(coef[0]), float(coef[1]), res


def prewarm_ranks(calls=CALLS) -> list[tuple[str, int, int, float]]:
    """Per rank of every prewarm: (case, distinct row counts, distinct kernel bands beyond the
    first call's, host s beyond the repeats), the process's first call left out."""
    out = []
    for r in runs(calls):
        for d in r["prewarm_logs"] or []:
            pw = [p for p in d.get("prewarm", []) if p[1] > 0]
            if len(pw) < 2:
                continue
            seen = {int(band_of(np.array([pw[0][1]]))[0])}
            new_b, extra = 0, 0.0
            for _layer, m, t1, t2 in pw[1:]:
                b = int(band_of(np.array([m]))[0])
                if b not in seen:
                    seen.add(b)
                    new_b += 1
                extra += t1 - t2
            out.append((r["case"], len(pw) - 1, new_b, extra))
    return out


def fit_prewarm(calls=CALLS) -> tuple[float, float, np.ndarray]:
    """(s a new row count, s a new kernel band, residuals s) of :func:`prewarm_ranks`."""
    pr = prewarm_ranks(calls)
    coef, res = _lstsq(np.array([[c, b] for _, c, b, _ in pr], dtype=float),
                       np.array([e for *_, e in pr]))
    return float(coef[0]), float(coef[1]), res


def sim_counted(case: str, share: float, bands: float) -> float:
    """The simulator's step (s) for the case's workload with its new-count share and new
    kernel bands a rank-step replaced by ``share`` and ``bands``."""
    from simulator.config.load import load_workload
    from simulator.engine import build
    from simulator.run import simulate

    saved = build.new_shape_share, build.first_launch_drains
    build.new_shape_share = lambda *a, **k: share
    build.first_launch_drains = lambda *a, **k: bands
    try:
        return simulate(load_workload(workload_path(case))).summary["step_time_s"]
    finally:
        build.new_shape_share, build.first_launch_drains = saved


def engine_prices(calls=CALLS) -> list[tuple[str, float, float, float]]:
    """Per run: (case, measured ``learned - replay``, the engine's price of the counted events,
    the engine's price of its own expected events), s."""
    from simulator.config.load import load_workload
    from simulator.run import simulate

    out = []
    for r in runs(calls):
        case = r["case"]
        warm = simulate(load_workload(workload_path(case), {"training.measured_steps": None})
                        ).summary["step_time_s"]
        own = simulate(load_workload(workload_path(case))).summary["step_time_s"]
        counted = sim_counted(case, r["counts"] / r["calls"], r["bands"])
        out.append((case, r["learned"] - r["replay"], counted - warm, own - warm))
    return out


def engine_scale(calls=CALLS) -> tuple[float, np.ndarray]:
    """The least-squares factor on the engine's price of the counted events that gives the
    measured parts, and the residuals (s)."""
    p = engine_prices(calls)
    m = np.array([x[1] for x in p])
    e = np.array([x[2] for x in p])
    k = float(np.sum(m * e) / np.sum(e * e))
    return k, m - k * e


def fits() -> str:
    from simulator.model import kernel_first

    out = []
    rs = runs()
    for coupled in (True, False):
        a, b, res = fit_steps(coupled)
        c, bb = ("counts_max", "bands_max") if coupled else ("counts", "bands")
        se = _stderr(np.array([[r[c], r[bb]] for r in rs]), res)
        out.append(f"steps ({'coupled' if coupled else 'ranks mean'} events): {a * 1e3:.2f} "
                   f"+- {se[0] * 1e3:.2f} ms a new count, {b * 1e3:.2f} +- {se[1] * 1e3:.2f} ms a "
                   "new band; residuals ms "
                   + " ".join(f"{x * 1e3:.0f}" for x in res)
                   + f" (rms {np.sqrt(np.mean(res ** 2)) * 1e3:.0f})")
    a, b, res = fit_prewarm()
    pr = prewarm_ranks()
    se = _stderr(np.array([[c, n] for _, c, n, _ in pr], dtype=float), res)
    out.append(f"prewarm (per rank, {len(res)}): {a * 1e3:.2f} +- {se[0] * 1e3:.2f} ms a new count,"
               f" {b * 1e3:.2f} +- {se[1] * 1e3:.2f} ms a new band; residual rms "
               f"{np.sqrt(np.mean(res ** 2)) * 1e3:.0f} ms")
    m = [r for r in rs if r["prewarm"] == r["prewarm"]]
    out.append("prewarm: sum of (learned - prewarm) / sum of (learned - replay of the prewarm's "
               f"process) {sum(r['learned'] - r['prewarm'] for r in m) / sum(r['learned'] - r['replay_b'] for r in m):.3f}, "
               f"/ sum of (learned - replay) {sum(r['learned'] - r['prewarm'] for r in m) / sum(r['learned'] - r['replay'] for r in m):.3f}")
    k, res = engine_scale()
    out.append(f"engine's price of the counted events x {k:.3f} = measured; residuals ms "
               + " ".join(f"{x * 1e3:.0f}" for x in res))
    out.append(f"shipped: {shipped_count_s() * 1e3:.2f} ms a new count (six GEMMs' heuristic "
               f"queries), {2 * kernel_first.FIRST_LAUNCH_S * kernel_first.KERNELS_PER_PASS * 1e3:.2f}"
               " ms a new band (two passes' first launches)")
    out.append("runs: " + " ".join(f"{r['case']}({r['call']})" for r in runs()))
    return "\n".join(out)


def shipped_count_s(gpu: str = "H100-SXM-80GB") -> float:
    """The host time the engine charges an expert at a new row count: each of its forward,
    data-gradient and weight-gradient GEMM pairs' heuristic query (gpus.yaml
    ``host_gemm_new_shape_*``; SwiGLU's third GEMM shares the first one's entries)."""
    from simulator.hardware.catalog import load_gpu

    g = load_gpu(gpu)
    return 2 * (g.host_gemm_new_shape_fwd_s + g.host_gemm_new_shape_dgrad_s
                + g.host_gemm_new_shape_wgrad_s)


def report(where: Path, with_sim: bool = False) -> str:
    times, logs = load(where)
    out = ["| case | learned | replay a | prewarm | replay b | replay_cold | L-R ms | L-P ms | "
           "P-R ms | new counts / bands a rank-step (mean; coupled) | prewarm call ms "
           "(old band; new band; n) |" + (" sim / warm s, counts, bands |" if with_sim else ""),
           "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if with_sim else "")]
    for case in sorted(times):
        t = times[case]
        L, Ra, P = step_s(t, "a", "learned"), step_s(t, "a", "replay"), step_s(t, "b", "prewarm")
        Rb, C = step_s(t, "b", "replay"), step_s(t, "c", "replay_cold")
        ev = ""
        if (case, "a") in logs:
            e = events(logs[(case, "a")])
            w = slice(e["warmup"], e["steps"])
            ev = (f"{e['counts'][w].mean():.1f} / {e['bands'][w].mean():.2f}; "
                  f"{e['counts_max'][w].mean():.1f} / {e['bands_max'][w].mean():.2f}")
        pw = ""
        if (case, "b") in logs:
            o, n, no, nn = prewarm_costs(logs[(case, "b")])
            pw = f"{o * 1e3:.2f}; {n * 1e3:.2f}; {no}/{nn}"
        line = (f"| {case} | {L:.4f} | {Ra:.4f} | {P:.4f} | {Rb:.4f} | {C:.4f} | "
                f"{(L - Ra) * 1e3:.1f} | {(L - P) * 1e3:.1f} | {(P - Ra) * 1e3:.1f} | {ev} | {pw} |")
        if with_sim:
            full, warm, sc, sb = sim_figures(case)
            line += f" {full:.4f} / {warm:.4f}, {sc:.1f}, {sb:.2f} |"
        out.append(line)
    return "\n".join(out)


def main() -> int:
    if sys.argv[1] == "--fit":
        print(fits())
        return 0
    print(report(Path(sys.argv[1]), "--sim" in sys.argv[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
