"""``model.qk_layernorm`` (Qwen3): Megatron-Core's q_layernorm and k_layernorm, one kernel per
tensor each way, between the QKV projection and the rotary embedding. Checked against the
bytes worked by hand for Qwen3-235B-A22B's attention at TP 2 with SP, and against what the
norms keep for their backward."""

from __future__ import annotations

import pytest

from simulator.config.schema import ModelConfig
from simulator.model import memory, transformer

BASE = dict(layers=94, hidden=4096, ffn_hidden=12288, heads=64, kv_heads=4, vocab=151936,
            seq_len=4096, activation="swiglu", kv_channels=128)  # fmt: skip
QWEN3 = ModelConfig(**BASE, qk_layernorm=True)
PLAIN = ModelConfig(**BASE)


def _names(model, backward: bool) -> list[str]:
    fn = transformer._layer_backward if backward else transformer._layer_forward
    return [op.name for op in fn(model, 1, 2, True, 2, True)]


def test_qk_norms_sit_between_qkv_and_rope():
    fwd = _names(QWEN3, False)
    assert fwd[fwd.index("qkv") + 1:fwd.index("rope")] == ["q_norm", "k_norm"]
    bwd = _names(QWEN3, True)
    assert bwd[bwd.index("rope") + 1:bwd.index("qkv_dgrad")] == ["k_norm", "q_norm"]
    assert [n for n in fwd if n not in ("q_norm", "k_norm")] == _names(PLAIN, False)
    assert [n for n in bwd if n not in ("q_norm", "k_norm")] == _names(PLAIN, True)


def test_qk_norm_bytes_by_hand():
    # TP 2: 32 query heads and 2 KV heads of 128 on 4,096 tokens (SP gathers them), bf16
    by = {op.name: op.bytes for op in transformer._layer_forward(QWEN3, 1, 2, True, 2, True)}
    assert by["q_norm"] == 2 * 4096 * 32 * 128 * 2  # read and write
    assert by["k_norm"] == 2 * 4096 * 2 * 128 * 2
    back = {op.name: op.bytes for op in transformer._layer_backward(QWEN3, 1, 2, True, 2, True)}
    assert back["q_norm"] == 3 * 4096 * 32 * 128 * 2  # read x and dy, write dx


def test_qk_norms_keep_their_inputs():
    kw = dict(micro_batch=1, tp=2, sequence_parallel=True, recompute="selective")
    with_qk = memory.activation_tensors_per_layer(QWEN3, **kw)
    plain = memory.activation_tensors_per_layer(PLAIN, **kw)
    extra = {k: v for k, v in with_qk.items() if k not in plain}
    assert extra == pytest.approx({"qk_norm_input": 4096 * (32 + 2) * 128 * 2,
                                   "qk_norm_rstd": 4096 * (32 + 2) * 4})  # fmt: skip
    full = dict(kw, recompute="full")
    assert memory.activation_tensors_per_layer(QWEN3, **full) == \
        memory.activation_tensors_per_layer(PLAIN, **full)


def test_eager_qk_layernorm_is_one_line_error(tmp_path, capsys):
    from tests.test_bad_input import BASE_WORK, expect, fails, write

    work = {**BASE_WORK, "model": {**BASE_WORK["model"], "qk_layernorm": True},
            "training": {**BASE_WORK["training"], "kernels": "eager"}}  # fmt: skip
    p = write(tmp_path, work)
    expect(fails(capsys, tmp_path, "run", str(p)), p, "model.qk_layernorm", "fused")
