"""Refit the memory-bound access classes (``memory_access`` in gpus.yaml): each class's
bandwidth relative to a streaming copy, from the elementwise measurements of a GPU.

Data: ``data/measured/h100x1`` (the catalog's defaults, used as ratios by GPUs without their
own measurement) and ``data/measured/h200x1`` (H200's own): ``elementwise.jsonl`` (large flat
tensors) and ``rowwise.jsonl`` ([8192, width] rows), written by
``benchmarks/device/elementwise.py``. Medians over model widths 2,048..16,384 (rows) or the
two largest sizes (flat).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from simulator.calibrate import REPO
from simulator.hardware.catalog import load_gpu

FOLDERS = {"H100-SXM-80GB": REPO / "data/measured/h100x1",
           "H200-SXM-141GB": REPO / "data/measured/h200x1"}

WIDTHS = (2048, 4096, 8192, 16384)


def load(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def ratios(folder: Path) -> dict[str, float]:
    flat = [r for r in load(folder / "elementwise.jsonl") if "GBps" in r and "elements" in r]
    rows = [r for r in load(folder / "rowwise.jsonl") if "GBps" in r and r.get("width") in WIDTHS]
    big = sorted({r["elements"] for r in flat})[-2:]

    def flat_med(op, dtypes=("bf16", "fp32")):
        return statistics.median(r["GBps"] for r in flat
                                 if r["op"] == op and r["elements"] in big and r["dtype"] in dtypes)

    def row_med(ops, dtypes=("bf16", "fp32")):
        return statistics.median(r["GBps"] for r in rows if r["op"] in ops and r["dtype"] in dtypes)

    copy = flat_med("copy")
    out = {
        "upcast": flat_med("cast_to_fp32"),
        "broadcast": row_med({"row_mul_vec"}, ("fp32",)),
        "norm": row_med({"row_layer_norm", "row_rms_norm"}),
        "softmax": row_med({"row_softmax"}),
        "cat": flat_med("cat_halves"),
        "dropout": flat_med("dropout"),
        "strided": row_med({"strided_silu", "strided_mul"}, ("bf16",)),
        "mixed": row_med({"mixed_add"}, ("fp32",)),
    }
    return {"copy_GBps": round(copy), **{k: round(v / copy, 3) for k, v in out.items()}}




def refit() -> dict[str, tuple[float, float]]:
    """{GPU.class: (refitted, shipped)}, rounded to 3 decimals as shipped."""
    out = {}
    for gpu, folder in FOLDERS.items():
        shipped = load_gpu(gpu).memory_access
        for k, v in ratios(folder).items():
            if k != "copy_GBps":
                out[f"{gpu}.{k}"] = (v, float(shipped[k]))
    return out
