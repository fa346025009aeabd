"""Kernel-time model: fit to measured GEMMs/attention/copies, generalisation, invariants."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.errors import ConfigError
from simulator.hardware.catalog import gpu_names, load_gpu
from simulator.hardware.compute import (
    ComputeModel,
    Dataset,
    attention_rows,
    calibration_sets,
    fit_attention,
    fit_gemm,
    fit_gemm_fp8,
    gemm_rows,
    gemm_times,
    read_jsonl,
)

H100, H200 = "H100-SXM-80GB", "H200-SXM-141GB"
SHARED_FILES = {H100: "H100-SXM-80GB/gemm.jsonl", H200: "H200-SXM-141GB/gemm.jsonl"}


@pytest.fixture(scope="module")
def models():
    return {n: ComputeModel(load_gpu(n)) for n in gpu_names()}


def _errors(kind, name, role="fit"):
    """Errors per calibration file with catalog parameters; only nuisances are fitted
    (each host-timed file's timing overhead, the kernel-timed file's own eta)."""
    out = {}
    for ds in calibration_sets(load_gpu(name), kind, role):
        if kind == "gemm":
            res = fit_gemm([ds], fit=())
        elif kind == "gemm_fp8":
            res = fit_gemm_fp8([ds], fit=())
        else:
            res = fit_attention([ds], kind.endswith("bwd"), fit=())
        out[ds.label] = (res.errors[ds.label], res.overheads_s[ds.label])
    return out


# -- GEMM -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [H100, H200])
def test_gemm_reproduces_the_shared_measurements(name):
    """Stated fit error (README): mean <= 5 %, max <= 15 % on each shared file."""
    errs = _errors("gemm", name)
    err, overhead = errs[f"{name}:{SHARED_FILES[name]}"]
    assert err["n"] == 54
    assert err["mean_abs_pct"] <= 5.0 and err["max_abs_pct"] <= 15.0
    assert abs(err["bias_pct"]) < 1.0
    # the host overhead of the file's timing method, fitted, agrees with the ~13-20 us
    # measured by timing the same GEMMs both ways (sync_vs_events.jsonl)
    assert 5e-6 < overhead < 30e-6


def test_gemm_kernel_timed_calibration_and_held_out_sets():
    errs = _errors("gemm", H100)
    calib, _ = errs[f"{H100}:H100-SXM-80GB/kernels.jsonl[calib]"]
    assert calib["mean_abs_pct"] <= 5.0 and calib["max_abs_pct"] <= 15.0
    # held out, catalog eta, nothing refitted: 48 transformer-layer shapes never used in the
    # fit (two runs on two machines), back-to-back event timings of 49 shapes, and the 79 bf16
    # shapes >= 100 us measured beside FP8 on a third machine (worst 21 %)
    held_out = _errors("gemm", H100, role="test")
    assert len(held_out) == 4
    for err, _ in held_out.values():
        assert err["n"] >= 48
        assert err["mean_abs_pct"] <= 6.0 and err["max_abs_pct"] <= 22.0
        assert abs(err["bias_pct"]) <= 3.0


def test_vectorised_and_scalar_gemm_agree(models):
    gpu = load_gpu(H100)
    rows = [(m, k, n) for m in (64, 1000, 4096) for k in (320, 4096) for n in (128, 12288)]
    vec = gemm_times(gpu, gpu.gemm, rows)
    scalar = [models[H100].gemm_s(*r) for r in rows]
    np.testing.assert_allclose(vec, scalar, rtol=1e-12)


@pytest.mark.parametrize("name", ["A100-SXM-80GB", H100, H200, "B200"])
def test_bigger_square_gemms_are_never_much_slower_per_flop(name, models):
    cm = models[name]
    sizes = list(range(256, 16385, 128))
    eff = [cm.gemm_efficiency(s, s, s) for s in sizes]
    times = [cm.gemm_s(s, s, s) for s in sizes]
    assert all(b > a for a, b in zip(times, times[1:], strict=False))
    best = 0.0
    for e in eff:
        assert e >= 0.9 * best  # wave quantization may dent it, never by more than 10 %
        best = max(best, e)
    assert max(eff) < 1.0 and eff[-1] > 0.55  # B200: 0.58 at its sustained rate


def test_gemm_generalises_to_unmeasured_shapes_sensibly(models):
    cm = models[H100]
    eta = load_gpu(H100).gemm.eta
    big = cm.gemm_efficiency(8192, 8192, 8192)
    assert 0.95 * eta < big <= eta
    # TP-sharded and thin shapes: slower per FLOP than the big square, but not absurdly
    for shape in [(1024, 4096, 4096), (4096, 1536, 4096), (4096, 8192, 1024), (4096, 1024, 8192)]:
        assert 0.45 < cm.gemm_efficiency(*shape) < big
    # tall-skinny (decode-like) GEMM is bound by reading the weight once
    t = cm.gemm_s(16, 8192, 8192)
    assert t == pytest.approx(2 * 8192 * 8192 / load_gpu(H100).hbm_Bps, rel=0.15)
    # halving k roughly halves the time of a big GEMM
    assert cm.gemm_s(8192, 4096, 8192) / cm.gemm_s(8192, 8192, 8192) == pytest.approx(0.5, abs=0.05)


def test_gemm_dtypes_scale_with_their_peak(models):
    cm = models[H100]
    bf16 = cm.gemm_s(8192, 8192, 8192)
    # FP8 at twice the peak, at the efficiency measured for FP8 (compute-bound shape)
    gemm = load_gpu(H100).gemm
    assert bf16 / cm.gemm_s(8192, 8192, 8192, "fp8") == pytest.approx(
        2.0 * gemm.eta_fp8 / gemm.eta, rel=0.03)
    # B200: twice the peak at its own FP8 efficiency (both fitted on published per-shape rows)
    b = models["B200"]
    bw = load_gpu("B200").gemm
    assert b.gemm_s(16384, 16384, 16384) / b.gemm_s(16384, 16384, 16384, "fp8") == pytest.approx(
        2.0 * bw.eta_fp8 / bw.eta, rel=0.03)
    assert cm.gemm_s(8192, 8192, 8192, "tf32") / bf16 == pytest.approx(2.0, rel=0.05)
    assert cm.gemm_s(8192, 8192, 8192, "fp16") == bf16
    with pytest.raises(ConfigError):
        models["A100-SXM-80GB"].gemm_s(4096, 4096, 4096, "fp8")


def test_fp8_gemm_against_its_measurements():
    """H100 FP8 GEMMs (torch._scaled_mm, per-tensor scales) of >= 100 us: the model with the
    fitted eta_fp8 is unbiased within 3 % and within 10 % on average; and the measured FP8 /
    bf16 speed-up of the same shapes (median 1.8, not the peak ratio 2) is what the model gives."""
    from simulator.hardware.compute import read_jsonl

    errs = _errors("gemm_fp8", H100)
    (err, _), = errs.values()
    assert err["n"] >= 60 and err["mean_abs_pct"] <= 10.0 and abs(err["bias_pct"]) <= 3.0
    recs = read_jsonl("H100-SXM-80GB/gemm_fp8.jsonl")
    t = {(r["m"], r["k"], r["n"], r["dtype"]): r["time_s"] for r in recs}
    cm = ComputeModel(load_gpu(H100))
    meas, model = [], []
    for (m, k, n, dt), v in t.items():
        if dt == "fp8" and v >= 1e-4:
            meas.append(t[(m, k, n, "bf16")] / v)
            model.append(cm.gemm_s(m, k, n) / cm.gemm_s(m, k, n, "fp8"))
    assert np.median(model) == pytest.approx(np.median(meas), rel=0.05)
    assert 1.6 < np.median(meas) < 1.95


def test_gemm_edge_cases(models):
    cm = models[H200]
    assert cm.gemm_s(0, 4096, 4096) == 0.0 and cm.gemm_efficiency(4096, 0, 4096) == 0.0
    with pytest.raises(ValueError):
        cm.gemm_s(-1, 4096, 4096)
    assert cm.gemm_s(1, 1, 1) >= load_gpu(H200).gemm.t0_s


def test_newer_gpus_are_faster_on_a_big_gemm(models):
    t = {n: models[n].gemm_s(8192, 8192, 8192) for n in gpu_names()}
    assert t["B200"] < t[H200] <= t[H100] * 1.01 < t["A100-SXM-80GB"]
    # A100 reaches about its published achievable matmul rate (271 TFLOP/s at best shapes)
    assert 0.75 < 2 * 8192**3 / t["A100-SXM-80GB"] / 271.2e12 < 1.0


# -- fitting ----------------------------------------------------------------------------------


def test_fit_recovers_known_parameters_from_synthetic_data():
    gpu = load_gpu(H100)
    true = gpu.gemm.__class__(**{**gpu.gemm.__dict__, "eta": 0.6})
    rows = [(m, k, n) for m in (1024, 4096, 16384) for k in (1024, 8192) for n in (2048, 8192)]
    t = gemm_times(gpu, true, rows) + 15e-6  # a host overhead of 15 us in every time
    ds = Dataset(
        "synthetic", gpu, [(*r, ti) for r, ti in zip(rows, t, strict=True)], timing_overhead_s=None
    )
    res = fit_gemm([ds], fit=("eta",))
    assert res.etas[H100] == pytest.approx(0.6, rel=1e-3)
    assert res.overheads_s["synthetic"] == pytest.approx(15e-6, rel=1e-2)
    assert res.errors["synthetic"]["max_abs_pct"] < 0.1


# -- attention --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [H100, H200])
@pytest.mark.parametrize("kind", ["attention.fwd", "attention.bwd"])
def test_attention_reproduces_the_shared_sdpa_rows(name, kind):
    err, _ = _errors(kind, name)[f"{name}:{SHARED_FILES[name]}"]
    assert err["n"] == 4 and err["mean_abs_pct"] <= 5.0 and err["max_abs_pct"] <= 10.0


@pytest.mark.parametrize("kind", ["attention.fwd", "attention.bwd"])
def test_attention_reproduces_the_kernel_timed_sdpa_rows(kind):
    err, _ = _errors(kind, H100)[f"{H100}:H100-SXM-80GB/kernels.jsonl[calib]"]
    assert err["n"] == 25 and err["mean_abs_pct"] <= 5.0 and err["max_abs_pct"] <= 15.0
    # a re-run on another machine, catalog eta (fitted on the shared file), nothing refitted
    ((held_out, _),) = _errors(kind, H100, role="test").values()
    assert held_out["mean_abs_pct"] <= 7.0 and held_out["max_abs_pct"] <= 20.0


def test_attention_scales_sensibly(models):
    cm = models[H100]
    f = cm.attention_s
    assert f(1, 32, 4096, 128) > 0
    # efficiency grows with work per head, toward eta at long sequences
    effs = [cm.attention_flops(1, 32, s, 128) / f(1, 32, s, 128) for s in (512, 2048, 8192, 32768)]
    assert all(b > a for a, b in zip(effs, effs[1:], strict=False))
    assert effs[-1] / load_gpu(H100).peak_flops("bf16") <= load_gpu(H100).attention.fwd.eta
    # long causal sequences: quadratic in seq, linear in batch*heads, non-causal about 2x
    assert f(1, 32, 16384, 128) / f(1, 32, 8192, 128) == pytest.approx(4.0, rel=0.1)
    assert 7.0 < f(8, 32, 8192, 128) / f(1, 32, 8192, 128) <= 8.0  # last-wave tail amortised
    assert f(1, 32, 8192, 128, causal=False) / f(1, 32, 8192, 128) == pytest.approx(2, rel=0.1)
    # backward costs 2.5x the forward FLOPs, at a lower efficiency
    ratio = f(1, 32, 8192, 128, backward=True) / f(1, 32, 8192, 128)
    assert 2.5 < ratio < 3.5
    # GQA changes bytes, not FLOPs: same time for long sequences
    assert f(1, 64, 8192, 128, kv_heads=8) == pytest.approx(f(1, 64, 8192, 128), rel=0.01)
    assert f(0, 32, 4096, 128) == 0.0
    assert f(1, 32, 4096, 128, dtype="fp8") < f(1, 32, 4096, 128)


def test_attention_rows_read_both_timing_styles():
    shared = attention_rows(read_jsonl(SHARED_FILES[H100]), backward=True)
    r = next(x for x in read_jsonl(SHARED_FILES[H100]) if x.get("op") == "sdpa_causal")
    assert shared[0] == (16, 2048, 128, pytest.approx(r["fwdbwd_s"] - r["fwd_s"]))
    kern = attention_rows(read_jsonl("H100-SXM-80GB/kernels.jsonl"), backward=True)
    assert len(kern) == 25 and all(t > 0 for *_, t in kern)
    assert len(gemm_rows(read_jsonl(SHARED_FILES[H100]))) == 54


# -- memory-bound -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [H100, H200])
def test_memory_s_reproduces_the_measured_copy(name, models):
    (copy,) = [r for r in read_jsonl(SHARED_FILES[name]) if r.get("op") == "d2d_copy"]
    # GBps counts bytes read + written, as memory_s does
    assert copy["GBps"] == pytest.approx(copy["bytes"] / copy["time_s"] / 1e9)
    assert models[name].memory_s(copy["bytes"]) == pytest.approx(copy["time_s"], rel=0.05)


def test_memory_s_matches_kernel_timed_copies_and_is_linear(models):
    cm = models[H100]
    for r in read_jsonl("H100-SXM-80GB/kernels.jsonl"):
        if r.get("op") == "d2d_copy" and r["bytes"] >= 2**28:  # beyond the 50 MB L2
            assert cm.memory_s(r["bytes"]) == pytest.approx(r["time_s"], rel=0.05)
    assert cm.memory_s(2e9) == pytest.approx(2 * cm.memory_s(1e9))
    assert cm.memory_s(0) == 0.0
    assert models["B200"].memory_s(1e9) < models[H200].memory_s(1e9) < cm.memory_s(1e9)
