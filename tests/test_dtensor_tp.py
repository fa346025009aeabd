"""``parallelism.tp_impl: dtensor``: PyTorch DTensor tensor parallelism in eager code, its
host time per unit of the plan on the host clock (``HostRates.extra``,
:func:`simulator.engine.host.dtensor_extra`) and its SP collectives. Counts and bytes worked
out by hand from the workloads and the plan of ``benchmarks/device/steps_alt.py``."""

from __future__ import annotations

import pytest

from simulator.calibrate import jsonl
from simulator.config.load import load_workload
from simulator.engine.host import dtensor_opt_s, dtensor_param_tensors
from simulator.hardware.catalog import load_gpu
from simulator.model import comm
from simulator.model.sync import host_group_factor
from simulator.run import simulate
from tests.conftest import ROOT

TP2 = ROOT / "validation/heldout6/h6_tp2_U.yaml"  # 20 layers, TP 2, one micro-batch of 8
TP2SP = ROOT / "validation/heldout6/h6_tp2sp_V.yaml"  # 16 layers, TP 2 + SP, 2 micro-batches
# host-bound widths: the GPU has almost nothing to do, the host sets the step
TINY = ("model.hidden=256", "model.ffn_hidden=1024", "model.heads=4", "model.kv_heads=4",
        "model.vocab=1024", "model.seq_len=128")
#: (forward, backward) seconds per unit, distinct powers of ten apart so each count shows
RATES = {"colwise": (1e-3, 2e-3), "rowwise": (3e-3, 4e-3), "rowwise_rs": (5e-4, 6e-4),
         "sp_colwise": (7e-4, 8e-4), "loss_parallel": (5e-3, 6e-3)}


