"""Memory model against closed forms: ZeRO model states (Rajbhandari et al. 2020) and
Korthikanti et al. 2022 activation memory (eq. 1-2, Table 2, Section 4.3)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from simulator.config.schema import ModelConfig
from simulator.errors import ConfigError
from simulator.model import memory as mem

GB = 1e9

GPT_22B = ModelConfig(
    layers=48, hidden=6144, heads=64, vocab=51200, seq_len=2048, activation="gelu"
)
GPT3_175B = ModelConfig(
    layers=96, hidden=12288, heads=96, vocab=51200, seq_len=2048, activation="gelu"
)
LLAMA2_70B = ModelConfig(
    layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8, vocab=32000, seq_len=4096
)


# ------------------------------------------------------------------------------ model states


def test_zero_closed_forms():
    # (2 + 2 + 12/N) bytes/param at ZeRO-1, (2 + 14/N) at ZeRO-2, 16/N at ZeRO-3
    kw = dict(dp=64, param_dtype="bf16", grad_dtype="bf16")
    assert mem.model_state_bytes(7e9, zero=1, **kw).total / GB == pytest.approx(29.3, abs=0.05)
    assert mem.model_state_bytes(7e9, zero=2, **kw).total / GB == pytest.approx(15.5, abs=0.05)
    assert mem.model_state_bytes(7e9, zero=3, **kw).total / GB == pytest.approx(1.75, abs=1e-9)
    assert mem.model_state_bytes(7e9, zero=1, **kw).total == 7e9 * (2 + 2 + 12 / 64)
    assert mem.model_state_bytes(70e9, zero=0, dp=64).total / GB == pytest.approx(1120)
    s = mem.model_state_bytes(70e9, zero=0, dp=64)
    assert (s.weights, s.gradients, s.optimizer) == (140e9, 140e9, 840e9)


def test_zero_stages_shard_the_right_parts():
    n, dp = 1e9, 8
    z = [mem.model_state_bytes(n, zero=k, dp=dp, grad_dtype="fp32") for k in range(4)]
    assert z[0] == mem.ModelStateBytes(2e9, 4e9, 12e9)
    assert z[1] == mem.ModelStateBytes(2e9, 4e9, 12e9 / dp)
    assert z[2] == mem.ModelStateBytes(2e9, 4e9 / dp, 12e9 / dp)
    assert z[3] == mem.ModelStateBytes(2e9 / dp, 4e9 / dp, 12e9 / dp)


def test_fp32_params_have_no_master_copy():
    s = mem.model_state_bytes(1e9, zero=0, dp=1, param_dtype="fp32", grad_dtype="bf16")
    assert (s.weights, s.gradients, s.optimizer) == (4e9, 4e9, 8e9)


def test_bad_state_inputs():
    with pytest.raises(ConfigError):
        mem.model_state_bytes(1e9, zero=4, dp=1)
    with pytest.raises(ConfigError):
        mem.model_state_bytes(1e9, zero=1, dp=1, param_dtype="int8")
    assert mem.BYTES == {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


# ------------------------------------------------------------------------------ activations


def act(model, b, t, sp, rc, flash=False, d=2):
    return mem.activation_bytes_per_layer(
        model, micro_batch=b, tp=t, sequence_parallel=sp, recompute=rc, flash_attention=flash,
        dtype_bytes=d,
    )  # fmt: skip


@pytest.mark.parametrize("model", [GPT_22B, GPT3_175B])
@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("b", [1, 4])
def test_korthikanti_table2_exactly(model, t, b):
    s, h, a = model.seq_len, model.hidden, model.heads
    sbh = s * b * h
    q = 5 * Fraction(a * s, h)
    # eq. 1 / Table 2 (no flash attention: the s^2 score tensors are stored)
    if t == 1:
        assert act(model, b, t, False, "none") == sbh * (34 + q)
    assert act(model, b, t, False, "none") == sbh * (10 + Fraction(24, t) + q / t)
    assert act(model, b, t, True, "none") == Fraction(sbh, t) * (34 + q)
    assert act(model, b, t, False, "selective") == sbh * (10 + Fraction(24, t))
    assert act(model, b, t, True, "selective") == Fraction(sbh, t) * 34
    assert act(model, b, t, False, "full") == 2 * sbh
    assert act(model, b, t, True, "full") == Fraction(2 * sbh, t)


def test_flash_attention_stores_no_scores():
    m, b, t, s = GPT_22B, 1, 8, 2048
    lse = b * (m.heads // t) * s * 4  # fp32 log-sum-exp per query row
    assert act(m, b, t, True, "none", flash=True) == act(m, b, t, True, "selective") + lse
    assert act(m, b, t, True, "selective", flash=True) == act(m, b, t, True, "selective")


def test_llama_gqa_swiglu_tensor_by_tensor():
    # Llama-2-70B, b=1, tp=8, SP, bf16, no dropout, selective recompute; worked by hand:
    # replicated-part tensors (norm1 in, qkv in, norm2 in, fc1 in) on s/t tokens: 4 * 2*sbh/t
    # Q,K: (8 + 1) heads * 128 * s * 2; V: 1 * 128 * s * 2; out_proj in: 1024 * s * 2
    # act in: 2*3584 * s * 2; fc2 in: 3584 * s * 2
    s, h = 4096, 8192
    expected = 4 * 2 * s * h // 8 + s * 2 * (9 * 128 + 128 + 1024 + 2 * 3584 + 3584)
    assert act(LLAMA2_70B, 1, 8, True, "selective", flash=True) == expected
    t = mem.activation_tensors_per_layer(
        LLAMA2_70B, micro_batch=1, tp=8, sequence_parallel=True, recompute="selective"
    )
    assert not any("mask" in k for k in t)  # Llama family: no dropout
    # with MHA and ffn = 4h, GELU and dropout the same code gives Korthikanti's 34
    assert act(GPT_22B, 1, 8, True, "selective", flash=True) == 34 * s // 2 * 6144 // 8


def test_fp8_recipes_save_quantised_gemm_inputs():
    # Llama-2-70B, b=1, tp=8, SP, flash, no recompute, FP8 (Transformer Engine): the qkv and
    # fc1 inputs (s/t tokens, h wide), the fc2 input (s tokens, 3584 wide) and the
    # out-projection's copy (s tokens, 1024 wide) at 1 byte; the attention keeps its bf16
    # output beside that copy. Against bf16: -1 byte on 2 sh/t + 3584 s, +1 byte on 1024 s.
    s, h = 4096, 8192
    kw = dict(micro_batch=1, tp=8, sequence_parallel=True, recompute="none")
    bf16 = mem.activation_bytes_per_layer(LLAMA2_70B, **kw)
    fp8 = mem.activation_bytes_per_layer(LLAMA2_70B, gemm_in_bytes=1, **kw)
    assert bf16 - fp8 == 2 * s * h // 8 + s * 3584 - s * 1024
    t = mem.activation_tensors_per_layer(LLAMA2_70B, gemm_in_bytes=1, **kw)
    assert t["attn_output"] == 2 * s * 1024 and t["out_proj_input"] == s * 1024
    # full recompute keeps the layer input as it is
    full = dict(kw, recompute="full")
    assert mem.activation_bytes_per_layer(LLAMA2_70B, gemm_in_bytes=1, **full) == (
        mem.activation_bytes_per_layer(LLAMA2_70B, **full)
    )


def test_dtype_scales_widths_not_masks():
    m, b, t = GPT_22B, 1, 8
    s, h = 2048, 6144
    # 34 = 32 two-byte widths (16 elements) + 2 one-byte masks per sbh
    assert act(m, b, t, True, "selective", d=4) == Fraction(s * h, t) * (16 * 4 + 2)


def test_embedding_and_head_activations():
    m, b, t = GPT_22B, 1, 8
    s, h, V = 2048, 6144, 51200
    # Korthikanti Section 4.3: embedding dropout sbh/t; head 4sbh/t (1 + v/h)
    emb = mem.embedding_activation_bytes(m, micro_batch=b, tp=t, sequence_parallel=True)
    assert emb == s * b * h / t
    head = mem.head_activation_bytes(m, micro_batch=b, tp=t, sequence_parallel=True)
    assert head == Fraction(4 * s * b * h, t) * (1 + Fraction(V, h))
    assert (
        mem.embedding_activation_bytes(LLAMA2_70B, micro_batch=1, tp=8, sequence_parallel=True) == 0
    )
    peak = mem.head_activation_bytes(
        m, micro_batch=b, tp=t, sequence_parallel=True, include_transient=True
    )
    assert peak == head + s * b * V / t * (2 + 4)


def test_bad_recompute():
    with pytest.raises(ConfigError) as e:
        act(GPT_22B, 1, 1, False, "partial")
    assert e.value.field == "training.recompute"
