"""Read ``route_replay.py``'s results: step times of the variants and the row counts' statistics
against the simulator's (issue 10).

Usage: ``python benchmarks/route_replay_report.py DIR`` (``DIR``: ``replay.jsonl`` and
``replay-CASE-rN.json``, as ``data/measured/routerdiag-h100x4/``). Prints, per case:

* each variant's step time (median of the timed steps, slowest rank) and its ratio to
  ``replay`` (the logged counts replayed without the gate);
* the simulator's step time for the case's workload (``validation/heldoutN/CASE.yaml``), as it
  is, without the new-shape and first-launch costs of a fresh process (``measured_steps``
  null) and with balanced routes (``moe_routing: balanced``: no busiest-rank excess);
* for the learned counts and the model's: the busiest EP rank's copies over the mean rank's
  (mean over the calls of the timed steps) and the share of expert calls at a row count new to
  the rank in steps 4-9 (``simulator.calibrate.routes``' counting), beside the simulator's
  (``route_skew.busiest_share``; ``moe.new_shape_share``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.calibrate import routes  # noqa: E402
from simulator.config.load import load_workload  # noqa: E402
from simulator.run import simulate  # noqa: E402

VARIANTS = ("learned", "replay", "replay_gate", "learned_again", "model", "replay_end",
            "replay_cold")


def workload_path(case: str) -> Path:
    n = re.match(r"h(\d+)t?_", case).group(1)
    return ROOT / "validation" / f"heldout{n}" / f"{case}.yaml"


def sim(case: str, over: dict | None = None) -> tuple[float, dict]:
    """The simulator's step time and MoE summary for the case's workload with ``over``."""
    s = simulate(load_workload(workload_path(case), over or {})).summary
    return s["step_time_s"], s


def sim_counted(case: str, share: float, drains: float) -> float:
    """The simulator's step time with the new-count share and the new kernel bands a rank-step
    put in place of its own (the engine's calls of ``new_shape_share`` and
    ``first_launch_drains`` answered with the counted ones)."""
    from simulator.engine import build

    saved = build.new_shape_share, build.first_launch_drains
    build.new_shape_share = lambda *a, **k: share
    build.first_launch_drains = lambda *a, **k: drains
    try:
        return sim(case)[0]
    finally:
        build.new_shape_share, build.first_launch_drains = saved


def load(where: Path) -> tuple[dict, dict]:
    """({case: {variant: record}}, {case: [rank logs]})."""
    times: dict = {}
    for line in (where / "replay.jsonl").read_text().splitlines():
        r = json.loads(line)
        key = r["case"] + (f"-{r['tag']}" if r.get("tag") else "")
        times.setdefault(key, {})[r["variant"]] = r
    logs: dict = {}
    for f in sorted(where.glob("replay-*-r*.json")):
        d = json.loads(f.read_text())
        key = f.name[len("replay-"):f.name.rindex("-r")]
        logs.setdefault(key, []).append(d)
    for v in logs.values():
        v.sort(key=lambda d: d["rank"])
    return times, logs


def as_case(case: str, logs: list[dict], variants: list[str]) -> routes.Case:
    """The rows of ``variants`` (in the order they ran) as one
    :class:`simulator.calibrate.routes.Case` (rows ``[rank][layer][call][expert]``)."""
    rows = np.concatenate([np.array([d["variants"][v]["local_rows"] for d in logs])
                           for v in variants], axis=2)
    wl = load_workload(workload_path(case)).workload
    seq, mb = wl.model.seq_len, wl.training.micro_batch
    n = mb * seq * len(logs)
    k, E = wl.model.moe.top_k, wl.model.moe.experts
    return routes.Case(case, "", rows, n, k / E, logs[0]["calls_per_step"] // rows.shape[1],
                       logs[0]["warmup"], k, wl.model.hidden, seq)


def busiest_timed(c: routes.Case, warmup: int) -> float:
    """The busiest rank's copies over the mean rank's, mean over the timed steps' calls."""
    per = c.rows.sum(axis=3)  # [rank][layer][call]
    first = warmup * c.micro_batches
    timed = per[:, :, first:].reshape(per.shape[0], -1).T
    return float(np.mean(timed.max(axis=1) / timed.mean(axis=1)))


