"""MoE and MLA model math against closed forms and published parameter counts."""

from __future__ import annotations

import pytest

from simulator.config.schema import ModelConfig
from simulator.model import mla, moe
from simulator.model import transformer as tf
from simulator.model.moe import Comm

# DeepSeek-V3 (arXiv:2412.19437, Section 4.2 and its config.json): 61 layers, h 7168, 128 heads,
# MLA ranks 1536 / 512, head dims 128 + 64 and 128, 3 dense layers of 18432, 256 routed experts
# of 2048 (top-8) and one shared, vocabulary 129,280.
DSV3 = ModelConfig(
    layers=61, hidden=7168, ffn_hidden=18432, heads=128, vocab=129280, seq_len=4096, mla={},
    moe=dict(experts=256, top_k=8, ffn_hidden=2048, shared_experts=1, dense_layers=3,
             router="sigmoid", router_groups=8, router_group_top_k=4),
)  # fmt: skip
# Mixtral 8x7B (arXiv:2401.04088, Table 1): 32 layers, h 4096, 32 heads, 8 KV heads, 8 experts
# of 14336, top-2, vocabulary 32000.
MIXTRAL = ModelConfig(
    layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=32000, seq_len=4096,
    moe=dict(experts=8, top_k=2, ffn_hidden=14336),
)  # fmt: skip
# Qwen3-235B-A22B (Qwen3 technical report, Table 2, and config.json): 94 layers, h 4096, 64
# query / 4 KV heads of 128, 128 experts of 1536, top-8, vocabulary 151,936.
QWEN3 = ModelConfig(
    layers=94, hidden=4096, ffn_hidden=12288, heads=64, kv_heads=4, kv_channels=128,
    vocab=151936, seq_len=4096, moe=dict(experts=128, top_k=8, ffn_hidden=1536),
)  # fmt: skip


@pytest.mark.parametrize(
    "model,total,active",
    [(DSV3, 671e9, 37e9), (MIXTRAL, 46.7e9, 12.9e9), (QWEN3, 235e9, 22e9)],
)
def test_published_parameter_counts(model, total, active):
    # The papers round to the stated digits; DeepSeek's 37 B is a rounded figure (2 %).
    assert tf.total_params(model) == pytest.approx(total, rel=0.002)
    assert tf.active_params(model) == pytest.approx(active, rel=0.02)


def test_mixtral_parameters_by_hand():
    h, L, kv, f, E, V = 4096, 32, 1024, 14336, 8, 32000
    attn = h * (h + 2 * kv) + h * h
    layer = attn + E * 3 * h * f + h * E + 2 * h
    assert tf.total_params(MIXTRAL) == L * layer + 2 * V * h + h
    active = attn + 2 * 3 * h * f + h * E + 2 * h
    assert tf.active_params(MIXTRAL) == L * active + 2 * V * h + h


def test_mla_parameters_by_hand():
    h, H, rq, rkv, dn, dr, dv = 7168, 128, 1536, 512, 128, 64, 128
    n = h * rq + rq + rq * H * (dn + dr) + h * (rkv + dr) + rkv + rkv * H * (dn + dv) + H * dv * h
    assert mla.mla_params(DSV3) == n == 187_107_328


def test_model_flops_count_active_parameters():
    # 3 x forward; forward = 2 x (active matrix entries) per token + causal attention
    # (2 s H hd per token for GQA; non-causal 4 s H hd) + the LM head.
    B, s, h, L = 8, 4096, 4096, 32
    mats = h * (h + 2 * 1024) + h * h + 2 * 3 * h * 14336 + h * 8
    fwd = B * s * (L * (2 * mats + 2 * s * 32 * 128) + 2 * h * 32000)
    assert tf.model_flops_per_step(MIXTRAL, B) == 3 * fwd
    non_causal = B * s * (L * (2 * mats + 4 * s * 32 * 128) + 2 * h * 32000)
    assert tf.model_flops_per_step(MIXTRAL, B, causal=False) == 3 * non_causal


