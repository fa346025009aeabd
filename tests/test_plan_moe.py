"""``plan`` on mixture-of-experts models: ep and etp searched under MoE Parallel Folding's
rules, the pre-screen counting the engine's MoE memory, and every printed layout running."""

from __future__ import annotations

import shlex

import pytest

from simulator.config.checks import resolve
from simulator.config.load import LoadedWorkload, load_workload
from simulator.model import moe as moe_math
from simulator.plan import enumerate_layouts, expert_layouts, plan, plan_topology
from simulator.plan_estimate import Estimator
from simulator.run import make_machine, simulate
from tests.conftest import ROOT

MIXTRAL = ROOT / "workloads" / "mixtral-8x7b.yaml"


def test_expert_layouts_follow_parallel_folding():
    m = load_workload(MIXTRAL).workload.model  # 8 experts of 14,336
    # tp 2 over 16 GPUs: etp 1 or tp; ep divides 8 and (16 / etp)
    assert sorted(expert_layouts(m, 2, 16)) == [
        (1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2), (8, 1), (8, 2),
    ]  # fmt: skip
    assert sorted(expert_layouts(m, 1, 4)) == [(1, 1), (2, 1), (4, 1)]
    ds = load_workload(ROOT / "workloads" / "deepseek-v3.yaml").workload.model  # 256 experts
    assert [ep for ep, _ in expert_layouts(ds, 1, 128)] == [1, 2, 4, 8, 16, 32, 64, 128]


def test_every_moe_candidate_is_a_valid_folding():
    loaded = load_workload(MIXTRAL)
    work, n = loaded.workload, 32
    topo = plan_topology(loaded.topology, n)
    cands = list(enumerate_layouts(work, n, 8))
    assert len(cands) == len(set(cands)) > 100
    assert {c.ep for c in cands} == {1, 2, 4, 8} and {c.etp for c in cands} == {1, 2, 4, 8}
    for c in cands[:: max(1, len(cands) // 400)]:
        width = c.tp * c.cp * c.dp
        assert width % (c.ep * c.etp) == 0 and 8 % c.ep == 0 and c.etp in (1, c.tp)
        assert c.sequence_parallel == (c.tp > 1) and c.zero < 3
        res = resolve(c.apply(work), topo, file="t")  # raises if a rule were broken
        assert (res.ep, res.etp, res.edp) == (c.ep, c.etp, width // (c.ep * c.etp))


def test_moe_prescreen_is_the_engines_memory():
    """The estimator's memory of an MoE layout is the engine's (experts over ep x etp, their
    states over edp, MoE activations per layer), and its step within 25 %."""
    loaded = load_workload(MIXTRAL)
    topo = plan_topology(loaded.topology, 16)
    base = LoadedWorkload(loaded.workload, topo, loaded.workload_path, loaded.topology_path)
    machine = make_machine(base)
    est = Estimator(loaded.workload, topo, machine)
    picks = [c for c in enumerate_layouts(loaded.workload, 16, 8)
             if (c.tp, c.pp, c.ep, c.etp, c.zero, c.pp_schedule, c.micro_batch) in {
                 (1, 2, 8, 1, 1, "1f1b", 1), (2, 1, 4, 2, 2, "1f1b", 1),
                 (4, 2, 2, 1, 0, "1f1b", 1)}]  # fmt: skip
    assert len(picks) >= 6
    for cand in picks[::2]:
        work, res = est.resolve(cand)
        e = est.estimate(cand, res)
        s = simulate(LoadedWorkload(work, topo, loaded.workload_path, loaded.topology_path),
                     machine=machine).summary  # fmt: skip
        assert e.memory_gib == pytest.approx(s["memory_gib"]["total"], rel=1e-9), cand
        if e.fits:
            assert e.step_time_s == pytest.approx(s["step_time_s"], rel=0.25), cand


def test_plan_mixtral_picks_expert_parallelism_and_its_commands_run():
    """On 16 H100 Mixtral 8x7B's 46.7 B parameters (93 GB in bf16) cannot be replicated on
    every GPU: every fitting layout splits the experts (ep x etp > 1), and every layout plan
    prints reproduces its figures through `run`'s overrides."""
    loaded = load_workload(MIXTRAL)
    total = loaded.workload.model.layers * moe_math.routed_expert_params(loaded.workload.model)
    assert total * 2 > 80 * 2**30  # the closed form behind "must split the experts"
    res = plan(loaded, 16, top=3, n_simulate=3, workers=1)
    assert res.top and all(p.summary["fits"] for p in res.top)
    for p in res.top:
        c = p.candidate
        assert c.ep is not None and c.ep * c.etp > 1
        args = shlex.split(p.candidate.set_args())  # as printed: --set k=v ...
        sets = [a for a in args if a != "--set"] + ["topology.nodes=2"]
        again = simulate(load_workload(MIXTRAL, sets)).summary
        assert again["tokens_per_s"] == pytest.approx(p.summary["tokens_per_s"], rel=1e-12)
        assert (again["moe"]["ep"], again["moe"]["etp"]) == (c.ep, c.etp)

