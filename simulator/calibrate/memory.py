"""Refit the memory-bound access classes (``memory_access`` in gpus.yaml): each class's
bandwidth relative to a streaming copy, from the elementwise measurements of a GPU.

Data: ``data/measured/h100x1`` (the catalog's defaults, used as ratios by GPUs without their
own measurement) and ``data/measured/h200x1`` (H200's own): ``elementwise.jsonl`` (large flat
tensors) and ``rowwise.jsonl`` ([8192, width] rows), written by
``benchmarks/device/elementwise.py``. Medians over model widths 2,048..16,384 (rows) or the
two largest sizes (flat).

The row-indexed bf16 classes of Megatron-Core's PyTorch MoE permutation (H100, defaults):
``data/measured/moe-permute-h100x1/permute.jsonl`` (``benchmarks/device/moe_permute.py``), each
case's pieces against its own copy of the permuted rows (:func:`permute_ratios`).

PyTorch's multi-tensor optimizer kernels over bf16 tensors (H100, defaults; eager code only):
``data/measured/stepmech-h100x4/adam.jsonl`` (``benchmarks/device/step_mechanisms.py --phase
adam``), the fused AdamW and ``clip_grad_norm_`` over AC-shaped parameter lists against the
catalog's copy (:func:`optimizer_ratios`).
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




PERMUTE = REPO / "data/measured/moe-permute-h100x1/permute.jsonl"
I64, BF16 = 8, 2


def permute_ratios(path: Path = PERMUTE) -> dict[str, float]:
    """Bandwidth relative to a copy of the permuted rows (``copy_Rh_ref``: ``R`` rows of ``h``
    bf16, read and written) of the three row-indexed kernels of Megatron-Core's PyTorch
    permutation, with the bytes :mod:`simulator.model.moe` gives them; medians over the cases
    of at least 8,192 rows. The pieces are chains of kernels: the others in a chain are taken
    at the copy's rate and removed.

    * ``index_add``: ``index_select``'s backward, a zero ``[t, h]`` gradient and ``index_add_``
      of the rows' gradients (an atomic add per row, ``3 R h d + 8 R`` bytes)
      (``permute_gather_bwd`` less the zeros).
    * ``scatter_add``: ``scatter_add_`` of the scaled rows into the zero output, expanded
      index (``3 R h d + 8 R``) (``unpermute_fwd`` less the weights' gather and index
      arithmetic, the scaling and the zeros; drop-and-pad cases only: the dropless one's
      ``masked_select`` waits for the host every call).
    * ``index_gather``: ``scatter_add_``'s backward, ``gather`` of the output gradient by the
      expanded index (``2 R h d + 8 R``) (``unpermute_bwd``, the rows' gradient only, less
      the product with the weights).
    """
    by: dict[str, dict[str, dict]] = {}
    for r in load(path):
        if "case" in r:
            by.setdefault(r["case"], {})[r["piece"]] = r
    got: dict[str, list[float]] = {"index_add": [], "scatter_add": [], "index_gather": []}
    for p in by.values():
        ref = p["copy_Rh_ref"]
        R, h, t, E = ref["rows"], ref["hidden"], ref["tokens"], ref["experts"]
        if R < 8192:
            continue
        rows = R * h * BF16
        bw = 2 * rows / ref["time_s"]
        zeros = t * h * BF16 / bw
        t_ia = p["permute_gather_bwd"]["time_s"] - zeros
        got["index_add"].append((3 * rows + R * I64) / t_ia / bw)
        if ref["drop_and_pad"]:
            small = (2 * t * E * BF16 + 5 * R * I64 + R * (I64 + 2 * BF16)) / bw
            scale = (2 * rows + R * BF16) / bw
            t_sa = p["unpermute_fwd"]["time_s"] - small - scale - zeros
            got["scatter_add"].append((3 * rows + R * I64) / t_sa / bw)
        t_g = p["unpermute_bwd"]["time_s"] - (2 * rows + R * BF16) / bw
        got["index_gather"].append((2 * rows + R * I64) / t_g / bw)
    return {k: round(statistics.median(v), 3) for k, v in got.items()}


OPTIMIZER = REPO / "data/measured/stepmech-h100x4/adam.jsonl"
#: bytes a parameter of bf16 parameters, gradients and moments: fused AdamW reads g, p, m, v and
#: writes p, m, v (simulator.model.transformer.optimizer_ops, master_weights none);
#: clip_grad_norm_ (foreach) reads every gradient for the norm, reads and writes it for the
#: multiply (clip_ops)
ADAM_BF16_BYTES, CLIP_BF16_BYTES = 14, 6
#: parameter lists at least this large (the step's sizes: hundreds of millions and more)
OPTIMIZER_MIN_NUMEL = 250_000_000


def optimizer_ratios(path: Path = OPTIMIZER, copy_GBps: float | None = None) -> dict[str, float]:
    """Bandwidth of PyTorch's multi-tensor kernels over bf16 tensors relative to a streaming
    copy: ``adam_fused`` (``AdamW(fused=True)`` stepping bf16 parameters and moments in place)
    and ``foreach`` (``clip_grad_norm_``'s ``_foreach_norm`` and ``_foreach_mul_``), with the
    bytes :func:`simulator.model.transformer.optimizer_ops` gives them over the measured time,
    median over the AC-shaped parameter lists of at least :data:`OPTIMIZER_MIN_NUMEL`
    (``benchmarks/device/step_mechanisms.py --phase adam``); the copy is data/measured/h100x1's."""
    copy = (copy_GBps or ratios(FOLDERS["H100-SXM-80GB"])["copy_GBps"]) * 1e9
    got: dict[str, list[float]] = {"adam_fused": [], "foreach": []}
    for r in load(path):
        if (r.get("dtype") != "bfloat16" or r.get("numel", 0) < OPTIMIZER_MIN_NUMEL
                or not str(r.get("params", "")).startswith("AC_")):
            continue
        if r["op"] == "adamw_fused":
            got["adam_fused"].append(ADAM_BF16_BYTES * r["numel"] / r["time_s"] / copy)
        elif r["op"] == "clip_grad_norm":
            got["foreach"].append(CLIP_BF16_BYTES * r["numel"] / r["time_s"] / copy)
    return {k: round(statistics.median(v), 3) for k, v in got.items()}


def refit() -> dict[str, tuple[float, float]]:
    """{GPU.class: (refitted, shipped)}, rounded to 3 decimals as shipped."""
    out = {}
    for gpu, folder in FOLDERS.items():
        shipped = load_gpu(gpu).memory_access
        for k, v in ratios(folder).items():
            if k != "copy_GBps":
                out[f"{gpu}.{k}"] = (v, float(shipped[k]))
    shipped = load_gpu("H100-SXM-80GB").memory_access
    for k, v in permute_ratios().items():
        out[f"H100-SXM-80GB.{k}"] = (v, float(shipped[k]))
    for k, v in optimizer_ratios().items():
        out[f"H100-SXM-80GB.{k}"] = (v, float(shipped[k]))
    return out