def new_events(c: routes.Case, first: int, last: int) -> tuple[float, float]:
    """(new row counts, new kernel bands) a rank-step in steps ``first..last`` of the rows
    (each rank's history from its first call), mean over the ranks."""
    from simulator.model.kernel_first import band_of

    mb = c.micro_batches
    ranks, layers, calls, local = c.rows.shape
    new_m, new_b = [], []
    for r in range(ranks):
        seen_m: set[int] = set()
        seen_b: set[int] = set()
        nm = nb = 0
        for call in range(calls):
            step = call // mb + 1
            for layer in range(layers):
                for e in range(local):
                    m = int(c.rows[r, layer, call, e])
                    if m <= 0:
                        continue
                    b = int(band_of(np.array([m]))[0])
                    if first <= step <= last:
                        nm += m not in seen_m
                        nb += b not in seen_b
                    seen_m.add(m)
                    seen_b.add(b)
        new_m.append(nm)
        new_b.append(nb)
    steps = last - first + 1
    return float(np.mean(new_m)) / steps, float(np.mean(new_b)) / steps


def report(where: Path) -> str:
    from simulator.model import moe as moe_math
    from simulator.model import route_skew

    times, logs = load(where)
    out = []
    for key in sorted(times):
        t = times[key]
        case = next(iter(t.values()))["case"]
        base = t.get("replay", {}).get("step_time_s")
        out.append(f"## {key}")
        out.append("| variant | step s | / replay | min | max |")
        out.append("|---|---|---|---|---|")
        for v in VARIANTS:
            if v not in t:
                continue
            r = t[v]
            ratio = r["step_time_s"] / base if base else float("nan")
            out.append(f"| {v} | {r['step_time_s']:.4f} | {ratio:.3f} | "
                       f"{r['step_time_min_s']:.4f} | {r['step_time_max_s']:.4f} |")
        full, s = sim(case)
        warm, _ = sim(case, {"training.measured_steps": None})
        bal, _ = sim(case, {"training.moe_routing": "balanced"})
        out.append(f"simulator: {full:.4f} s; without fresh-process costs {warm:.4f}; "
                   f"balanced routes {bal:.4f}")
        wl = load_workload(workload_path(case)).workload
        tr, mdl = wl.training, wl.model
        ep = wl.parallelism.ep
        tokens = tr.micro_batch * mdl.seq_len
        copies = ep * tokens * mdl.moe.top_k
        sim_busy = ep * route_skew.busiest_share((1.0 / ep,) * ep, copies,
                                                 tr.moe_rank_correlation)
        loc = moe_math.moe_local(mdl, tr.micro_batch, 1, 1, ep, 1, tr.moe_expert_load)
        sim_new = moe_math.new_shape_share(mdl, tr, loc, mdl.layers * 2, ep)
        sim_bands = moe_math.first_launch_drains(mdl, tr, loc, mdl.layers * 2, ep)
        calls = mdl.layers * 2 * loc.local_experts
        out.append(f"simulator counts: busiest rank / mean {sim_busy:.4f}; new-count share "
                   f"steps 4-9 {sim_new:.3f} ({sim_new * calls:.1f} new counts a rank-step); "
                   f"new kernel bands a rank-step {sim_bands:.2f}")
        lg = logs.get(key, [])
        ran = [v for v in lg[0]["variants"]] if lg else []  # in the order they ran
        w, n_steps = (lg[0]["warmup"], lg[0]["warmup"] + lg[0]["timed"]) if lg else (0, 0)
        for j, v in enumerate(ran):
            c = as_case(case, lg, [v])
            busy = busiest_timed(c, w)
            fresh = routes.measured_share(c, w + 1, n_steps)
            hist = routes.measured_share(as_case(case, lg, ran[:j + 1]), j * n_steps + w + 1,
                                         (j + 1) * n_steps)
            rho = routes.step_correlations(c)
            cnt, bands = new_events(as_case(case, lg, ran[:j + 1]), j * n_steps + w + 1,
                                    (j + 1) * n_steps)
            if j == 0:  # the first variant of a process: its counts were new to it
                out.append(f"  simulator with {v}'s counted new counts and bands: "
                           f"{sim_counted(case, cnt / calls, bands):.4f} s")
            out.append(f"- {v}: busiest rank / mean {busy:.4f}; new share steps {w + 1}-"
                       f"{n_steps} {fresh:.3f} as a fresh process, {hist:.3f} in this one "
                       f"({cnt:.1f} new counts, {bands:.2f} new bands a rank-step); "
                       f"rank correlation {routes.rank_correlation_of(c):.2e}; correlation "
                       "by step " + " ".join(f"{x:.1e}" for x in rho))
        out.append("")
    return "\n".join(out)


def main() -> int:
    print(report(Path(sys.argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
