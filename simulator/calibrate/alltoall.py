"""Refit NCCL all-to-all's constants within one NVLink domain (``nccl.all_to_all`` in
``simulator/network/fabrics.yaml``: ``launch_extra_us``, ``bandwidth_fraction``,
``simple_fill_bytes``, ``port_softness`` and the warp rates of ``p2p``) together, from
``all_to_all_single`` calls the GPU bounds.

Model (:meth:`~simulator.network.collectives.CollectiveModel._a2a_phase`, docs/DESIGN_NOTES.md
"All-to-all: the port's ceiling and the warps"): a call costs the launch (``launch_us`` +
``launch_extra_us``), the route's latency and protocol step, p2p Simple's pipeline fill (up to
``simple_fill_bytes`` of the busiest rank's traffic at the link's rate) and its data time: with
LL the busiest port's load at LL's share of ``bandwidth_fraction`` of the link; with Simple
(ports^p + warps^p)^(1/p), ports the busiest port's load (what it receives plus
``reverse_load`` x what it sends, ``calibrate ports``) at ``bandwidth_fraction`` of the
link's rate, warps the slowest of NCCL's channels, each block (a rank's channel in one
batch) moving every side of its works one after the other at the rate of all its warps
(``warp_GBps`` x w^``warp_exponent``; a side whose part starts off 16 bytes at the narrow rates;
:mod:`simulator.network.p2p`), p = ``port_softness``.

Data, every row >= 16 MiB a rank or device-timed (no host in its time):

1. ``data/measured/h100x2-nccl-device/tuning.jsonl``: every uniform all-to-all timed ``device``
   (2x H100, 4 KiB-256 MiB: the stream held while the host enqueues), on
   ``topologies/h100x2-nvswitch.yaml``; its small LL calls fix the launch;
2. ``data/calibration/h100x4-nvswitch/alltoall.jsonl``: the uniform rows the GPU bounds
   (:func:`device_rows`) and the uneven (``comm.py``'s rotated and hot) rows >= 32 MiB;
3. ``data/measured/a2a-probe-h100x4`` and ``a2a-probe2-h100x4`` (``a2a_probe.py`` tables,
   phase ``large``, >= 32 MiB): uneven, aligned and misaligned splits in groups of 2, 3, 4;
4. ``data/measured/a2a-ports-h100x4`` (>= 256 MiB): ports loaded one way and both ways;
5. ``data/measured/a2a-pair-h100x4`` (>= 256 MiB; its 64 MiB pairs scatter with the host's
   interval): the same patterns under ``NCCL_MAX_P2P_NCHANNELS`` 8 / 16 / 32 and
   ``NCCL_MIN_P2P_NCHANNELS`` 64, each launch priced on its own layout (the channels and
   channels per peer of its NCCL INFO line, :data:`LAYOUTS`);
6. ``data/measured/a2a-floor-h100x4/alltoall.jsonl`` (128 MiB-1 GiB, ``a2a_floor.py`` phase
   ``narrow``): pairs whose transfer is narrow on its send side only, its receive side only,
   both (one rank), or neither, one way and both ways: what pins the two narrow rates apart.

Rows of 2-6 on ``topologies/h100x4-nvswitch.yaml`` (pairs as two pairs at once), the tables
laid out in rank order in both buffers (parts off 16 bytes run narrow). Fit: least squares on
log(predicted / measured), each data set (pair-device, uniform, uneven, probe, ports, narrow) weighing
alike (:func:`weights`), ten constants free, Nelder-Mead from a fixed start; the prediction is the model's own, taken apart once per row (:func:`prepared`: what does
not depend on the constants, checked against ``CollectiveModel`` in tests) so that the search
is a vector computation. Shipped: the launch to 0.1 us, the fill to 4 KiB, the rest at three
significant figures. The start's fill (7 MiB) sits off the 8 MiB kink of the 16 MiB pair rows
(their busiest rank's bytes), where the search would stall; from the previous fit's values it
reaches the same constants.
"""

from __future__ import annotations

import functools
import statistics

import numpy as np
from scipy.optimize import minimize

