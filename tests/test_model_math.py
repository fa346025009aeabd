"""Model math against independently worked numbers: published parameter counts, the MFU
formulas of Megatron-LM (Narayanan et al. 2021) and Korthikanti et al. 2022, and closed-form
per-layer FLOPs."""

from __future__ import annotations

from fractions import Fraction

import pytest

from simulator.config.schema import ModelConfig
from simulator.errors import ConfigError
from simulator.model import comm as mc
from simulator.model import transformer as tf

LLAMA2_7B = ModelConfig(
    layers=32, hidden=4096, ffn_hidden=11008, heads=32, vocab=32000, seq_len=4096
)
LLAMA2_70B = ModelConfig(
    layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8, vocab=32000, seq_len=4096
)
LLAMA3_8B = ModelConfig(
    layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=128256, seq_len=8192
)
LLAMA3_405B = ModelConfig(
    layers=126, hidden=16384, ffn_hidden=53248, heads=128, kv_heads=8, vocab=128256, seq_len=8192
)


def gpt(layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048) -> ModelConfig:
    # Megatron-LM's GPT ties the LM head to the word embedding (as GPT-2/3 do)
    return ModelConfig(
        layers=layers, hidden=hidden, heads=heads, vocab=vocab, seq_len=seq, activation="gelu",
        tied_embeddings=True,
    )  # fmt: skip


GPT3_175B = gpt(96, 12288, 96)
GPT_22B = gpt(48, 6144, 64)  # Korthikanti et al. 2022, Table 3


# ------------------------------------------------------------------------------ parameters


@pytest.mark.parametrize(
    "model, expected",
    [
        # Worked by hand: l*(4h^2 or GQA projections + 3*h*ffn + 2h) + 2*V*h + h
        (LLAMA2_7B, 6_738_415_616),  # HF model card: 6.74B
        (LLAMA2_70B, 68_976_648_192),  # 68.98B
        (LLAMA3_8B, 8_030_261_248),  # 8.03B
        (LLAMA3_405B, 405_853_388_800),  # ~405.8B
    ],
)
def test_llama_parameter_counts(model, expected):
    assert tf.total_params(model) == expected


def test_gpt3_parameter_count_matches_megatron_formula():
    # Narayanan et al. 2021 Section 5.1: P = 12 l h^2 (1 + 13/(12h) + (V+s)/(12 l h)), which
    # counts learned position embeddings, one V x h matrix (tied head) and omits the
    # final LayerNorm (2h).
    m = GPT3_175B
    L, h, V, s = m.layers, m.hidden, m.vocab, m.seq_len
    formula = 12 * L * h * h * (1 + Fraction(13, 12 * h) + Fraction(V + s, 12 * L * h))
    assert tf.total_params(m) - tf.final_norm_params(m) == formula
    assert tf.final_norm_params(m) == 2 * h
    assert tf.layer_params(m) == 12 * h * h + 13 * h
    assert round(tf.total_params(m) / 1e9, 1) == 174.6


@pytest.mark.parametrize(
    "layers, h, heads, params_b",
    # Megatron-LM SC21 Table 1 (published params, billions)
    [(24, 2304, 24, 1.7), (30, 3072, 32, 3.6), (36, 4096, 32, 7.5), (40, 6144, 48, 18.4),
     (48, 8192, 64, 39.1), (60, 10240, 80, 76.1), (80, 12288, 96, 145.6),
     (96, 16384, 128, 310.1), (105, 20480, 128, 529.6), (128, 25600, 160, 1008.0)],
)  # fmt: skip
def test_megatron_table1_parameter_counts(layers, h, heads, params_b):
    assert tf.total_params(gpt(layers, h, heads)) / 1e9 == pytest.approx(params_b, abs=0.051)


def test_stage_params_add_up():
    m, split = LLAMA2_70B, [20, 20, 20, 20]
    last = len(split) - 1
    per = [tf.stage_params(m, n, first=i == 0, last=i == last) for i, n in enumerate(split)]
    assert sum(per) == tf.total_params(m)
    assert tf.stage_params(m, m.layers, first=True, last=True) == tf.total_params(m)
    # tied (GPT): one stage holds it once; with pp > 1 the last stage keeps its own copy
    g = GPT3_175B
    assert tf.head_params(g) == 0
    assert tf.stage_params(g, g.layers, first=True, last=True) == tf.total_params(g)
    two = tf.stage_params(g, 48, first=True, last=False) + tf.stage_params(
        g, 48, first=False, last=True
    )
    assert two == tf.total_params(g) + g.vocab * g.hidden


