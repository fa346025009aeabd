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
their MAMF efficiencies to B200's (the same sweep script on each GPU). GB300 (no MAMF
published; the same 152 SMs and BF16/FP8 datasheet rate as GB200) takes GB200's eta times the
ratio of their sustained SM clocks under their power caps (:func:`sustained_clock_ratio`:
1,400 W against 1,200 W).

The power-cap law. A GPU kept at its cap by back-to-back tensor-core work settles at the clock
where its power meets the cap; dynamic power is C V^2 f per SM and, over the DVFS range, the
voltage rises about in proportion to the clock, so the power per SM goes as f^3 and the
sustained clock as the cube root of the cap per SM (the same die family: the same energy per
operation). :func:`sustained_rate` anchors it on B200's one measured pair (flashinfer PR
#2899: back-to-back BF16 attention at 1,000 W, 148 SMs, the clock falling from 1,965 to
~1,580 MHz and the rate from 1,450 to 1,237 TFLOP/s, so 0.707 of that kernel's time scales
with 1/clock) and gives the rate of another GPU's idle-GPU (burst) timings at its own cap and
maximum clock: GB200 0.855 (B200's 0.853 is shipped for it, assumed until now), GB300 0.886
(``sustained_rate`` of its cuDNN calibration entry). No validation suite is read here.
"""

from __future__ import annotations

from simulator.calibrate import REPO, jsonl
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import Dataset, fit_gemm, fit_gemm_fp8, fit_gemm_mxfp8

XLA = REPO / "data/published/xla-matmul-table/matmul.jsonl"
TORCHAO = REPO / "data/published/torchao-matmul-b200/matmul.jsonl"
MAMF = REPO / "data/published/mamf-ml-engineering/mamf.jsonl"
MXFP8 = REPO / "data/published/mxfp8-gemm-b200/gemm.jsonl"
#: rows of at least 2 b m n k = 2^37 FLOP (4096^3 and up)
MIN_FLOP = 2.0**37
#: B200's sustained / burst throughput under its 1,000 W cap (gpus.yaml B200 calibration)
SUSTAINED_RATE = 0.853
#: GPUs derived from B200 by their MAMF efficiency, and GB300 from GB200 by the power-cap law
DERIVED = {"GB200": "B200", "B300": "B200"}
POWER_SCALED = {"GB300": "GB200"}
#: B200's measured burst and sustained SM clock (MHz) and attention rate (TFLOP/s) under its
#: 1,000 W cap (flashinfer-ai/flashinfer PR #2899, 2026-03: BF16 FA4, b 4, s 8192, 16 heads,
#: d 128, 100 back-to-back iterations: iterations 10-19 against 70-79)
B200_BURST_MHZ, B200_SUSTAINED_MHZ = 1965.0, 1580.0
B200_BURST_TFLOPS, B200_SUSTAINED_TFLOPS = 1450.0, 1237.0
#: maximum SM clock (MHz) of the GPUs the law is applied to: B200 as above; GB200 NVML's max
#: clock 2,062 (NVIDIA/cudnn-frontend PR #314, 2026-06, a GB200 node); GB300 the locked
#: maximum 2,070 (facebookexperimental/triton PR #2023, 2026-07, denoise.sh on a GB300); B300
#: 2,032 at 1,100 W (sgl-project/sglang PR #28460, 2026-06, an 8x B300 node against B200's
#: 1,965 at 1,000 W)
MAX_CLOCK_MHZ = {"B200": B200_BURST_MHZ, "GB200": 2062.0, "GB300": 2070.0, "B300": 2032.0}


def sustained_clock_ratio(gpu: str, ref: str) -> float:
    """Sustained SM clock of ``gpu`` over ``ref``'s under their power caps, both held at the
    cap: the cube root of their caps per SM (power per SM ~ f^3; gpus.yaml ``power_W`` and
    ``sm_count``)."""
    g, r = load_gpu(gpu), load_gpu(ref)
    return ((g.power_W / g.sm_count) / (r.power_W / r.sm_count)) ** (1.0 / 3.0)


def clock_bound_share() -> float:
    """Share of B200's back-to-back attention time that scales with 1/clock: the measured
    rate ratio against the clock ratio, ``1/rate = (1 - c) + c f_burst / f_sustained``."""
    rate = B200_SUSTAINED_TFLOPS / B200_BURST_TFLOPS
    return (1.0 / rate - 1.0) / (B200_BURST_MHZ / B200_SUSTAINED_MHZ - 1.0)


def sustained_rate(gpu: str) -> float:
    """Sustained / burst throughput of ``gpu``'s back-to-back kernels under its power cap: its
    sustained clock (B200's measured one times :func:`sustained_clock_ratio`, at most its
    maximum clock) against its maximum, through B200's clock-bound share."""
    f = min(MAX_CLOCK_MHZ[gpu], B200_SUSTAINED_MHZ * sustained_clock_ratio(gpu, "B200"))
    c = clock_bound_share()
    return 1.0 / ((1.0 - c) + c * MAX_CLOCK_MHZ[gpu] / f)
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
    for gpu, src in POWER_SCALED.items():
        k = sustained_clock_ratio(gpu, src)
        base = {key: b200[key] * mamf_efficiency(src, dt) / mamf_efficiency(DERIVED[src], dt)
                for key, dt in (("eta", "bf16"), ("eta_fp8", "fp8"))}
        out[gpu] = {key: round(v * k, 3) for key, v in base.items()}
    return out


def refit() -> dict[str, tuple[float, float]]:
    out = {}
    for gpu, vals in fit().items():
        g = load_gpu(gpu).gemm
        out[f"{gpu}.gemm.eta"] = (vals["eta"], g.eta)
        out[f"{gpu}.gemm.eta_fp8"] = (vals["eta_fp8"], g.eta_for("fp8"))
    for gpu in ("GB300",):
        shipped = [c["sustained_rate"] for c in load_gpu(gpu).calibration if "sustained_rate" in c]
        out[f"{gpu}.calibration.sustained_rate"] = (round(sustained_rate(gpu), 3), shipped[0])
    return out


def mxfp8_rows(dtype: str = "mxfp8", rate: float = SUSTAINED_RATE) -> list[tuple]:
    """``(b m, k, n, sustained time)`` of the published B200 MXFP8 rows (``dtype``: or their
    per-tensor FP8 twins) of at least ``MIN_FLOP``, from the printed rate."""
    out = []
    for r in jsonl(MXFP8):
        flop = 2.0 * r["b"] * r["m"] * r["n"] * r["k"]
        if r["dtype"] == dtype and flop >= MIN_FLOP:
            out.append((r["b"] * r["m"], r["k"], r["n"], flop / (r["tflops"] * 1e12) / rate))
    return out


def mxfp8_check(rate: float = SUSTAINED_RATE, libraries: tuple[str, ...] | None = None) -> float:
    """The eta that :func:`fit_eta`'s procedure gives on the published MXFP8 B200 rows
    (``libraries``: only those; None: all), to set beside B200's ``eta_fp8``, which an MXFP8
    GEMM takes (``simulator.hardware.catalog.FP8_RATE_DTYPES``). A check, not a fit: nothing
    shipped is set from it."""
    g = load_gpu("B200")
    rows = [r for r, src in zip(mxfp8_rows(rate=rate), _mxfp8_libraries(), strict=True)
            if libraries is None or src in libraries]
    return fit_gemm_mxfp8([Dataset("B200:mxfp8", g, rows, 0.0)], fit=("eta",)).etas[g.name]


def _mxfp8_libraries() -> list[str]:
    return [r["library"] for r in jsonl(MXFP8) if r["dtype"] == "mxfp8"
            and 2.0 * r["b"] * r["m"] * r["n"] * r["k"] >= MIN_FLOP]


def mxfp8_pair_ratio() -> float:
    """MXFP8 over per-tensor FP8 rate at the one shape timed both ways by one harness
    (flashinfer PR #2256, cuDNN, B200)."""
    rows = jsonl(MXFP8)
    out = []
    for r in rows:
        if r["dtype"] != "fp8":
            continue
        twin = next(x for x in rows if x["dtype"] == "mxfp8" and x["source"] == r["source"]
                    and (x["b"], x["m"], x["k"], x["n"]) == (r["b"], r["m"], r["k"], r["n"]))
        out.append(twin["tflops"] / r["tflops"])
    return sum(out) / len(out)
