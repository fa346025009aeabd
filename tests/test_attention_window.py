"""Local attention windows (``model.attention_window``, ``attention_window_kind``,
``attention_window_pattern``: GPT-OSS's sliding 128-token windows on every other layer, Llama
4's 8192-token chunks on three layers of four): the query-key pairs against a count of them,
the model FLOPs and the kernel's FLOPs in closed form, the kernel time by the causal kernel's
per-key rule, no window equal to today's model, and bad input as one line naming the field."""

from __future__ import annotations

import copy

import pytest

from simulator.config.schema import ModelConfig
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.model import transformer as tf
from simulator.model.ops import flash_attention_op, local_dims
from tests.conftest import run_summary, small_topology
from tests.test_bad_input import BASE_WORK, expect, fails, write

DENSE = {
    "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 8,
    "vocab": 32000, "seq_len": 4096, "activation": "swiglu",
}  # fmt: skip


def _model(**kw) -> ModelConfig:
    return ModelConfig.model_validate({**DENSE, **kw})


@pytest.mark.parametrize("s,w", [(4096, 128), (4096, 1024), (1000, 7), (64, 64)])
def test_sliding_pairs_against_a_count(s, w):
    # query i sees keys max(0, i-w+1)..i: min(i+1, w) of them
    count = sum(min(i + 1, w) for i in range(s))
    half = tf.window_pairs2(s, w, "sliding") / 2  # s w - w^2 / 2
    assert abs(count - half) <= w / 2  # the diagonal's half, as s^2/2 against s(s+1)/2
    if w == s:
        assert half == s * s / 2  # a window of the whole sequence is causal attention


@pytest.mark.parametrize("s,c", [(8192, 2048), (4096, 4096), (16384, 8192)])
def test_chunked_pairs_against_a_count(s, c):
    count = sum(min(i % c + 1, c) for i in range(s))  # causal inside each chunk
    assert abs(count - tf.window_pairs2(s, c, "chunked") / 2) <= s / 2  # (s/c) c^2/2


