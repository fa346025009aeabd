"""Refit the copy rate of NCCL's p2p warps (``nccl.all_to_all.p2p`` in
``simulator/network/fabrics.yaml``: ``warp_GBps``, ``warp_exponent``, ``narrow_send_*``,
``narrow_recv_*``) from all-to-alls whose splits load NCCL's channels unevenly.

Data: ``data/measured/a2a-probe-h100x4/a2a_probe.jsonl`` (4x H100 NVSwitch, NCCL 2.28.9,
``benchmarks/device/a2a_probe.py``), every ``large`` row >= 32 MiB a rank (60 rows: a group of 4,
two pairs at once and a group of 3; uniform, eight aligned uneven patterns and three whose
parts start off 16 bytes; CUDA events between back-to-back calls), the second probe's rows
(``data/measured/a2a-probe2-h100x4/a2a_probe.jsonl``, 60 rows, 32 MiB-1 GiB in a group of 4,
two launches: uniform, receiver-hot, sender-hot and the rotated 4:3:2:1 split aligned, whose
parts double their channels above 16 MiB so that 2-4 rounds share a channel), and the uneven rows >= 32
MiB of the fit set ``data/calibration/h100x4-nvswitch/alltoall.jsonl`` (``comm.py``'s rotated and
hot splits, 12 rows: their parts are off 16 bytes on one side or the other, which the
probe's, off on both, cannot tell apart). No held-out or development suite's data
(heldout9-11) is read.

Model: each row priced as ``validate`` prices it, :meth:`CollectiveModel.all_to_all_table`
on ``topologies/h100x4-nvswitch.yaml``: the longer of the links' time (the fitted uniform
model, unchanged) and the launch plus the slowest piece of work on NCCL's p2p channels
(:mod:`simulator.network.p2p`: NCCL's own layout of rounds, channels and warps), a piece
``bytes / (GBps x warps ** exponent)``, a narrow side with its own pair (sending, receiving).
Six constants free, least squares on log(predicted / measured), Nelder-Mead from a fixed
start, shipped at three significant figures. The pieces depend only on the table, so they
are laid out once.

What it says: a 16-byte piece moves about 3.4 GB/s x warps^0.83 (9 receiving warps of one
channel: 21 GB/s; 2 warps, where three rounds share a channel: 6.0 GB/s; before the second
probe, 2.8 x warps^0.9, 5.2 GB/s at 2 warps); a narrow send
1.6 x warps^0.65 (9 warps: 6.8 GB/s), a narrow receive 1.6 x warps^0.79 (9 warps: 9.3 GB/s).
The uniform rows are the links' (their pieces are even and well warped), so the uniform fit
(``calibrate alltoall``) is untouched.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize

from simulator.calibrate import REPO, jsonl
from simulator.config.load import load_topology
from simulator.hardware.catalog import load_gpu
from simulator.network.alignment import split_table
from simulator.network.collectives import CollectiveModel
from simulator.network.p2p import WARP_RATE_KEYS, narrow_parts, pieces
from simulator.network.topology import Topology, load_fabrics

FIT_DATA = REPO / "data/measured/a2a-probe-h100x4/a2a_probe.jsonl"
FIT_DATA2 = REPO / "data/measured/a2a-probe2-h100x4/a2a_probe.jsonl"
SPLIT_DATA = REPO / "data/calibration/h100x4-nvswitch/alltoall.jsonl"
TOPOLOGY = REPO / "topologies/h100x4-nvswitch.yaml"
MIN_BYTES = 32 * 2**20
START = (2.8, 0.9, 2.0, 0.6, 2.0, 0.6)
NAMES = WARP_RATE_KEYS


def groups_of(g: int) -> list[list[int]]:
    """The GPUs of a row's group(s): a group of 4, two pairs at once, a group of 3 alone."""
    return {4: [[0, 1, 2, 3]], 2: [[0, 1], [2, 3]], 3: [[0, 1, 2]]}[g]


def rows() -> list[tuple[dict, list[list[float]]]]:
    """(row, its table of bytes) of every fit row."""
    out = [(r, [[float(b) for b in row] for row in r["table_bytes"]])
           for path in (FIT_DATA, FIT_DATA2) for r in jsonl(path)
           if r.get("phase") == "large" and r["bytes"] >= MIN_BYTES]
    out += [(r, split_table(r["splits"], r["group"], r["bytes"])) for r in jsonl(SPLIT_DATA)
            if r.get("op") == "all_to_all" and r.get("splits") in ("rotated", "hot")
            and r.get("timing") == "events" and r["bytes"] >= MIN_BYTES]
    return out


def _prepared():
    """Per row: (measured, links' time, launch, piece arrays)."""
    cfg = load_topology(TOPOLOGY)
    model = CollectiveModel(Topology(cfg, load_gpu(cfg.gpu)))
    out = []
    for r, table in rows():
        nb = max(sum(row) for row in table)
        share = [[b / nb for b in row] for row in table]
        base = model.all_to_all_v(groups_of(r["group"]), nb, share)
        ps = pieces(table, model.p2p_layout, narrow_parts(table))
        keys = {k: i for i, k in enumerate(sorted({p[0] for p in ps}))}
        arr = (np.array([keys[p[0]] for p in ps]), np.array([p[1] for p in ps]),
               np.array([max(p[2], 1) for p in ps], float), np.array([p[3] for p in ps]),
               np.array([max(p[4], 1) for p in ps], float), np.array([p[5] for p in ps]),
               len(keys), {i: k[0] for k, i in keys.items()})
        out.append((r["time_s"], base.time_s, base.launch_s, arr))
    return out


def _side(b, w, nar, g, e, ng, ne):
    return np.where(nar, b / (ng * 1e9 * w ** ne), b / (g * 1e9 * w ** e))


def _predict(prep, x) -> np.ndarray:
    out = []
    g, e, gs, es, gr, er = x
    for _, link, launch, (key, b, sw, sn, rw, rn, nkeys, key_chan) in prep:
        t = np.maximum(_side(b, sw, sn, g, e, gs, es), _side(b, rw, rn, g, e, gr, er))
        per_key = np.zeros(nkeys)
        np.maximum.at(per_key, key, t)
        per_chan: dict[int, float] = {}
        for k, v in enumerate(per_key):
            per_chan[key_chan[k]] = per_chan.get(key_chan[k], 0.0) + float(v)
        out.append(max(link, launch + max(per_chan.values())))
    return np.array(out)


def fit() -> dict[str, float]:
    """The six constants minimising the squared log error of :func:`rows`."""
    prep = _prepared()
    meas = np.array([p[0] for p in prep])

    def loss(x) -> float:
        if min(x) <= 0:
            return 1e9
        return float(np.sum(np.log(_predict(prep, x) / meas) ** 2))

    res = minimize(loss, np.array(START), method="Nelder-Mead",
                   options={"xatol": 1e-5, "fatol": 1e-9, "maxiter": 4000})
    return dict(zip(NAMES, (float(v) for v in res.x), strict=True))


def shipped() -> dict[str, float]:
    p2p = load_fabrics()["nccl"]["all_to_all"]["p2p"]
    return {k: float(p2p[k]) for k in NAMES}


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}, the refit at three significant figures."""
    new, now = fit(), shipped()
    return {k: (float(f"{new[k]:.3g}"), now[k]) for k in NAMES}
