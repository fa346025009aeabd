"""Tensor-parallel collectives of eager (plain PyTorch) code: the dtype they carry and whether
they can overlap, from how autograd and autocast run (simulator.model.comm)."""

from __future__ import annotations

import pytest

from simulator.config.schema import ModelConfig
from simulator.model import comm as mc
from tests.conftest import SMALL_MODEL

MODEL = ModelConfig(**SMALL_MODEL)
B, S, H = 1, MODEL.seq_len, MODEL.hidden


def _comms(ops):
    return [op for op in ops if op.kind == "comm"]


def _layer(backward: bool, **kw):
    base = dict(micro_batch=B, tp=2, sequence_parallel=False, backward=backward)
    return mc.layer_ops(MODEL, **{**base, **kw})


def test_eager_backward_all_reduce_carries_the_residual_dtype_after_the_weight_gradient():
    """fp32 master weights: the norm's output (the column-parallel input) is fp32, so its
    gradient's all-reduce moves 4 bytes an element; it follows the weight gradient (autograd's
    MmBackward computes both first) and does not overlap it."""
    ops = _layer(True, kernels="eager", param_dtype="fp32")
    comms = _comms(ops)  # attention's and the MLP's input gradients (row-parallel: identity)
    assert [c.bytes for c in comms] == [B * S * H * 4] * 2
    assert not any(c.overlap for c in comms)
    for c in comms:
        i = ops.index(c)
        assert ops[i - 1].name.endswith("_wgrad")


def test_forward_all_reduces_carry_the_compute_dtype():
    comms = _comms(_layer(False, kernels="eager", param_dtype="fp32"))
    assert [c.bytes for c in comms] == [B * S * H * 2] * 2


def test_a_cast_before_the_tp_region_or_fused_kernels_keep_bf16_and_megatrons_overlap():
    cast = _comms(_layer(True, kernels="eager", param_dtype="fp32", tp_input_dtype="compute"))
    assert {c.bytes for c in cast} == {B * S * H * 2}
    fused = _comms(_layer(True, kernels="fused", param_dtype="bf16"))
    assert {c.bytes for c in fused} == {B * S * H * 2}
    assert sum(c.overlap for c in fused) == 2  # the input-gradient all-reduces beside wgrad


@pytest.mark.parametrize("param_dtype,nbytes", [("fp32", 4), ("bf16", 2)])
def test_eager_embedding_all_reduce_is_in_the_weights_dtype(param_dtype, nbytes):
    ops = mc.embedding_ops(MODEL, micro_batch=B, tp=2, sequence_parallel=False, backward=False,
                           kernels="eager", param_dtype=param_dtype)
    (c,) = _comms(ops)
    assert c.bytes == B * S * H * nbytes
