"""Refit NCCL all-to-all's two constants (``nccl.all_to_all`` in ``simulator/network/fabrics.yaml``)
from ``all_to_all_single`` calls measured on 4x H100 NVSwitch.

Data: the uniform rows of ``data/calibration/h100x4-nvswitch/alltoall.jsonl`` (CUDA events
between back-to-back calls, groups of 4 and two pairs at once, 4 KiB - 1 GiB;
``data/calibration/h100x4-nvswitch/README.md``), priced by
:class:`~simulator.network.collectives.CollectiveModel` exactly as the simulator runs it on
``topologies/h100x4-nvswitch.yaml``.

Fit: least squares on log(predicted / measured) over the rows the GPU bounds, both constants
free: ``launch_extra_us`` (the call's fixed device cost beyond the other collectives'
``launch_us``) and ``bandwidth_fraction`` (the share of the NVLink rate the exchange reaches).
A row is device-bound when it is >= 16 MiB and at least 1.25x the same group's small-size
floor, the median of its rows <= 256 KiB. That floor is the host's call interval, not the
collective: a Python loop issuing ``all_to_all_single`` back to back (45-70 us a call on the
lent boxes) is slower than the GPU's small exchange, and as soon as the GPU takes longer than
the host, the host's time hides behind the previous call. Until 2026-11-26 the extra launch was
the median excess of the <= 256 KiB rows (24.5 us), i.e. the host's rate, added to every call's
device time: the fit set's own 4-16 MiB rows came out 12-32 % slow.

Each row's prediction is affine in (extra, 1 / fraction) -- the protocol follows NCCL's p2p
rule (size only), the fraction scales the wire bytes of the one direct step, the extra adds --
so two evaluations of the model per row give the whole loss surface; the search is a nested
golden section.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

from simulator.calibrate import REPO, jsonl
from simulator.config.load import load_topology
from simulator.hardware.catalog import load_gpu
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology, load_fabrics

FIT_DATA = REPO / "data/calibration/h100x4-nvswitch/alltoall.jsonl"
TOPOLOGY = REPO / "topologies/h100x4-nvswitch.yaml"
DEVICE_MIN_BYTES = 16 * 2**20
FLOOR_BYTES = 256 * 2**10
FLOOR_RATIO = 1.25


def _groups(n: int) -> list[list[int]]:
    return [[0, 1, 2, 3]] if n == 4 else [[0, 1], [2, 3]]


def rows() -> list[dict]:
    """The uniform all-to-all rows of the fit data."""
    out = jsonl(FIT_DATA)
    return [r for r in out if r.get("op") == "all_to_all" and r.get("splits") == "uniform"]


def device_rows(data: list[dict] | None = None) -> list[dict]:
    """The rows the GPU bounds (see the module docstring)."""
    data = rows() if data is None else data
    floor = {g: statistics.median(r["time_s"] for r in data
                                  if r["group"] == g and r["bytes"] <= FLOOR_BYTES)
             for g in {r["group"] for r in data}}
    return [r for r in data
            if r["bytes"] >= DEVICE_MIN_BYTES and r["time_s"] >= FLOOR_RATIO * floor[r["group"]]]


def _affine(topo: Topology, data: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(c, b) per row with predicted time = c + extra + b / fraction."""
    def at(fraction: float) -> np.ndarray:
        model = CollectiveModel(topo)
        model.a2a_launch_extra_s, model.a2a_bw_fraction = 0.0, fraction
        return np.array([model.cost("all_to_all", _groups(r["group"]), float(r["bytes"])).time_s
                         for r in data])

    t1, t2 = at(1.0), at(0.5)
    b = t2 - t1
    return t1 - b, b


def _golden(f, lo: float, hi: float, iters: int = 60) -> float:
    g = (math.sqrt(5) - 1) / 2
    for _ in range(iters):
        a, b = hi - g * (hi - lo), lo + g * (hi - lo)
        if f(a) < f(b):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


def fit() -> dict[str, float]:
    """launch_extra_us and bandwidth_fraction minimising the squared log error over the
    device-bound rows."""
    cfg = load_topology(TOPOLOGY)
    data = device_rows()
    meas = np.array([r["time_s"] for r in data])
    c, b = _affine(Topology(cfg, load_gpu(cfg.gpu)), data)

    def loss(extra: float, fraction: float) -> float:
        pred = c + extra + b / fraction
        return float(np.sum(np.log(np.maximum(pred, 1e-9) / meas) ** 2))

    def best_extra(fraction: float) -> float:
        return _golden(lambda e: loss(e, fraction), -20e-6, 60e-6)

    fraction = _golden(lambda f: loss(best_extra(f), f), 0.5, 1.2)
    return {"launch_extra_us": best_extra(fraction) * 1e6, "bandwidth_fraction": fraction}


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}, the refit rounded as fabrics.yaml ships it."""
    fab = load_fabrics()["nccl"]["all_to_all"]
    new = fit()
    return {"launch_extra_us": (round(new["launch_extra_us"], 1), float(fab["launch_extra_us"])),
            "bandwidth_fraction": (round(new["bandwidth_fraction"], 3),
                                   float(fab["bandwidth_fraction"]))}
