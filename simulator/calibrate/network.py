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

Split: the fitted total is what a host-synchronised call costs; only part of it is the GPU's.
``launch_us`` (the device's fixed cost of a call, what a training step pays) is fitted alone on
device-bound timings: ``data/measured/h100x2-nccl-device/tuning.jsonl`` rows ``timing:
device`` (the stream held by a sleep kernel while the host enqueues, then the GPU runs the
calls back to back), all-gather and reduce-scatter <= 1 MiB (ring/LL, as NCCL's own log of
that run shows), least squares on log(predicted / measured) over a 0.1 us grid.
``host_sync_overhead_us`` = the fitted total less it.

Event timing: a Python loop issuing calls back to back with a CUDA event between them (the
``timing: events`` suites) times max(the call's device time, the host's interval between two
calls): the slowest rank's host time a call plus its event record
(``data/measured/a2a-floor-h100x4``), which moves between runs with the state the processes
run in. The interval is the box's (gpus.yaml ``host_events_call_s`` for all-reduce,
all-gather and reduce-scatter, ``host_events_a2a_s`` for all-to-all, per GPU entry: the host
is part of the machine): the :func:`centre` (the value minimising the mean relative error,
what the suites score) of the event-timed rows <= 256 KiB of the kind (the all-to-alls
uniform, each less its per-peer part) of every non-held-out run on the box
(:data:`HOST_BOUND_DATA`), each at least twice the device's time (8-12 us): on the 4x H100
box its three calibration files, the floor probe's two default launches and the development
batches heldout10-14 (comm.py); on the 4x H200 box its development files (measure.py's,
comm.py's all-to-all run, heldout9). (The device-bound file's own event rows, 58-73 us, were
timed with NCCL's per-call tuning log on, which slows the host.) Until 2026-11-28 one figure
per box for every kind, the median of the calibration files alone (H100 59.2 us, H200 31.6:
the H200's all-to-alls -30 %); until 2026-11-27 the split was the median difference between
host-synchronised and CUDA-event rows at <= 256 KiB, whose event rows time that host interval
too: 25.6 us of "launch" on the GPU, three times the device's.
"""

from __future__ import annotations

import copy
import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from simulator.calibrate import REPO, jsonl
from simulator.config.load import load_topology
from simulator.hardware.catalog import CATALOG_FILE, load_gpu
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology, load_fabrics

FIT_DATA = REPO / "data/calibration/h200x4-nvswitch/collectives.jsonl"
DEVICE_DATA = REPO / "data/measured/h100x2-nccl-device/tuning.jsonl"
TOPOLOGY = REPO / "topologies/h200x4-nvswitch.yaml"
DEVICE_TOPOLOGY = REPO / "topologies/h100x2-nvswitch.yaml"
DEVICE_OPS, DEVICE_MAX_BYTES = ("all_gather", "reduce_scatter"), 2**20
#: per GPU entry of gpus.yaml (``defaults``: the catalog's default, the 4x H100 box's), the
#: event-timed files of its box whose small rows time the host's call interval: every run on
#: the box that is not held out (the development batches' collective files among them)
HOST_BOUND_DATA = {
    "defaults": (REPO / "data/calibration/h100x4-nvswitch/collectives.jsonl",
                 REPO / "data/calibration/h100x4-nvswitch/alltoall.jsonl",
                 REPO / "data/calibration/h100x4-nvswitch/collectives-pair-alone.jsonl",
                 REPO / "data/measured/a2a-floor-h100x4/events.jsonl",
                 *(REPO / f"data/measured/heldout{b}-h100x4/{f}.jsonl"
                   for b, files in ((10, ("comm-g3-aligned", "comm-g3-misaligned", "comm-g4")),
                                    (11, ("comm-g3", "comm-g4")), (12, ("comm-g3", "comm-g4")),
                                    (13, ("comm-g3", "comm-g4")), (14, ("comm-g3", "comm-g4")))
                   for f in files)),
    "H200-SXM-141GB": (REPO / "data/measured/h200x4/collectives.jsonl",
                       REPO / "data/measured/h200x4-alltoall/alltoall.jsonl",
                       REPO / "data/measured/heldout9-h200x4/comm-g3.jsonl",
                       REPO / "data/measured/heldout9-h200x4/comm-g4-offset.jsonl"),
}
HOST_BOUND_OPS, HOST_BOUND_MAX_BYTES = ("all_reduce", "all_gather", "reduce_scatter",
                                        "all_to_all"), 2**18
OPS = ("all_reduce", "all_gather", "reduce_scatter")
SMALL_WEIGHT, SMALL_BYTES = 0.3, 2**20
# name: (where in fabrics.yaml, lower bound, upper bound, decimals shipped)
FREE = {
    # at most the data rate NVIDIA states over the line rate (H100 / H200 NVLink4: 450 GB/s a
    # direction of 18 x 26.5625 GB/s, 0.941): without that bound the fit runs along a flat ridge
    # of the efficiency against copy_GBps to the line rate itself
    "nvlink_efficiency": (("links", "nvlink", "efficiency"), 0.7, 0.941, 3),
    "launch_total_us": (None, 5.0, 120.0, 1),
    "copy_GBps": (("nccl", "copy_GBps"), 500.0, 6000.0, -1),
    "ring_fill_fraction": (("nccl", "ring_simple_fill", "fraction"), 0.0, 1.0, 3),
    "ring_slice_us": (("nccl", "ring_simple_fill", "slice_us"), 0.0, 5.0, 2),
}
#: device-bound ring collectives (no host in the time), fitted beside the host-synchronised set:
#: (file, topology, timing, labels read, smallest size, whether a group ran alone). The 2x H100
#: device-timed all-gathers / reduce-scatters and the 4x H100 ring run of
#: benchmarks/device/call_ring_simple.sh (NCCL's own choices, ``label`` auto) from 4 MiB, where
#: NCCL runs ring / Simple (its logs); the 4x H100 calibration files' CUDA-event rows from 64 MiB
#: (160 us and more a call against the host's 41-124 us interval: the GPU bounds them).
DEVICE_BOUND = (
    (DEVICE_DATA, DEVICE_TOPOLOGY, "device", None, 2**22, True),
    (REPO / "data/measured/ring-simple-h100x4/g2.jsonl", DEVICE_TOPOLOGY, "device", "auto",
     2**22, True),
    (REPO / "data/measured/ring-simple-h100x4/g4.jsonl", REPO / "topologies/h100x4-nvswitch.yaml",
     "device", "auto", 2**22, True),
    (REPO / "data/calibration/h100x4-nvswitch/collectives.jsonl",
     REPO / "topologies/h100x4-nvswitch.yaml", "events", None, 2**26, False),
    (REPO / "data/calibration/h100x4-nvswitch/collectives-pair-alone.jsonl",
     REPO / "topologies/h100x4-nvswitch.yaml", "events", None, 2**26, True),
)


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
    """The fit's rows and loss: the host-synchronised set (:data:`FIT_DATA`, priced with the
    whole launch total) and the device-bound ring rows (:data:`DEVICE_BOUND`, priced with the
    device's launch, ``nccl.launch_us``), each as :class:`CollectiveModel` prices it."""

    def __init__(self, data: Path = FIT_DATA):
        cfg = load_topology(TOPOLOGY)
        self.topo = Topology(cfg, load_gpu(cfg.gpu))
        self.rows = _rows(data)
        self.dev: list[tuple[Topology, dict, list[list[int]]]] = []
        topos: dict[Path, Topology] = {}
        for path, tpath, timing, label, lo, alone in DEVICE_BOUND:
            if tpath not in topos:
                tcfg = load_topology(tpath)
                topos[tpath] = Topology(tcfg, load_gpu(tcfg.gpu))
            t = topos[tpath]
            for r in _rows(path):
                if (r.get("timing") == timing and r["bytes"] >= lo
                        and (label is None or r.get("label") == label)):
                    g = int(r["group"])
                    self.dev.append((t, r, [list(range(g))] if alone else _groups(g, t.n_gpus)))
        meas = [r["time_s"] for r in self.rows] + [r["time_s"] for _, r, _ in self.dev]
        self.meas = np.array(meas)
        self.w = np.concatenate([np.where(np.array([r["bytes"] for r in self.rows]) < SMALL_BYTES,
                                          SMALL_WEIGHT, 1.0), np.ones(len(self.dev))])

    def predict(self, values: Mapping[str, float]) -> np.ndarray:
        fab = variant(values)
        m = CollectiveModel(self.topo, fab)
        out = [m.cost(r["op"], _groups(int(r["group"]), self.topo.n_gpus),
                      float(r["bytes"])).time_s for r in self.rows]
        dev_fab = copy.deepcopy(fab)
        dev_fab["nccl"]["launch_us"] = float(load_fabrics()["nccl"]["launch_us"])
        models: dict[int, CollectiveModel] = {}
        for t, r, groups in self.dev:
            dm = models.get(id(t)) or models.setdefault(id(t), CollectiveModel(t, dev_fab))
            out.append(dm.cost(r["op"], groups, float(r["bytes"])).time_s)
        return np.array(out)

    def loss(self, values: Mapping[str, float]) -> float:
        return float(np.sum(self.w * np.log(self.predict(values) / self.meas) ** 2))


def fit(start: Mapping[str, float] | None = None, iters: int = 400) -> dict[str, float]:
    """The five constants minimising the weighted squared log error, from ``start`` (default:
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


def device_rows(timing: str = "device") -> list[dict]:
    """The rows of the device-bound measurement timed ``timing`` (``device`` or ``events``)."""
    return [r for r in (json.loads(x) for x in DEVICE_DATA.read_text().splitlines() if x.strip())
            if r.get("timing") == timing]


def fit_launch(fab: Mapping | None = None) -> float:
    """``launch_us`` minimising the squared log error of the device-bound all-gather and
    reduce-scatter rows <= 1 MiB, on a 0.1 us grid (module docstring)."""
    cfg = load_topology(DEVICE_TOPOLOGY)
    topo = Topology(cfg, load_gpu(cfg.gpu))
    rows = [r for r in device_rows()
            if r["op"] in DEVICE_OPS and r["bytes"] <= DEVICE_MAX_BYTES]
    fab = copy.deepcopy(dict(fab or load_fabrics()))
    fab["nccl"]["launch_us"] = 0.0
    m = CollectiveModel(topo, fab)
    rest = np.array([m.cost(r["op"], [[0, 1]], float(r["bytes"])).time_s for r in rows])
    meas = np.array([r["time_s"] for r in rows])
    grid = np.arange(0.0, 40.0, 0.1)
    loss = [float(np.sum(np.log((rest + g * 1e-6) / meas) ** 2)) for g in grid]
    return round(float(grid[int(np.argmin(loss))]), 1)


def host_bound_rows(gpu: str = "defaults") -> list[dict]:
    """The event-timed rows of ``gpu``'s box files that the host bounds (module docstring;
    ``cuda_events`` is ``events``)."""
    return [r for path in HOST_BOUND_DATA[gpu]
            for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip())
            if r.get("timing") in ("events", "cuda_events") and r.get("op") in HOST_BOUND_OPS
            and r.get("splits", "uniform") == "uniform" and r["bytes"] <= HOST_BOUND_MAX_BYTES]


def centre(values) -> float:
    """The value minimising the mean relative error over ``values`` (what a suite's MAPE
    scores): their median weighted 1 / value."""
    v = sorted(float(x) for x in values)
    half, acc = sum(1.0 / x for x in v) / 2.0, 0.0
    for x in v:
        acc += 1.0 / x
        if acc >= half:
            return x
    raise ValueError("no values")


def events_call_us(gpu: str = "defaults") -> float:
    """The host's interval between back-to-back calls of an events-timed loop on ``gpu``'s
    box: the :func:`centre` of its :func:`host_bound_rows` of all-reduces, all-gathers and
    reduce-scatters, rounded to 0.1 us."""
    return round(centre(
        r["time_s"] * 1e6 for r in host_bound_rows(gpu) if r["op"] != "all_to_all"), 1)


def events_a2a_us(gpu: str = "defaults") -> float:
    """The same interval for ``all_to_all_single`` on ``gpu``'s box (gpus.yaml
    ``host_events_a2a_s``): its uniform all-to-all rows among
    :func:`host_bound_rows`, each less its per-peer part (:func:`events_peer_us`): their
    :func:`centre`, rounded to 0.1 us."""
    peer = events_peer_us()["all_to_all"]
    return round(centre(
        r["time_s"] * 1e6 - peer * (r["group"] - 1)
        for r in host_bound_rows(gpu) if r["op"] == "all_to_all"), 1)


#: the host phase of the all-to-all probe (``benchmarks/device/a2a_probe.py``): per call kind
#: and group, the same process's loops of 64 KiB calls, interleaved
PEER_DATA = REPO / "data/measured/a2a-probe-h100x4/a2a_probe.jsonl"
#: the probe's call kinds of each all-to-all kind (``all_to_all_single`` without split lists;
#: with them: equal, uneven, some parts zero)
PEER_KINDS = {"all_to_all": ("a2a_plain",),
              "all_to_all_splits": ("a2a_equal_lists", "a2a_uneven", "a2a_sparse")}


def events_peer_us() -> dict[str, float]:
    """What an all-to-all call adds to an events-timed loop's interval per peer of its group
    (``n - 1``) beyond an all-reduce, all-gather or reduce-scatter of the same group in the
    same process: per block of the probe's host phase (a launch, a repetition, a group: one
    row of each call kind, run one after another), the kind's ``events_s`` (the slowest rank's
    median interval, what ``comm.py`` reports) less the median of the block's three
    collectives', over ``n - 1``; the median over blocks and the kind's call kinds, rounded to
    0.01 us (gpus.yaml ``host_events_peer_s``)."""
    blocks: dict[tuple, dict[str, dict]] = {}
    for r in jsonl(PEER_DATA):
        if r.get("phase") == "host":
            key = (r["world"], r["label"], r["rep"], r["group_label"])
            blocks.setdefault(key, {})[r["case"]] = r
    out = {}
    for kind, cases in PEER_KINDS.items():
        vals = []
        for b in blocks.values():
            base = statistics.median(b[c]["events_s"] for c in OPS)
            n = b[OPS[0]]["group"]
            vals += [(b[c]["events_s"] - base) / (n - 1) * 1e6 for c in cases if c in b]
        out[kind] = round(statistics.median(vals), 2)
    return out


#: the floor probe's default launches (``benchmarks/device/a2a_floor.py``): each cell timed
#: both with an event after every call and as one loop between one pair of events
RECORD_DATA = REPO / "data/measured/a2a-floor-h100x4/events.jsonl"


def events_record_us() -> float:
    """What recording a CUDA event after each call adds to the host's interval between
    back-to-back calls (gpus.yaml ``host_event_record_s``): per cell <= 256 KiB of the floor
    probe's two default launches (the floor's all-to-alls and the order phase's collectives,
    both timings of the same calls in the same process), the event-timed interval (the slowest
    rank's median) less the loop's (100 calls between one pair of events, the GPU's mean
    interval, the slowest rank's); their median, rounded to 0.1 us. A ``timing: loop``
    measurement (nccl-tests' method in a PyTorch loop) shows the box's event-timed
    interval less it."""
    return round(statistics.median(
        (r["time_s"] - r["loop_time_s"]) * 1e6 for r in jsonl(RECORD_DATA)
        if r["bytes"] <= HOST_BOUND_MAX_BYTES), 1)


def shipped_events_record_us() -> float:
    """gpus.yaml's ``host_event_record_s`` (defaults) in us."""
    cat = yaml.safe_load(CATALOG_FILE.read_text())
    return round(float(cat["defaults"]["host_event_record_s"]) * 1e6, 1)


def shipped_events_peer_us() -> dict[str, float]:
    """gpus.yaml's ``host_events_peer_s`` (defaults) in us."""
    cat = yaml.safe_load(CATALOG_FILE.read_text())
    return {k: round(float(v) * 1e6, 2) for k, v in cat["defaults"]["host_events_peer_s"].items()}


def shipped_events_call_us(key: str = "host_events_call_s") -> dict[str, float]:
    """gpus.yaml's ``key`` (``host_events_call_s`` or ``host_events_a2a_s``) in us, per
    entry of :data:`HOST_BOUND_DATA`."""
    cat = yaml.safe_load(CATALOG_FILE.read_text())
    return {g: round(float((cat["defaults"] if g == "defaults" else cat["gpus"][g])
                           [key]) * 1e6, 1) for g in HOST_BOUND_DATA}


def launch_split(fab: Mapping | None = None) -> dict[str, float]:
    """launch_us fitted on device-bound rows; host_sync_overhead_us = the fitted total less it;
    events_call_us, the host interval of events-timed loops."""
    launch = fit_launch(fab)
    total = shipped(fab)["launch_total_us"]
    return {"host_sync_overhead_us": round(total - launch, 1), "launch_us": launch,
            **{f"events_call_us[{g}]": events_call_us(g) for g in HOST_BOUND_DATA},
            **{f"events_a2a_us[{g}]": events_a2a_us(g) for g in HOST_BOUND_DATA}}


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}, each refit rounded as fabrics.yaml ships it."""
    fab = load_fabrics()
    now, new = shipped(fab), fit()
    out = {n: (round(new[n], FREE[n][3]), now[n]) for n in FREE}
    split = launch_split(fab)
    out["host_sync_overhead_us"] = (split["host_sync_overhead_us"],
                                    float(fab["nccl"]["host_sync_overhead_us"]))
    out["launch_us"] = (split["launch_us"], float(fab["nccl"]["launch_us"]))
    for g, v in shipped_events_call_us().items():  # gpus.yaml host_events_call_s
        out[f"events_call_us[{g}]"] = (split[f"events_call_us[{g}]"], v)
    for g, v in shipped_events_call_us("host_events_a2a_s").items():  # host_events_a2a_s
        out[f"events_a2a_us[{g}]"] = (split[f"events_a2a_us[{g}]"], v)
    peer, now = events_peer_us(), shipped_events_peer_us()
    for k, v in now.items():  # gpus.yaml host_events_peer_s
        out[f"events_peer_us[{k}]"] = (peer[k], v)
    out["events_record_us"] = (events_record_us(), shipped_events_record_us())
    return out
