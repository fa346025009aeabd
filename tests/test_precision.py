"""Low-precision recipes: quantisation traffic, GEMM format, weight memory (issue 11)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from simulator.config.load import load_workload
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.hardware.precision import RECIPES, quantize_bytes, recipe, weight_bytes
from simulator.run import simulate

ROOT = Path(__file__).resolve().parents[1]


def training(precision="fp8", fp8_recipe="delayed", fp8_param_gather=False):
    return SimpleNamespace(
        precision=precision, fp8_recipe=fp8_recipe, fp8_param_gather=fp8_param_gather
    )


def test_quantisation_bytes_per_element_from_the_formats():
    m, k, n = 8192, 4096, 1024
    # delayed: read bf16 (2) + write fp8 and its transpose (1 + 1)
    assert quantize_bytes(recipe("fp8"), m, k, n, False) == 4 * m * k
    # current scaling adds a whole-tensor amax read (2)
    assert quantize_bytes(recipe("fp8", "current"), m, k, n, False) == 6 * m * k
    # MX: both orientations, one E8M0 byte per 32 elements
    assert quantize_bytes(recipe("mxfp8"), m, k, n, False) == pytest.approx(
        (2 + 2 * 33 / 32) * m * k
    )
    # NVFP4 wgrad: both operands re-read and Hadamard-transformed, written as 4-bit + E4M3/16
    assert quantize_bytes(recipe("nvfp4"), m, k, n, True) == pytest.approx(
        (2 + 0.5 + 1 / 16) * (m * k + k * n)
    )
    assert recipe("bf16") is None
    assert all(r.source for r in RECIPES.values())


def test_block_scaled_gemms_run_at_their_peak():
    """A large, compute-bound GEMM: mxfp8 runs at B200's FP8 peak with per-tensor FP8's
    efficiency (its block scales applied inside the MMA; only the 1/32 scale bytes differ),
    nvfp4 at the FP4 peak (2x FP8) with bf16's efficiency (not published per shape)."""
    g = load_gpu("B200")
    cm = ComputeModel(g)
    big = (16384, 16384, 16384)
    t8, tmx, t4 = (cm.gemm_s(*big, d) for d in ("fp8", "mxfp8", "nvfp4"))
    assert g.gemm.eta_for("mxfp8") == g.gemm.eta_fp8 != g.gemm.eta
    assert tmx == pytest.approx(t8, rel=0.01)
    assert t4 == pytest.approx(t8 * g.gemm.eta_fp8 / g.gemm.eta / 2, rel=0.05)


def test_weight_memory_of_each_recipe():
    assert weight_bytes(training("bf16"), 2) == (None, 2.0)
    assert weight_bytes(training("fp8"), 2) == (4.0, 2.0)  # bf16 + fp8 + fp8 transpose
    assert weight_bytes(training("fp8", fp8_param_gather=True), 2) == (2.0, 1.0)
    w, g = weight_bytes(training("nvfp4", fp8_param_gather=True), 2)
    assert w == pytest.approx(2 * (0.5 + 1 / 256)) and g == pytest.approx(0.5 + 1 / 16)
    # MXFP8: both orientations held, the weights gathered in bf16 (Megatron-Core's MXFP8
    # parameter all-gather through the gradient buffer)
    assert weight_bytes(training("mxfp8", fp8_param_gather=True), 2) == (2 * 33 / 32, 2.0)


@pytest.mark.parametrize("gpu, transposed", [("H100-SXM-80GB", True), ("B200", False)])
def test_a_run_holds_the_low_precision_weight_copies(gpu, transposed):
    """bf16 weights (2 B) beside the FP8 copy (1 B) and, on a GPU whose FP8 GEMMs are TN only
    (Hopper), its transpose (1 B); with fp8_param_gather the FP8 copies alone."""
    path = ROOT / "workloads" / "llama3-8b.yaml"
    base = [f"topology.gpu={gpu}"]
    bf16 = simulate(load_workload(path, base)).summary
    fp8 = simulate(load_workload(path, base + ["training.precision=fp8"])).summary
    fp8p = simulate(
        load_workload(path, base + ["training.precision=fp8", "training.fp8_param_gather=true"])
    ).summary
    w = bf16["memory_gib"]["weights"]
    copies = 2 if transposed else 1
    assert fp8["memory_gib"]["weights"] == pytest.approx(w * (2 + copies) / 2)
    assert fp8p["memory_gib"]["weights"] == pytest.approx(w * copies / 2)
    assert fp8["step_time_s"] < bf16["step_time_s"]


