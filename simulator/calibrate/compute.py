"""Refit the kernel-time model's parameters (``gemm``, ``attention``, ``hbm_efficiency`` in
gpus.yaml) from the ``calibration`` files each GPU declares (see
simulator/hardware/data/README.md): one ``eta`` per GPU from its host-timed shared file, the
shape parameters shared by H100 and H200 (and the kernel-timed H100 file with its own eta),
each host-timed file's timing overhead fitted as a nuisance parameter. The copy's bandwidth
less that overhead gives ``hbm_efficiency``. Uses :mod:`simulator.hardware.compute`'s fitter.
FlashAttention-2's passes (``attention_fa2``) are fitted apart (:func:`fit_fa2`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from simulator.calibrate import REPO, jsonl
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import (
    _BOUNDS,
    _attention_time,
    _nelder_mead_bounded,
    calibration_sets,
    fit_attention,
    fit_gemm,
    fit_gemm_fp8,
    read_jsonl,
)

GPUS = ("H100-SXM-80GB", "H200-SXM-141GB")
GEMM_FIT = ("eta", "t0_s", "write_exposed", "overlap_p", "tile_ai0")
ATTN_FIT = {"fwd": ("eta", "t0_s", "block_overhead", "head_dim_overhead", "tail"),
            # the backward's t0_s is 3x the forward's (three kernels), not fitted
            "bwd": ("eta", "block_overhead", "head_dim_overhead", "tail")}
# decimals (relative for the shape parameters) to which a refit must agree with the catalog
ROUND = {"eta": 3, "t0_s": 3, "write_exposed": 2, "overlap_p": 2, "tile_ai0": 2,
         "block_overhead": 2, "head_dim_overhead": 2, "tail": 2, "hbm_efficiency": 3}


def _sets(kind: str):
    return [ds for n in GPUS for ds in calibration_sets(load_gpu(n), kind)]


def refit(
    kinds=("gemm", "gemm_fp8", "attention.fwd", "attention.bwd", "attention_fa2",
           "attention_blackwell"),
) -> dict[str, tuple[float, float]]:
    """{GPU-or-shared.parameter: (refitted, shipped)}, refitted from the shipped values."""
    out: dict[str, tuple[float, float]] = {}
    gpus = {n: load_gpu(n) for n in GPUS}
    for kind in kinds:
        if kind == "attention_fa2":
            out.update(refit_fa2())
            continue
        if kind == "attention_blackwell":
            out.update(refit_blackwell_attention())
            continue
        if kind == "gemm_fp8":  # eta_fp8 of the GPUs with FP8 files, bf16 shape parameters kept
            res = fit_gemm_fp8(_sets(kind))
            for label, v in res.etas.items():
                out[f"gemm.eta_fp8[{label}]"] = (v, float(gpus[label].gemm.eta_fp8))
            continue
        if kind == "gemm":
            res = fit_gemm(_sets(kind), GEMM_FIT)
            shipped = {n: g.gemm for n, g in gpus.items()}
        else:
            bwd = kind.endswith("bwd")
            res = fit_attention(_sets(kind), bwd, ATTN_FIT[kind.split(".")[1]])
            shipped = {n: (g.attention.bwd if bwd else g.attention.fwd) for n, g in gpus.items()}
        for k, v in res.params.items():
            out[f"{kind}.{k}"] = (v, float(getattr(shipped[GPUS[0]], k)))
        for label, v in res.etas.items():
            if label in gpus:
                out[f"{kind}.eta[{label}]"] = (v, float(shipped[label].eta))
        if kind == "gemm":
            for n, g in gpus.items():
                ov = next(v for lb, v in res.overheads_s.items() if lb.startswith(n)
                          and "gemm.jsonl" in lb)
                copy = next(r for r in read_jsonl(g.calibration[0]["file"])
                            if r.get("op") == "d2d_copy")
                bw = copy["bytes"] / (copy["time_s"] - ov)
                out[f"{n}.hbm_efficiency"] = (bw / (g.hbm_TBps * 1e12), g.hbm_efficiency)
    return out



#: FlashAttention-2 rows: PyTorch SDPA with its FLASH_ATTENTION backend forced, beside the cuDNN
#: rows of the same shapes (CUDA events between back-to-back calls), on both GPUs; and the
#: FlashAttention-3 paper's FA2 bars on H100 (data/published/fa3-paper-h100/README.md)
FA2_DATA = {"H100-SXM-80GB": REPO / "data/measured/h100x1/gemm.jsonl",
            "H200-SXM-141GB": REPO / "data/measured/h200x4/gemm.jsonl"}
FA2_PAPER = REPO / "data/published/fa3-paper-h100/fa2.jsonl"
FA2_FIT = ("eta", "block_overhead", "tail")


def fa2_rows(backward: bool) -> list[tuple[int, int, int, bool, float]]:
    """``(batch*heads, seq, head_dim, causal, seconds)`` of every FlashAttention-2 row of one
    pass: the measured ones (backward = the forward-and-backward call less the forward) and
    the paper's (time = the convention's FLOPs over the bar's TFLOP/s)."""
    rows = [(r["batch"] * r["heads"], r["seq"], r["head_dim"], True,
             r["fwdbwd_s"] - r["fwd_s"] if backward else r["fwd_s"])
            for path in FA2_DATA.values() for r in jsonl(path)
            if r.get("op") == "sdpa_causal" and r.get("resolved_backend") == "FLASH_ATTENTION"]
    ps = "bwd" if backward else "fwd"
    for r in jsonl(FA2_PAPER):
        if r["pass"] == ps:
            bh, sq = r["batch"] * r["heads"], r["seq"]
            flops = 4.0 * bh * sq * sq * r["head_dim"] * (0.5 if r["causal"] else 1.0)
            flops *= 2.5 if backward else 1.0
            rows.append((bh, sq, r["head_dim"], r["causal"], flops / (r["tflops"] * 1e12)))
    return rows


