"""Summary of ``benchmarks/device/gemm_drain.py`` runs (issue 12, helper emoe6).

Per run (``drain-TAG.json``): each timed GEMM call is *drained* when its host time exceeds
half the spin kernel queued before it (the host waited for the GPU; an ordinary call takes
well under 2 ms), and *brings a new kernel* when one of the kernels its profiled replay
launched had not been launched by an earlier call of the process. Prints the contingency
(new row count or seen, new kernel or not, drained or not), the host time beyond the spin of
the drained calls (what the drain costs besides the GPU's lag), calls that allocated a
segment, and per GEMM kind the distinct kernels over the row counts (the row-count ranges
that pick each). ``--bt`` prints the native backtraces' frames (``drain-TAG-bt.txt``).

``--map``: the kernel sets by row-count range; ``--octaves``: per octave of row counts, the
counts sampled and the kernel sets they picked.

Usage: ``python benchmarks/gemm_drain_summary.py DIR [--bt] [--map] [--octaves]``.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import statistics
import sys


def classify(rec: dict) -> list[dict]:
    """The calls with ``drained`` and ``new_kernel`` added."""
    seen: set[str] = set()
    half = 0.5 * rec["sleep_ms"]
    out = []
    for c in rec["calls"]:
        ks = c.get("kernels", [])
        new_k = any(k not in seen for k in ks)
        seen.update(ks)
        out.append({**c, "drained": c["host_ms"] > half, "new_kernel": new_k})
    return out


def table(calls: list[dict], sleep_ms: float) -> list[str]:
    lines = []
    cnt = collections.Counter((c["phase"], c["new_kernel"], c["drained"]) for c in calls)
    lines.append("  phase  new-kernel  drained  calls")
    for key in sorted(cnt):
        lines.append(f"  {key[0]:5s}  {str(key[1]):10s}  {str(key[2]):7s}  {cnt[key]}")
    dr = [c for c in calls if c["drained"]]
    if dr:
        extra = [c["host_ms"] - sleep_ms for c in dr]
        lines.append(f"  drained: {len(dr)}, host ms beyond the {sleep_ms} ms spin: median "
                     f"{statistics.median(extra):.2f}, min {min(extra):.2f}, max {max(extra):.2f}")
    nd = [c["host_ms"] for c in calls if not c["drained"] and c["phase"] == "new"]
    sd = [c["host_ms"] for c in calls if not c["drained"] and c["phase"] == "seen"]
    if nd and sd:
        lines.append(f"  not drained, host ms median: new count {statistics.median(nd):.3f}, "
                     f"seen {statistics.median(sd):.3f}")
    segs = [c for c in calls if c["new_segments"] > 0]
    lines.append(f"  calls that allocated a segment: {len(segs)} (drained among them: "
                 f"{sum(c['drained'] for c in segs)})")
    return lines


def kernel_map(calls: list[dict]) -> list[str]:
    """Per shape and GEMM kind: the kernel sets by row-count range (sorted by row count)."""
    lines = []
    by = collections.defaultdict(dict)
    for c in calls:
        by[(c["shape"], c["op"])][c["m"]] = tuple(c.get("kernels", []))
    names: dict[str, int] = {}
    for (shape, op), d in sorted(by.items()):
        runs = []
        for m in sorted(d):
            ks = d[m]
            kid = "+".join(str(names.setdefault(k, len(names))) for k in ks) or "-"
            if runs and runs[-1][2] == kid:
                runs[-1][1] = m
            else:
                runs.append([m, m, kid])
        distinct = len({r[2] for r in runs})
        lines.append(f"  {shape} {op}: {distinct} kernel sets, {len(runs)} runs: "
                     + " ".join(f"[{a}-{b}]:{k}" for a, b, k in runs))
    lines.append("  kernels: " + "; ".join(f"{i}={n[:90]}" for n, i in names.items()))
    return lines


def octaves(calls: list[dict]) -> list[str]:
    """Per shape and GEMM kind, per octave of row counts [2^i, 2^(i+1)): the distinct row
    counts sampled and the distinct kernel sets they picked (what a first-use model would
    count)."""
    lines = []
    by = collections.defaultdict(lambda: collections.defaultdict(dict))
    for c in calls:
        if c["m"] > 0:
            by[(c["shape"], c["op"])][c["m"].bit_length() - 1][c["m"]] = tuple(c["kernels"])
    for (shape, op), octs in sorted(by.items()):
        cells = " ".join(f"{2**o}:{len(d)}/{len(set(d.values()))}" for o, d in sorted(octs.items()))
        lines.append(f"  {shape} {op:3s} (octave start: counts/kernel sets) {cells}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--bt", action="store_true")
    ap.add_argument("--map", action="store_true", help="kernel sets by row-count range")
    ap.add_argument("--octaves", action="store_true", help="kernel sets per octave of rows")
    a = ap.parse_args()
    for f in sorted(glob.glob(os.path.join(a.dir, "drain-*.json"))):
        rec = json.load(open(f))
        calls = classify(rec)
        print(f"== {rec['tag']} (blas {rec['blas']}, spin {rec['sleep_ms']} ms, "
              f"{len(calls)} calls, separators {rec['separators']}, env "
              f"{ {k: v for k, v in rec['env'].items() if k.startswith('CUDA_M')} })")
        for shape in dict.fromkeys(c["shape"] for c in calls):
            sub = [c for c in calls if c["shape"] == shape]
            print(f" shape {shape}")
            print("\n".join(table(sub, rec["sleep_ms"])))
        if a.map:
            print("\n".join(kernel_map(calls)))
        if a.octaves:
            print("\n".join(octaves(calls)))
        bt = f[: -len(".json")] + "-bt.txt"
        if a.bt and os.path.exists(bt):
            print(f" backtraces ({rec['bt_samples']} samples):")
            for line in open(bt):
                line = line.rstrip()
                if line.startswith("=="):
                    print("  " + line)
                else:
                    lib = os.path.basename(line.split("(")[0])
                    print(f"    {lib}{line[line.find('('):line.find(')') + 1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
