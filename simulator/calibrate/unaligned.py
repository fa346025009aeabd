"""Refit the rate of NCCL's narrow copies (``nccl.unaligned_copy_GBps`` in
``simulator/network/fabrics.yaml``) from all-to-alls whose split offsets are off 16 bytes.

Data: the uneven rows of the fit set ``data/calibration/h100x4-nvswitch/alltoall.jsonl`` (4x H100
NVSwitch, CUDA events, ``benchmarks/device/comm.py``: ``rotated`` and ``hot`` splits, groups of
4 and two pairs at once) >= 64 MiB whose offsets :func:`split_table` puts off a 16-byte
boundary (group 4 rotated and hot, group 2 hot: 9 rows); the aligned ones (group 2 rotated)
are the check that the uneven split itself costs nothing more. No ``heldout9`` row is read.

Model: each row priced by :meth:`CollectiveModel.all_to_all_v` (the busiest receiver, with
NCCL's 16-byte copies), then :func:`simulator.network.alignment.narrow_time` with the busiest
rank's narrow and wide stores (:func:`simulator.network.alignment.a2a_stores`); the rate is
the one free constant, least squares on log(predicted / measured) over a 1 GB/s grid.
"""

from __future__ import annotations

import numpy as np

from simulator.calibrate import REPO, jsonl
from simulator.config.load import load_topology
from simulator.hardware.catalog import load_gpu
from simulator.network.alignment import a2a_stores, narrow_time, split_table
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology, load_fabrics

FIT_DATA = REPO / "data/calibration/h100x4-nvswitch/alltoall.jsonl"
TOPOLOGY = REPO / "topologies/h100x4-nvswitch.yaml"
MIN_BYTES = 64 * 2**20
GRID_GBPS = np.arange(100.0, 1000.01, 1.0)
def _groups(n: int) -> list[list[int]]:
    return [[0, 1, 2, 3]] if n == 4 else [[0, 1], [2, 3]]


def rows() -> list[tuple[dict, float, float, tuple[float, float]]]:
    """(row, its time with 16-byte copies, its launch, (narrow, wide) stores) for every uneven
    row >= 64 MiB of the fit data with narrow stores."""
    cfg = load_topology(TOPOLOGY)
    model = CollectiveModel(Topology(cfg, load_gpu(cfg.gpu)))
    out = []
    for r in jsonl(FIT_DATA):
        if (
            r.get("op") != "all_to_all"
            or r.get("splits") not in ("rotated", "hot")
            or r.get("timing") != "events"
            or r["bytes"] < MIN_BYTES
        ):
            continue
        table = split_table(r["splits"], r["group"], r["bytes"])
        stores = a2a_stores(table)
        if stores[0] > 0:
            share = [[b / r["bytes"] for b in row] for row in table]
            cost = model.all_to_all_v(_groups(r["group"]), float(r["bytes"]), share)
            out.append((r, cost.time_s, cost.launch_s, stores))
    return out


def fit() -> float:
    """``unaligned_copy_GBps`` minimising the squared log error of :func:`rows`."""
    data = rows()

    class _C:  # the cost fields narrow_time reads
        def __init__(self, t, launch):
            self.time_s, self.launch_s = t, launch

    def loss(gbps: float) -> float:
        return sum(
            np.log(narrow_time(_C(t, la), st, gbps * 1e9) / r["time_s"]) ** 2
            for r, t, la, st in data
        )

    return float(GRID_GBPS[int(np.argmin([loss(g) for g in GRID_GBPS]))])


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}."""
    return {"unaligned_copy_GBps": (fit(), float(load_fabrics()["nccl"]["unaligned_copy_GBps"]))}