def test_mla_attention_flops():
    # QK^T over d_n + d_r = 192 and PV over d_v = 128 per head, non-causal.
    assert mla.mla_attention_flops_per_token(DSV3) == 2 * 4096 * 128 * (192 + 128)


def _comms(ops, collective="all_to_all"):
    return [o for o in ops if isinstance(o, Comm) and o.collective == collective]


@pytest.mark.parametrize("ep,tp,b", [(8, 1, 1), (64, 1, 1), (4, 2, 2)])
def test_alltoall_bytes_per_rank(ep, tp, b):
    # tokens x top_k x hidden x bytes x (ep-1)/ep per direction, twice forward, twice backward
    loc = moe.moe_local(DSV3, b, tp, 1, ep, 1)
    t = b * 4096 // tp
    assert loc.tokens == t
    per = t * 8 * 7168 * 2 * (ep - 1) / ep
    assert moe.alltoall_bytes_per_rank(t, 8, 7168, 2, ep) == pytest.approx(per)
    kw = dict(tp=tp, ep=ep, etp=1, d=2)
    for ops in (moe.moe_forward_ops(DSV3, loc, **kw), moe.moe_backward_ops(DSV3, loc, **kw)):
        big = [c for c in _comms(ops) if c.name not in ("moe_counts", "moe_dispatch_probs")]
        assert len(big) == 2
        # nbytes as nccl-tests counts it (the whole send buffer); (ep-1)/ep leaves the rank
        assert all(c.nbytes * (ep - 1) / ep == pytest.approx(per) for c in big)
        # Megatron-Core's alltoall dispatcher sends each copy's fp32 probability beside it
        probs = [c for c in _comms(ops) if c.name == "moe_dispatch_probs"]
        assert [c.nbytes for c in probs] == [pytest.approx(t * 8 * 4)]


def test_uniform_load_spreads_copies_evenly():
    loc = moe.moe_local(DSV3, 1, 1, 1, 64, 1)
    assert loc.local_experts == 4 and loc.imbalance == pytest.approx(1.0)
    # each expert gets tokens * top_k * ep / experts copies
    assert loc.expert_tokens == pytest.approx((4096 * 8 * 64 / 256,) * 4)
    assert loc.received == pytest.approx(loc.sent) and loc.dropped == 0


def test_skewed_load_makes_the_busiest_rank_the_critical_path():
    # 8 experts, ep 4 (two per rank): experts 0 and 1 take half of all copies.
    load = (0.3, 0.2) + (0.5 / 6,) * 6
    loc = moe.moe_local(MIXTRAL, 1, 1, 1, 4, 1, load)
    N = 4 * 4096 * 2
    assert loc.expert_tokens == pytest.approx((0.3 * N, 0.2 * N))
    assert loc.imbalance == pytest.approx(0.5 / 0.25)
    assert loc.busiest_share == pytest.approx(0.5)
    # the busiest rank receives half of each of its 3 peers' copies
    assert loc.received == pytest.approx(3 * 4096 * 2 * 0.5)


def test_capacity_factor_drops_tokens_above_capacity():
    m = MIXTRAL.model_copy(update={"moe": MIXTRAL.moe.model_copy(update={"capacity_factor": 1.0})})
    load = (0.3, 0.2) + (0.5 / 6,) * 6
    loc = moe.moe_local(m, 1, 1, 1, 4, 1, load)
    cap = 4 * 4096 * 2 / 8  # capacity_factor * copies / experts
    assert max(loc.expert_tokens) == pytest.approx(cap)
    kept = 2 * cap + 6 * (0.5 / 6) * 4 * 4096 * 2
    assert loc.dropped == pytest.approx(1 - kept / (4 * 4096 * 2))


