"""Refit the reverse load of an NVLink port direction (``nccl.all_to_all.reverse_load`` in
``simulator/network/fabrics.yaml``) from all-to-alls that load a port one way or both ways.

Data: ``data/measured/a2a-ports-h100x4/a2a_probe.jsonl`` (4x H100 NVSwitch, NCCL 2.28.9,
``benchmarks/device/a2a_probe.py`` phase ``large``, two launches): in a group of 4, ``incast``
(every rank sends its whole buffer to rank 0: rank 0's port receives 3 parts and sends none)
and ``incast_back`` (rank 0 also sends one part to each peer: the same 3 parts in, 3 out); in
two pairs at once, ``oneway`` (rank 1 sends one part to rank 0, rank 0 none back) and
``uniform`` (one part each way). Each is priced by the busiest port direction (NCCL writes into
the receiver's FIFO over NVLink, ``P2P/CUMEM`` without ``/read`` on H100: NCCL 2.28
``src/graph/paths.cc`` enables P2P read only for compute capability 8.0).

Fit (closed form, no model run): within a pattern, time = fixed + load / rate; the slope of
time against rank 0's received bytes between two sizes cancels the fixed part. A port loaded
both ways carries ``1 + reverse_load`` times the load of one loaded one way at the same bytes
received, so reverse_load = slope(two ways) / slope(one way) - 1, from the pairs of patterns
with the same received bytes a size (``incast`` 64 / 256 MiB against ``incast_back`` 256 / 1,024
MiB; ``oneway`` against ``uniform`` at 256 / 1,024 MiB), each launch, averaged; shipped at two
decimals.
"""

from __future__ import annotations

import statistics

from simulator.calibrate import REPO, jsonl
from simulator.network.topology import load_fabrics

DATA = REPO / "data/measured/a2a-ports-h100x4/a2a_probe.jsonl"
MiB = 2**20
#: (group, one-way pattern, its two sizes, two-way pattern, its two sizes): the same bytes
#: received by rank 0 at each of the two sizes
PAIRS = ((4, "incast", (64, 256), "incast_back", (256, 1024)),
         (2, "oneway", (256, 1024), "uniform", (256, 1024)))


def received(row: dict) -> float:
    """Bytes group rank 0 receives from its peers."""
    t = row["table_bytes"]
    return float(sum(t[i][0] for i in range(1, len(t))))


def _at(rows: list[dict], label: str, g: int, pattern: str, mib: int) -> dict:
    hit = [r for r in rows if r["label"] == label and r["group"] == g
           and r["pattern"] == pattern and r["bytes"] == mib * MiB]
    if len(hit) != 1:
        raise ValueError(f"{DATA}: expected one {pattern} g{g} {mib} MiB row of launch {label}")
    return hit[0]


def slope(rows: list[dict], label: str, g: int, pattern: str, sizes) -> float:
    """Seconds per byte received by rank 0 between the two sizes."""
    a, b = (_at(rows, label, g, pattern, s) for s in sizes)
    return (b["time_s"] - a["time_s"]) / (received(b) - received(a))


def estimates(rows: list[dict] | None = None) -> list[float]:
    """reverse_load from every launch and pair of patterns."""
    rows = jsonl(DATA) if rows is None else rows
    out = []
    for label in sorted({r["label"] for r in rows}):
        for g, one, s1, two, s2 in PAIRS:
            out.append(slope(rows, label, g, two, s2) / slope(rows, label, g, one, s1) - 1.0)
    return out


def fit() -> dict[str, float]:
    return {"reverse_load": statistics.mean(estimates())}


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}, the refit at two decimals."""
    a2a = load_fabrics()["nccl"]["all_to_all"]
    return {"reverse_load": (round(fit()["reverse_load"], 2), float(a2a.get("reverse_load", 0.0)))}