# ------------------------------------------------------------------------------ model FLOPs


@pytest.mark.parametrize("model", [GPT3_175B, GPT_22B, gpt(24, 2304, 24), gpt(3, 64, 4, 1000, 32)])
@pytest.mark.parametrize("B", [1, 4, 1536])
def test_model_flops_is_megatron_formula_exactly(model, B):
    L, h, V, s = model.layers, model.hidden, model.vocab, model.seq_len
    mfu = 72 * B * s * L * h * h * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * L * h))
    hfu = 96 * B * s * L * h * h * (1 + Fraction(s, 6 * h) + Fraction(V, 16 * L * h))
    # Narayanan et al. 2021 eq. 3: attention counted non-causal
    assert tf.model_flops_per_step(model, B, causal=False) == float(mfu)
    assert tf.hardware_flops_per_step(model, B, "full") == float(hfu)
    assert tf.hardware_flops_per_step(model, B, "none") == float(mfu)
    # selective recompute re-runs QK^T and PV: 4 B s^2 h per layer
    assert tf.hardware_flops_per_step(model, B, "selective") == float(mfu + 4 * B * s * s * h * L)
    # The default (MFU) counts causal attention, as Megatron-LM's num_floating_point_operations:
    # half of the s x s matrix, s/(12h) in place of s/(6h).
    causal = 72 * B * s * L * h * h * (1 + Fraction(s, 12 * h) + Fraction(V, 12 * L * h))
    assert tf.model_flops_per_step(model, B) == float(causal)


@pytest.mark.parametrize("model", [LLAMA2_7B, LLAMA2_70B, LLAMA3_405B])
def test_model_flops_llama_is_6N_plus_attention(model):
    # 6 x (matmul parameters) per token (Kaplan et al. 2020) + 6 l s h causal attention per
    # token (12 l s h non-causal, PaLM's 12 L H Q T)
    B, s, h, L = 8, model.seq_len, model.hidden, model.layers
    norms_per_layer = 2 * h
    n_matmul = L * (tf.layer_params(model) - norms_per_layer) + model.vocab * h
    assert tf.model_flops_per_step(model, B) == 6 * n_matmul * B * s + 6 * L * s * h * B * s
    assert tf.model_flops_per_step(model, B, causal=False) == (
        6 * n_matmul * B * s + 12 * L * s * h * B * s
    )


@pytest.mark.parametrize(
    "model, B, n_gpus, time_s, mfu",
    # Korthikanti et al. 2022 Table 5 (selective recompute + SP), A100 peak 312 TFLOP/s
    [(GPT_22B, 4, 8, 1.10, 0.415), (GPT3_175B, 64, 64, 13.75, 0.514),
     (gpt(105, 20480, 128), 280, 280, 37.83, 0.560), (gpt(128, 25600, 160), 512, 512, 71.49, 0.563)],
)  # fmt: skip
def test_korthikanti_table5_mfu(model, B, n_gpus, time_s, mfu):
    # the paper counts attention non-causal
    got = tf.model_flops_per_step(model, B, causal=False) / (time_s * n_gpus * 312e12)
    assert got == pytest.approx(mfu, abs=0.003)


def test_sc21_model_vs_hardware_flops_ratio():
    # published.yaml megatron-sc21-table1-1.7B: 137 TFLOP/s hardware -> 0.335 model-FLOPs MFU
    m = gpt(24, 2304, 24)
    ratio = tf.model_flops_per_step(m, 512, causal=False) / tf.hardware_flops_per_step(
        m, 512, "full"
    )
    assert 137e12 * ratio / 312e12 == pytest.approx(0.335, abs=0.001)


# ------------------------------------------------------------------------------ layer ops


def _sum(ops, kind=None, backward=None):
    return sum(
        o.flops
        for o in ops
        if (kind is None or o.kind == kind) and (backward is None or o.backward == backward)
    )


