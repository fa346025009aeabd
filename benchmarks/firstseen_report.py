"""Read a ``firstseen`` device call (``route_replay.py``'s ``a``/``b``/``c`` processes of each case,
issue 10): what a fresh process pays for the expert-GEMM row counts a learned router draws,
split into cuBLAS's part and the rest, beside the events counted in the learned counts.

Usage: ``python benchmarks/firstseen_report.py DIR [--sim]`` (``DIR``: ``replay.jsonl`` and
``replay-CASE-TAG-rN.json``, as ``data/measured/firstseen-h100x4/call1``). Per case:

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

Also importable: :func:`events` and :func:`load` serve ``simulator/calibrate/first_seen.py``.
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
    print(report(Path(sys.argv[1]), "--sim" in sys.argv[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
