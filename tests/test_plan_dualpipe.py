"""``plan`` searches DeepSeek-V3's DualPipe and DualPipeV for MoE models: only where their rules
hold (``run`` refuses the rest), with an estimate that plays each rank's order with the
engine's pass and pair times, and picked where hiding the expert-parallel all-to-all wins.

(The closed-form DualPipe bubble of DeepSeek's Table 2 is held to the engine in
``tests/test_dualpipe.py``; not repeated here.)"""

from __future__ import annotations

import shlex

import pytest

import simulator.plan as plan_mod
from simulator.config.checks import resolve
from simulator.config.load import LoadedWorkload, load_workload
from simulator.errors import ConfigError
from simulator.parallel.schedules import max_in_flight, schedule
from simulator.plan import Candidate, dual_schedules, enumerate_layouts, plan, plan_topology
from simulator.plan_estimate import Estimator, peak_inflight_bytes
from simulator.run import make_machine, simulate
from tests.conftest import ROOT, small_topology, write_case

#: A small fine-grained MoE model (64 experts, top-6, as DeepSeek-V2-Lite's router) whose
#: routed experts, 8.9 B parameters, crowd a 32 GiB GPU: on 8 nodes of one GPU (every
#: all-to-all crosses the NICs) a layout either splits them over ep and pays the all-to-all,
#: or keeps them whole over a deeper pipeline.
MODEL = {
    "layers": 8, "hidden": 2048, "ffn_hidden": 8192, "heads": 16, "kv_heads": 8,
    "vocab": 32000, "seq_len": 4096, "activation": "swiglu",
    "moe": {"experts": 64, "top_k": 6, "ffn_hidden": 2816, "shared_experts": 1,
            "dense_layers": 0},
}  # fmt: skip


def moe_case(tmp_path, global_batch: int = 128) -> LoadedWorkload:
    work = {
        "name": "dual",
        "model": MODEL,
        "training": {"global_batch": global_batch, "micro_batch": 1},
        "parallelism": {"tp": 1, "pp": 2, "ep": 4, "zero": 1},
    }
    topo = small_topology(8, 1, gpu={"base": "H100-SXM-80GB", "hbm_GiB": 32.0})
    return load_workload(write_case(tmp_path, work, topo))


def test_dual_rules():
    """DualPipe: even pp, an even number of micro-batches >= 2 pp; DualPipeV: >= 2 pp
    micro-batches and a layer for each of its 2 pp stages (DeepSeek's asserts)."""
    assert dual_schedules(4, 8, 8) == [("dualpipe", 1), ("dualpipev", 2)]
    assert dual_schedules(4, 9, 8) == [("dualpipev", 2)]  # odd: not DualPipe
    assert dual_schedules(4, 6, 8) == []  # fewer than 2 pp
    assert dual_schedules(3, 6, 8) == [("dualpipev", 2)]  # odd pp: only the V
    assert dual_schedules(8, 16, 8) == [("dualpipe", 1)]  # 16 stages of 8 layers: no V
    assert dual_schedules(1, 16, 8) == []


