"""Folded and full-detail simulations agree (step time and breakdown within 1%).

Folded mode simulates one process per distinct behaviour and prices collectives on the real
groups' links; full detail simulates every GPU and every algorithm step as flows in the
max-min fair network. Both must tell the same story: on the fixed layouts below, on seeded
random layouts (``tests/folding_cases.py``; ``benchmarks/folding.py`` runs a larger set and
prints the error distribution), and where traffic of different kinds shares links.
"""

from __future__ import annotations

import pytest

from simulator.cli import main as cli_main
from simulator.config.load import load_workload
from simulator.run import FULL_DETAIL_MAX_UNITS, simulate
from tests.conftest import SMALL_MODEL, small_topology, write_case
from tests.folding_cases import describe, random_case

MODEL = {"layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 16,
         "vocab": 32000, "seq_len": 1024, "activation": "gelu"}
LLAMA = {"layers": 4, "hidden": 1024, "ffn_hidden": 2816, "heads": 16, "kv_heads": 4,
         "vocab": 32000, "seq_len": 1024, "activation": "swiglu"}
LONG = {**LLAMA, "layers": 2, "seq_len": 16384}

CASES = [
    # (name, nodes, gpus/node, model, parallelism, training)
    ("tp8", 1, 8, MODEL, {"tp": 8, "pp": 1, "dp": 1}, {"global_batch": 4}),
    ("tp4-sp-pp2-dp2", 2, 8, LLAMA,
     {"tp": 4, "pp": 2, "dp": 2, "sequence_parallel": True, "zero": 1}, {"global_batch": 8}),
    ("dp16-zero3", 2, 8, MODEL, {"tp": 1, "pp": 1, "dp": 16, "zero": 3}, {"global_batch": 32}),
    ("tp2-pp2-dp16-interleaved", 8, 8, LLAMA,
     {"tp": 2, "pp": 2, "dp": 16, "pp_schedule": "interleaved", "virtual_stages": 2},
     {"global_batch": 64}),
    ("tp8-pp2-dp16-zero1", 32, 8, MODEL,
     {"tp": 8, "pp": 2, "dp": 16, "zero": 1, "sequence_parallel": True}, {"global_batch": 64}),
    # context parallelism: ring attention inside a node, all-gather across nodes, ring across
    ("tp2-cp4-ring", 1, 8, LONG,
     {"tp": 2, "cp": 4, "pp": 1, "dp": 1, "sequence_parallel": True}, {"global_batch": 2}),
    ("tp2-cp2-dp4-allgather", 2, 8, LONG,
     {"tp": 2, "cp": 2, "pp": 1, "dp": 4, "cp_comm": "all_gather", "zero": 1},
     {"global_batch": 8}),
    ("tp4-cp4-dp2-ring-across-nodes", 4, 8, LONG,
     {"tp": 4, "cp": 4, "pp": 1, "dp": 2, "sequence_parallel": True, "zero": 1},
     {"global_batch": 4}),
]


@pytest.mark.parametrize("name,nodes,gpn,model,par,train", CASES, ids=[c[0] for c in CASES])
def test_full_and_folded_agree(tmp_path, name, nodes, gpn, model, par, train):
    topo = {"name": "t", "gpu": "H100-SXM-80GB", "nodes": nodes, "gpus_per_node": gpn,
            "nics_per_node": gpn, "nodes_per_leaf": 4}
    if name == "tp2-pp2-dp16-interleaved":
        # NVLink SHARP off here: with it (NVLS Tree gradient all-reduces sharing NVLink with
        # the pipeline sends) the step agrees but the parts split up to 1.6 % of the step
        # apart (pp_bubble), a known worse case (README, folded and full detail), checked below
        topo["nvls"] = False
    work = {"name": name, "model": model, "training": {"micro_batch": 1, **train},
            "parallelism": par}
    loaded = load_workload(write_case(tmp_path, work, topo))
    folded = simulate(loaded, detail="folded").summary
    full = simulate(loaded, detail="full").summary
    assert full["simulated_processes"] == nodes * gpn
    assert folded["simulated_processes"] < full["simulated_processes"]
    assert folded["step_time_s"] == pytest.approx(full["step_time_s"], rel=0.01)
    step = full["step_time_s"]
    for key, value in full["breakdown_s"].items():
        # Each component within 1% of the step time.
        assert folded["breakdown_s"][key] == pytest.approx(value, abs=0.01 * step), key
    assert folded["memory_gib"]["total"] == pytest.approx(full["memory_gib"]["total"], rel=1e-6)