def fit_fa2(backward: bool) -> dict[str, float]:
    """FlashAttention-2's ``eta``, ``block_overhead`` and ``tail`` of one pass, shared by H100
    and H200 (the same SMs and clocks; their measured FA2 rows agree within 1 %): least squares
    on log time over :func:`fa2_rows`, the H100's ``t0_s`` and ``head_dim_overhead`` kept."""
    gpu = load_gpu("H100-SXM-80GB")
    base = gpu.attention.bwd if backward else gpu.attention.fwd
    rows = fa2_rows(backward)
    f, peak = (2.5 if backward else 1.0), gpu.peak_flops("bf16")

    def loss(x) -> float:
        pp = replace(base, **dict(zip(FA2_FIT, x, strict=True)))
        return sum(math.log(_attention_time(pp, gpu.sm_count, peak, bh, s, d, c, f) / t) ** 2
                   for bh, s, d, c, t in rows) / len(rows)

    lo = np.array([_BOUNDS[k][0] for k in FA2_FIT])
    hi = np.array([_BOUNDS[k][1] for k in FA2_FIT])
    x = _nelder_mead_bounded(loss, np.array([getattr(base, k) for k in FA2_FIT]), lo, hi)
    return dict(zip(FA2_FIT, (float(v) for v in x), strict=True))


def refit_fa2() -> dict[str, tuple[float, float]]:
    """{``attention_fa2.<pass>.<parameter>[GPU]``: (refit, shipped)} for H100 and H200."""
    out = {}
    for bwd, ps in ((False, "fwd"), (True, "bwd")):
        fitted = fit_fa2(bwd)
        for name in FA2_DATA:
            shipped = getattr(load_gpu(name).attention_fa2, ps)
            for k, v in fitted.items():
                out[f"attention_fa2.{ps}.{k}[{name}]"] = (v, float(getattr(shipped, k)))
    return out


#: Blackwell GPUs whose attention ``eta`` is fitted on published cuDNN SDPA timings (their
#: ``calibration`` entries: cudnn-frontend's training benchmark), and the GPUs derived from one
#: of them by the ratio of their GEMM etas (each from its published BF16 MAMF): GB200 from
#: B200 (the same SM, other clocks and power), B300 from GB300 (Blackwell Ultra's SM).
BLACKWELL_FITTED = ("B200", "GB300")
BLACKWELL_DERIVED = {"GB200": "B200", "B300": "GB300"}


def refit_blackwell_attention() -> dict[str, tuple[float, float]]:
    """{``attention.<pass>.eta[GPU]``: (refit, shipped)}: ``eta`` alone fitted per pass on the
    GPU's published timings (each file's host dispatch fitted as its overhead; the shape
    parameters are H100's), and the derived GPUs' ``eta`` as the source's times their GEMM
    eta ratio (the MAMF ratio of ``gemm.eta``'s sources)."""
    out: dict[str, tuple[float, float]] = {}
    fitted: dict[tuple[str, str], float] = {}
    for name in BLACKWELL_FITTED:
        gpu = load_gpu(name)
        for ps in ("fwd", "bwd"):
            res = fit_attention(calibration_sets(gpu, f"attention.{ps}"), ps == "bwd", ("eta",))
            fitted[name, ps] = res.etas[name]
            out[f"attention.{ps}.eta[{name}]"] = (res.etas[name], getattr(gpu.attention, ps).eta)
    for name, src in BLACKWELL_DERIVED.items():
        gpu, base = load_gpu(name), load_gpu(src)
        for ps in ("fwd", "bwd"):
            want = fitted[src, ps] * gpu.gemm.eta / base.gemm.eta
            out[f"attention.{ps}.eta[{name}]"] = (want, getattr(gpu.attention, ps).eta)
    return out
