"""Summarise ``benchmarks/device/moe_phases.py`` output (``data/measured/moe-phases-h100x4``):
per case the slowest rank's step times, and per phase (between consecutive marks, in host
order) the host and GPU milliseconds a step on each rank.

Usage: ``python benchmarks/moe_phases_summary.py [DIR]``."""

from __future__ import annotations

import collections
import glob
import json
import os
import statistics as st
import sys


def summary(root: str) -> None:
    files = glob.glob(f"{root}/phases-*-r*.json")
    for case in sorted({os.path.basename(f)[len("phases-"):].rsplit("-r", 1)[0] for f in files}):
        tab: dict = collections.defaultdict(lambda: collections.defaultdict(list))
        walls = []
        for f in sorted(glob.glob(f"{root}/phases-{case}-r[0-9]*.json")):
            d = json.load(open(f))
            walls.append([s["wall_s"] for s in d["steps"]])
            for s in d["steps"]:
                acc: dict = collections.defaultdict(lambda: [0.0, 0.0])
                for a, b in zip(s["marks"], s["marks"][1:], strict=False):
                    acc[f"{a[2]}->{b[2]}"][0] += b[3] - a[3]
                    acc[f"{a[2]}->{b[2]}"][1] += b[4] - a[4]
                for k, (h, g) in acc.items():
                    tab[k][d["rank"]].append((h, g))
        slow = [max(w[i] for w in walls) for i in range(len(walls[0]))]
        print(f"== {case}: slowest rank's steps {[round(x, 3) for x in slow]}, "
              f"median {st.median(slow):.3f} s")
        keys = sorted(tab, key=lambda k: -max(st.mean(x[0] for x in v) for v in tab[k].values()))
        for k in keys[:14]:
            cells = "  ".join(f"{st.mean(x[0] for x in v) * 1e3:6.1f}/{st.mean(x[1] for x in v) * 1e3:6.1f}"
                              for _, v in sorted(tab[k].items()))
            print(f"  {k:28s} host/GPU ms a step, rank 0..: {cells}")


if __name__ == "__main__":
    summary(sys.argv[1] if len(sys.argv) > 1 else "data/measured/moe-phases-h100x4")
