"""Expert gradients on their own communicator: Megatron-Core reduces the routed experts'
gradients over the expert-data-parallel group (edp = tp*cp*dp / (ep*etp)) in buckets of
their own, and the rest over cp x dp; the distributed optimizer shards (and re-gathers)
expert states over edp. Bytes per group against closed forms."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.engine.build import make_job
from simulator.run import make_machine, resolve_loaded, simulate
from tests.conftest import small_topology, write_case
from tests.test_moe_engine import WORK

H, Q, KV, F, FE, E, V = 1024, 1024, 512, 4096, 1024, 8, 32000
ATTN, NORMS = H * (Q + 2 * KV) + Q * H, 2 * H
DENSE_LAYER = ATTN + NORMS + 3 * H * F
MOE_SHARED = ATTN + NORMS + H * E + 3 * H * FE  # router and shared expert (TP-split)
ROUTED = E * 3 * H * FE  # routed experts of one MoE layer (split over ep x etp)


def _run(tmp_path, par: dict, **training):
    work = {**WORK, "parallelism": {**WORK["parallelism"], **par},
            "training": {**WORK["training"], **training}}  # fmt: skip
    return simulate(load_workload(write_case(tmp_path, work, small_topology(2, 8))))


def _bytes(ev, stream: str, stage_gpus) -> float:
    """Bytes of the collectives on ``stream`` that GPU ``stage_gpus[0]``'s process issued."""
    rows = ev[(ev["stream"] == stream) & (ev["gpu"] == stage_gpus[0])]
    return float(rows["bytes"].sum())


@pytest.mark.parametrize("zero", [0, 1])
def test_expert_gradients_reduced_over_edp_dense_over_dp(tmp_path, zero):
    # 16 GPUs: pp 2, and per stage tp 2 x dp 4 = 8 GPUs regrouped as ep 4 x edp 2
    r = _run(tmp_path, {"zero": zero}, grad_reduce_dtype="fp32")
    ev, s = r.events, r.summary
    assert s["moe"]["edp"] == 2
    tp, ep, gb = 2, 4, 4
    # stage 1 (GPUs 8..15) holds MoE layers 2, 3, the final norm and the LM head
    dense1 = (2 * MOE_SHARED + V * H + H) / tp * gb
    expert1 = 2 * ROUTED / ep * gb
    last = ev[ev["stream"].isin(["dp", "edp"])]
    g1 = int(last[last["name"].str.contains("expert")]["gpu"].max())
    assert _bytes(ev, "edp", [g1]) == pytest.approx(expert1, rel=1e-9)
    assert _bytes(ev, "dp", [g1]) == pytest.approx(dense1, rel=1e-9)
    # stage 0: the dense layer 0, MoE layer 1 and the embedding
    g0 = int(last[last["name"].str.contains("expert")]["gpu"].min())
    dense0 = (DENSE_LAYER + MOE_SHARED + V * H) / tp * gb
    assert _bytes(ev, "edp", [g0]) == pytest.approx(ROUTED / ep * gb, rel=1e-9)
    assert _bytes(ev, "dp", [g0]) == pytest.approx(dense0, rel=1e-9)
    # the edp all-gather of the updated expert shards (ZeRO-1) carries their bf16 weights
    if zero:
        assert _bytes(ev, "egather", [g1]) == pytest.approx(2 * ROUTED / ep * 2, rel=1e-9)
        assert _bytes(ev, "gather", [g1]) == pytest.approx(dense1 / gb * 2, rel=1e-9)
    else:
        assert not (ev["stream"] == "egather").any()


def test_no_expert_reduction_when_every_expert_has_one_owner(tmp_path):
    # ep 8 over tp 2 x dp 4: edp 1, each expert's gradient lives on one rank: nothing to
    # reduce, and the dense reduction carries only the dense part
    r = _run(tmp_path, {"ep": 8}, grad_reduce_dtype="fp32")
    ev = r.events
    assert r.summary["moe"]["edp"] == 1
    assert not ev["stream"].isin(["edp", "egather"]).any()
    g1 = int(ev[ev["stream"] == "dp"]["gpu"].max())
    assert _bytes(ev, "dp", [g1]) == pytest.approx((2 * MOE_SHARED + V * H + H) / 2 * 4, rel=1e-9)


def test_full_detail_reduces_experts_on_edp_groups(tmp_path):
    """Full detail: every GPU reduces its own experts' gradients (the closed form above) on
    its edp group of the MoE layout (etp-ep-edp-pp order: GPU 0's edp group is {0, 4}, its
    dp group {0, 2, 4, 6}), and the step agrees with the folded one."""
    folded = _run(tmp_path, {}, grad_reduce_dtype="fp32")
    (tmp_path / "f").mkdir()
    path = write_case(tmp_path / "f", WORK, small_topology(2, 8))
    loaded = load_workload(path, ["training.grad_reduce_dtype=fp32"])
    full = simulate(loaded, detail="full")
    assert full.summary["step_time_s"] == pytest.approx(folded.summary["step_time_s"], rel=0.01)
    ev = full.events
    for gpu in range(8):  # stage 0
        assert _bytes(ev, "edp", [gpu]) == pytest.approx(ROUTED / 4 * 4, rel=1e-9)
    job = make_job(loaded.workload, loaded.topology, resolve_loaded(loaded),
                   make_machine(loaded))  # fmt: skip
    lay = job.layout_of("edp")
    assert lay.group("edp", lay.coords(0)) == (0, 4)
    assert job.layout.group(("cp", "dp"), job.layout.coords(0)) == (0, 2, 4, 6)