def _gpu(rates: dict, opt: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> str:
    """An H100 with these DTensor unit rates and optimizer rates (per step, per tensor with
    SP, per tensor without)."""
    units = ", ".join(f"{u}: {{fwd_s: {f!r}, bwd_s: {b!r}}}" for u, (f, b) in rates.items())
    return (f"topology.gpu={{base: H100-SXM-80GB, host_dtensor: {{{units}}}, "
            f"host_dtensor_opt_step_s: {opt[0]!r}, host_dtensor_opt_tensor_s: {opt[1]!r}, "
            f"host_dtensor_opt_tensor_nosp_s: {opt[2]!r}}}")


def _paced(gpus: int) -> float:
    """The host's time at the pace of the slowest of ``gpus`` hosts (``host_jitter``)."""
    return host_group_factor(gpus, load_gpu("H100-SXM-80GB").host_jitter)


def _step(case, impl: str, rates: dict = RATES, extra: tuple[str, ...] = (),
          opt: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> dict:
    sets = [*TINY, *extra, f"parallelism.tp_impl={impl}", _gpu(rates, opt)]
    return simulate(load_workload(case, sets)).summary


def test_dtensor_units_show_as_host_time_without_sp():
    """TP 2 without SP, one micro-batch: per layer two ColwiseParallel Linears (qkv, fc1:
    2 x (1 + 2) ms) and two RowwiseParallel ones (out_proj, fc2: 2 x (3 + 4) ms) = 20 ms, 20
    layers 400 ms; the LM head column-parallel 3 ms and the loss 11 ms; the embedding
    row-parallel 7 ms: 421 ms more host time, all of it exposed (the GPU idles), at the pace
    of the slower of the two hosts."""
    base, dt = _step(TP2, "megatron"), _step(TP2, "dtensor")
    want = (20 * (2 * 3e-3 + 2 * 7e-3) + 3e-3 + 11e-3 + 7e-3) * _paced(2)
    assert dt["step_time_s"] - base["step_time_s"] == pytest.approx(want, rel=0.01)
    shown = dt["breakdown_s"]["host"] - base["breakdown_s"]["host"]
    assert shown == pytest.approx(want, rel=0.02)


def test_dtensor_units_with_sp_per_micro_batch():
    """TP 2 + SP, two micro-batches of 4: per layer two SP fronts (norm, all-gather,
    column-parallel Linear: 2 x 1.5 ms) and two reduce-scattering row-parallel Linears
    (2 x 1.1 ms) = 5.2 ms, 16 layers 83.2 ms; head 1.5 + 11 ms, embedding 1.1 ms: 96.8 ms a
    micro-batch, 193.6 ms a step, at the slower host's pace. The SP collectives differ too
    (fp32 gathers, no re-gather), so the difference is taken against DTensor with every rate
    at zero."""
    zero = {u: (0.0, 0.0) for u in RATES}
    base, dt = _step(TP2SP, "dtensor", zero), _step(TP2SP, "dtensor")
    want = 2 * (16 * (2 * 1.5e-3 + 2 * 1.1e-3) + 1.5e-3 + 11e-3 + 1.1e-3) * _paced(2)
    assert dt["step_time_s"] - base["step_time_s"] == pytest.approx(want, rel=0.01)


def test_dtensor_param_tensors_match_the_measured_model():
    """The DTensor parameters ``dtensor_step_host.py`` counted on steps_alt.py's TP + SP
    GPT-2 (LayerNorm, untied): 28 at 2 layers, 292 at 24 (data/measured/
    dtensor-step-host-h200x4); without SP the norms stay plain: 8 a layer and the two ends."""
    rows = [r for r in jsonl(ROOT / "data/measured/dtensor-step-host-h200x4/"
                             "dtensor_step_host_w4.jsonl") if "rank" in r]
    for layers in (2, 24):
        got = {r["dtensor_params"] for r in rows if r["layers"] == layers}
        assert got == {dtensor_param_tensors(layers, True, 2, False)}
    assert dtensor_param_tensors(20, False, 2, False) == 162
    assert dtensor_param_tensors(20, True, 1, True) == 20 * 10 + 1 + 1


def test_dtensor_optimizer_host_once_a_step():
    """TP 2 + SP, two micro-batches, 16 layers: 16 x 12 + 2 + 2 = 198 DTensor parameter
    tensors; the optimizer step adds 5 ms + 198 x 0.1 ms = 24.8 ms of host time once a step
    (not per micro-batch), at the slower host's pace; without SP (TP 2, 20 layers) 20 x 8 + 2
    = 162 tensors at the rate without SP, 5 ms + 162 x 0.02 ms = 8.24 ms."""
    opt = (5e-3, 1e-4, 2e-5)
    zero = {u: (0.0, 0.0) for u in RATES}
    for case, tensors, rate, want_s in ((TP2SP, 198, 1e-4, 24.8e-3), (TP2, 162, 2e-5, 8.24e-3)):
        base, dt = _step(case, "dtensor", zero), _step(case, "dtensor", zero, opt=opt)
        assert dtensor_opt_s(opt[0], rate, tensors) == pytest.approx(want_s)
        got = dt["step_time_s"] - base["step_time_s"]
        assert got == pytest.approx(want_s * _paced(2), rel=0.01)


def test_megatron_is_unchanged_by_dtensor_rates():
    """The rates only act under ``tp_impl: dtensor``."""
    a = _step(TP2, "megatron", {u: (0.0, 0.0) for u in RATES})
    b = _step(TP2, "megatron")
    assert a["step_time_s"] == b["step_time_s"]


def _tp_comms(impl: str, backward: bool, head: bool = False) -> list[tuple[str, float, bool]]:
    m = load_workload(TP2SP).workload.model
    fn = comm.head_ops if head else comm.layer_ops
    ops = fn(m, micro_batch=4, tp=2, sequence_parallel=True, backward=backward,
             kernels="eager", param_dtype="fp32", tp_input_dtype="residual", tp_impl=impl)
    return [(o.collective, o.bytes, o.overlap) for o in ops if o.kind == "comm"]


def test_dtensor_sp_gathers_the_fp32_norm_output_once():
    """V at micro-batch 4: a [4, 2048, 2304] activation is 75.5 MB in fp32, 37.7 MB in bf16.
    Under autocast a LayerNorm's output is fp32, and DTensor's PrepareModuleInput gathers it
    before the Linear casts it, so each forward all-gather carries fp32 (Megatron: bf16); the
    row-parallel reduce-scatters carry the GEMM's bf16 output. In the backward autograd kept
    the gathered input, so there is no re-gather, and the column-parallel input's gradient is
    reduce-scattered in fp32; the row-parallel output's gradient is gathered in bf16."""
    fp32, bf16 = 4 * 2048 * 2304 * 4, 4 * 2048 * 2304 * 2
    fwd = _tp_comms("dtensor", False)
    assert fwd == [("all_gather", fp32, False), ("reduce_scatter", bf16, False)] * 2
    bwd = _tp_comms("dtensor", True)
    assert sorted(bwd) == sorted([("all_gather", bf16, False), ("reduce_scatter", fp32, False)] * 2)
    meg = _tp_comms("megatron", True)
    assert sum(1 for c in meg if c[0] == "all_gather") == 4  # two re-gathers (overlapped)
    assert _tp_comms("dtensor", False, head=True) == [("all_gather", fp32, False)]
    assert _tp_comms("dtensor", True, head=True) == [("reduce_scatter", fp32, False)]


def test_dtensor_needs_eager_kernels(tmp_path):
    """DTensor is PyTorch's eager tensor parallelism: with fused kernels the key is refused."""
    from simulator.errors import ConfigError
    with pytest.raises(ConfigError, match="parallelism.tp_impl"):
        simulate(load_workload(TP2, ["parallelism.tp_impl=dtensor", "training.kernels=fused"]))
