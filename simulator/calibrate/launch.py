"""Refit the per-kernel launch gap (``kernel_launch_s`` in gpus.yaml) and the host's eager
launch interval.

Data: ``simulator/hardware/data/H100-SXM-80GB/sync_vs_events.jsonl`` row ``tiny_kernel``:
trivial kernels replayed from a CUDA graph back to back (``cuda_graph_events_s``: the gap the
GPU itself needs between two kernels) and launched one by one from Python
(``eager_events_s``: the host's launch rate, which bounds a stream of short kernels);
``data/measured/h100x1/elementwise.jsonl`` row ``tiny_kernel`` (the same, a second host);
the smallest GEMM of ``sync_vs_events.jsonl`` timed back to back (a matmul's launch rate).
"""

from __future__ import annotations

import json

from simulator.calibrate import REPO
from simulator.hardware.catalog import default_kernel_params, load_gpu

DATA = REPO / "simulator/hardware/data/H100-SXM-80GB/sync_vs_events.jsonl"
ELEMENTWISE = REPO / "data/measured/h100x1/elementwise.jsonl"


def tiny_kernel() -> dict:
    return next(r for r in (json.loads(x) for x in DATA.read_text().splitlines() if x.strip())
                if r.get("op") == "tiny_kernel")


def _rows(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}: the CUDA-graph gap rounded to 0.1 us as shipped; the
    host's eager launch interval of a kernel (mean of the two one-element-kernel measurements)
    and of a matmul (the smallest GEMM's back-to-back time), to 0.1 us."""
    r = tiny_kernel()
    out = {}
    for name in ("H100-SXM-80GB", "H200-SXM-141GB"):
        out[f"{name}.kernel_launch_s"] = (round(r["cuda_graph_events_s"] * 1e7) / 1e7,
                                          load_gpu(name).kernel_launch_s)
    ew = next(x for x in _rows(ELEMENTWISE) if x.get("op") == "tiny_kernel")
    host = (r["eager_events_s"] + ew["time_s"]) / 2
    gemm = min((x for x in _rows(DATA) if x.get("op") == "gemm"),
               key=lambda x: x["m"] * x["k"] * x["n"])
    defaults = default_kernel_params()
    out["defaults.host_launch_s"] = (round(host * 1e7) / 1e7, defaults["host_launch_s"])
    out["defaults.host_gemm_launch_s"] = (round(gemm["events_s"] * 1e7) / 1e7,
                                          defaults["host_gemm_launch_s"])
    return out