@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("b", [1, 4])
def test_gpt_layer_flops_closed_form(tp, sp, b):
    m = GPT_22B
    s, h = m.seq_len, m.hidden
    fwd = tf.layer_forward_ops(m, micro_batch=b, tp=tp, sequence_parallel=sp)
    bwd = tf.layer_backward_ops(m, micro_batch=b, tp=tp, sequence_parallel=sp)
    # Narayanan et al. 2021 Appendix: 24 b s h^2 weight GEMMs, 4 b s^2 h attention (non-causal)
    assert tp * _sum(fwd, "gemm") == 24 * b * s * h * h
    assert tp * _sum(fwd, "attention") == 2 * b * s * s * h  # causal execution halves it
    assert _sum(bwd, "gemm") == 2 * _sum(fwd, "gemm")
    assert _sum(bwd, "attention") == 2.5 * _sum(fwd, "attention")
    assert _sum(fwd, "memory") == 0
    # unfused attention computes the full s x s: 4 b s^2 h forward, 2x backward
    fwd_u = tf.layer_forward_ops(
        m, micro_batch=b, tp=tp, sequence_parallel=sp, flash_attention=False
    )
    bwd_u = tf.layer_backward_ops(
        m, micro_batch=b, tp=tp, sequence_parallel=sp, flash_attention=False
    )
    assert tp * _sum(fwd_u) == 24 * b * s * h * h + 4 * b * s * s * h
    assert _sum(bwd_u) == 2 * _sum(fwd_u)


def test_layer_flops_match_model_flops_helper():
    for m in (LLAMA2_70B, LLAMA3_8B, GPT_22B):
        fwd = tf.layer_forward_ops(m, micro_batch=2, tp=8, sequence_parallel=True)
        tokens = 2 * m.seq_len
        assert 8 * _sum(fwd) == tf.layer_forward_flops(m, tokens, causal=True)


def test_op_order_and_names():
    names = [
        o.name
        for o in tf.layer_forward_ops(LLAMA2_70B, micro_batch=1, tp=8, sequence_parallel=True)
    ]
    assert names == [
        "norm1",
        "qkv",
        "rope",
        "attn",
        "out_proj",
        "residual1",
        "norm2",
        "fc1",
        "act",
        "fc2",
        "residual2",
    ]
    names = [
        o.name for o in tf.layer_forward_ops(GPT_22B, micro_batch=1, tp=8, sequence_parallel=False)
    ]
    assert "rope" not in names
    bwd = [
        o.name
        for o in tf.layer_backward_ops(LLAMA2_70B, micro_batch=1, tp=8, sequence_parallel=True)
    ]
    assert bwd[:4] == ["residual2", "fc2_dgrad", "fc2_wgrad", "act"]
    assert bwd[-3:] == ["qkv_dgrad", "qkv_wgrad", "norm1"]
    assert all(
        o.backward
        for o in tf.layer_backward_ops(LLAMA2_70B, micro_batch=1, tp=8, sequence_parallel=True)
    )