def test_eager_experts_run_one_after_another():
    loc = moe.moe_local(MIXTRAL, 1, 1, 1, 2, 1)
    ops = moe.moe_forward_ops(MIXTRAL, loc, tp=1, ep=2, etp=1, d=2, grouped=False)
    names = [o.name for o in ops if not isinstance(o, Comm) and o.name.startswith("expert")]
    # FeedForward as steps.py writes it: w1 and w3 on x, silu, the product, w2; then torch.cat
    parts = ("fc1", "fc3", "act", "act_mul", "fc2")
    assert names == [f"expert_{p}_e{i}" for i in range(4) for p in parts] + ["expert_cat"]
    act = {o.name: o.bytes for o in ops if not isinstance(o, Comm)}
    m, f = round(loc.expert_tokens[0]), 14336
    assert act["expert_act_e0"] == 2 * m * f * 2 and act["expert_act_mul_e0"] == 3 * m * f * 2
    grouped = moe.moe_forward_ops(MIXTRAL, loc, tp=1, ep=2, etp=1, d=2)
    flops = sum(o.flops for o in ops if not isinstance(o, Comm))
    assert flops == pytest.approx(sum(o.flops for o in grouped if not isinstance(o, Comm)))


def test_backward_gemm_flops_are_twice_forward():
    loc = moe.moe_local(DSV3, 1, 1, 1, 64, 1)
    kw = dict(tp=1, ep=64, etp=1, d=2)
    f = sum(o.flops for o in moe.moe_forward_ops(DSV3, loc, **kw) if not isinstance(o, Comm))
    b = sum(o.flops for o in moe.moe_backward_ops(DSV3, loc, **kw) if not isinstance(o, Comm))
    assert b == pytest.approx(2 * f)
    # forward GEMM FLOPs of the busiest rank = its tokens' share of the layer's MoE FLOPs
    t = 4096
    per_token = 2 * moe.moe_mlp_active_params(DSV3)
    assert f == pytest.approx(t * per_token)


def test_mla_ops_flops_match_the_model_count():
    ops = mla.mla_forward_ops(DSV3, 1, 1, False, 2)
    gem = sum(o.flops for o in ops if o.kind == "gemm")
    assert gem == 4096 * 2 * sum(a * b for _, a, b in mla.mla_matrices(DSV3))
    att = next(o for o in ops if o.kind == "attention")
    assert att.flops == pytest.approx(4096 * mla.mla_attention_flops_per_token(DSV3) / 2)


def test_eager_combine_and_index_kernels_follow_the_script():
    # steps.py: per (local expert, source rank) an arange and their cat after the count sync;
    # the inverse permutation; zeros, weights times copies, out-of-place index_add
    ep, t, k, h = 2, 4096, 2, 4096
    loc = moe.moe_local(MIXTRAL, 1, 1, 1, ep, 1)
    fwd = {o.name: o.bytes for o in moe.moe_forward_ops(MIXTRAL, loc, tp=1, ep=ep, etp=1, d=2,
                                                        grouped=False) if not isinstance(o, Comm)}
    assert sum(n.startswith("perm_arange") for n in fwd) == loc.local_experts * ep
    assert fwd["combine_zeros"] == t * h * 2
    assert fwd["combine_weight"] == 2 * t * k * h * 2 + t * k * 2
    assert fwd["unpermute"] == (t * k * h + 4 * t * h) * 2 + t * k * 8
    bwd = [o.name for o in moe.moe_backward_ops(MIXTRAL, loc, tp=1, ep=ep, etp=1, d=2,
                                                grouped=False) if not isinstance(o, Comm)]
    # views, constants and integer bookkeeping have no backward kernel; x's two input
    # gradients (w1 and w3) are added
    assert not any(n.startswith(("perm_", "inv_", "combine_zeros", "expert_cat")) for n in bwd)
    assert sum(n.startswith("expert_dx_add") for n in bwd) == 4