def test_model_flops_of_gpt_oss_and_llama4_patterns():
    s, h, B = 4096, 1024, 2
    full = _model()
    # GPT-OSS: sliding 128 on layers 0 and 2, full on 1 and 3
    m = _model(attention_window=128, attention_window_pattern=2)
    assert [m.is_local_layer(i) for i in range(4)] == [True, False, True, False]
    per_pair = 4 * h  # QK^T and PV: 2 x 2 h FLOPs a pair (heads x head_dim = h)
    causal = s * s // 2
    sliding = s * 128 - 128 * 128 // 2
    diff = 3 * B * 2 * per_pair * (causal - sliding)
    assert tf.model_flops_per_step(full, B) - tf.model_flops_per_step(m, B) == diff
    # Llama 4: chunks of 1024 on layers 0, 1, 2; full on layer 3
    m = _model(attention_window=1024, attention_window_kind="chunked", attention_window_pattern=4)
    assert [m.is_local_layer(i) for i in range(4)] == [True, True, True, False]
    chunked = (s // 1024) * 1024 * 1024 // 2
    diff = 3 * B * 3 * per_pair * (causal - chunked)
    assert tf.model_flops_per_step(full, B) - tf.model_flops_per_step(m, B) == diff
    # no window, or a pattern without local layers: today's model
    assert tf.model_flops_per_step(_model(attention_window=128, attention_window_pattern=[0] * 4),
                                   B) == tf.model_flops_per_step(full, B)  # fmt: skip


def test_kernel_flops_and_time():
    cm = ComputeModel(load_gpu("H100-SXM-80GB"))
    b, s, tp = 1, 8192, 2
    loc = local_dims(_model(seq_len=s, attention_window=128), b, tp, False)
    full = local_dims(_model(seq_len=s), b, tp, False)
    chunk = local_dims(_model(seq_len=s, attention_window=2048,
                              attention_window_kind="chunked"), b, tp, False)  # fmt: skip
    hq, hd = 8, 64
    for bwd, f in ((False, 1.0), (True, 2.5)):
        op = flash_attention_op(loc, 2, bwd)
        assert op.flops == f * 2 * b * hq * (2 * s * 128 - 128 * 128) * hd
        assert op.bytes == flash_attention_op(full, 2, bwd).bytes  # Q, K, V, O once
        c = flash_attention_op(chunk, 2, bwd)
        assert c.flops == f * 2 * b * hq * s * 2048 * hd and (c.batch, c.seq) == (4, 2048)
    # the same per-key rule: a window of the whole sequence is the causal kernel; a smaller
    # window costs less (128 of 8192: about 16x fewer keys per row tile, less the fixed costs)
    t_full = cm.attention_s(b, hq, s, hd, kv_heads=4)
    assert cm.attention_s(b, hq, s, hd, kv_heads=4, window=s) == t_full
    ts = [cm.attention_s(b, hq, s, hd, kv_heads=4, window=w) for w in (128, 1024, 4096)]
    assert 0 < ts[0] < t_full / 5 and ts == sorted(ts) and ts[-1] < t_full
    # chunks: s/c causal sequences of c, cheaper than the whole causal sequence
    assert cm.attention_s(4, hq, 2048, hd, kv_heads=4) < t_full


WORK = {
    "name": "small-window",
    "model": {**DENSE, "attention_window": 128, "attention_window_pattern": 2},
    "training": {"global_batch": 16, "micro_batch": 1, "precision": "bf16"},
    "parallelism": {"tp": 2, "pp": 2, "zero": 1, "sequence_parallel": True},
}


def _run(tmp_path, capsys, work) -> dict:
    return run_summary(tmp_path, capsys, work, small_topology(1, 8))


def test_engine_runs_local_layers(tmp_path, capsys):
    w = copy.deepcopy(WORK)
    win = _run(tmp_path, capsys, w)
    w["model"]["attention_window_pattern"] = [0, 0, 0, 0]
    assert _run(tmp_path, capsys, w) == _run(tmp_path, capsys, {**w, "model": DENSE})
    assert win["step_time_s"] < _run(tmp_path, capsys, w)["step_time_s"]


@pytest.mark.parametrize(
    "model,field,words",
    [
        ({"attention_window": 4096}, "model.attention_window", ["exceeds seq_len=1024"]),
        ({"attention_window": 1000, "attention_window_kind": "chunked"},
         "model.attention_window", ["must divide seq_len=1024"]),
        ({"attention_window": 128, "attention_window_pattern": [1, 0]},
         "model.attention_window_pattern", ["has 2 entries", "layers=8"]),
        ({"attention_window": 128, "attention_window_kind": "local"},
         "model.attention_window_kind", ["sliding", "chunked"]),
        ({"attention_window_pattern": 2}, "model.attention_window_pattern",
         ["needs an attention_window"]),
        ({"attention_window_kind": "chunked"}, "model.attention_window_kind",
         ["needs an attention_window"]),
    ],
)  # fmt: skip
def test_bad_windows(tmp_path, capsys, model, field, words):
    w = copy.deepcopy(BASE_WORK)
    w["model"].update(model)
    p = write(tmp_path, w)
    expect(fails(capsys, tmp_path, "run", str(p)), p, field, *words)


@pytest.mark.parametrize(
    "model,field",
    [({"attention_window": 128, "attention_window_pattern": 0}, "model.attention_window_pattern"),
     ({"attention_window": 128, "attention_window_pattern": [1, 2]},
      "model.attention_window_pattern"),
     ({"moe": {"experts": 4, "top_k": 1, "ffn_hidden": 256, "layer_freq": -2}},
      "model.moe.layer_freq")],
)  # fmt: skip
def test_bad_pattern_says_got_once(tmp_path, capsys, model, field):
    # the loader appends ", got VALUE" to a validator's message: the pattern's must not too
    w = copy.deepcopy(BASE_WORK)
    w["model"].update(model)
    p = write(tmp_path, w)
    line = fails(capsys, tmp_path, "run", str(p))
    expect(line, p, field)
    assert line.count(", got ") == 1, line