def test_gqa_swiglu_shapes_per_rank():
    m, tp, b = LLAMA2_70B, 8, 2
    ops = {o.name: o for o in tf.layer_forward_ops(m, micro_batch=b, tp=tp, sequence_parallel=True)}
    T = b * m.seq_len
    assert (ops["qkv"].m, ops["qkv"].k, ops["qkv"].n) == (T, 8192, (8 + 2 * 1) * 128)
    a = ops["attn"]
    assert (a.batch, a.heads, a.kv_heads, a.seq, a.head_dim) == (2, 8, 1, 4096, 128)
    assert (ops["out_proj"].m, ops["out_proj"].k, ops["out_proj"].n) == (T, 1024, 8192)
    assert ops["fc1"].n == 2 * 28672 // 8
    assert (ops["fc2"].k, ops["fc2"].n) == (28672 // 8, 8192)
    # kv heads replicated when tp > kv_heads
    ops16 = {
        o.name: o for o in tf.layer_forward_ops(m, micro_batch=1, tp=16, sequence_parallel=True)
    }
    assert ops16["attn"].kv_heads == 1 and ops16["attn"].heads == 4
    gelu = {
        o.name: o
        for o in tf.layer_forward_ops(GPT_22B, micro_batch=1, tp=8, sequence_parallel=False)
    }
    assert gelu["fc1"].n == 4 * 6144 // 8


def test_backward_gemm_shapes():
    fwd = {
        o.name: o
        for o in tf.layer_forward_ops(LLAMA3_8B, micro_batch=1, tp=2, sequence_parallel=False)
    }
    bwd = {
        o.name: o
        for o in tf.layer_backward_ops(LLAMA3_8B, micro_batch=1, tp=2, sequence_parallel=False)
    }
    for name in ("qkv", "out_proj", "fc1", "fc2"):
        f = fwd[name]
        dg, wg = bwd[name + "_dgrad"], bwd[name + "_wgrad"]
        assert (dg.m, dg.k, dg.n) == (f.m, f.n, f.k)  # dX = dY W^T
        assert (wg.m, wg.k, wg.n) == (f.k, f.m, f.n)  # dW = X^T dY


def test_sequence_parallel_splits_memory_ops():
    kw = dict(micro_batch=1, tp=8)
    a = {o.name: o for o in tf.layer_forward_ops(LLAMA2_70B, sequence_parallel=False, **kw)}
    b = {o.name: o for o in tf.layer_forward_ops(LLAMA2_70B, sequence_parallel=True, **kw)}
    for name in ("norm1", "norm2", "residual1", "residual2"):
        assert a[name].bytes == 8 * b[name].bytes
    for name in ("qkv", "fc1", "act", "attn"):
        assert a[name].bytes == b[name].bytes
    # norm forward reads x and writes y: 2 tensors of b*s*h
    assert a["norm1"].bytes == 2 * 4096 * 8192 * 2


def test_memory_op_backward_bytes_are_1p5_to_2x_forward():
    for m in (LLAMA2_70B, GPT_22B):
        f = {
            o.name: o for o in tf.layer_forward_ops(m, micro_batch=1, tp=4, sequence_parallel=True)
        }
        for o in tf.layer_backward_ops(m, micro_batch=1, tp=4, sequence_parallel=True):
            if o.kind == "memory":
                assert 1.0 <= o.bytes / f[o.name].bytes <= 2.0, o.name


def test_head_and_embedding_ops():
    m, b, tp = LLAMA3_8B, 2, 4
    T = b * m.seq_len
    head = tf.head_forward_ops(m, micro_batch=b, tp=tp, sequence_parallel=True)
    assert [o.name for o in head] == ["final_norm", "lm_head", "cross_entropy"]
    lm = head[1]
    assert (lm.m, lm.k, lm.n) == (T, 4096, 128256 // 4)
    assert tp * lm.flops == 2 * T * m.hidden * m.vocab
    hb = tf.head_backward_ops(m, micro_batch=b, tp=tp, sequence_parallel=True)
    assert [o.name for o in hb] == ["cross_entropy", "lm_head_dgrad", "lm_head_wgrad", "final_norm"]
    assert _sum(hb) == 2 * lm.flops
    assert head[2].bytes == T * (128256 // 4) * (2 + 36)  # fp32 loss passes over V/tp logits
    emb = tf.embedding_forward_ops(m, micro_batch=b, tp=tp, sequence_parallel=True)
    assert [o.name for o in emb] == ["embed"] and _sum(emb) == 0
    g = tf.embedding_forward_ops(GPT_22B, micro_batch=1, tp=8, sequence_parallel=True)
    assert [o.name for o in g] == ["embed", "pos_embed", "embed_dropout"]
    gb = tf.embedding_backward_ops(GPT_22B, micro_batch=1, tp=8, sequence_parallel=True)
    assert [o.name for o in gb] == ["embed_dropout", "pos_embed", "embed_mask", "embed_sort",
                                    "embed_zero", "embed_partial", "embed_scatter"]


def test_optimizer_ops_bytes_per_param():
    n = 1e9
    ops = tf.optimizer_ops(n, param_dtype="bf16", grad_dtype="fp32")
    assert [o.name for o in ops] == ["grad_norm", "adam"]
    assert ops[0].bytes == 4 * n
    assert ops[1].bytes == (4 + 12 + 12 + 2) * n  # read g, master, m, v; write those + bf16 copy
    ops = tf.optimizer_ops(n, param_dtype="fp32", grad_dtype="bf16")
    assert ops[1].bytes == 28 * n
    with pytest.raises(ConfigError):
        tf.optimizer_ops(n, param_dtype="int4", grad_dtype="bf16")
    with pytest.raises(ConfigError):
        tf.optimizer_ops(n, param_dtype="fp32", grad_dtype="fp32", impl="apex")


def test_foreach_adamw_passes():
    """torch.optim.AdamW(foreach=True) over fp32 parameters, fp32 gradients and moments, pass
    by pass (read + write, 4 bytes each): weight decay on p 8; lerp_(m, g) 12; v *= beta2 8;
    addcmul_(v, g, g) 12; sqrt(v) into a new list 8; /= 8; += eps 8; addcdiv_(p, m, denom) 16."""
    n = 1e9
    passes = 8 + 12 + 8 + 12 + 8 + 8 + 8 + 16
    assert passes == 80
    ops = tf.optimizer_ops(n, param_dtype="fp32", grad_dtype="fp32", impl="foreach")
    assert ops[1].bytes == passes * n
    # bf16 moments: the seven passes over m or v move 2-byte elements (14 of them), the
    # parameter passes 16 bytes, the gradient 2 reads of 4: 16 + 8 + 28
    ops = tf.optimizer_ops(n, param_dtype="fp32", grad_dtype="fp32", moments_dtype="bf16",
                           impl="foreach")
    assert ops[1].bytes == 52 * n


def test_comm_volumes():
    m = LLAMA2_70B
    assert tf.tp_comm_bytes(m, micro_batch=2) == 2 * 4096 * 8192 * 2
    kw = dict(micro_batch=1, tp=8)
    assert tf.pp_activation_bytes(m, sequence_parallel=True, **kw) == 4096 * 8192 * 2 / 8
    assert tf.pp_activation_bytes(m, sequence_parallel=False, **kw) == 4096 * 8192 * 2
    assert (
        tf.pp_activation_bytes(m, sequence_parallel=False, scatter_gather=True, **kw)
        == 4096 * 8192 * 2 / 8
    )


def test_tp_collectives_are_ops_at_megatrons_places():
    """Shoeybi et al. 2019 Fig. 4: two all-reduces per layer forward, after the row-parallel
    GEMMs, two in backward after the column-parallel input gradients (overlapping the weight
    gradients). With SP (Korthikanti et al. 2022 Sec. 4.2): forward all-gather before qkv and
    fc1, reduce-scatter after out_proj and fc2; backward adds the two re-gathers of the
    sharded input."""
    m = LLAMA2_70B
    x = 4096 * 8192 * 2.0

    def seq(sp, bwd):
        ops = mc.layer_ops(m, micro_batch=1, tp=8, sequence_parallel=sp, backward=bwd)
        out, prev = [], None
        for op in ops:
            if op.kind == "comm":
                assert op.dim == "tp" and op.bytes == x
                out.append((op.collective, prev, op.overlap))
            prev = op.name
        return out

    assert seq(False, False) == [("all_reduce", "out_proj", False), ("all_reduce", "fc2", False)]
    assert seq(False, True) == [("all_reduce", "fc1_dgrad", True), ("all_reduce", "qkv_dgrad", True)]
    fwd_sp = seq(True, False)
    assert [c for c, _, _ in fwd_sp] == ["all_gather", "reduce_scatter"] * 2
    bwd_sp = seq(True, True)
    assert [c for c, _, _ in bwd_sp].count("all_gather") == 4
    assert [c for c, _, _ in bwd_sp].count("reduce_scatter") == 2
    assert all(o for c, _, o in bwd_sp if c == "reduce_scatter")


def test_invalid_tp_raises_config_error():
    with pytest.raises(ConfigError) as e:
        tf.layer_forward_ops(LLAMA2_70B, micro_batch=1, tp=3, sequence_parallel=False)
    assert e.value.field == "parallelism.tp"
    with pytest.raises(ConfigError):
        tf.hardware_flops_per_step(LLAMA2_7B, 8, "some")
