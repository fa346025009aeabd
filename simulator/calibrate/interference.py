"""Refit ``nccl.compute_slowdown_beside_comm`` and ``nccl.comm_slowdown_beside_compute``
(fabrics.yaml): how much slower a GEMM runs while an NCCL kernel shares the GPU, and the
collective beside the GEMM.

Data: ``data/measured/h200x4/interference.jsonl`` (benchmarks/device/measure.py, part
interference): an 8192^3 bf16 GEMM loop on the default stream, alone and beside a 256 MiB
all-reduce / all-gather / reduce-scatter loop on a side stream, 4x H200. The compute constant
is the mean GEMM slowdown over the three collectives, less one; each collective's is its own
slowdown beside the GEMM, less one.
"""

from __future__ import annotations

import json
import statistics

from simulator.calibrate import REPO
from simulator.network.topology import load_fabrics

DATA = REPO / "data/measured/h200x4/interference.jsonl"


def rows() -> list[dict]:
    return [json.loads(x) for x in DATA.read_text().splitlines() if x.strip()]


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}, rounded to 3 decimals as shipped: the GEMM's mean
    slowdown, and each collective's own slowdown beside the GEMM."""
    nccl = load_fabrics()["nccl"]
    slow = statistics.mean(r["gemm_with_comm_s"] / r["gemm_alone_s"] for r in rows())
    out = {"compute_slowdown_beside_comm": (round(slow - 1.0, 3),
                                            float(nccl["compute_slowdown_beside_comm"]))}
    for r in rows():
        out[f"comm_slowdown_beside_compute.{r['comm']}"] = (
            round(r["comm_with_gemm_s"] / r["comm_alone_s"] - 1.0, 3),
            float(nccl["comm_slowdown_beside_compute"][r["comm"]]))
    return out
