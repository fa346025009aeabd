"""Eager-PyTorch kernels (``training.kernels: eager``) and AMP master-weight casts against hand
counts written tensor by tensor, and invariants between the fused and eager op lists."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from simulator.config.load import load_workload
from simulator.config.schema import ModelConfig
from simulator.engine.build import Machine
from simulator.errors import ConfigError
from simulator.model import transformer as tf
from simulator.network.collectives import Step
from simulator.run import simulate
from tests.conftest import small_topology, write_case
from tests.stubs import NoLinks, StubGpu

# A small Llama (swiglu, rmsnorm, RoPE, GQA) and a small GPT (gelu, layernorm, biases, dropout)
LLAMA = ModelConfig(
    layers=2, hidden=64, ffn_hidden=128, heads=4, kv_heads=2, vocab=100, seq_len=8
)  # fmt: skip
GPT = ModelConfig(
    layers=2, hidden=64, ffn_hidden=256, heads=4, vocab=100, seq_len=8, activation="gelu"
)  # fmt: skip


def mem_bytes(ops) -> float:
    return sum(o.bytes for o in ops if o.kind == "memory")


def layer(model, fn, **kw):
    base = dict(micro_batch=2, tp=1, sequence_parallel=False)
    return fn(model, **{**base, **kw})


# ------------------------------------------------------------------------------ hand counts


def test_llama_eager_layer_bytes_match_hand_count():
    # b=2 sequences of s=8 tokens: T=16; h=64; q heads 4 x 16 = 64, kv heads 2 x 16 = 32;
    # ffn 128. fp32 master weights and residual stream, bf16 compute.
    T, h, qw, kvw, f, s, hd = 16, 64, 64, 32, 128, 8, 16
    X = T * h
    # RMSNorm forward: pow (r4 w4), mean (r4 X, w4 T), +eps (T), rsqrt (T), xf*r (r4 X + T,
    # w4), *weight (r4 X + h, w4), .to(bf16) (r4 w2)
    norm_fwd = 8 * X + (4 * X + 4 * T) + 8 * T + 8 * T + (8 * X + 4 * T) + (8 * X + 4 * h) + 6 * X
    weights = {"qkv": h * (qw + 2 * kvw), "out_proj": qw * h, "fc1": h * 2 * f, "fc2": f * h}
    # RoPE on a bf16 tensor of e elements: x*cos (r e + table, w e), -x2 (r e/2, w e/2),
    # cat (r e, w e), *sin (r e + table, w e), add (r 2e, w e); tables cast fp32->bf16 (6 B)
    rope = sum(20 * e + 4 * s * hd for e in (T * qw, T * kvw)) + 2 * 6 * s * hd
    residual = 4 * X + 2 * X + 4 * X  # fp32 x + bf16 branch -> fp32
    mlp = 4 * T * f + 6 * T * f  # silu(gate) (r2 w2), * up (r2+2, w2)
    fwd = 2 * norm_fwd + 6 * sum(weights.values()) + rope + 2 * residual + mlp

    # RMSNorm backward: .to backward (r2 w4); dy*y (12X); dy*w (8X + 4h); sum -> dw (4X + 4h);
    # .grad += dw (12h); dy*xf (12X); dy*r (8X + 4T); sum -> dr (4X + 4T); rsqrt backward
    # -0.5*g*r^3 (8T + 8T + 12T); mean backward (r4 T, w4 X); pow backward xf.pow(1) copy
    # (8X), *2 (8X), g* (12X); x has 3 uses (pow, *r, residual) -> 2 gradient sums (12X each)
    norm_bwd = (
        6 * X + 12 * X + (8 * X + 4 * h) + (4 * X + 4 * h) + 12 * h + 12 * X + (8 * X + 4 * T)
        + (4 * X + 4 * T) + 28 * T + (4 * T + 4 * X) + 8 * X + 8 * X + 12 * X + 24 * X
    )  # fmt: skip
    branch_cast = 6 * X  # residual gradient fp32 -> bf16 for the branch
    grad_acc = 18 * sum(weights.values())  # bf16 wgrad -> fp32 (6 B) and .grad += (12 B)
    # mul backward: two muls (6 Tf each); silu_backward (r g, gate; w: 6 Tf); chunk backward = cat
    # of the two halves into [T, 2f] (8 Tf)
    mlp_bwd = 6 * T * f + 6 * T * f + 6 * T * f + 8 * T * f
    rope_bwd = sum(20 * e + 4 * s * hd for e in (T * qw, T * kvw))  # *sin, -half, *cos, cat, add
    qkv_cat = 2 * 2 * T * (qw + 2 * kvw)  # split backward: cat of dq, dk, dv
    bwd = 2 * norm_bwd + 2 * branch_cast + grad_acc + mlp_bwd + rope_bwd + qkv_cat

    kw = dict(kernels="eager", param_dtype="fp32")
    f_ops, b_ops = (
        layer(LLAMA, tf.layer_forward_ops, **kw),
        layer(LLAMA, tf.layer_backward_ops, **kw),
    )
    assert mem_bytes(f_ops) == fwd
    assert mem_bytes(b_ops) == bwd
    # one op per kernel (aten trace of measure.py's DecoderLayer: 34 forward, 59 backward)
    assert sum(o.kind == "memory" for o in f_ops) == 34
    assert sum(o.kind == "memory" for o in b_ops) == 59


def test_gpt_eager_forward_bytes_match_hand_count():
    # nanoGPT block, fp32 params: LayerNorm (r4 w4 + mean/rstd 8T + gain/bias 8h), autocast's
    # cast of the Linear input (6X), weight and bias casts (6 B each), GELU (r2 w2), dropout on
    # the bf16 branch (r2 w2 + 1 B mask), fp32 residual add (10X); flash attention (dropout in
    # the kernel) and the GEMMs are not memory ops.
    T, h, f = 16, 64, 256
    X = T * h
    ln = 8 * X + 8 * T + 8 * h + 6 * X
    casts = 6 * (h * 3 * h + 3 * h + h * h + h + h * f + f + f * h + h)
    fwd = 2 * ln + casts + 4 * T * f + 2 * (5 * X + 10 * X)
    ops = layer(GPT, tf.layer_forward_ops, kernels="eager", param_dtype="fp32")
    assert mem_bytes(ops) == fwd


def test_bf16_parameters_keep_a_bf16_residual_stream():
    # FSDP mixed precision hands bf16 weights to the module: no weight casts, the residual add
    # is bf16 + bf16 -> bf16 (6 B), and RMSNorm starts with x.float() (r2 w4)
    ops = {o.name: o for o in layer(LLAMA, tf.layer_forward_ops, kernels="eager")}
    X = 16 * 64
    assert ops["residual1"].bytes == 6 * X
    assert ops["norm1_upcast"].bytes == 6 * X
    assert not any(n.endswith("_wcast") for n in ops)


# ------------------------------------------------------------------------------ invariants

CASES = list(
    itertools.product(
        [LLAMA, GPT], [1, 2], [False, True], [True, False], ["bf16", "fp32"]
    )
)  # fmt: skip


def all_ops(model, tp, sp, flash, kernels, param_dtype):
    kw = dict(micro_batch=2, tp=tp, sequence_parallel=sp, kernels=kernels, param_dtype=param_dtype)
    return {
        "layer_fwd": tf.layer_forward_ops(model, flash_attention=flash, **kw),
        "layer_bwd": tf.layer_backward_ops(model, flash_attention=flash, **kw),
        "embed_fwd": tf.embedding_forward_ops(model, **kw),
        "embed_bwd": tf.embedding_backward_ops(model, **kw),
        "head_fwd": tf.head_forward_ops(model, **kw),
        "head_bwd": tf.head_backward_ops(model, **kw),
    }


@pytest.mark.parametrize("model, tp, sp, flash, pdt", CASES)
def test_eager_moves_at_least_the_fused_bytes_and_the_same_flops(model, tp, sp, flash, pdt):
    fused = all_ops(model, tp, sp, flash, "fused", pdt)
    eager = all_ops(model, tp, sp, flash, "eager", pdt)
    for part in fused:
        # except the tp = 1 loss: F.cross_entropy's log_softmax reads a row once (14 B per
        # logit forward) where Megatron's vocab-parallel loss makes five passes (d + 36 B)
        if not (part == "head_fwd" and tp == 1):
            assert mem_bytes(eager[part]) >= mem_bytes(fused[part]), part
        assert sum(o.flops for o in eager[part]) == sum(o.flops for o in fused[part]), part
        # the same GEMMs and attention kernels, in the same order
        big = [(o.name, o.m, o.k, o.n, o.batch) for o in fused[part] if o.kind != "memory"]
        assert big == [(o.name, o.m, o.k, o.n, o.batch) for o in eager[part] if o.kind != "memory"]


@pytest.mark.parametrize("kernels", ["fused", "eager"])
def test_master_weight_casts_scale_with_parameters(kernels):
    # per micro-batch and TP rank: fp32 -> bf16 cast of every GEMM weight (6 B), and in the
    # backward the bf16 -> fp32 cast (6 B) and .grad += (12 B) of its gradient
    for tp in (1, 2):
        kw = dict(micro_batch=1, tp=tp, kernels=kernels, param_dtype="fp32")
        fwd = layer(LLAMA, tf.layer_forward_ops, **kw)
        bwd = layer(LLAMA, tf.layer_backward_ops, **kw)
        h, hd = LLAMA.hidden, LLAMA.head_dim
        w = (h * (LLAMA.heads + 2 * LLAMA.n_kv_heads) * hd + LLAMA.heads * hd * h) // tp
        w += 3 * h * LLAMA.ffn // tp
        assert sum(o.bytes for o in fwd if o.name.endswith("_wcast")) == 6 * w
        assert sum(o.bytes for o in bwd if o.name.endswith("_gcast")) == 6 * w
        assert sum(o.bytes for o in bwd if o.name.endswith("_gacc") and "norm" not in o.name) == (
            12 * w
        )
        # independent of the tokens in the micro-batch
        fwd4 = layer(LLAMA, tf.layer_forward_ops, **{**kw, "micro_batch": 4})
        assert sum(o.bytes for o in fwd4 if o.name.endswith("_wcast")) == 6 * w


def test_fused_fp32_is_fused_bf16_plus_the_casts():
    for fn in (tf.layer_forward_ops, tf.layer_backward_ops, tf.head_forward_ops):
        a = layer(GPT, fn)
        b = layer(GPT, fn, param_dtype="fp32")
        extra = [o for o in b if o.name.endswith(("_wcast", "_gcast", "_gacc"))]
        assert [o for o in b if o not in extra] == a
        assert extra


def test_unknown_kernels_raises_config_error():
    with pytest.raises(ConfigError) as e:
        layer(LLAMA, tf.layer_forward_ops, kernels="compiled")
    assert e.value.field == "training.kernels"


# ------------------------------------------------------------------------------ engine


class BytesCompute:
    """Only memory-bound kernels take time: 1 s per 1e12 bytes."""

    gpu = StubGpu()

    def gemm_s(self, m, k, n, dtype="bf16"):
        return 0.0

    def attention_s(self, *a, **kw):
        return 0.0

    def memory_s(self, nbytes, access="stream"):
        return nbytes / 1e12


class _NoComm:
    """Collectives of a one-GPU group: free."""

    def launch_s(self, op, group):
        return 0.0

    def cost(self, op, groups, nbytes, algorithm=None):
        return SimpleNamespace(time_s=0.0)

    def bundles(self, op, groups, nbytes):
        return [Step((), 0.0)]


def step_s(tmp_path, microbatches: int, param_dtype: str, kernels: str = "fused") -> float:
    model = {"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "kv_heads": 2,
             "vocab": 100, "seq_len": 8}  # fmt: skip
    work = {
        "name": "t",
        "model": model,
        "training": {"global_batch": microbatches, "micro_batch": 1, "param_dtype": param_dtype,
                     "kernels": kernels},
    }  # fmt: skip
    path = write_case(tmp_path, work, small_topology(1, 1))
    machine = Machine(StubGpu(), NoLinks(), BytesCompute(), _NoComm())
    return simulate(load_workload(path), machine=machine).summary["step_time_s"]


def test_engine_runs_the_casts_once_per_micro_batch(tmp_path):
    # fp32 - bf16 step time = m * (per-micro-batch casts) + (optimizer difference)
    d = {m: step_s(tmp_path, m, "fp32") - step_s(tmp_path, m, "bf16") for m in (1, 2, 4)}
    h, hd, L = 64, 16, 2
    w = L * (h * (4 + 2 * 2) * hd + 4 * hd * h + 3 * h * 128) + h * 100  # layers + LM head
    per_mb = 24 * w / 1e12  # 6 (cast) + 6 (gradient cast) + 12 (.grad +=) bytes per weight
    # the word embedding's dense gradient (transformer.embedding_weight_grad_ops): fp32 dY
    # zero-fills 4 bytes an element, not 2, and adds into .grad (12) where bf16 adds into
    # an fp32 main_grad (2 + 4 + 4); its partial sums and scatter read / write 4-byte dY rows
    per_mb += (100 * 64 * (2 + 2) + 8 * 64 * (2 + 2)) / 1e12
    assert d[2] - d[1] == pytest.approx(per_mb, rel=1e-9)
    assert d[4] - d[2] == pytest.approx(2 * per_mb, rel=1e-9)
    assert step_s(tmp_path, 2, "fp32", "eager") > step_s(tmp_path, 2, "fp32")
