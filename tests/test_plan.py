"""``plan``: the layout search space, the memory pre-screen against the engine, the ranking,
and Llama-2-70B on 1,024 GPUs within a minute, at least as fast as the shipped layout."""

from __future__ import annotations

import io
import json
import shlex

import pytest
from rich.console import Console

from simulator.cli import main as cli_main
from simulator.commands.plan_cmd import plan_table
from simulator.config.load import LoadedWorkload, load_workload
from simulator.errors import ConfigError
from simulator.parallel.schedules import max_in_flight, schedule
from simulator.plan import (
    Candidate,
    enumerate_layouts,
    knob_variants,
    plan,
    plan_topology,
    uneven_split,
)
from simulator.plan_estimate import Estimator, peak_inflight_bytes
from simulator.report.table import format_seconds
from simulator.run import make_machine, simulate
from tests.conftest import ROOT, SMALL_MODEL, small_topology, write_case


def small(tmp_path, nodes=2, **topo) -> LoadedWorkload:
    work = {
        "name": "p",
        "model": {**SMALL_MODEL, "layers": 6, "activation": "swiglu", "kv_heads": 4},
        "training": {"global_batch": 32, "micro_batch": 1},
        "parallelism": {"tp": 4, "pp": 2, "zero": 1, "sequence_parallel": True},
    }
    return load_workload(write_case(tmp_path, work, small_topology(nodes, 8, **topo)))


def test_search_space(tmp_path):
    loaded = small(tmp_path)
    cands = list(enumerate_layouts(loaded.workload, 16, 8))
    assert len(cands) == len(set(cands)) > 100
    for c in cands:
        assert c.tp * c.pp * c.dp == 16 and c.tp <= 8
        assert c.zero == 0 or c.dp > 1
        assert c.zero < 3 or c.pp == 1
        assert (c.pp_schedule == "interleaved") == (c.virtual_stages > 1)
        assert c.pp > 1 or c.pp_schedule == "1f1b"
        assert not c.sequence_parallel or c.tp > 1
    assert {c.recompute for c in cands} == {"none", "selective", "full"}
    assert {c.tp for c in cands} == {1, 2, 4, 8}


def test_plan_topology():
    topo = load_workload(ROOT / "workloads" / "llama70b.yaml").topology
    assert plan_topology(topo, 1024).nodes == 128
    assert plan_topology(topo, 64).nodes == 8
    small4 = plan_topology(topo, 4)
    assert (small4.nodes, small4.gpus_per_node) == (1, 4)
    with pytest.raises(ConfigError, match="whole number"):
        plan_topology(topo, 12)