from simulator.calibrate import REPO, jsonl
from simulator.config.load import load_topology
from simulator.hardware.catalog import load_gpu
from simulator.network.alignment import split_table
from simulator.network.collectives import CollectiveModel
from simulator.network.p2p import WARP_RATE_KEYS, P2pLayout, narrow_parts, pieces
from simulator.network.topology import Topology, load_fabrics

FIT_DATA = REPO / "data/calibration/h100x4-nvswitch/alltoall.jsonl"
TOPOLOGY = REPO / "topologies/h100x4-nvswitch.yaml"
DEVICE_DATA = REPO / "data/measured/h100x2-nccl-device/tuning.jsonl"
DEVICE_TOPOLOGY = REPO / "topologies/h100x2-nvswitch.yaml"
PROBES = (REPO / "data/measured/a2a-probe-h100x4/a2a_probe.jsonl",
          REPO / "data/measured/a2a-probe2-h100x4/a2a_probe.jsonl")
PORTS = (REPO / "data/measured/a2a-ports-h100x4/a2a_probe.jsonl",
         REPO / "data/measured/a2a-pair-h100x4/a2a_probe.jsonl")
#: pairs whose one transfer runs narrow on one side only (a2a_floor.py phase narrow)
NARROW = REPO / "data/measured/a2a-floor-h100x4/alltoall.jsonl"
#: (p2p channels, channels per peer) of a launch with NCCL_MAX/MIN_P2P_NCHANNELS set (its NCCL
#: INFO line, data/measured/a2a-pair-h100x4/nccl_channels.txt); every other launch: fabrics.yaml
LAYOUTS = {"max8": (8, 8), "max16": (16, 16), "max32": (32, 32), "min64": (64, 64)}
DEVICE_MIN_BYTES = 16 * 2**20
UNEVEN_MIN_BYTES = 32 * 2**20
PORTS_MIN_BYTES = 256 * 2**20
FLOOR_BYTES = 256 * 2**10
FLOOR_RATIO = 1.25
NAMES = ("launch_extra_us", "bandwidth_fraction", "simple_fill_bytes", "port_softness",
         *WARP_RATE_KEYS)
#: the search's start and its units (the fill in MiB)
START = (1.2, 0.85, 7.0, 3.0, 3.4, 0.83, 1.64, 0.65, 1.62, 0.79)
SCALE = (1e-6, 1.0, 2.0**20, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)


def _groups(n: int) -> list[list[int]]:
    return {4: [[0, 1, 2, 3]], 2: [[0, 1], [2, 3]], 3: [[0, 1, 2]]}[n]


def rows() -> list[dict]:
    """The uniform all-to-all rows of the fit data."""
    out = jsonl(FIT_DATA)
    return [r for r in out if r.get("op") == "all_to_all" and r.get("splits") == "uniform"]


def device_rows(data: list[dict] | None = None) -> list[dict]:
    """The uniform rows of data 2 the GPU bounds: >= 16 MiB and at least 1.25x the same
    group's small-size floor (the median of its rows <= 256 KiB: the host's call interval,
    which a Python loop issuing calls back to back shows for small calls)."""
    data = rows() if data is None else data
    floor = {g: statistics.median(r["time_s"] for r in data
                                  if r["group"] == g and r["bytes"] <= FLOOR_BYTES)
             for g in {r["group"] for r in data}}
    return [r for r in data
            if r["bytes"] >= DEVICE_MIN_BYTES and r["time_s"] >= FLOOR_RATIO * floor[r["group"]]]


def pair_device_rows() -> list[dict]:
    """The all-to-alls of data 1."""
    return [r for r in jsonl(DEVICE_DATA)
            if r.get("op") == "all_to_all" and r.get("timing") == "device"]


def _topo(path) -> Topology:
    cfg = load_topology(path)
    return Topology(cfg, load_gpu(cfg.gpu))


