"""Transformer Engine's grouped experts' weight gradients: one wgrad GEMM per expert, each
adding into that expert's fp32 ``main_grad`` (Megatron's gradient-accumulation fusion), so
with few rows an expert the kernels are bound by reading and writing the accumulated
gradient. Checked against the HBM traffic worked out by hand and against the structure of
the backward (one op per round of four experts, the forward's FLOPs kept)."""

from __future__ import annotations

import pytest

from simulator.config.schema import ModelConfig, TrainingConfig
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.model import moe

# Qwen3-235B-A22B's MoE layer (hidden 4096, 128 experts of 1536, top 8) as the ModelZoo's TP 4
# / EP 8 row runs it: 4096 / 4 tokens a rank, 16 local experts of 512 rows each
QWEN3 = ModelConfig(
    layers=94, hidden=4096, ffn_hidden=12288, heads=64, kv_heads=4, vocab=151936,
    seq_len=4096, activation="swiglu", kv_channels=128,
    moe={"experts": 128, "top_k": 8, "ffn_hidden": 1536, "shared_experts": 0},
)  # fmt: skip
H100 = ComputeModel(load_gpu("H100-SXM-80GB"))


def _wgrads(acc: int) -> list:
    loc = moe.moe_local(QWEN3, 1, 4, 1, 8, 1)
    ops = moe.moe_backward_ops(QWEN3, loc, tp=4, ep=8, etp=1, d=2, dispatcher="deepep",
                               wgrad_acc_bytes=acc)  # fmt: skip
    return [op for op in ops if not isinstance(op, moe.Comm) and op.name.endswith("_wgrad")
            and op.name.startswith("expert_")]  # fmt: skip


def test_one_wgrad_op_per_round_keeps_the_forward_flops():
    loc = moe.moe_local(QWEN3, 1, 4, 1, 8, 1)
    assert loc.expert_tokens == pytest.approx((512.0,) * 16)  # 1024 tokens x 8 x 8 ranks / 128
    w = _wgrads(4)
    fc1 = [op for op in w if op.name == "expert_fc1_wgrad"]
    fc2 = [op for op in w if op.name == "expert_fc2_wgrad"]
    assert len(fc1) == len(fc2) == 4  # 16 experts, four streams
    # each round: four [4096, 512] @ [512, 3072] (fc1) / [1536, 512] @ [512, 4096] (fc2)
    assert {(op.m, op.k, op.n) for op in fc1} == {(4 * 4096, 512, 3072)}
    assert {(op.m, op.k, op.n) for op in fc2} == {(4 * 1536, 512, 4096)}
    assert sum(op.flops for op in w) == pytest.approx(2 * 16 * 512 * 3 * 4096 * 1536)
    assert all(op.acc_bytes == 4 for op in w)


def test_fp32_accumulation_makes_few_rows_memory_bound():
    # one round of fc1 wgrads: four fp32 main_grads of 4096 x 3072 read and written (8 bytes
    # an element), 403 MB; on H100's achievable HBM rate no kernel can beat that traffic
    out = 4 * 4096 * 3072 * 8
    floor = out / H100.gpu.hbm_Bps
    t_acc = H100.gemm_s(4 * 4096, 512, 3072, "bf16", 4)
    assert t_acc >= floor
    # its FLOPs alone (51.5 GFLOP) run at ~65 % of the bf16 peak in 80 us, below the floor;
    # the same FLOPs as one [4096, 2048] @ [2048, 3072] GEMM writing one bf16 output (how a
    # round was priced before) are faster still
    assert H100.gemm_s(4096, 2048, 3072) < floor < t_acc
    # a deep wgrad (a dense layer's, 16K rows) hides the same accumulation almost entirely
    deep = H100.gemm_s(4096, 16384, 3072, "bf16", 4) / H100.gemm_s(4096, 16384, 3072) - 1
    assert 0 < deep < 0.08


def test_megatron_defaults_accumulate_in_fp32():
    t = TrainingConfig(global_batch=8)
    assert moe.expert_wgrad_acc_bytes(t) == 4  # bf16 training: fp32 main_grad
    assert moe.expert_wgrad_acc_bytes(t.model_copy(update={"grad_reduce_dtype": "bf16"})) == 2
    assert moe.expert_wgrad_acc_bytes(t.model_copy(update={"grad_accumulation_fusion": False})) == 0
    assert moe.expert_wgrad_acc_bytes(t.model_copy(update={"kernels": "eager"})) == 0
    # without the fusion each expert writes a fresh bf16 output
    assert all(op.acc_bytes == 0 for op in _wgrads(0))


# ---- the router as Megatron-Core's PyTorch code runs it (before --moe-router-fusion)

#: the tensor operations of Megatron-LM 1e057005's top-k router after its gating GEMM, read
#: from router.py / moe_utils.py: RandomSTE's clone and normal_; topk_softmax_with_capacity's
#: topk, softmax, zeros_like + scatter (gates), zeros_like + int + scatter + bool (map), sum;
#: the aux loss's softmax, sum, product, sum and scale; the tracker's division and addition
TORCH_CALLS_FWD = 2 + 1 + 1 + 2 + 4 + 1 + 1 + 4 + 2
#: their autograd: topk's and the softmaxes' backward, the gates' gather, the loss's sum,
#: product and sum (the map, counts, random logits and logging have no gradient)
TORCH_CALLS_BWD = 1 + 1 + 1 + 1 + 3


def _router(backward: bool, router: str, tp: int = 4):
    loc = moe.moe_local(QWEN3, 1, tp, 1, 8, 1)
    fn = moe.moe_backward_ops if backward else moe.moe_forward_ops
    ops = fn(QWEN3, loc, tp=tp, ep=8, etp=1, d=2, dispatcher="deepep", router=router)
    return [op for op in ops if op.name.startswith("router") and op.name != "router"
            and not op.name.startswith("router_dgrad") and not op.name.startswith("router_wgrad")]


def test_unfused_router_launches_a_kernel_per_torch_call():
    fwd = _router(False, "unfused_random")
    kernels = [op for op in fwd if not isinstance(op, moe.Comm)]
    assert len(kernels) == TORCH_CALLS_FWD
    comms = [op for op in fwd if isinstance(op, moe.Comm)]
    # the tokens per expert summed over the TP group that splits the sequence (128 int64)
    assert [(c.collective, c.dim, c.nbytes) for c in comms] == [("all_reduce", "tp", 128 * 8)]
    bwd = _router(True, "unfused_random")
    assert not any(isinstance(op, moe.Comm) for op in bwd)
    assert len(bwd) == TORCH_CALLS_BWD
    # without forced balance no random logits; without TP no all-reduce
    assert len(_router(False, "unfused")) == TORCH_CALLS_FWD - 2 + 1
    assert not any(isinstance(op, moe.Comm) for op in _router(False, "unfused", tp=1))
    # the fused router (the default) is one kernel each way
    assert [op.name for op in _router(False, "fused")] == ["router_topk"]
    assert [op.name for op in _router(True, "fused")] == ["router_topk"]


def test_router_setting_follows_the_code():
    t = TrainingConfig(global_batch=8)
    assert moe.router_kernels(t) == "fused"
    old = t.model_copy(update={"moe_router_fusion": False})
    assert moe.router_kernels(old) == "unfused"
    assert moe.router_kernels(old.model_copy(update={"moe_routing": "random"})) == \
        "unfused_random"
    assert moe.router_kernels(old.model_copy(update={"kernels": "eager"})) == "fused"
