"""Refit the network model's constants (``simulator/network/fabrics.yaml``) from measured NCCL
collectives, and derive the split of the launch cost.

Fit: least squares on log(predicted / measured time) of every all-reduce, all-gather and
reduce-scatter of ``data/calibration/h200x4-nvswitch/collectives.jsonl`` (4x H200 on
NVSwitch, groups of 4 and two pairs at once, 1 KiB .. 4 GiB, timed with a barrier and a
device synchronisation around each call), sizes below 1 MiB weighted 0.3, with
:class:`~simulator.network.collectives.CollectiveModel` exactly as the simulator runs it on
``topologies/h200x4-nvswitch.yaml``. Three constants are free: ``links.nvlink.efficiency``,
the launch cost as that timing sees it (``nccl.launch_us + nccl.host_sync_overhead_us``) and
``nccl.copy_GBps``; every other constant is NCCL's own figure (cited in fabrics.yaml). (The
intra-node Simple ring step was a fourth until LL128 joined the model: with it the data no
longer pin that step down, a free fit runs it to any bound, so it is NCCL's figure now.)

Split: the same collectives timed back to back with CUDA events
(``data/measured/h200x4/collectives.jsonl``) are faster at <= 256 KiB by the host overhead of
synchronised timing; its median over the 24 (op, group, size) pairs is
``host_sync_overhead_us``, and ``launch_us`` is the fitted launch less it. (That file is also
the events suite, a development set, see validation/collectives-h200x4-events.yaml.)
"""

from __future__ import annotations

import copy
import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from simulator.calibrate import REPO
from simulator.config.load import load_topology
from simulator.hardware.catalog import load_gpu
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology, load_fabrics

FIT_DATA = REPO / "data/calibration/h200x4-nvswitch/collectives.jsonl"
EVENTS_DATA = REPO / "data/measured/h200x4/collectives.jsonl"
TOPOLOGY = REPO / "topologies/h200x4-nvswitch.yaml"
OPS = ("all_reduce", "all_gather", "reduce_scatter")
SMALL_WEIGHT, SMALL_BYTES = 0.3, 2**20
# name: (where in fabrics.yaml, lower bound, upper bound, decimals shipped)
FREE = {
    "nvlink_efficiency": (("links", "nvlink", "efficiency"), 0.7, 1.0, 3),
    "launch_total_us": (None, 5.0, 120.0, 1),
    "copy_GBps": (("nccl", "copy_GBps"), 500.0, 6000.0, -1),
}


def _rows(path: Path) -> list[dict]:
    return [r for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip())
            if r.get("op") in OPS]


def _groups(g: int, n_gpus: int) -> list[list[int]]:
    return [list(range(i, i + g)) for i in range(0, n_gpus - g + 1, g)]


def _get(d: Mapping, path: tuple) -> Any:
    for k in path:
        d = d[k]
    return d


def shipped(fab: Mapping | None = None) -> dict[str, float]:
    """The fitted constants as fabrics.yaml holds them."""
    fab = fab or load_fabrics()
    out = {n: float(_get(fab, p)) for n, (p, *_rest) in FREE.items() if p}
    out["launch_total_us"] = float(fab["nccl"]["launch_us"]) + float(
        fab["nccl"].get("host_sync_overhead_us", 0.0))
    return out


def variant(values: Mapping[str, float], base: Mapping | None = None) -> dict:
    """fabrics.yaml with the fitted constants replaced (the launch all on the GPU side)."""
    fab = copy.deepcopy(dict(base or load_fabrics()))
    for n, (path, *_rest) in FREE.items():
        if path:
            d = fab
            for k in path[:-1]:
                d = d[k]
            d[path[-1]] = float(values[n])
    fab["nccl"]["launch_us"] = float(values["launch_total_us"])
    fab["nccl"]["host_sync_overhead_us"] = 0.0
    return fab


class _Problem:
    def __init__(self, data: Path = FIT_DATA):
        cfg = load_topology(TOPOLOGY)
        self.topo = Topology(cfg, load_gpu(cfg.gpu))
        self.rows = _rows(data)
        self.meas = np.array([r["time_s"] for r in self.rows])
        self.w = np.where(np.array([r["bytes"] for r in self.rows]) < SMALL_BYTES,
                          SMALL_WEIGHT, 1.0)

    def predict(self, values: Mapping[str, float]) -> np.ndarray:
        m = CollectiveModel(self.topo, variant(values))
        return np.array([m.cost(r["op"], _groups(int(r["group"]), self.topo.n_gpus),
                                float(r["bytes"])).time_s for r in self.rows])

    def loss(self, values: Mapping[str, float]) -> float:
        return float(np.sum(self.w * np.log(self.predict(values) / self.meas) ** 2))


def fit(start: Mapping[str, float] | None = None, iters: int = 400) -> dict[str, float]:
    """The three constants minimising the weighted squared log error, from ``start`` (default:
    the shipped values), by bounded Nelder-Mead."""
    from simulator.hardware.compute import _nelder_mead_bounded

    prob = _Problem()
    names = list(FREE)
    x0 = np.array([(start or shipped())[n] for n in names])
    lo = np.array([FREE[n][1] for n in names])
    hi = np.array([FREE[n][2] for n in names])
    x = _nelder_mead_bounded(lambda v: prob.loss(dict(zip(names, v, strict=True))), x0, lo, hi,
                             iters=iters, restarts=2)
    return dict(zip(names, (float(v) for v in x), strict=True))


def launch_split(fab: Mapping | None = None) -> dict[str, float]:
    """host_sync_overhead_us: median (host-synchronised - CUDA-event) time at <= 256 KiB over
    the (op, group, size) pairs measured both ways; launch_us = the fitted total less it."""
    sync = {(r["op"], r["group"], r["bytes"]): r["time_s"] for r in _rows(FIT_DATA)}
    diffs = [sync[k] - r["time_s"] for r in _rows(EVENTS_DATA)
             if (k := (r["op"], r["group"], r["bytes"])) in sync and r["bytes"] <= 2**18]
    host = round(statistics.median(diffs) * 1e6, 1)
    total = shipped(fab)["launch_total_us"]
    return {"host_sync_overhead_us": host, "launch_us": round(total - host, 1),
            "pairs": float(len(diffs))}


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}, each refit rounded as fabrics.yaml ships it."""
    fab = load_fabrics()
    now, new = shipped(fab), fit()
    out = {n: (round(new[n], FREE[n][3]), now[n]) for n in FREE}
    split = launch_split(fab)
    out["host_sync_overhead_us"] = (split["host_sync_overhead_us"],
                                    float(fab["nccl"]["host_sync_overhead_us"]))
    out["launch_us"] = (split["launch_us"], float(fab["nccl"]["launch_us"]))
    return out