def fit_rows() -> list[tuple[str, dict, list[list[float]], bool, str]]:
    """(data set, row, table of bytes, parts laid out in rank order, topology) of every row."""
    out = [("pair-device", r, split_table("uniform", 2, r["bytes"]), False, "x2")
           for r in pair_device_rows()]
    out += [("uniform", r, split_table("uniform", r["group"], r["bytes"]), False, "x4")
            for r in device_rows()]
    out += [("uneven", r, split_table(r["splits"], r["group"], r["bytes"]), True, "x4")
            for r in jsonl(FIT_DATA)
            if r.get("op") == "all_to_all" and r.get("splits") in ("rotated", "hot")
            and r.get("timing") == "events" and r["bytes"] >= UNEVEN_MIN_BYTES]
    for name, paths, lo in (("probe", PROBES, UNEVEN_MIN_BYTES), ("ports", PORTS, PORTS_MIN_BYTES)):
        out += [(name, r, [[float(b) for b in row] for row in r["table_bytes"]], True, "x4")
                for path in paths for r in jsonl(path)
                if r.get("phase") == "large" and r["bytes"] >= lo]
    out += [("narrow", r, [[float(b) for b in row] for row in r["table_bytes"]], True, "x4")
            for r in jsonl(NARROW) if r.get("phase") == "narrow"]
    return out


def _layout(model: CollectiveModel, row: dict) -> P2pLayout:
    base = model.p2p_layout
    if row.get("label") in LAYOUTS:
        c, k = LAYOUTS[row["label"]]
        return P2pLayout(c, k, base.chunk_bytes)
    return base


@functools.lru_cache(maxsize=1)
def prepared():
    """Each row taken apart as the model prices it (module docstring): the measured time,
    the host's interval of an event-timed call, what the constants do not change (launch,
    latency and step, fluid time of the raw bytes, the busiest rank's bytes, the port's load,
    the protocol's share, Simple or not) and its pieces of work."""
    models = {"x2": CollectiveModel(_topo(DEVICE_TOPOLOGY)), "x4": CollectiveModel(_topo(TOPOLOGY))}
    meas, fixed, fluid, busiest, load, pfrac, simple, ev = ([] for _ in range(8))
    pc = {k: [] for k in ("block", "b", "w", "n", "kind")}
    key_of_block, block_warps, chan_of_key, row_of_chan = [], [], [], []
    for i, (_, r, table, laid_out, tk) in enumerate(fit_rows()):
        m = models[tk]
        groups = [[0, 1]] if tk == "x2" else _groups(len(table))
        n = len(table)
        tr = tuple((g[a], g[b], table[a][b]) for g in groups for a in range(n) for b in range(n)
                   if a != b and table[a][b])
        ph = m._direct_phase(tr, 0.0, 1.0)
        peer = max(table[a][b] for a in range(n) for b in range(n) if a != b)
        proto = m._p2p_protocol(groups[0], peer)
        meas.append(r["time_s"])
        fixed.append(m._launch + m._lat(ph, proto))
        fluid.append(m._fluid(ph))
        sent, recv = {}, {}
        for a, b, nb in tr:
            sent[a] = sent.get(a, 0.0) + nb
            recv[b] = recv.get(b, 0.0) + nb
        busiest.append(max(max(sent.values()), max(recv.values())))
        load.append(m._port_load(table))
        pfrac.append(proto.fraction)
        simple.append(proto.name == "Simple")
        kind = "uniform" if not laid_out else "splits"
        ev.append(m.events_interval_s("all_to_all", n, kind) if r.get("timing") == "events"
                  else 0.0)
        if proto.name != "Simple":
            continue
        ps = pieces(table, _layout(m, r), narrow_parts(table) if laid_out else None)
        keys, chans, blocks, seen = {}, {}, {}, set()
        for key, b, _sw, sn, _rw, rn, swork, ws, rwork, wr in ps:
            if key not in keys:
                keys[key] = len(chan_of_key)
                if key[0] not in chans:
                    chans[key[0]] = len(row_of_chan)
                    row_of_chan.append(i)
                chan_of_key.append(chans[key[0]])
            sides = (((swork, ws, sn or rn, 2),) if swork == rwork
                     else ((swork, ws, sn, 0), (rwork, wr, rn, 1)))
            for work, w, nar, kind in sides:
                block = (work[0], work[1], key[1])
                if block not in blocks:
                    blocks[block] = len(key_of_block)
                    key_of_block.append(keys[key])
                    block_warps.append(0)
                if work not in seen:
                    seen.add(work)
                    block_warps[blocks[block]] += w
                for k, v in zip(("block", "b", "n", "kind"),
                                (blocks[block], b, nar, kind), strict=True):
                    pc[k].append(v)
        first = len(pc["w"])
        pc["w"] += [0] * (len(pc["block"]) - first)
        for x in range(first, len(pc["block"])):
            pc["w"][x] = block_warps[pc["block"][x]]
    arr = {k: np.array(v, dtype=float if k in ("b", "w") else
                       (bool if k == "n" else np.int64)) for k, v in pc.items()}
    return (np.array(meas), np.array(ev), np.array(fixed), np.array(fluid), np.array(busiest),
            np.array(load), np.array(pfrac), np.array(simple), arr,
            np.array(key_of_block, dtype=np.int64), np.array(chan_of_key, dtype=np.int64),
            np.array(row_of_chan, dtype=np.int64))