def test_full_and_folded_agree_on_the_step_with_nvls_tree(tmp_path):
    """The interleaved case with NVLink SHARP on: the step within 1.5 %, the parts within 3 %
    of the step (folded +1.2 %, pp_comm +2.5 % of the step, since DP collectives are slowed
    beside compute by message size: pipeline sends that meet a slowed DP collective are priced
    in the flow network; README names it)."""
    name, nodes, gpn, model, par, train = CASES[3]
    topo = {"name": "t", "gpu": "H100-SXM-80GB", "nodes": nodes, "gpus_per_node": gpn,
            "nics_per_node": gpn, "nodes_per_leaf": 4}
    work = {"name": name, "model": model, "training": {"micro_batch": 1, **train},
            "parallelism": par}
    loaded = load_workload(write_case(tmp_path, work, topo))
    folded = simulate(loaded, detail="folded").summary
    full = simulate(loaded, detail="full").summary
    assert folded["step_time_s"] == pytest.approx(full["step_time_s"], rel=0.015)
    for key, value in full["breakdown_s"].items():
        assert folded["breakdown_s"][key] == pytest.approx(value, abs=0.03 * full["step_time_s"])


def test_full_detail_refuses_what_it_cannot_finish(tmp_path, capsys):
    """Issue 15.6: --detail full at 512 GPUs grew past 12 GB and ran for more than 15 min. A
    simulation above the measured limit (GPUs x micro-batches x layers) is refused at once
    with one line; one within it runs."""
    # 512 GPUs, 4 micro-batches per replica, 40 layers: 81,920 units.
    work = {
        "name": "big",
        "model": {**SMALL_MODEL, "layers": 40},
        "training": {"global_batch": 256, "micro_batch": 1},
        "parallelism": {"tp": 8, "pp": 1, "dp": 64},
    }
    path = write_case(tmp_path, work, small_topology(64, 8))
    assert 512 * 4 * 40 > FULL_DETAIL_MAX_UNITS
    assert cli_main(["run", str(path), "--detail", "full", "--no-files"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1 and "81,920" in err


def _agree(folded: dict, full: dict, what: str, tol: float = 0.01) -> None:
    step = full["step_time_s"]
    assert folded["step_time_s"] == pytest.approx(step, rel=tol), what
    for key, value in full["breakdown_s"].items():
        assert folded["breakdown_s"][key] == pytest.approx(value, abs=tol * step), (key, what)


#: Seeds of random_case(seed, 32) whose full-detail run is quick (a few seconds); together
#: they cover TP 1-16 (across nodes), PP 1-4 with every schedule, ZeRO 0-3, SP, overlap on
#: and off, recompute, 1:1 to 4:1 oversubscription, one node per leaf, one NIC per node and
#: stragglers.
SEEDS = [0, 1, 2, 3, 6, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20, 22]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_layouts_agree(tmp_path, seed):
    _, work, topo = random_case(seed, 32)
    loaded = load_workload(write_case(tmp_path, work, topo))
    folded = simulate(loaded, detail="folded").summary
    full = simulate(loaded, detail="full").summary
    _agree(folded, full, describe(work, topo))


def _tp16(tmp_path, zero: int, stragglers=()) -> tuple[dict, dict]:
    """TP 16 over two nodes beside data-parallel traffic, on one NIC per node and a 4:1
    oversubscribed leaf per node: TP collectives and DP/ZeRO collectives share NICs and
    uplinks."""
    model = {**MODEL, "layers": 2}
    work = {"name": "tp16", "model": model, "training": {"global_batch": 4},
            "parallelism": {"tp": 16, "pp": 1, "dp": 2, "zero": zero},
            "faults": {"stragglers": list(stragglers)}}
    topo = {"name": "t", "gpu": "H100-SXM-80GB", "nodes": 4, "gpus_per_node": 8,
            "nics_per_node": 1, "nodes_per_leaf": 1, "oversubscription": 4.0}
    loaded = load_workload(write_case(tmp_path, work, topo))
    return (simulate(loaded, detail="folded").summary, simulate(loaded, detail="full").summary)


def test_tp_collectives_contend_with_dp_traffic(tmp_path):
    """Issue 14 item 1: folded priced TP collectives alone, so it missed their sharing NICs
    with the ZeRO-3 gathers and gradient reduce-scatters (folded was 19 % fast). Now they run
    in the flow network beside them, as bundles of the 2 concurrent TP groups; the bundles
    merge a ring's steps, which under contention leaves +1.0 % against step-by-step flows:
    the worst case we know (README), hence 2 % here."""
    folded, full = _tp16(tmp_path, zero=3)
    _agree(folded, full, "tp16 zero3", tol=0.02)


def test_straggler_breakdown_matches_full_detail(tmp_path):
    """Issue 14 item 2: a straggling GPU slows its own compute; its TP peers wait for it in
    their TP collectives. The straggler finishes last (its optimizer is slow too), so it is
    the critical GPU in both modes and its breakdown agrees part by part (folded was 19 %
    fast: its TP collectives missed the ZeRO-3 traffic on the shared NIC)."""
    folded, full = _tp16(tmp_path, zero=3, stragglers=[{"gpu": 15, "slowdown": 1.5}])
    assert full["critical_process"] == "g15"
    _agree(folded, full, "tp16 zero3 straggler", tol=0.02)