def test_blackwell_per_tensor_fp8_writes_no_transpose():
    """Transformer Engine 2.x creates no transposed FP8 copy where FP8 GEMMs take any layout
    (compute capability 10.x): per-tensor quantisation of an [m, k] operand moves 1 B an
    element less on B200 / GB200 / GB300 than on H100 (delayed 3 against 4, current 5
    against 6); block-scaled recipes already write each orientation as its own copy."""
    from simulator.engine.program import _op_time
    from simulator.hardware.precision import non_tn_fp8
    from simulator.model.ops import gemm_op

    assert not non_tn_fp8(load_gpu("H100-SXM-80GB"))
    assert all(non_tn_fp8(load_gpu(g)) for g in ("B200", "GB200", "GB300"))
    m, k, n = 16384, 4096, 14336
    for rec, hopper in (("delayed", 4), ("current", 6)):
        r = recipe("fp8", rec)
        assert quantize_bytes(r, m, k, n, False) == hopper * m * k
        assert quantize_bytes(r, m, k, n, False, non_tn=True) == (hopper - 1) * m * k
        assert quantize_bytes(r, m, k, n, True, non_tn=True) == 0.0
    for name in ("mxfp8", "nvfp4"):
        r = recipe(name)
        assert quantize_bytes(r, m, k, n, False, non_tn=True) == quantize_bytes(r, m, k, n, False)
    cm = ComputeModel(load_gpu("B200"))
    op = gemm_op("fc1", "mlp", m, k, n, 2)
    launch = cm.gpu.kernel_launch_s
    assert _op_time(cm, op, "fp8/current") == pytest.approx(
        cm.gemm_s(m, k, n, "fp8") + cm.memory_s(5 * m * k) + 3 * launch + launch)


