"""Refit the per-kernel launch gap (``kernel_launch_s`` in gpus.yaml).

Data: ``simulator/hardware/data/H100-SXM-80GB/sync_vs_events.jsonl`` row ``tiny_kernel``:
trivial kernels replayed from a CUDA graph back to back (``cuda_graph_events_s``: the gap the
GPU itself needs between two kernels). The host's time for eager code is refitted by
:mod:`simulator.calibrate.host`.
"""

from __future__ import annotations

import json

from simulator.calibrate import REPO
from simulator.hardware.catalog import load_gpu

DATA = REPO / "simulator/hardware/data/H100-SXM-80GB/sync_vs_events.jsonl"


def tiny_kernel() -> dict:
    return next(r for r in (json.loads(x) for x in DATA.read_text().splitlines() if x.strip())
                if r.get("op") == "tiny_kernel")


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}: the CUDA-graph gap rounded to 0.1 us as shipped."""
    r = tiny_kernel()
    out = {}
    for name in ("H100-SXM-80GB", "H200-SXM-141GB"):
        out[f"{name}.kernel_launch_s"] = (round(r["cuda_graph_events_s"] * 1e7) / 1e7,
                                          load_gpu(name).kernel_launch_s)
    return out