def predict(x) -> np.ndarray:
    """Every row's time at the constants ``x`` (in :data:`NAMES`' order and units)."""
    (meas, ev, fixed, fluid, busiest, load, pfrac, simple, pc, key_of_block, chan_of_key,
     row_of_chan) = prepared()
    extra, frac, fill, p, g, e, gs, es, gr, er = x
    tc = fluid * load / (frac * pfrac)
    b, w, n, kind = pc["b"], pc["w"], pc["n"], pc["kind"]
    wide = b / (g * 1e9 * w ** e)
    send = np.where(n, b / (gs * 1e9 * w ** es), wide)
    recv = np.where(n, b / (gr * 1e9 * w ** er), wide)
    side = np.where(kind == 0, send, np.where(kind == 1, recv, np.maximum(send, recv)))
    per_block = np.zeros(len(key_of_block))
    np.add.at(per_block, pc["block"], side)
    per_key = np.zeros(len(chan_of_key))
    np.maximum.at(per_key, key_of_block, per_block)
    per_chan = np.zeros(len(row_of_chan))
    np.add.at(per_chan, chan_of_key, per_key)
    tw = np.zeros(len(meas))
    np.maximum.at(tw, row_of_chan, per_chan)
    data = np.where(simple & (tw > 0), (tc ** p + tw ** p) ** (1 / p), tc)
    filled = np.where(simple, fluid * np.minimum(1.0, fill / busiest), 0.0)
    return np.maximum(ev, fixed + extra + filled + data)


def _unit(q) -> list[float]:
    return [float(v) * s for v, s in zip(q, SCALE, strict=True)]


def weights() -> np.ndarray:
    """Each row's weight: every data set of :func:`fit_rows` weighs alike (a row 1 / its set's
    rows), so that the 9 device-timed pair calls and the 8 uniform rows, what training's
    exchanges are, count as much as the 120 probe rows or the 122 rows of the port runs."""
    sets = [s for s, *_ in fit_rows()]
    w = np.array([1.0 / sets.count(s) for s in sets])
    return w * len(w) / w.sum()


@functools.lru_cache(maxsize=1)
def fit() -> dict[str, float]:
    """The ten constants minimising the weighted squared log error over :func:`fit_rows`."""
    meas, w = prepared()[0], weights()

    def loss(q) -> float:
        if min(q) <= 0:
            return 1e9
        return float(np.sum(w * np.log(predict(_unit(q)) / meas) ** 2))

    res = minimize(loss, np.array(START), method="Nelder-Mead",
                   options={"xatol": 1e-6, "fatol": 1e-10, "maxiter": 20000, "maxfev": 20000})
    return dict(zip(NAMES, _unit(res.x), strict=True))


def shipped() -> dict[str, float]:
    a2a = load_fabrics()["nccl"]["all_to_all"]
    out = {k: float(a2a.get(k, 0.0)) for k in NAMES[:4]}
    out.update({k: float(a2a["p2p"][k]) for k in WARP_RATE_KEYS})
    return out


def rounded(new: dict[str, float]) -> dict[str, float]:
    """The fit as fabrics.yaml ships it (module docstring)."""
    out = {k: float(f"{v:.3g}") for k, v in new.items()}
    out["launch_extra_us"] = round(new["launch_extra_us"] * 1e6, 1)
    out["simple_fill_bytes"] = float(round(new["simple_fill_bytes"] / 4096) * 4096)
    return out


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}, the refit rounded as fabrics.yaml ships it."""
    new, now = rounded(fit()), shipped()
    return {k: (new[k], now[k]) for k in NAMES}
