"""The shipped Llama 4 and GPT-OSS workloads against their published parameter counts, and
their layer patterns as the published configs give them.

Tolerances: OpenAI's model card gives gpt-oss's counts to four significant figures (its
parameter table: 116.83 B total and 5.13 B active for gpt-oss-120b, 20.91 B and 3.61 B for
gpt-oss-20b), counting as active the unembedding but not the embedding lookup; what this
model leaves out (the projections', router's and experts' biases, the attention sinks) is
0.04 % of the total, so 0.5 % covers the rounding and the biases. Meta gives Llama 4's counts
to two or three figures (Maverick "17B active, 400B total", Scout "17B active, 109B total")
and they include the multimodal checkpoint's vision encoder, which is not modelled: 2 %
(Scout's text model is 1.1 % under 109 B)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.config.load import load_workload
from simulator.config.schema import ModelConfig
from simulator.model import transformer as tf

ROOT = Path(__file__).resolve().parents[1]


def _shipped(name: str) -> ModelConfig:
    return load_workload(ROOT / "workloads" / f"{name}.yaml").workload.model


def _variant(model: ModelConfig, **update) -> ModelConfig:
    data = model.model_dump()
    for k, v in update.items():
        if k == "moe":
            data["moe"].update(v)
        else:
            data[k] = v
    return ModelConfig.model_validate(data)


def _published_active(model: ModelConfig) -> float:
    """Active parameters as OpenAI counts them (no embedding lookup)."""
    return tf.active_params(model) - tf.embedding_params(model)


def test_gpt_oss_120b():
    m = _shipped("gpt-oss-120b")
    assert tf.total_params(m) == pytest.approx(116.83e9, rel=0.005)
    assert _published_active(m) == pytest.approx(5.13e9, rel=0.005)
    # layer_types: sliding_attention on even layers, full_attention on odd ones; all MoE
    assert [m.is_local_layer(i) for i in range(4)] == [True, False, True, False]
    assert m.moe_layers == 36


def test_gpt_oss_20b():
    # openai/gpt-oss-20b's config.json: 24 layers, 32 experts, top-4; otherwise as the 120b
    m = _variant(_shipped("gpt-oss-120b"), layers=24, moe={"experts": 32})
    assert tf.total_params(m) == pytest.approx(20.91e9, rel=0.005)
    assert _published_active(m) == pytest.approx(3.61e9, rel=0.005)


def test_llama4_maverick():
    m = _shipped("llama4-maverick")
    assert tf.total_params(m) == pytest.approx(400e9, rel=0.02)
    assert tf.active_params(m) == pytest.approx(17e9, rel=0.02)
    # interleave_moe_layer_step 2: layers 1, 3, ... MoE; no_rope_layer_interval 4: layers
    # 3, 7, ... full (NoPE) attention, the others chunked
    assert m.moe_layers == 24 and not m.is_moe_layer(0) and m.is_moe_layer(47)
    assert [m.is_local_layer(i) for i in range(8)] == [True] * 3 + [False] + [True] * 3 + [False]


def test_llama4_scout():
    # meta-llama/Llama-4-Scout-17B-16E's config.json: 16 experts, interleave_moe_layer_step 1
    # (every layer MoE); otherwise Maverick's text model
    m = _shipped("llama4-scout")
    assert m == _variant(_shipped("llama4-maverick"), moe={"experts": 16, "layer_freq": 1})
    assert m.moe_layers == 48
    assert tf.total_params(m) == pytest.approx(109e9, rel=0.02)
    assert tf.active_params(m) == pytest.approx(17e9, rel=0.02)
