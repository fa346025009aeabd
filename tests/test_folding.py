"""Folded and full-detail simulations agree (step time and breakdown within 1%).

Folded mode simulates one process per distinct behaviour and prices collectives on the real
groups' links; full detail simulates every GPU and every algorithm step as flows in the
max-min fair network. On symmetric layouts both must tell the same story.
"""

from __future__ import annotations

import pytest

from simulator.cli import main as cli_main
from simulator.config.load import load_workload
from simulator.run import FULL_DETAIL_MAX_UNITS, simulate
from tests.conftest import SMALL_MODEL, small_topology, write_case

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