@pytest.mark.parametrize(
    "name,pp,m,v",
    [("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("interleaved", 2, 6, 3), ("gpipe", 3, 5, 1)],
)
def test_inflight_peak_matches_schedule(name, pp, m, v):
    for s in range(pp):
        order = schedule(name, s, pp, m, v)
        # Equal chunks: the peak is the schedule's own in-flight maximum.
        assert peak_inflight_bytes(name, s, pp, m, v, (1.0,) * v) == max_in_flight(order)
        # Unequal chunks: brute force over the work order.
        w = tuple(1.0 + 10.0 * c for c in range(v))
        live, best = 0.0, 0.0
        for step in order:
            live += w[step.chunk] if step.phase == "F" else -w[step.chunk]
            best = max(best, live)
        assert peak_inflight_bytes(name, s, pp, m, v, w) == pytest.approx(best)


LAYOUTS = [
    Candidate(4, 2, 2, 1, 1, "none", "1f1b", 1, True),
    Candidate(4, 2, 2, 1, 0, "selective", "interleaved", 3, False),
    Candidate(2, 2, 4, 2, 2, "full", "interleaved", 3, True),
    Candidate(8, 1, 2, 2, 3, "none", "1f1b", 1, True),
    Candidate(1, 2, 8, 1, 1, "none", "1f1b", 1, False),
    Candidate(2, 1, 8, 4, 2, "selective", "1f1b", 1, False),
]


def test_memory_prescreen_is_the_engine_accounting(tmp_path):
    """The analytic peak equals the simulated one (ZeRO-3: never above it), so the screen
    never drops a layout the simulator would say fits; the step estimate is close."""
    loaded = small(tmp_path)
    machine = make_machine(loaded)
    est = Estimator(loaded.workload, loaded.topology, machine)
    for cand in LAYOUTS:
        work, res = est.resolve(cand)
        e = est.estimate(cand, res)
        s = simulate(
            LoadedWorkload(work, loaded.topology, loaded.workload_path, loaded.topology_path),
            machine=machine,
        ).summary
        sim = s["memory_gib"]["total"]
        assert e.memory_gib <= sim * (1 + 1e-9), cand
        if cand.zero < 3:
            assert e.memory_gib == pytest.approx(sim, rel=1e-9), cand
        assert e.step_time_s == pytest.approx(s["step_time_s"], rel=0.25), cand


def test_small_plan_ranks_fitting_layouts(tmp_path):
    # 1 GiB of HBM for tensors: many layouts do not fit, and none of those may be returned.
    loaded = small(
        tmp_path, gpu={"base": "H100-SXM-80GB", "hbm_GiB": 1.0, "runtime_reserved_GiB": 0.0}
    )
    res = plan(loaded, 16, top=4, workers=1, headroom_gib=0.0)
    c = res.counts
    assert c["enumerated"] == c["invalid"] + c["does_not_fit"] + c["estimated"]
    assert c["does_not_fit"] > 0  # (every pipeline depth divides: uneven splits)
    assert 1 <= len(res.top) <= 4
    tps = [p.summary["tokens_per_s"] for p in res.top]
    assert tps == sorted(tps, reverse=True)
    assert all(p.summary["fits"] for p in res.top)
    assert all(p.summary["memory_gib"]["total"] <= 1.0 for p in res.top)
    if res.reference is not None and res.reference.summary.get("fits"):
        assert tps[0] >= res.reference.summary["tokens_per_s"]


def test_cli_json(tmp_path, capsys):
    loaded = small(tmp_path)
    rc = cli_main(
        [
            "plan",
            str(loaded.workload_path),
            "--gpus",
            "16",
            "--top",
            "3",
            "--json",
            "--workers",
            "1",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["n_gpus"] == 16 and len(doc["top"]) == 3
    assert doc["top"][0]["summary"]["tokens_per_s"] >= doc["top"][-1]["summary"]["tokens_per_s"]
    best = doc["top"][0]["overrides"]
    # The printed overrides reproduce the winner with `run`.
    again = simulate(load_workload(loaded.workload_path, best)).summary
    assert again["tokens_per_s"] == pytest.approx(doc["top"][0]["summary"]["tokens_per_s"])
    assert (tmp_path / "o" / "plan.csv").exists()
    assert cli_main(["plan", str(loaded.workload_path), "--gpus", "12"]) == 2


def test_llama70b_on_1024_gpus():
    """Fitting layouts, best first, and a winner at least as fast as the layout shipped in
    workloads/llama70b.yaml (the search's wall time is printed by benchmarks/micro.py)."""
    loaded = load_workload(ROOT / "workloads" / "llama70b.yaml")
    res = plan(loaded, 1024, top=5)
    assert len(res.top) == 5 and all(p.summary["fits"] for p in res.top)
    tps = [p.summary["tokens_per_s"] for p in res.top]
    assert tps == sorted(tps, reverse=True)
    shipped = res.reference
    assert shipped is not None and shipped.candidate == Candidate(
        8, 4, 32, 1, 1, "none", "1f1b", 1, True
    )
    assert tps[0] >= shipped.summary["tokens_per_s"]
    # The search itself (not just the reference it always simulates) beats the shipped layout.
    searched = [p for p in res.simulated if not p.is_reference and p.summary.get("fits")]
    assert max(p.summary["tokens_per_s"] for p in searched) >= shipped.summary["tokens_per_s"]


# --------------------------------------------------------------------------------------------
# Issue 15.5: a plan you can paste


def test_run_the_best_line_works_with_stage_layers(tmp_path, capsys):
    """The printed command reproduces the best layout even when the workload has its own
    (uneven) stage_layers, which do not fit another pipeline depth."""
    loaded = small(tmp_path)
    work = loaded.workload_path.read_text().replace("pp: 2", "pp: 2\n  stage_layers: [2, 4]")
    loaded.workload_path.write_text(work)
    assert load_workload(loaded.workload_path).workload.parallelism.stage_layers == (2, 4)
    args = ["plan", str(loaded.workload_path), "--gpus", "16", "--top", "2", "--workers", "1",
            "--no-files"]  # fmt: skip
    assert cli_main(args) == 0
    out = capsys.readouterr().out.splitlines()
    line = out[out.index(next(x for x in out if x.startswith("run the best"))) + 1]
    cmd = shlex.split(line)
    assert cmd[:4] == ["python", "-m", "simulator", "run"]
    assert cli_main([*cmd[3:], "--json", "--no-files"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert cli_main([*args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert best["tokens_per_s"] == pytest.approx(doc["top"][0]["summary"]["tokens_per_s"])


def test_uneven_layer_splits_are_searched(tmp_path):
    # Llama 3 405B: 126 layers on 16 stages, the first and last lighter (Llama Team 2024, 3.3.2).
    assert uneven_split(126, 16) == (7,) + (8,) * 14 + (7,)
    assert uneven_split(80, 16) is None and uneven_split(3, 4) is None
    assert sum(uneven_split(6, 4)) == 6 and uneven_split(6, 4) == (1, 2, 2, 1)
    loaded = small(tmp_path)  # 6 layers: pp 4 divides only unevenly
    cands = [c for c in enumerate_layouts(loaded.workload, 16, 8) if c.pp == 4]
    assert cands and all(c.stage_layers == (1, 2, 2, 1) for c in cands)
    est = Estimator(loaded.workload, loaded.topology, make_machine(loaded))
    work, res = est.resolve(cands[0])  # valid: no longer dropped as not dividing
    assert res.stage_layers == (1, 2, 2, 1)


def test_knobs_are_tried(tmp_path):
    loaded = small(tmp_path)
    t = loaded.workload.training
    base = Candidate(4, 2, 2, 1, 1, "none", "1f1b", 1, True)
    variants = knob_variants(base, loaded.workload)
    assert {(v.overlap_param_gather, v.grad_reduce_dtype) for v in variants} == {
        (not t.overlap_param_gather, None),
        (None, "bf16" if t.grad_reduce_dtype != "bf16" else "fp32"),
        (not t.overlap_param_gather, "bf16" if t.grad_reduce_dtype != "bf16" else "fp32"),
    }
    applied = variants[0].apply(loaded.workload).training
    assert applied.overlap_param_gather is not t.overlap_param_gather
    assert knob_variants(Candidate(8, 2, 1, 1, 0, "none", "1f1b", 1, True), loaded.workload) == []


def test_headroom(tmp_path):
    """Every layout returned leaves the headroom free; more headroom than any layout can
    leave returns none."""
    loaded = small(tmp_path)
    res = plan(loaded, 16, top=3, workers=1, headroom_gib=5.0)
    assert res.top
    for p in res.top:
        mem = p.summary["memory_gib"]
        assert mem["total"] + 5.0 <= mem["capacity"]
    cap = res.top[0].summary["memory_gib"]["capacity"]
    assert plan(loaded, 16, top=3, workers=1, headroom_gib=cap).top == []


def test_no_layout_names_what_refused_the_layouts(tmp_path, capsys):
    """When every layout is refused for one reason (here too many micro-batches a step), the
    error says which; it blamed divisibility alone."""
    path = small(tmp_path).workload_path
    argv = ["plan", str(path), "--gpus", "16", "--no-files",
            "--set", "training.global_batch=16777216"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --gpus: no parallel layout"), err
    assert "refused by training.global_batch" in err and "layer passes" in err, err


def test_plan_table_never_cuts_a_figure(tmp_path):
    """On a terminal narrower than the layouts' labels, the label column wraps and every
    layout's throughput, step time, MFU and memory are printed whole (no ellipsis)."""
    res = plan(small(tmp_path), 16, top=3, workers=1)
    for width in (90, 120):
        buf = io.StringIO()
        Console(file=buf, width=width, highlight=False).print(plan_table(res))
        out = buf.getvalue()
        assert "…" not in out and max(len(x) for x in out.splitlines()) <= width
        for p in res.top:
            s = p.summary
            assert format_seconds(s["step_time_s"]) in out and f"{s['mfu']:.1%}" in out


def test_estimate_computes_at_the_groups_expected_slowest_gpu(tmp_path):
    """The analytic step, like the engine, runs a TP group's compute at its expected slowest
    GPU (simulator/model/sync.py): with one stage and one replica the step grows by exactly
    (factor - 1) x the compute of the same estimate without the spread."""
    import dataclasses

    from simulator.model.sync import expected_max_normal

    work = {
        "name": "s",
        "model": {**SMALL_MODEL, "layers": 4},
        "training": {"global_batch": 4, "micro_batch": 1},
        "parallelism": {"tp": 8, "pp": 1, "zero": 1, "sequence_parallel": True},
    }
    loaded = load_workload(write_case(tmp_path, work, small_topology(1, 8)))
    machine = make_machine(loaded)
    jitter = machine.gpu.sync_jitter
    assert jitter > 0  # the catalog's H100 carries the measured spread
    cand = Candidate(tp=8, pp=1, dp=1, micro_batch=1, zero=1, recompute="none",
                     pp_schedule="1f1b", virtual_stages=1, sequence_parallel=True)
    still = dataclasses.replace(machine, gpu=dataclasses.replace(machine.gpu, sync_jitter=0.0))
    e0 = Estimator(loaded.workload, loaded.topology, still)
    e1 = Estimator(loaded.workload, loaded.topology, machine)
    a, b = e0.estimate(cand, e0.resolve(cand)[1]), e1.estimate(cand, e1.resolve(cand)[1])
    factor = 1.0 + jitter * expected_max_normal(8)  # 1 + 0.0168 x 2.85: +4.8 % at 8
    assert b.step_time_s - a.step_time_s == pytest.approx(
        (factor - 1.0) * a.breakdown_s["compute"], rel=1e-6)
    assert b.breakdown_s["compute"] == pytest.approx(factor * a.breakdown_s["compute"], rel=1e-9)


def test_a_knob_set_either_way_shows_in_the_label():
    """A candidate that turns the parameter gather's overlap off reads differently from one
    that keeps the workload's value (gpt-oss-120b's plan listed two such rows under one label);
    one that turns it on says so; the workload's own value stays unlabelled."""
    from dataclasses import replace

    base = Candidate(4, 2, 2, 1, 1, "none", "1f1b", 1, True)
    labels = {replace(base, overlap_param_gather=v).label() for v in (None, False, True)}
    assert len(labels) == 3
    assert replace(base, overlap_param_gather=False).label().endswith(" no-overlap-gather")
    assert replace(base, overlap_param_gather=True).label().endswith(" overlap-gather")
    assert "overlap" not in base.label()