def test_dual_candidates_are_valid_and_only_where_allowed(tmp_path):
    """Every DualPipe candidate passes ``run``'s checks, and none has a micro-batch count the
    schedule refuses: 24 sequences a step give odd or too few micro-batches on many layouts."""
    loaded = moe_case(tmp_path, global_batch=24)
    work, topo = loaded.workload, plan_topology(loaded.topology, 8)
    cands = list(enumerate_layouts(work, 8, 1))
    duals = [c for c in cands if c.pp_schedule in ("dualpipe", "dualpipev")]
    assert {c.pp_schedule for c in duals} == {"dualpipe", "dualpipev"}
    refused = 0
    for c in cands:
        m = 24 // (c.dp * c.micro_batch)
        if c.pp_schedule == "dualpipe":
            assert c.pp % 2 == 0 and m % 2 == 0 and m >= 2 * c.pp, c
        elif c.pp_schedule == "dualpipev":
            assert c.virtual_stages == 2 and m >= 2 * c.pp and 8 >= 2 * c.pp, c
        elif c.pp > 1 and c.pp_schedule == "1f1b":
            # the same layout under DualPipe is refused by run when the rules fail: never listed
            for sched, v in (("dualpipe", 1), ("dualpipev", 2)):
                if (sched, v) in dual_schedules(c.pp, m, 8):
                    continue
                bad = Candidate(c.tp, c.pp, c.dp, c.micro_batch, c.zero, c.recompute, sched, v,
                                c.sequence_parallel, c.cp, None, ep=c.ep, etp=c.etp)
                assert bad not in cands
                with pytest.raises(ConfigError):
                    resolve(bad.apply(work), topo, file="t")
                refused += 1
    assert refused > 0
    for c in duals[:: max(1, len(duals) // 40)]:
        resolve(c.apply(work), topo, file="t")  # raises if a rule were broken


@pytest.mark.parametrize("name,pp,m", [("dualpipe", 4, 8), ("dualpipe", 4, 10),
                                       ("dualpipev", 3, 6), ("dualpipev", 2, 5)])
def test_inflight_peak_of_dual_orders(name, pp, m):
    """The pre-screen's activation count along a DualPipe order: with equal chunks never above
    the schedule's own in-flight maximum (a pair's backward frees first), at most one under."""
    for s in range(pp):
        order = schedule(name, s, pp, m, 2 if name == "dualpipev" else 1)
        peak = peak_inflight_bytes(name, s, pp, m, 2 if name == "dualpipev" else 1, (1.0, 1.0))
        assert max_in_flight(order) - 1 <= peak <= max_in_flight(order)


def test_plan_picks_dualpipe_where_it_wins_and_its_estimate_holds(tmp_path, monkeypatch):
    """Hiding the all-to-all behind the other direction's compute wins: plan's best layout is a
    DualPipe one with the experts split, faster in simulation (by 16 % when written, with the
    paired all-to-all at its own cost; by about 1 % since both sides of the pair slow down as
    measured beside expert GEMMs, data/measured/a2a-beside-compute-h100x4) than the
    best plan finds without DualPipe (the experts whole over 8 stages of 1F1B); its estimate is within plan's tolerance (25 %, as for 1F1B) of the
    simulated step, its memory never above the simulated peak, and its printed overrides
    reproduce it through ``run``."""
    loaded = moe_case(tmp_path)
    res = plan(loaded, 8, top=2, n_simulate=3, workers=1)
    best = res.top[0]
    assert best.candidate.pp_schedule in ("dualpipe", "dualpipev"), best.candidate.label()
    assert best.candidate.ep * best.candidate.etp > 1
    for p in res.simulated:
        if p.candidate.pp_schedule in ("dualpipe", "dualpipev") and p.estimate is not None:
            e, s = p.estimate, p.summary
            assert e.step_time_s == pytest.approx(s["step_time_s"], rel=0.25), p.candidate
            if p.candidate.grad_reduce_dtype is None:  # (the knob's memory: simulated only)
                assert e.memory_gib <= s["memory_gib"]["total"] * (1 + 1e-9), p.candidate
    sets = [a for a in shlex.split(best.candidate.set_args()) if a != "--set"]
    again = simulate(load_workload(tmp_path / "work.yaml", sets))
    assert again.summary["tokens_per_s"] == pytest.approx(best.summary["tokens_per_s"], rel=1e-12)

    monkeypatch.setattr(plan_mod, "dual_schedules", lambda pp, m, layers: [])
    without = plan(loaded, 8, top=1, n_simulate=3, workers=1).top[0]
    assert without.candidate.pp_schedule not in ("dualpipe", "dualpipev")
    assert best.summary["tokens_per_s"] > without.summary["tokens_per_s"]


def test_estimate_of_deepseek_v3_as_shipped():
    """DeepSeek-V3's own layout (arXiv:2412.19437 Sections 3.2 and 4.2: 2,048 H800, PP 16
    with DualPipe, EP 64 over 8 nodes, MTP depth 1): it fits in the H800's 80 GB, and the
    walk's step and the pre-screen's memory agree with the engine's."""
    loaded = load_workload(ROOT / "workloads" / "deepseek-v3.yaml")
    machine = make_machine(loaded)
    est = Estimator(loaded.workload, loaded.topology, machine)
    cand = plan_mod.candidate_of(loaded.workload, resolve(loaded.workload, loaded.topology,
                                                          file="t"))  # fmt: skip
    work, res = est.resolve(cand)
    e = est.estimate(cand, res)
    s = simulate(loaded, machine=machine).summary
    assert loaded.workload.model.mtp_depth == 1
    assert s["n_gpus"] == 2048 and s["gpu"] == "H800" and s["fits"]
    assert (s["layout"]["pp"], s["layout"]["pp_schedule"], s["moe"]["ep"]) == (16, "dualpipe", 64)
    assert e.step_time_s == pytest.approx(s["step_time_s"], rel=0.25)
    assert e.memory_gib <= s["memory_gib"]["total"] * (1 + 1e-9)


def test_uneven_split_counts_the_mtp_modules_on_the_last_stage():
    """A multi-token prediction module (model.mtp_depth) is a layer's worth of work on the last
    stage: the split is the most even one of layers + mtp_depth units, ends lighter, with the
    last stage holding that many fewer layers. Closed form: units u = L + d over S stages,
    base = u // S, the u % S heavier stages in the middle; then the last stage minus d."""
    split = plan_mod.uneven_split
    # DeepSeek-V3: 61 layers + 1 MTP over 16 stages, as its workload splits them
    assert split(61, 16, 1) == (3,) + (4,) * 14 + (2,)
    assert split(61, 16) == (3, 4) + (4,) * 12 + (3, 3)  # MTP ignored: the last stage's 3 + 1
    assert split(60, 4, 1) == (15, 16, 15, 14)  # even without MTP, not with it
    assert split(8, 8, 2) is None  # one unit a stage: the last cannot give up two
    for layers in range(4, 70, 3):
        for stages in (2, 4, 8, 16):
            for d in (1, 2):
                s = split(layers, stages, d)
                if (layers + d) // stages < d:  # a stage's share is below d: layers alone
                    assert s == split(layers, stages)
                    continue
                units = (*s[:-1], s[-1] + d)
                assert sum(s) == layers and min(s) >= 0
                assert max(units) - min(units) <= 1
                assert units[-1] == min(units)  # the last stage is a light one
                assert all(u >= max(units[0], units[-1]) for u in units[1:-1])


def test_deepseek_v3_dual_candidates_split_for_the_mtp_module():
    """plan's DualPipe candidates of DeepSeek-V3 on 16 ranks give the last stage (on rank 0,
    beside the embedding's stage 0) one layer fewer for its MTP module; DualPipeV on 8 ranks x
    16 stages the same."""
    work = load_workload(ROOT / "workloads" / "deepseek-v3.yaml").workload
    seen = set()
    for c in enumerate_layouts(work, 2048, 8):
        if c.pp_schedule in ("dualpipe", "dualpipev") and c.pp * c.virtual_stages == 16:
            assert c.stage_layers == (3,) + (4,) * 14 + (2,), c
            seen.add(c.pp_schedule)
    assert seen == {"dualpipe", "dualpipev"}


def test_dual_estimate_computes_at_the_groups_expected_slowest_gpu(tmp_path):
    """DualPipe's walk, like the engine and the 1F1B estimate, runs every kernel at the
    expected slowest GPU of the group that meets at each layer (simulator/model/sync.py; here
    the EP group of 4): with the NCCL interference set to 0 and no measured slowdown of a
    paired all-to-all (so a kernel's time beside a collective is its own), every pass's and
    pair's kernel seconds, and so the rank's compute,
    grow by exactly ``1 + jitter e_4`` over the same estimate without the spread."""
    import dataclasses

    from simulator.model.sync import expected_max_normal

    loaded = moe_case(tmp_path)
    machine = make_machine(loaded)
    jitter = machine.gpu.sync_jitter
    assert jitter > 0  # the catalog's H100 carries the measured spread
    cand = Candidate(tp=1, pp=2, dp=4, micro_batch=1, zero=1, recompute="none",
                     pp_schedule="dualpipev", virtual_stages=2, sequence_parallel=False, ep=4,
                     etp=1)  # fmt: skip
    still = dataclasses.replace(machine, gpu=dataclasses.replace(machine.gpu, sync_jitter=0.0))
    factor = 1.0 + jitter * expected_max_normal(4)  # 1 + 0.0168 x 1.03
    out = []
    for m in (still, machine):
        est = Estimator(loaded.workload, loaded.topology, m)
        est.interference = 0.0
        est.nccl = {**est.nccl, "ep_pair_beside_experts": {}}
        out.append(est.estimate(cand, est.resolve(cand)[1]))
    a, b = out
    assert a.fits and b.fits
    assert b.breakdown_s["compute"] == pytest.approx(factor * a.breakdown_s["compute"], rel=1e-9)
    assert b.step_time_s > a.step_time_s + 0.5 * (factor - 1.0) * a.breakdown_s["compute"]
