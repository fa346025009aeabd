"""Refit NCCL all-to-all's three constants (``nccl.all_to_all`` in
``simulator/network/fabrics.yaml``) from ``all_to_all_single`` calls the GPU bounds.

Data: (1) every uniform all-to-all of ``data/measured/h100x2-nccl-device/tuning.jsonl`` timed
``device`` (2x H100 NVSwitch, 4 KiB - 256 MiB: the stream held by a sleep kernel while the host
enqueues, then the GPU runs the calls back to back), on ``topologies/h100x2-nvswitch.yaml``;
(2) the uniform rows of ``data/calibration/h100x4-nvswitch/alltoall.jsonl`` (CUDA events between
back-to-back calls, groups of 4 and two pairs at once, 4 KiB - 1 GiB;
``data/calibration/h100x4-nvswitch/README.md``) that the GPU bounds, on
``topologies/h100x4-nvswitch.yaml``. Both priced by
:class:`~simulator.network.collectives.CollectiveModel` exactly as the simulator runs them.

A row of (2) is device-bound when it is >= 16 MiB and at least 1.25x the same group's small-size
floor, the median of its rows <= 256 KiB. That floor is the host's call interval, not the
collective: a Python loop issuing ``all_to_all_single`` back to back (45-70 us a call on the
lent boxes) is slower than the GPU's small exchange (9-12 us, (1)); the validation suites price
such rows as max(device time, the host's interval), gpus.yaml ``host_events_call_s``.

Fit: least squares on log(predicted / measured) over those rows, three constants free:
``launch_extra_us`` (the call's fixed device cost beyond the other collectives'
``launch_us``), ``bandwidth_fraction`` (the share of the NVLink rate the exchange reaches) and
``simple_fill_bytes`` (p2p Simple's pipeline fill: up to this many bytes of the busiest rank's
traffic are not overlapped with the receivers' copy-out, :meth:`CollectiveModel._p2p_fill`;
the uniform rows send what they receive, so sender and receiver give the same fill). The device
rows show the fill directly: 9.1 us at 4 KiB, 16.5 us at 1 MiB (LL), then 25 / 57 / 148 /
506 us at 4 / 16 / 64 / 256 MiB, i.e. about 20-28 us above the fluid time from 16 MiB on, a
ramp that ends near 8 MiB a rank (16 channels x NCCL's 512 KiB p2p chunk,
``NCCL_P2P_NVL_CHUNKSIZE``), where a fixed extra cost would add the same 20+ us to the small
calls too. (Until 2026-11-27 a fixed extra of 10 us beside a 25.6 us launch stood for it.)

For a given fill each row's prediction is affine in (extra, 1 / fraction) -- the protocol
follows NCCL's p2p rule (size only), the fraction scales the wire bytes of the one direct step,
the fill (at the link's rate) and the extra add -- so two evaluations of the model per row give
the loss surface; the fill is searched on a 0.25 MiB grid, the other two by nested golden section.
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
DEVICE_DATA = REPO / "data/measured/h100x2-nccl-device/tuning.jsonl"
DEVICE_TOPOLOGY = REPO / "topologies/h100x2-nvswitch.yaml"
FILL_GRID_MIB = np.arange(1.0, 24.01, 0.25)
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


def pair_device_rows() -> list[dict]:
    """The all-to-alls of the device-bound measurement (data (1) of the module docstring)."""
    return [r for r in jsonl(DEVICE_DATA)
            if r.get("op") == "all_to_all" and r.get("timing") == "device"]


def _affine(topo: Topology, data: list[dict], fill_bytes: float = 0.0, pair: bool = False
            ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(c, b) per row with predicted time = c + extra + b / fraction, at ``fill_bytes``;
    ``pair``: each row on GPUs 0 and 1 alone (the device-bound pair data)."""
    def at(fraction: float) -> np.ndarray:
        model = CollectiveModel(topo)
        model.a2a_launch_extra_s, model.a2a_bw_fraction = 0.0, fraction
        model.a2a_fill_bytes = fill_bytes
        return np.array([model.cost("all_to_all", [[0, 1]] if pair else _groups(r["group"]),
                                    float(r["bytes"])).time_s for r in data])

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


def _topo(path) -> Topology:
    cfg = load_topology(path)
    return Topology(cfg, load_gpu(cfg.gpu))


def fit() -> dict[str, float]:
    """launch_extra_us, bandwidth_fraction and simple_fill_bytes minimising the squared log
    error over the device-bound rows of both data sets."""
    pair, box = pair_device_rows(), device_rows()
    meas = np.array([r["time_s"] for r in pair + box])
    t2, t4 = _topo(DEVICE_TOPOLOGY), _topo(TOPOLOGY)

    def loss(c, b, extra: float, fraction: float) -> float:
        pred = c + extra + b / fraction
        return float(np.sum(np.log(np.maximum(pred, 1e-9) / meas) ** 2))

    best = None
    for mib in FILL_GRID_MIB:
        fill = float(mib) * 2**20
        (c2, b2), (c4, b4) = _affine(t2, pair, fill, pair=True), _affine(t4, box, fill)
        c, b = np.concatenate([c2, c4]), np.concatenate([b2, b4])

        def best_extra(fraction: float, c=c, b=b) -> float:
            return _golden(lambda e: loss(c, b, e, fraction), -20e-6, 60e-6)

        fraction = _golden(lambda f, c=c, b=b: loss(c, b, best_extra(f), f), 0.5, 1.2)
        extra = best_extra(fraction)
        val = loss(c, b, extra, fraction)
        if best is None or val < best[0]:
            best = (val, extra, fraction, fill)
    _, extra, fraction, fill = best
    return {"launch_extra_us": extra * 1e6, "bandwidth_fraction": fraction,
            "simple_fill_bytes": fill}


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}, the refit rounded as fabrics.yaml ships it."""
    fab = load_fabrics()["nccl"]["all_to_all"]
    new = fit()
    return {"launch_extra_us": (round(new["launch_extra_us"], 1), float(fab["launch_extra_us"])),
            "bandwidth_fraction": (round(new["bandwidth_fraction"], 3),
                                   float(fab["bandwidth_fraction"])),
            "simple_fill_bytes": (new["simple_fill_bytes"],
                                  float(fab.get("simple_fill_bytes", 0.0)))}
