"""MoE layers in the engine: EP all-to-all on the critical path as its own breakdown key,
expert states sharded over EP (closed form), folded and full detail agreeing, the busiest EP
rank setting the pace under skewed routing, and MLA layers running."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from tests.conftest import small_topology, write_case

MODEL = {
    "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 8,
    "vocab": 32000, "seq_len": 2048, "activation": "swiglu",
    "moe": {"experts": 8, "top_k": 2, "ffn_hidden": 1024, "shared_experts": 1,
            "dense_layers": 1},
}  # fmt: skip
WORK = {
    "name": "small-moe",
    "model": MODEL,
    "training": {"global_batch": 16, "micro_batch": 1, "precision": "bf16"},
    "parallelism": {"tp": 2, "pp": 2, "ep": 4, "zero": 1, "sequence_parallel": True},
}


def run(tmp_path, capsys, work=WORK, *extra) -> dict:
    p = write_case(tmp_path, work, small_topology(2, 8))
    assert main(["run", str(p), "--json", "--no-files", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_ep_comm_is_its_own_key_and_parts_add_up(tmp_path, capsys):
    s = run(tmp_path, capsys)
    bd = s["breakdown_s"]
    assert bd["ep_comm"] > 0
    assert sum(bd.values()) == pytest.approx(s["step_time_s"], rel=1e-9)
    assert s["moe"]["ep"] == 4 and s["moe"]["edp"] == 2 and s["moe"]["experts_per_rank"] == 2
    # tp 2 x dp 4 = 8 GPUs of one node per stage: the EP groups stay inside NVLink
    assert s["moe"]["ep_inside_nvlink_domain"] is True


def test_expert_weights_are_sharded_over_ep(tmp_path, capsys):
    s = run(tmp_path, capsys)
    h, q, kv, f, fe, E, V, tp, ep = 1024, 1024, 512, 4096, 1024, 8, 32000, 2, 4
    attn, norms = h * (q + 2 * kv) + q * h, 2 * h
    dense_layer = attn + norms + 3 * h * f
    moe_shared = attn + norms + h * E + 3 * h * fe  # router and shared expert, TP-split
    routed = E * 3 * h * fe
    stage0 = (dense_layer + moe_shared + V * h) / tp + routed / ep
    stage1 = (2 * moe_shared + V * h + h) / tp + 2 * routed / ep
    assert s["memory_gib"]["weights"] == pytest.approx(max(stage0, stage1) * 2 / 2**30, rel=1e-6)


def test_folded_and_full_detail_agree(tmp_path, capsys):
    a = run(tmp_path, capsys)
    b = run(tmp_path, capsys, WORK, "--detail", "full")
    assert b["step_time_s"] == pytest.approx(a["step_time_s"], rel=0.01)
    assert b["breakdown_s"]["ep_comm"] == pytest.approx(a["breakdown_s"]["ep_comm"], rel=0.02)


def test_skewed_load_costs_time_and_is_reported(tmp_path, capsys):
    load = [0.3, 0.2] + [0.5 / 6] * 6
    work = {**WORK, "training": {**WORK["training"], "moe_expert_load": load}}
    s = run(tmp_path, capsys, work)
    m = s["moe"]
    assert m["imbalance"] == pytest.approx(0.5 / 0.25)
    assert m["imbalance_cost_s"] > 0
    assert s["step_time_s"] == pytest.approx(m["uniform_step_time_s"] + m["imbalance_cost_s"])


def test_ep_across_nodes_is_reported_outside_the_nvlink_domain(tmp_path, capsys):
    work = {**WORK, "parallelism": {**WORK["parallelism"], "tp": 1, "pp": 1, "ep": 8}}
    work["training"] = {**WORK["training"], "global_batch": 32}
    p = write_case(tmp_path, work, small_topology(2, 4))
    assert main(["run", str(p), "--json", "--no-files"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["moe"]["ep_inside_nvlink_domain"] is False


def test_mla_model_runs(tmp_path, capsys):
    model = {**MODEL, "heads": 8, "kv_heads": 8, "attention": "mla",
             "mla": {"q_lora_rank": 256, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
                     "qk_rope_head_dim": 32, "v_head_dim": 64}}  # fmt: skip
    s = run(tmp_path, capsys, {**WORK, "model": model})
    assert s["step_time_s"] > 0 and s["breakdown_s"]["ep_comm"] > 0
