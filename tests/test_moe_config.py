"""MoE and MLA input keys: accepted as documented, and every bad combination is one line
``error: FILE: dotted.field: ...`` with exit code 2 (the contract of tests/test_bad_input.py)."""

from __future__ import annotations

import copy

import pytest

from simulator.config.checks import check_moe
from simulator.config.schema import ModelConfig, WorkloadConfig
from tests.test_bad_input import BASE_WORK, expect, fails, write

MOE = {"experts": 8, "top_k": 2, "ffn_hidden": 2048}


def moe_work(moe=None, training=None, parallelism=None, model=None) -> dict:
    w = copy.deepcopy(BASE_WORK)
    w["model"] = {**w["model"], "moe": {**MOE, **(moe or {})}, **(model or {})}
    w["training"].update(training or {})
    w["parallelism"].update({"sequence_parallel": True, **(parallelism or {})})
    return w


def test_edp_is_what_folding_leaves():
    # tp 2 x dp 2 = 4 GPUs per stage: ep 2 x etp 1 leaves edp 2; ep 4 leaves edp 1.
    w = WorkloadConfig.model_validate({**moe_work(), "cluster": {"topology": "x"}})
    assert check_moe(w, 2, "f") == (1, 1, 4)
    w = WorkloadConfig.model_validate(
        {**moe_work(parallelism={"ep": 2}), "cluster": {"topology": "x"}}
    )
    assert check_moe(w, 2, "f") == (2, 1, 2)
    w = WorkloadConfig.model_validate(
        {**moe_work(parallelism={"ep": 2, "etp": 2}), "cluster": {"topology": "x"}}
    )
    assert check_moe(w, 2, "f") == (2, 2, 1)


def test_model_defaults():
    m = ModelConfig.model_validate({**BASE_WORK["model"], "moe": MOE})
    assert m.moe_layers == 8 and m.attention_kind == "mha"
    m = ModelConfig.model_validate(
        {**BASE_WORK["model"], "moe": {**MOE, "dense_layers": 3}, "mla": {}}
    )
    assert m.moe_layers == 5 and m.attention_kind == "mla"
    assert m.mla.kv_lora_rank == 512 and m.moe.shared_ffn == 2048
    m = ModelConfig.model_validate({**BASE_WORK["model"], "kv_channels": 128})
    assert m.head_dim == 128  # Qwen3-235B: 64 heads of 128 on a 4096-wide model


@pytest.mark.parametrize(
    "work,field,words",
    [
        (moe_work(parallelism={"ep": 8}), "parallelism.ep", ["ep*etp", "must divide", "tp*cp*dp"]),
        (moe_work(parallelism={"ep": 4}, moe={"experts": 6}), "parallelism.ep",
         ["experts=6", "not divisible by ep=4"]),
        (moe_work(parallelism={"etp": 2}, moe={"ffn_hidden": 1001}), "parallelism.etp",
         ["1001", "etp=2"]),
        (moe_work(training={"moe_expert_load": [0.5, 0.5]}), "training.moe_expert_load",
         ["2 entries", "8"]),
        (moe_work(training={"moe_expert_load": [0.2] * 8}), "training.moe_expert_load",
         ["add up to 1.6", "expected 1"]),
        (moe_work(training={"moe_expert_load": [0.5, -0.1, 0.6] + [0] * 5}),
         "training.moe_expert_load", [">= 0"]),
        ({**BASE_WORK, "parallelism": {**BASE_WORK["parallelism"], "ep": 2}}, "parallelism.ep",
         ["model.moe is not set"]),
        (moe_work(training={"moe_routing": "random", "moe_expert_load": [0.125] * 8}),
         "training.moe_routing", ["training.moe_expert_load", "accepted: balanced"]),
        (moe_work(training={"moe_routing": "random"}, moe={"capacity_factor": 1.0}),
         "training.moe_routing", ["capacity_factor"]),
        (moe_work(training={"moe_routing": "learned"}, moe={"capacity_factor": 1.0}),
         "training.moe_routing", ["capacity_factor", "accepted: balanced"]),
        ({**BASE_WORK, "training": {**BASE_WORK["training"], "moe_routing": "random"}},
         "training.moe_routing", ["needs model.moe"]),
        (moe_work(training={"moe_dispatcher": "flex"}), "training.moe_dispatcher",
         ["'alltoall', 'allgather' or 'deepep'"]),
    ],
)  # fmt: skip
def test_bad_moe_layouts(tmp_path, capsys, work, field, words):
    p = write(tmp_path, work)
    expect(fails(capsys, tmp_path, "run", str(p)), p, field, *words)


@pytest.mark.parametrize(
    "model,field,words",
    [
        ({"moe": {**MOE, "top_k": 9}}, "model.moe.top_k", ["top_k=9 exceeds experts=8"]),
        ({"moe": {**MOE, "router_groups": 3}}, "model.moe.router_groups", ["router_groups=3", "divide"]),
        ({"moe": {**MOE, "dense_layers": 9}}, "model.moe.dense_layers",
         ["dense_layers=9 exceeds layers=8"]),
        ({"attention": "mla"}, "model", ["needs the model.mla"]),
        ({"attention": "gqa", "mla": {}}, "model", ["model.mla is given"]),
        ({"moe": {**MOE, "expert": 8}}, "model.moe.expert", ["did you mean 'experts'"]),
        ({"mla": {"kv_lora_rank": 0}}, "model.mla.kv_lora_rank", ["greater than 0"]),
    ],
)
def test_bad_moe_models(tmp_path, capsys, model, field, words):
    w = copy.deepcopy(BASE_WORK)
    w["model"].update(model)
    p = write(tmp_path, w)
    expect(fails(capsys, tmp_path, "run", str(p)), p, field, *words)


def test_moe_with_tensor_parallelism_needs_sequence_parallelism(tmp_path, capsys):
    # Megatron-Core refuses MoE with TP but without SP (the MoE block works on s/tp tokens)
    p = write(tmp_path, moe_work(parallelism={"ep": 2, "sequence_parallel": False}))
    expect(fails(capsys, tmp_path, "run", str(p)), p, "parallelism.sequence_parallel", "tp=2")
