"""Refit the kernel-time model's parameters (``gemm``, ``attention``, ``hbm_efficiency`` in
gpus.yaml) from the ``calibration`` files each GPU declares (see
simulator/hardware/data/README.md): one ``eta`` per GPU from its host-timed shared file, the
shape parameters shared by H100 and H200 (and the kernel-timed H100 file with its own eta),
each host-timed file's timing overhead fitted as a nuisance parameter. The copy's bandwidth
less that overhead gives ``hbm_efficiency``. Uses :mod:`simulator.hardware.compute`'s fitter.
"""

from __future__ import annotations

from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import (
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
    kinds=("gemm", "gemm_fp8", "attention.fwd", "attention.bwd"),
) -> dict[str, tuple[float, float]]:
    """{GPU-or-shared.parameter: (refitted, shipped)}, refitted from the shipped values."""
    out: dict[str, tuple[float, float]] = {}
    gpus = {n: load_gpu(n) for n in GPUS}
    for kind in kinds:
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
