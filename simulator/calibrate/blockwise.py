"""Refit ``BLOCKWISE_RATE_HOPPER`` (``simulator/hardware/precision.py``): Hopper's block-scaled
FP8 GEMMs against per-tensor FP8 GEMMs of the same shapes.

Data: ``data/measured/dsv3-fp8-h100x1/fp8_shapes.jsonl`` (``benchmarks/device/fp8_shapes.py``,
one H100): DeepSeek-V3's expert and MLA GEMM shapes as forward, dgrad and wgrad products,
each through ``torch._scaled_mm`` with per-tensor scales (``tensor``), 1x128 activation by
128x128 weight-block scales (``block_1x128_128x128``) and 1x128 by 1x128 scales
(``block_1x128_1x128``), timed after 3 s of the same GEMM back to back (the power-capped
clock a training step runs at). ``fwd``: the median over the forward and dgrad shapes of
per-tensor time / 1x128-by-128x128 time; ``wgrad``: the same over the wgrad shapes with
1x128-by-1x128 scales (both wgrad operands are activations, scaled along the tokens).
No validation suite is read here.
"""

from __future__ import annotations

import statistics

from simulator.calibrate import REPO, jsonl
from simulator.hardware import precision

DATA = REPO / "data/measured/dsv3-fp8-h100x1/fp8_shapes.jsonl"
#: the scaling each kind of GEMM runs under DeepSeek-V3's recipe
SCALING = {"fwd": "block_1x128_128x128", "wgrad": "block_1x128_1x128"}


def ratios() -> dict[str, list[tuple[str, float]]]:
    """{kind: [(shape label, per-tensor time / blockwise time), ...]}, sustained timings."""
    rows = [r for r in jsonl(DATA) if "label" in r and r["label"].startswith(("expert", "out_proj",
                                                                              "q_up"))]
    tensor = {r["label"]: r["sustained_s"] for r in rows if r["scaling"] == "tensor"}
    out: dict[str, list[tuple[str, float]]] = {"fwd": [], "wgrad": []}
    for r in rows:
        kind = "wgrad" if r["label"].endswith("_wgrad") else "fwd"
        if r["scaling"].split("/")[0] == SCALING[kind] and r["label"] in tensor:
            out[kind].append((r["label"], tensor[r["label"]] / r["sustained_s"]))
    return out


def fit() -> dict[str, float]:
    return {k: round(statistics.median(x for _, x in v), 3) for k, v in ratios().items()}


def refit() -> dict[str, tuple[float, float]]:
    return {f"BLOCKWISE_RATE_HOPPER.{k}": (v, precision.BLOCKWISE_RATE_HOPPER[k])
            for k, v in fit().items()}
