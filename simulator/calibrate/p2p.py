"""Refit the copy rate of NCCL's p2p warps (``nccl.all_to_all.p2p`` in
``simulator/network/fabrics.yaml``: ``warp_GBps``, ``warp_exponent``, ``narrow_send_*``,
``narrow_recv_*``): since 2026-11-27 night fitted together with the port's ceiling, the fill,
the launch and the softness of the two bounds (:mod:`simulator.calibrate.alltoall`, whose
docstring gives the model and the data); this set reports the six warp rates of that fit.

The rows that bind the warps: the uneven splits of ``data/measured/a2a-probe-h100x4`` and
``a2a-probe2-h100x4`` (``benchmarks/device/a2a_probe.py`` tables >= 32 MiB a rank: a group of 4,
two pairs at once and a group of 3; aligned splits and parts off 16 bytes on both sides; the
rotated 4:3:2:1 split whose parts double their channels above 16 MiB so that 2-4 rounds share a
channel), the uneven rows >= 32 MiB of ``data/calibration/h100x4-nvswitch/alltoall.jsonl``
(``comm.py``'s rotated and hot splits, off 16 bytes on one side or the other), and the channel
runs of ``data/measured/a2a-pair-h100x4`` (``NCCL_MAX_P2P_NCHANNELS`` 8 / 16 / 32 and
``NCCL_MIN_P2P_NCHANNELS`` 64: the same patterns with 4 to 19 warps a piece). No held-out or
development suite's data is read.
"""

from __future__ import annotations

from simulator.calibrate import alltoall
from simulator.network.p2p import WARP_RATE_KEYS

NAMES = WARP_RATE_KEYS


def rows() -> list[tuple[dict, list[list[float]]]]:
    """(row, its table of bytes) of the uneven and probe rows of the joint fit."""
    return [(r, table) for s, r, table, _, _ in alltoall.fit_rows() if s in ("uneven", "probe")]


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)} of the six warp rates, as
    :func:`simulator.calibrate.alltoall.refit` gives them."""
    out = alltoall.refit()
    return {k: out[k] for k in NAMES}
