"""Summary of ``benchmarks/device/moe_bwd_host.py``'s files (issue 12, emoe5): per launch (tag)
and rank, the step's wall time, host and GPU ms a step between consecutive marks of each MoE
layer call (summed over the calls, median over the timed steps), each thread's CPU seconds over
the timed steps, and the profiled windows' events by name.

Drains (``--drains``): each expert's backward (``b_y{j}`` -> ``b_x{j}``) is classed by whether its
row count was new to the process (not run by any expert of any layer earlier in the timed
steps; the warm-up's counts are not stored, so "new" is an upper bound) and whether the GPU
drained during it (the GPU behind the host by more than 1 ms at ``b_y{j}`` and by less than
0.1 ms at ``b_x{j}``: the host waited for the GPU); per class the count, the median host ms and
the sum of (host ms - the GPU's lag at the start), and per timed step the drains of all ranks.

Usage: ``python benchmarks/moe_bwd_host_summary.py DIR [--prof] [--drains]``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import statistics


def segments(step: dict) -> dict:
    """host / GPU seconds of the step between consecutive marks of each layer call, by
    'a->b' (the calls' marks in host order), summed over calls."""
    calls = collections.defaultdict(list)
    for _s, call, ph, h, g in step["marks"]:
        if call >= 0:
            calls[call].append((h, g, ph))
    out = collections.defaultdict(lambda: [0.0, 0.0])
    for lst in calls.values():
        lst.sort()
        for (h0, g0, p0), (h1, g1, p1) in zip(lst, lst[1:], strict=False):
            # the per-expert marks carry the expert's index: pool them by kind
            k = f"{_kind(p0)}->{_kind(p1)}"
            out[k][0] += h1 - h0
            out[k][1] += g1 - g0
    return out


def _kind(p: str) -> str:
    return p[:3] if p[:3] in ("b_x", "b_y") else p


def drains(ranks: dict) -> tuple[dict, list]:
    """(class -> [(host ms, lag ms at start)], drains per timed step); classes ('new' | 'seen',
    'drained' | 'ahead')."""
    out, per_step = collections.defaultdict(list), collections.Counter()
    for rec in ranks.values():
        rows, seen = rec["rows"], set()
        nl = len(rows)
        for s, st in enumerate(rec["steps"]):
            by = collections.defaultdict(dict)
            for _s, c, ph, h, g in st["marks"]:
                if c >= 0:
                    by[c][ph] = (h, g)
            new = {}
            for c in sorted(by):
                k = s * (len(by) // nl) + c // nl
                for j, n in enumerate(rows[c % nl][k]):
                    new[(c, j)] = n not in seen
                    seen.add(n)
            for c, m in by.items():
                j = 0
                while f"b_y{j}" in m:
                    hy, gy = m[f"b_y{j}"]
                    hx, gx = m[f"b_x{j}"]
                    drained = gy - hy > 1e-3 and gx - hx < 1e-4
                    per_step[s] += drained
                    out[("new" if new[(c, j)] else "seen", "drained" if drained else "ahead")] \
                        .append(((hx - hy) * 1e3, (gy - hy) * 1e3))
                    j += 1
    return out, [per_step[s] for s in range(max(per_step, default=-1) + 1)]


def load(d: str) -> dict:
    runs = collections.defaultdict(dict)
    for f in sorted(glob.glob(os.path.join(d, "bwdhost-*-r*.json"))):
        r = json.load(open(f))
        runs[r["tag"]][r["rank"]] = r
    return runs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--prof", action="store_true")
    ap.add_argument("--drains", action="store_true")
    a = ap.parse_args()
    runs = load(a.dir)
    keys = ["f_dispatched->f_experts", "b_experts->b_y", "b_y->b_x", "b_x->b_y", "b_x->b_dispatch",
            "b_combine->b_experts", "b_dispatch->b_dispatched", "b_start->b_combine",
            "f_start->f_counts", "f_counts->f_synced"]
    for tag, ranks in runs.items():
        print(f"== {tag}")
        walls = [max(ranks[r]["steps"][i]["wall_s"] for r in ranks)
                 for i in range(len(ranks[0]["steps"]))]
        print(f"  slowest-rank step s: median {statistics.median(walls):.4f} "
              f"{[round(w, 4) for w in walls]}")
        print("  ms a step (median of steps), host / GPU, by rank:")
        for k in keys:
            row = []
            for r in sorted(ranks):
                segs = [segments(s) for s in ranks[r]["steps"]]
                h = statistics.median(sg[k][0] for sg in segs) * 1e3
                g = statistics.median(sg[k][1] for sg in segs) * 1e3
                row.append(f"{h:6.1f}/{g:6.1f}")
            print(f"    {k:28s} " + "  ".join(row))
        for r in sorted(ranks):
            th = ranks[r]["threads"]
            top = ", ".join(f"{t['name']}:{t['cpu_s']:.2f}s v{t['vol']} nv{t['nonvol']}"
                            for t in th[:5])
            print(f"  r{r} cpu {ranks[r]['process_cpu_s']:.2f}s threads: {top}")
        if a.drains:
            cls, per = drains(ranks)
            nstep = len(ranks[0]["steps"]) * len(ranks)
            print(f"  drained expert backwards per timed step (all ranks): {per}")
            for k in sorted(cls):
                v = cls[k]
                print(f"    {k[0]:4s} {k[1]:7s} n {len(v):4d} median host "
                      f"{statistics.median(x for x, _ in v):6.2f} ms, lag at start "
                      f"{statistics.median(y for _, y in v):6.2f} ms, sum host - lag "
                      f"{sum(x - y for x, y in v):8.1f} ms, host a rank-step "
                      f"{sum(x for x, _ in v) / nstep:6.1f} ms")
        if a.prof:
            for r in sorted(ranks):
                p = ranks[r]["prof"]
                for w in ("bwd_experts", "fwd_experts", "bwd_combine", "bwd_dispatch"):
                    if w not in p:
                        continue
                    n = len(p[w]["windows"])
                    ops = list(p[w]["ops"].items())[:14]
                    print(f"  r{r} {w}: {n} windows {p[w]['total_us'] / 1e3:.1f} ms")
                    for name, (c, us) in ops:
                        print(f"      {name[:60]:60s} {c:6d} {us / 1e3:8.2f} ms {us / c:7.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
