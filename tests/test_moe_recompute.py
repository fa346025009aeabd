"""Selective recompute modules (Megatron-Core's --recompute-modules: core_attn, layernorm,
mla_up_proj, mlp, moe_act) and FP8 activation caching in MLA and MoE blocks, as DeepSeek-V3 saves
memory (arXiv:2412.19437, Sections 3.2.3 and 3.3.3): bytes dropped and FLOPs recomputed
against closed forms."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.config.load import load_workload
from simulator.engine.program import Pricer, _recompute, price
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.model import mla, moe
from simulator.model import moe_layer as ml
from simulator.model.moe_sizes import layer_activation_bytes
from tests.conftest import ROOT, small_topology, write_case

DS = load_workload(ROOT / "workloads" / "deepseek-v3.yaml").workload
M = DS.model
T, HL, DN, DR, DV, RQ, RKV, H = 4096, 128, 128, 64, 128, 1536, 512, 7168  # tp 1, b 1


def test_mla_modules_drop_their_tensors():
    base = mla.mla_activation_bytes(M, 1, 1, False, 2)
    up = mla.mla_activation_bytes(M, 1, 1, False, 2, recompute=frozenset({"mla_up_proj"}))
    ln = mla.mla_activation_bytes(M, 1, 1, False, 2, recompute=frozenset({"layernorm"}))
    assert base - up == (T * HL * (DN + DR) * 2 + T * HL * DV) * 2  # Q, K, V in bf16
    assert base - ln == (T * H + T * RQ + T * RKV) * 2  # the three norm outputs
    fp8 = mla.mla_activation_bytes(M, 1, 1, False, 2, gemm_in=1)
    assert base - fp8 == T * H + T * RQ + T * RKV + T * HL * DV  # GEMM inputs at 1 byte


def test_moe_act_and_fp8_cache_in_the_moe_block():
    loc = moe.moe_local(M, 1, 1, 1, 64, 1)
    R, f, fs = sum(loc.expert_tokens), 2048, 2048
    assert R == pytest.approx(T * 8)  # uniform load: top_k copies of every token
    base = moe.moe_activation_bytes(M, loc, tp=1, d=2)
    act = moe.moe_activation_bytes(M, loc, tp=1, d=2, modules=frozenset({"moe_act"}))
    assert base - act == pytest.approx((R * f + T * fs) * 2)  # fc2 inputs, routed and shared
    fp8 = moe.moe_activation_bytes(M, loc, tp=1, d=2, gemm_in=1)
    # router input, dispatched copies, activation and fc2 inputs, shared GEMM inputs at 1 byte
    assert base - fp8 == pytest.approx(T * H + R * (H + 2 * f + f) + T * (2 * fs + fs))


def test_routing_weights_applied_in_the_experts_keep_no_combined_copies():
    # fused kernels weight the copies inside the SwiGLU (Megatron-Core's weighted_bias_swiglu,
    # DeepSeek-V3's cached SwiGLU input): the un-permutation keeps nothing; eager code keeps
    # the top_k combined copies of every token (bf16) for the weights' gradient, and, its
    # SwiGLU being separate modules, silu's output for the product (R copies x ffn, bf16)
    loc = moe.moe_local(M, 1, 1, 1, 64, 1)
    fused = moe.moe_activation_bytes(M, loc, tp=1, d=2)
    eager = moe.moe_activation_bytes(M, loc, tp=1, d=2, grouped=False)
    assert eager - fused == T * 8 * H * 2 + sum(loc.expert_tokens) * loc.ffn * 2


def test_layer_bytes_follow_the_training_settings():
    bf16 = DS.training.model_copy(update={"precision": "bf16", "recompute": "none",
                                          "recompute_modules": None})  # fmt: skip
    t = bf16.model_copy(update={"recompute": "selective",
                                "recompute_modules": ("mla_up_proj", "moe_act")})
    kw = dict(tp=1, sp=False, ep=64, etp=1)
    none = layer_activation_bytes(M, bf16, 3, **kw)
    sel = layer_activation_bytes(M, t, 3, **kw)
    R = T * 8
    assert none - sel == pytest.approx((T * HL * (DN + DR) * 2 + T * HL * DV) * 2
                                       + (R * 2048 + T * 2048) * 2)  # fmt: skip
    # modules are ignored outside selective recomputation (as Megatron-Core does)
    full = bf16.model_copy(update={"recompute": "full", "recompute_modules": ("moe_act",)})
    assert layer_activation_bytes(M, full, 3, **kw) < sel


def test_recomputed_kernels_are_the_modules():
    cm = ComputeModel(load_gpu("H800"))
    pr = Pricer(cm, "bf16")
    fwd = mla.mla_forward_ops(M, 1, 1, False, 2)
    prog = price(fwd, pr, None)
    up = _recompute(fwd, prog, "selective", pr, frozenset({"mla_up_proj"}))
    assert {p.name for p in up} == {"re_q_up", "re_kv_up", "re_rope"}
    # the up-projections' FLOPs: 2 T rq H (dn + dr) + 2 T rkv H (dn + dv)
    assert sum(p.flops for p in up) == pytest.approx(
        2 * T * RQ * HL * (DN + DR) + 2 * T * RKV * HL * (DN + DV))
    ln = _recompute(fwd, prog, "selective", pr, frozenset({"layernorm"}))
    assert {p.name for p in ln} == {"re_norm1", "re_q_norm", "re_kv_norm"}
    assert sum(p.flops for p in ln) == 0 and sum(p.dur for p in ln) > 0
    core = _recompute(fwd, prog, "selective", pr, frozenset({"core_attn"}))
    assert [p.name for p in core] == [f"re_{op.name}" for op in fwd if op.kind == "attention"]


def test_mlp_module_reruns_a_dense_mlp_and_no_moe_block():
    # Megatron-Core's "mlp" recomputes the dense MLP submodule only (transformer_layer.py:
    # recompute_mlp where self.mlp is not an MoELayer), its norm fused into linear_fc1: the
    # norm, fc1, the activation and fc2, with the MLP's TP collectives (tp 2, SP)
    cm = ComputeModel(load_gpu("H800"))
    pr = Pricer(cm, "bf16")
    kw = dict(micro_batch=1, tp=2, sequence_parallel=True, precision_bytes=2, ep=64, etp=1)
    mods = frozenset({"mla_up_proj", "mlp"})

    def reruns(moe_layer: bool):
        fwd = ml.layer_ops(M, backward=False, moe_layer=moe_layer, **kw)
        return [p.name for p in _recompute(fwd, price(fwd, pr, None), "selective", pr, mods)]

    assert reruns(False) == ["re_q_up", "re_kv_up", "re_rope", "re_norm2",
                             "re_tp_all_gather", "re_fc1", "re_act", "re_fc2",
                             "re_tp_reduce_scatter"]  # fmt: skip
    assert reruns(True) == ["re_q_up", "re_kv_up", "re_rope"]
    fwd = ml.layer_ops(M, backward=False, moe_layer=False, **kw)
    dense = _recompute(fwd, price(fwd, pr, None), "selective", pr, frozenset({"mlp"}))
    # fc1 (gate and up) and fc2 over the 4096 tokens, the TP-split width: 2 T H (3 ffn) / tp
    assert sum(p.flops for p in dense) == pytest.approx(2 * T * H * 3 * 18432 / 2)
    # its activations: only the layer's own norm2 input stays (dense layer 0, not MoE layer 3)
    t = DS.training.model_copy(update={"precision": "bf16", "recompute": "selective",
                                       "recompute_modules": ("mlp",)})  # fmt: skip
    none = t.model_copy(update={"recompute": "none"})
    lkw = dict(tp=1, sp=False, ep=64, etp=1)
    F = 18432
    drop = layer_activation_bytes(M, none, 0, **lkw) - layer_activation_bytes(M, t, 0, **lkw)
    assert drop == pytest.approx(T * H * 2 + T * 2 * F * 2 + T * F * 2)  # fc1, act, fc2 inputs
    assert layer_activation_bytes(M, none, 3, **lkw) == layer_activation_bytes(M, t, 3, **lkw)


SMALL = {
    "name": "rc", "model": {
        "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "vocab": 32000,
        "seq_len": 2048, "activation": "swiglu", "attention": "mla",
        "mla": {"q_lora_rank": 384, "kv_lora_rank": 256, "qk_nope_head_dim": 64,
                "qk_rope_head_dim": 32, "v_head_dim": 64},
        "moe": {"experts": 8, "top_k": 2, "ffn_hidden": 1024, "shared_experts": 1,
                "dense_layers": 1}},
    "training": {"global_batch": 16, "micro_batch": 1},
    "parallelism": {"tp": 1, "pp": 2, "ep": 8, "zero": 1},
}  # fmt: skip


def _run(tmp_path, capsys, *sets) -> dict:
    p = write_case(tmp_path, SMALL, small_topology(2, 8))
    args = [a for s in sets for a in ("--set", s)]
    assert main(["run", str(p), "--json", "--no-files", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_engine_trades_memory_for_recompute(tmp_path, capsys):
    none = _run(tmp_path, capsys)
    sel = _run(tmp_path, capsys, "training.recompute=selective",
               "training.recompute_modules=[layernorm,mla_up_proj,moe_act]")  # fmt: skip
    assert sel["memory_gib"]["activations"] < none["memory_gib"]["activations"]
    assert sel["hardware_flops_per_step"] > none["hardware_flops_per_step"]
    assert sel["model_flops_per_step"] == none["model_flops_per_step"]
    assert sel["step_time_s"] > none["step_time_s"]


def test_bad_modules_are_refused(tmp_path, capsys):
    p = write_case(tmp_path, {**SMALL, "model": {**SMALL["model"], "attention": "gqa",
                                                  "kv_heads": 4, "mla": None}},
                   small_topology(2, 8))  # fmt: skip
    rc = main(["run", str(p), "--no-files", "--set", "training.recompute=selective",
               "--set", "training.recompute_modules=[mla_up_proj]"])  # fmt: skip
    assert rc == 2
    assert "mla_up_proj needs model.attention: mla" in capsys.readouterr().err


def test_deepseek_v3_keeps_the_attention_output_in_e5m6():
    # arXiv:2412.19437 Sec. 3.3.3: 12 bits and a 1x128 tile scale, where other GEMM inputs
    # are cached at 1 byte
    t = DS.training  # fp8, blockwise
    kw = dict(tp=1, sp=False, ep=64, etp=1)
    e5m6 = layer_activation_bytes(M, t, 3, **kw)
    cur = layer_activation_bytes(M, t.model_copy(update={"fp8_recipe": "current"}), 3, **kw)
    assert e5m6 - cur == pytest.approx(T * HL * DV * (1.5 + 4 / 128 - 1))