def test_a_format_the_gpu_lacks_is_one_line_exit_2():
    out = subprocess.run(
        [sys.executable, "-m", "simulator", "run", "workloads/llama3-8b.yaml", "--no-files",
         "--set", "training.precision=mxfp8"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "training.precision" in out.stderr and "mxfp8" in out.stderr


def test_block_scaled_gemms_swizzle_both_operands_scales_first():
    """Transformer Engine 2.5-2.11 swizzles each MXFP8 / NVFP4 operand's scales in its own
    kernel before the GEMM (reads and writes them: 1/32 or 1/16 byte an element); per-tensor
    and blockwise FP8 run none."""
    from simulator.engine.program import _op_time
    from simulator.hardware.precision import swizzle_bytes
    from simulator.model.ops import gemm_op

    m, k, n = 8192, 4096, 14336
    assert swizzle_bytes(recipe("mxfp8"), m, k, n) == pytest.approx(2 * (m * k + k * n) / 32)
    assert swizzle_bytes(recipe("nvfp4"), m, k, n) == pytest.approx(2 * (m * k + k * n) / 16)
    # a grouped GEMM's one kernel per operand covers every expert's weight
    assert swizzle_bytes(recipe("mxfp8"), m, k, n, 4) == pytest.approx(
        2 * (m * k + 4 * k * n) / 32)
    for name in ("fp8", "fp8/current", "fp8/blockwise"):
        p, _, r = name.partition("/")
        assert swizzle_bytes(recipe(p, r or "delayed"), m, k, n) == 0.0
    cm = ComputeModel(load_gpu("B200"))
    op = gemm_op("fc1", "mlp", m, k, n, 2)
    launch = cm.gpu.kernel_launch_s
    quant = quantize_bytes(recipe("mxfp8"), m, k, n, False)
    want = (cm.gemm_s(m, k, n, "mxfp8") + cm.memory_s(quant, "mx_cast") + launch
            + cm.memory_s(2 * (m * k + k * n) / 32) + 2 * launch + launch)
    assert _op_time(cm, op, "mxfp8") == pytest.approx(want)


def test_blockwise_fp8_on_hopper_runs_at_its_measured_rate():
    """A DeepSeek-style block-scaled FP8 GEMM on a Hopper GPU takes the per-tensor GEMM's time
    over the measured rate (forward / dgrad 1x128 x 128x128, wgrad 1x128 x 1x128), its
    quantisation priced as before; per-tensor recipes and Blackwell GPUs keep the per-tensor
    GEMM time."""
    from simulator.engine.program import _op_time
    from simulator.hardware.precision import BLOCKWISE_RATE_HOPPER, gemm_rate
    from simulator.model.ops import gemm_op

    m, k, n = 4096, 7168, 4096
    blk, cur = recipe("fp8", "blockwise"), recipe("fp8", "current")
    for gpu in ("H100-SXM-80GB", "H800", "H200-SXM-141GB"):
        cm = ComputeModel(load_gpu(gpu))
        launch = cm.gpu.kernel_launch_s
        for name, wgrad in (("fc1", False), ("fc1_wgrad", True)):
            rate = BLOCKWISE_RATE_HOPPER["wgrad" if wgrad else "fwd"]
            assert gemm_rate(blk, gpu, wgrad) == rate
            op = gemm_op(name, "mlp", m, k, n, 2)
            quant = quantize_bytes(blk, m, k, n, wgrad)
            want = cm.gemm_s(m, k, n, "fp8") / rate + (cm.memory_s(quant) + launch if quant
                                                        else 0.0) + launch
            assert _op_time(cm, op, "fp8/blockwise") == pytest.approx(want)
            assert gemm_rate(cur, gpu, wgrad) == 1.0
    assert gemm_rate(blk, "B200", True) == 1.0 and gemm_rate(None, "H100-SXM-80GB", True) == 1.0


def test_lm_head_and_router_stay_bf16_in_fused_code():
    """Megatron-Core's LM head (``tensor_parallel.ColumnParallelLinear``) and MoE router
    (``torch.nn.functional.linear``) are not Transformer Engine modules, so under any
    low-precision recipe their forward, dgrad and wgrad GEMMs take exactly a bf16 GEMM's
    time with no quantisation kernel; TE's linear layers keep the recipe's pricing; eager
    code is not covered by the rule."""
    from simulator.engine.program import _op_time
    from simulator.hardware.precision import keeps_bf16
    from simulator.model.ops import gemm_op

    cm = ComputeModel(load_gpu("B200"))
    m, k, n = 16384, 4096, 32000
    for name in ("lm_head", "lm_head_dgrad", "lm_head_wgrad", "router"):
        op = gemm_op(name, "head", m, k, n, 2)
        bf16 = _op_time(cm, op, "bf16")
        assert bf16 == pytest.approx(cm.gemm_s(m, k, n, "bf16") + cm.gpu.kernel_launch_s)
        for dtype in ("fp8/current", "fp8/delayed", "mxfp8", "nvfp4"):
            assert _op_time(cm, op, dtype) == bf16
        assert keeps_bf16(name, "fused") and not keeps_bf16(name, "eager")
    fc1 = gemm_op("fc1", "mlp", m, k, 28672, 2)
    quant = quantize_bytes(recipe("fp8", "current"), m, k, 28672, False, non_tn=True)
    assert _op_time(cm, fc1, "fp8/current") == pytest.approx(
        cm.gemm_s(m, k, 28672, "fp8") + cm.memory_s(quant) + 4 * cm.gpu.kernel_launch_s)
    assert not keeps_bf16("expert_fc1", "fused") and not keeps_bf16("fc2_wgrad", "fused")


def test_quantisation_kernels_per_tensor_and_per_expert():
    """Transformer Engine's kernels per quantised tensor (v2.x ``quantizer.cpp``): current
    scaling three (amax, scale, cast), the others one; a grouped GEMM's ``split_quantize``
    runs them for every expert's slice, except delayed scaling with a transposed copy (Hopper),
    whose ``nvte_multi_cast_transpose`` does all experts in one kernel."""
    from simulator.engine.program import _op_time
    from simulator.hardware.precision import quantize_kernels
    from simulator.model.ops import Op

    cur, dly, mx = recipe("fp8", "current"), recipe("fp8"), recipe("mxfp8")
    assert [quantize_kernels(r) for r in (cur, dly, mx, recipe("fp8", "blockwise"))] == [3, 1, 1, 1]
    assert quantize_kernels(cur, 8) == 24 and quantize_kernels(mx, 8, True) == 8
    assert quantize_kernels(dly, 8, non_tn=False) == 1 and quantize_kernels(dly, 8, True) == 8
    # a grouped round of 4 experts on a B200: the GEMMs as before, the quantisation's bytes of
    # all rows once, its launches per expert
    cm = ComputeModel(load_gpu("B200"))
    launch = cm.gpu.kernel_launch_s
    m, k, n, e = 4 * 1024, 7168, 4096, 4
    op = Op("expert_fc1", "gemm", "moe", m=m, k=k, n=n, flops=2.0 * m * k * n, serial=e)
    gemms = e * cm.gemm_s(m // e, k, n, "fp8") + (e - 1) * launch
    assert _op_time(cm, op, "fp8/current") == pytest.approx(
        gemms + cm.memory_s(5 * m * k) + 3 * e * launch + launch)
    assert _op_time(cm, op, "fp8/delayed") == pytest.approx(
        gemms + cm.memory_s(3 * m * k) + e * launch + launch)


def test_weights_quantised_once_a_step():
    """TE quantises each weight in the first micro-batch's forward and reuses the copies:
    a forward GEMM under a low-precision recipe carries a ``_wquant`` part of 1/m of one
    cast (read bf16, an amax pass under current scaling, write every cached orientation);
    none for bf16, eager code, fp8_param_gather, the bf16 LM head, or backward GEMMs; a
    recomputed forward does not repeat it."""
    from simulator.engine.program import (
        Pricer,
        _rerun,
        price,
        weight_quant_part,
        weight_quant_share,
    )
    from simulator.hardware.precision import weight_quantize_bytes
    from simulator.model.ops import gemm_op

    cur, mx = recipe("fp8", "current"), recipe("mxfp8")
    assert weight_quantize_bytes(cur) == 2 + 2 + 2 and weight_quantize_bytes(cur, True) == 5
    assert weight_quantize_bytes(recipe("fp8"), True) == 3
    assert weight_quantize_bytes(mx, True) == pytest.approx(2 + 2 * 33 / 32)
    t = SimpleNamespace(kernels="fused", precision="mxfp8", fp8_param_gather=False)
    assert weight_quant_share(t, 8) == 1 / 8
    # MXFP8's fp8_param_gather gathers bf16 and casts every step; per-tensor FP8's casts the
    # optimizer's shard (not priced)
    assert weight_quant_share(SimpleNamespace(**(vars(t) | {"fp8_param_gather": True})), 8) == 1 / 8
    assert weight_quant_share(SimpleNamespace(**(vars(t) | {"fp8_param_gather": True,
                                                            "precision": "fp8"})), 8) == 0
    assert weight_quant_share(SimpleNamespace(**(vars(t) | {"kernels": "eager"})), 8) == 0
    assert weight_quant_share(SimpleNamespace(**(vars(t) | {"precision": "bf16"})), 8) == 0
    cm = ComputeModel(load_gpu("GB200"))
    m, k, n = 8192, 8192, 28672
    fc1 = gemm_op("fc1", "mlp", m, k, n, 2)
    part = weight_quant_part(cm, fc1, "mxfp8", "fused", 0.25)
    assert part.name == "fc1_wquant" and part.flops == 0
    assert part.dur == pytest.approx(0.25 * (cm.memory_s((2 + 2 * 33 / 32) * k * n, "mx_cast")
                                             + cm.gpu.kernel_launch_s))
    for name, dtype in (("fc1", "bf16"), ("lm_head", "mxfp8"), ("fc1_dgrad", "mxfp8")):
        assert weight_quant_part(cm, gemm_op(name, "mlp", m, k, n, 2), dtype, "fused", 0.25) is None
    prog = price([fc1], Pricer(cm, "mxfp8", weight_quant_share=0.25), None)
    assert [p.name for p in prog] == ["fc1", "fc1_wquant"]
    assert [p.name for p in _rerun(prog)] == ["re_fc1"]


def test_mxfp8_cast_runs_at_its_published_b200_rate():
    """Transformer Engine's MXFP8 cast writing both orientations of a bf16 8192 x 8192 tensor
    took 52.34 us on a B200 (ROCm/TransformerEngine PR #598): the model's quantisation of
    that tensor takes the same time (4.06 B an element at the ``mx_cast`` class's rate)."""
    from simulator.engine.program import _op_time
    from simulator.model.ops import gemm_op

    cm = ComputeModel(load_gpu("B200"))
    m = k = 8192
    q = quantize_bytes(recipe("mxfp8"), m, k, 1, False)
    assert cm.memory_s(q, recipe("mxfp8").cast_access) == pytest.approx(52.34e-6, rel=0.002)
    op = gemm_op("fc1", "mlp", m, k, 4096, 2)
    with_cast = _op_time(cm, op, "mxfp8")
    assert with_cast - cm.gemm_s(m, k, 4096, "mxfp8") > 52e-6
    assert recipe("fp8", "current").cast_access == "stream"


def test_sequence_parallel_gathers_quantised_shares():
    """Transformer Engine under SP quantises each rank's share before the all-gather and
    gathers the low-precision copy (``gather_along_first_dim(..., quantizer=...)``): forward
    inputs of qkv / fc1 and their backward re-gathers at the format's operand bytes (MXFP8:
    1 + 1/32, row-wise then column-wise), the row-parallel output gradients at both MXFP8
    copies (2 (1 + 1/32)) or per-tensor FP8's one byte; the quantisation of those operands
    covers 1/tp of the rows; current scaling all-reduces each one's amax over TP first."""
    from simulator.hardware.precision import sp_gather_bytes
    from simulator.model import comm as mc

    model = load_workload(ROOT / "workloads" / "llama3-8b.yaml").workload.model
    tp, b = 4, 1
    nbytes = mc.tf.tp_comm_bytes(model, micro_batch=b)
    mx = sp_gather_bytes(recipe("mxfp8"))
    assert mx == pytest.approx((33 / 32, 66 / 32))
    assert sp_gather_bytes(recipe("fp8", "current")) == (1.0, 1.0)
    assert sp_gather_bytes(recipe("fp8", "blockwise")) is None
    kw = dict(micro_batch=b, tp=tp, sequence_parallel=True)
    for lp, amax in ((mc.LowPrecisionGather(*mx, tp), 0),
                     (mc.LowPrecisionGather(1.0, 1.0, tp, amax=True), 4)):
        fwd = mc.layer_ops(model, backward=False, lowp_gather=lp, **kw)
        bwd = mc.layer_ops(model, backward=True, lowp_gather=lp, **kw)
        gathers = [op.bytes for op in fwd if op.collective == "all_gather"]
        assert gathers == pytest.approx([nbytes * lp.fwd / 2] * 2)
        assert {op.name: op.gathered for op in fwd if op.kind == "gemm"} == {
            "qkv": tp, "out_proj": 0, "fc1": tp, "fc2": 0}
        g_bwd = sorted(op.bytes for op in bwd if op.collective == "all_gather")
        want = sorted([nbytes * lp.fwd / 2] * 2 + [nbytes * lp.grad / 2] * 2)
        assert g_bwd == pytest.approx(want)
        dg = {op.name: op.gathered for op in bwd if op.name.endswith("_dgrad")}
        assert dg == {"fc2_dgrad": tp, "fc1_dgrad": 0, "out_proj_dgrad": tp, "qkv_dgrad": 0}
        amaxes = [op for op in fwd + bwd if op.name == "tp_amax_all_reduce"]
        assert len(amaxes) == amax and all(op.bytes == 4 for op in amaxes)
        plain = mc.layer_ops(model, backward=False, **kw)
        assert [op.bytes for op in plain if op.collective == "all_gather"] == [nbytes] * 2
    m, k = 8192, 4096
    assert quantize_bytes(recipe("mxfp8"), m, k, 1, False, True, gathered=4) == pytest.approx(
        (2 + 2 * 33 / 32) * m * k / 4)
    cur = recipe("fp8", "current")
    assert quantize_bytes(cur, m, k, 1, False, True, gathered=4) == 5 * m * k / 4
    # Hopper: the share's cast without the transpose, then the gathered copy transposed
    assert quantize_bytes(cur, m, k, 1, False, False, gathered=4) == 5 * m * k / 4 + 2 * m * k
