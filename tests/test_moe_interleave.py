"""Interleaved MoE layers (``model.moe.layer_freq``: Llama 4 Maverick's dense and MoE layers
alternating): the pattern is what every count follows (parameters, FLOPs, memory per stage,
the engine's per-layer programs), an all-MoE pattern is today's model, a pattern written as a
list equals the same pattern written with ``dense_layers``, and a list of the wrong length is
a one-line error naming file and field."""

from __future__ import annotations

import copy

import pytest

from simulator.config.load import LoadedWorkload, load_workload
from simulator.config.schema import ModelConfig
from simulator.model import transformer as tf
from simulator.plan import enumerate_layouts, plan_topology
from simulator.plan_estimate import Estimator
from simulator.run import make_machine, simulate
from tests.conftest import ROOT, run_summary, small_topology
from tests.test_bad_input import expect, fails, write
from tests.test_moe_config import moe_work
from tests.test_moe_engine import WORK


def _model(**moe) -> ModelConfig:
    m = copy.deepcopy(WORK["model"])
    m["moe"] = {**m["moe"], "dense_layers": 0, **moe}
    return ModelConfig.model_validate(m)


def _run(tmp_path, capsys, **moe) -> dict:
    w = copy.deepcopy(WORK)
    w["model"]["moe"] = {**w["model"]["moe"], "dense_layers": 0, **moe}
    return run_summary(tmp_path, capsys, w, small_topology(2, 8))


def test_every_second_layer_is_moe_as_llama4_counts_it():
    # Hugging Face's Llama 4: moe_layers = range(step - 1, layers, step) -> layers 1 and 3 of 4
    m = _model(layer_freq=2)
    assert [m.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert m.moe_layers == 2
    assert isinstance(hash(_model(layer_freq=[0, 1, 0, 1])), int)  # frozen and hashable
    h, q, kv, f, fe, E, V = 1024, 1024, 512, 4096, 1024, 8, 32000
    attn, norms = h * (q + 2 * kv) + q * h, 2 * h
    dense = attn + norms + 3 * h * f
    moe = attn + norms + h * E + (E + 1) * 3 * h * fe  # router, 8 routed and 1 shared expert
    moe_active = attn + norms + h * E + (2 + 1) * 3 * h * fe
    emb = 2 * V * h + h
    assert tf.total_params(m) == 2 * dense + 2 * moe + emb
    assert tf.active_params(m) == 2 * dense + 2 * moe_active + emb
    # forward FLOPs per token: 2 x the weights multiplied (active), causal attention 2 s h
    s, B = 2048, 3
    att = 4 * s * q // 2
    fwd = 2 * (2 * (dense - norms) + 2 * (moe_active - norms)) + 4 * att + 2 * h * V
    assert tf.model_flops_per_step(m, B) == 3 * B * s * fwd


def test_list_pattern_equals_int_and_all_moe_equals_today():
    assert _model(layer_freq=[0, 1, 0, 1]).layer_kinds == _model(layer_freq=2).layer_kinds
    today = _model()
    for freq in (1, [1, 1, 1, 1]):
        m = _model(layer_freq=freq)
        assert m.moe_layers == today.moe_layers == 4
        assert tf.total_params(m) == tf.total_params(today)
        assert tf.model_flops_per_step(m, 8) == tf.model_flops_per_step(today, 8)


def test_engine_follows_the_pattern(tmp_path, capsys):
    # the same layers written as dense_layers: 2 or as a 0/1 list: the same step, byte for byte
    a = _run(tmp_path, capsys, dense_layers=2)
    b = _run(tmp_path, capsys, layer_freq=[0, 0, 1, 1])
    assert a == b
    # all MoE written as layer_freq 1 is today's all-MoE model
    assert _run(tmp_path, capsys, layer_freq=1) == _run(tmp_path, capsys)
    # pp 2: an MoE layer weighs more on a rank than a dense one ((attention + router + shared
    # expert) / tp + 8 experts / ep 4 = 9.4 M against (attention + 3 h 4096) / tp = 7.9 M), so
    # both MoE layers on the first stage make its weights the heaviest
    front = _run(tmp_path, capsys, layer_freq=[1, 1, 0, 0])
    alt = _run(tmp_path, capsys, layer_freq=2)
    assert front["memory_gib"]["weights"] > alt["memory_gib"]["weights"]
    # fewer MoE layers: fewer all-to-all calls
    assert 0 < alt["breakdown_s"]["ep_comm"] < _run(tmp_path, capsys)["breakdown_s"]["ep_comm"]


@pytest.mark.parametrize(
    "moe,field,words",
    [
        ({"layer_freq": [0, 1, 0]}, "model.moe.layer_freq", ["has 3 entries", "layers=8"]),
        ({"layer_freq": [0] * 8}, "model.moe.layer_freq", ["leaves no MoE layer"]),
        ({"layer_freq": [0, 2] * 4}, "model.moe.layer_freq", ["list of 0/1"]),
        ({"layer_freq": 0}, "model.moe.layer_freq", [">= 1"]),
        ({"layer_freq": True}, "model.moe.layer_freq", ["list of 0/1"]),
    ],
)
def test_bad_layer_freq(tmp_path, capsys, moe, field, words):
    p = write(tmp_path, moe_work(moe=moe))
    expect(fails(capsys, tmp_path, "run", str(p)), p, field, *words)


def test_plan_estimate_is_the_engines_memory_for_an_interleaved_windowed_model():
    """The layout search's pre-screen counts the engine's memory of a model whose dense and
    MoE layers alternate and whose attention is local on three layers of four (the pattern
    decides which stage holds which experts), and its step within 25 % (as for Mixtral)."""
    loaded = load_workload(ROOT / "workloads" / "mixtral-8x7b.yaml")
    m = loaded.workload.model
    data = m.model_dump()
    data["moe"]["layer_freq"] = [1, 1, 0, 1] * 8  # uneven over two stages on purpose
    data.update(attention_window=1024, attention_window_kind="chunked",
                attention_window_pattern=4)  # fmt: skip
    work = loaded.workload.model_copy(update={"model": ModelConfig.model_validate(data)})
    topo = plan_topology(loaded.topology, 16)
    machine = make_machine(LoadedWorkload(work, topo, loaded.workload_path,
                                          loaded.topology_path))  # fmt: skip
    est = Estimator(work, topo, machine)
    picks = [c for c in enumerate_layouts(work, 16, 8)
             if (c.tp, c.pp, c.ep, c.etp, c.zero, c.pp_schedule, c.micro_batch) in {
                 (1, 2, 8, 1, 1, "1f1b", 1), (4, 2, 2, 1, 0, "1f1b", 1)}]  # fmt: skip
    assert len(picks) >= 2
    for cand in picks[:: max(1, len(picks) // 3)]:
        w, res = est.resolve(cand)
        e = est.estimate(cand, res)
        s = simulate(LoadedWorkload(w, topo, loaded.workload_path, loaded.topology_path),
                     machine=machine).summary  # fmt: skip
        assert e.memory_gib == pytest.approx(s["memory_gib"]["total"], rel=1e-9), cand
        if e.fits:
            assert e.step_time_s == pytest.approx(s["step_time_s"], rel=0.25), cand
