"""Refit the Blackwell GEMM efficiencies (``gemm.eta`` and ``gemm.eta_fp8`` of B200, GB200,
B300, GB300 in ``gpus.yaml``) from published per-shape GEMM timings.

Data:
- ``data/published/xla-matmul-table/matmul.jsonl``: OpenXLA's GEMM cost table (openxla/xla
  71feeddf, 2025-10-21), one harness on an H100 (``sm_90``) and a B200 (``sm_100``): 375
  batched shapes (b 1-4; m, n, k 256-4096) in bf16 and FP8 e4m3, each GEMM compiled alone, run
  once to warm up and five times under CUPTI, the median kernel time: an idle GPU's burst
  clock. The H100's FP8 rows are not used: Hopper's FP8 GEMMs need K-major operands, so XLA
  adds a transpose kernel and the median mixes the two kernels (rows up to 2,593 TFLOP/s,
  above the 1,979 peak); Blackwell's run as one kernel.
- ``data/published/torchao-matmul-b200/matmul.jsonl``: torchao's float8 matmul benchmark on a
  B200 (pytorch/ao PR #2427, 2025-06-23): square bf16 GEMMs 1024-8192, one warm-up and five
  calls under the PyTorch profiler, the mean kernel time: the burst clock again.
- ``data/published/mamf-ml-engineering/mamf.jsonl``: the best shape of each GPU's
  Maximum Achievable Matmul FLOPS sweep (stas00/ml-engineering), one more row per GPU and dtype.

Method: ``eta`` (``eta_fp8``) of B200 is fitted on log time by the kernel-time model
(``compute.fit_gemm``, B200's shape parameters as shipped) to the B200 rows of at least
``MIN_FLOP`` of both tables (the 4096^3 class and up, where waves are many and the operand
reads hidden; smaller rows carry each library's own kernel choices and are left out) plus its
MAMF row, each time taken at
the sustained rate under the power cap: burst time / ``SUSTAINED_RATE`` (B200's own, measured
on back-to-back attention, flashinfer PR #2899, the ``sustained_rate`` of gpus.yaml's B200
attention entries). :func:`hopper_check` applies the same procedure to the H100's rows and
returns the eta it gives beside H100's measured sustained eta (``test_blackwell_gemm.py``
holds them within 3 %). GB200 and B300 (no table rows) take B200's eta times the ratio of
their MAMF efficiencies to B200's (the same sweep script on each GPU); GB300 (no MAMF
published) takes GB200's. No validation suite is read here.
"""

from __future__ import annotations

from simulator.calibrate import REPO, jsonl
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import Dataset, fit_gemm, fit_gemm_fp8

XLA = REPO / "data/published/xla-matmul-table/matmul.jsonl"
TORCHAO = REPO / "data/published/torchao-matmul-b200/matmul.jsonl"
MAMF = REPO / "data/published/mamf-ml-engineering/mamf.jsonl"
#: rows of at least 2 b m n k = 2^37 FLOP (4096^3 and up)
MIN_FLOP = 2.0**37
#: B200's sustained / burst throughput under its 1,000 W cap (gpus.yaml B200 calibration)
SUSTAINED_RATE = 0.853
#: GPUs derived from B200 by their MAMF efficiency, and GB300 from GB200
DERIVED = {"GB200": "B200", "B300": "B200"}
SAME_AS = {"GB300": "GB200"}
#: table rows not used: Hopper's FP8 modules run a transpose kernel beside the GEMM
TWO_KERNELS = {("H100-SXM-80GB", "fp8")}


def rows(gpu: str, dtype: str, rate: float = SUSTAINED_RATE) -> list[tuple]:
    """``(m, k, n, sustained time)`` of ``gpu``'s rows of ``dtype`` of at least ``MIN_FLOP``
    (OpenXLA's table, then torchao's) and its MAMF row last; a batch of b GEMMs is one of b m
    rows (m is a multiple of every tile height, so the tiles and waves are the batch's)."""
    out = []
    for r in jsonl(XLA):
        if (gpu, dtype) in TWO_KERNELS:
            break
        if r["gpu"] == gpu and r["dtype"] == dtype and 2 * r["b"] * r["m"] * r["n"] * r["k"] >= MIN_FLOP:
            out.append((r["b"] * r["m"], r["k"], r["n"], r["time_s"] / rate))
    for r in jsonl(TORCHAO):
        if r["gpu"] == gpu and r["dtype"] == dtype and 2 * r["m"] * r["n"] * r["k"] >= MIN_FLOP:
            out.append((r["m"], r["k"], r["n"], r["time_s"] / rate))
    for r in jsonl(MAMF):
        if r["gpu"] == gpu and r["dtype"] == dtype:
            out.append((r["m"], r["k"], r["n"], 2 * r["m"] * r["n"] * r["k"] / (r["tflops"] * 1e12) / rate))
    return out


def fit_eta(gpu: str, dtype: str, rate: float = SUSTAINED_RATE) -> float:
    """The sustained ``eta`` (bf16) or ``eta_fp8`` (fp8) of ``gpu`` on its rows."""
    g = load_gpu(gpu)
    fit = fit_gemm if dtype == "bf16" else fit_gemm_fp8
    res = fit([Dataset(f"{gpu}:{dtype}", g, rows(gpu, dtype, rate), 0.0)], fit=("eta",))
    return res.etas[g.name]


def mamf_efficiency(gpu: str, dtype: str) -> float:
    r = next(r for r in jsonl(MAMF) if r["gpu"] == gpu and r["dtype"] == dtype)
    return r["tflops"] / r["peak_tflops"]


def hopper_check(rate: float = SUSTAINED_RATE) -> tuple[float, float]:
    """(eta the procedure gives on the H100's bf16 rows, H100's measured sustained eta)."""
    return fit_eta("H100-SXM-80GB", "bf16", rate), load_gpu("H100-SXM-80GB").gemm.eta


def fit() -> dict[str, dict[str, float]]:
    """{gpu: {"eta": .., "eta_fp8": ..}} rounded as gpus.yaml ships them."""
    b200 = {"eta": fit_eta("B200", "bf16"), "eta_fp8": fit_eta("B200", "fp8")}
    out = {"B200": {k: round(v, 3) for k, v in b200.items()}}
    for gpu, src in DERIVED.items():
        out[gpu] = {k: round(b200[k] * mamf_efficiency(gpu, dt) / mamf_efficiency(src, dt), 3)
                    for k, dt in (("eta", "bf16"), ("eta_fp8", "fp8"))}
    for gpu, src in SAME_AS.items():
        out[gpu] = dict(out[src])
    return out


def refit() -> dict[str, tuple[float, float]]:
    out = {}
    for gpu, vals in fit().items():
        g = load_gpu(gpu).gemm
        out[f"{gpu}.gemm.eta"] = (vals["eta"], g.eta)
        out[f"{gpu}.gemm.eta_fp8"] = (vals["eta_fp8"], g.eta_for("fp8"))
    return out
