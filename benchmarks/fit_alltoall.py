"""Fit NCCL all-to-all's two constants in ``simulator/network/fabrics.yaml`` (``nccl.all_to_all``)
on measured ``all_to_all_single`` timings, and print the fit and the held-back rows.

    python benchmarks/fit_alltoall.py [data/calibration/h100x4-nvswitch/alltoall.jsonl]

Data: CUDA-event timing, bf16, 4 KiB - 1 GiB, groups of 4 and of 2 (two pairs at once), uniform
and uneven splits (``data/calibration/h100x4-nvswitch/README.md`` says how it was measured).

Fitted on the **uniform** rows only:

* ``launch_extra_us``: what an all-to-all costs per call beyond the other collectives' launch
  (``launch_us``): the median of (measured - predicted) over the rows <= 256 KiB, where the
  time is the call's fixed cost (PyTorch's ``all_to_all_single`` issues a grouped send/recv
  per peer and checks the split sizes on the host).
* ``bandwidth_fraction``: the share of the NVLink rate the direct exchange reaches, the value
  minimising the squared log error over the rows >= 16 MiB (a golden-section search).

The uneven (``rotated``, ``hot``) rows are not fitted: they are printed as a check of the
busiest-receiver rule (:meth:`CollectiveModel.all_to_all_v`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

import yaml

from simulator.config.schema import TopologyConfig
from simulator.hardware.catalog import load_gpu
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data/calibration/h100x4-nvswitch/alltoall.jsonl"
TOPO = ROOT / "topologies/h100x4-nvswitch.yaml"
#: the uneven splits of benchmarks/device/comm.py
HOT = {4: [55, 15, 15, 15], 2: [7, 3]}
ROT = {4: [4, 3, 2, 1], 2: [3, 1]}


def groups_of(n: int) -> list[list[int]]:
    return [[0, 1, 2, 3]] if n == 4 else [[0, 1], [2, 3]]


def predict(cm: CollectiveModel, row: dict) -> float:
    """Predicted time of one measured row (the slowest rank's)."""
    n, S, kind = row["group"], float(row["bytes"]), row["splits"]
    if kind == "uniform":
        return cm.cost("all_to_all", groups_of(n), S).time_s
    if kind == "hot":
        return cm.all_to_all_v(groups_of(n), S, [x / sum(HOT[n]) for x in HOT[n]]).time_s
    # rotated: rank i sends W[(j - i) mod n] / sum(W) to rank j
    W = ROT[n]
    share = [[W[(j - i) % n] / sum(W) for j in range(n)] for i in range(n)]
    return cm.all_to_all_v(groups_of(n), S, share).time_s


def fit(rows: list[dict], cm: CollectiveModel) -> tuple[float, float]:
    uni = [r for r in rows if r["splits"] == "uniform"]
    cm.a2a_launch_extra_s, cm.a2a_bw_fraction = 0.0, 1.0
    small = [r["time_s"] - predict(cm, r) for r in uni if r["bytes"] <= 256 * 1024]
    extra = statistics.median(small)
    big = [r for r in uni if r["bytes"] >= 16 * 2**20]

    def loss(f: float) -> float:
        fresh = CollectiveModel(cm.topology)
        fresh.a2a_launch_extra_s, fresh.a2a_bw_fraction = extra, f
        return sum(math.log(predict(fresh, r) / r["time_s"]) ** 2 for r in big)

    lo, hi = 0.5, 1.2
    g = (math.sqrt(5) - 1) / 2
    for _ in range(40):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if loss(a) < loss(b):
            hi = b
        else:
            lo = a
    return extra, (lo + hi) / 2


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DATA
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    cfg = TopologyConfig(**yaml.safe_load(TOPO.read_text()))
    topo = Topology(cfg, load_gpu(cfg.gpu))
    extra, frac = fit(rows, CollectiveModel(topo))
    print(f"launch_extra_us: {extra * 1e6:.1f}\nbandwidth_fraction: {frac:.3f}")
    cm = CollectiveModel(topo)
    cm.a2a_launch_extra_s, cm.a2a_bw_fraction = extra, frac
    print(f"{'n':>2} {'splits':8} {'bytes':>11} {'measured us':>12} {'predicted us':>12} {'error':>7}")
    for r in rows:
        p = predict(cm, r)
        print(f"{r['group']:>2} {r['splits']:8} {r['bytes']:>11} {r['time_s'] * 1e6:12.1f} "
              f"{p * 1e6:12.1f} {p / r['time_s'] - 1:+7.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
