"""Invalid input through the command line: exit code 2, one ``error:`` line, no files written.

Every case starts from a small valid workload (8 GPUs: 2 nodes x 4, tp 2, pp 2, dp 2), breaks
one thing, runs ``simulator run`` with ``--out`` and checks that

* the exit code is 2 (invalid input), nothing is printed on stdout and no traceback anywhere;
* stderr is exactly one line ``error: FILE: dotted.field: what is wrong (...)``, naming the
  file and field to fix and, where it helps, what is accepted;
* the output folder was not created.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from simulator.calibrate.__main__ import main as calibrate_main
from simulator.cli import build_parser, main
from simulator.config.load import load_sweep
from simulator.errors import ConfigError
from tests.conftest import SMALL_MODEL, small_topology

BASE_WORK = {
    "name": "bad",
    "model": dict(SMALL_MODEL),
    "training": {"global_batch": 8, "micro_batch": 1},
    "parallelism": {"tp": 2, "pp": 2, "dp": 2, "zero": 1},
}
BASE_TOPO = small_topology(2, 4)


def write(tmp_path: Path, work: dict | None = None, topo: dict | None = None) -> Path:
    """Write ``work`` (default: the base case) with ``topo`` beside it; return its path."""
    work = copy.deepcopy(BASE_WORK if work is None else work)
    work.setdefault("cluster", {"topology": "topo.yaml"})
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(topo or BASE_TOPO))
    path = tmp_path / "work.yaml"
    path.write_text(yaml.safe_dump(work))
    return path


def changed(section: str, **kw) -> dict:
    work = copy.deepcopy(BASE_WORK)
    work[section] = {**work.get(section, {}), **kw}
    return work


def fails(capsys, tmp_path: Path, *args: str, out: bool = True) -> str:
    """Run the CLI expecting invalid input; return the one stderr line (without 'error: ')."""
    argv = list(args)
    out_dir = tmp_path / "out"
    if out and argv[0] == "run":
        argv += ["--out", str(out_dir)]
    rc = main(argv)
    cap = capsys.readouterr()
    assert rc == 2, cap.err
    assert cap.out == ""
    assert cap.err.endswith("\n") and cap.err.count("\n") == 1, cap.err
    assert cap.err.startswith("error: ")
    assert "Traceback" not in cap.err
    assert not out_dir.exists(), "invalid input must not write results"
    return cap.err[len("error: ") : -1]


def expect(line: str, file: str | Path, field: str, *words: str) -> None:
    """``line`` reads ``FILE: field: ...`` and contains every word."""
    assert line.startswith(f"{file}: {field}: "), line
    for w in words:
        assert w in line, (w, line)


# --------------------------------------------------------------------------------------------
# Sanity: the base case is valid


def test_base_case_is_valid(tmp_path, capsys):
    assert main(["run", str(write(tmp_path)), "--no-files", "--json"]) == 0
    capsys.readouterr()


# --------------------------------------------------------------------------------------------
# Files and YAML


def test_malformed_yaml(tmp_path, capsys):
    p = tmp_path / "work.yaml"
    p.write_text("name: x\nmodel: {layers: 8\n  hidden: [1, 2\n")
    line = fails(capsys, tmp_path, "run", str(p))
    assert line.startswith(f"{p}: malformed YAML: line "), line


def test_workload_file_does_not_exist(tmp_path, capsys):
    line = fails(capsys, tmp_path, "run", str(tmp_path / "nope.yaml"))
    assert line == f"{tmp_path / 'nope.yaml'}: workload file does not exist"


def test_empty_and_non_mapping_files(tmp_path, capsys):
    p = tmp_path / "work.yaml"
    p.write_text("")
    assert "file is empty" in fails(capsys, tmp_path, "run", str(p))
    p.write_text("- a\n- b\n")
    assert "expected a YAML mapping at the top level, got list" in fails(
        capsys, tmp_path, "run", str(p)
    )


def test_topology_file_does_not_exist(tmp_path, capsys):
    p = write(tmp_path, {**BASE_WORK, "cluster": {"topology": "missing.yaml"}})
    line = fails(capsys, tmp_path, "run", str(p))
    expect(line, p, "cluster.topology", "missing.yaml", "does not exist")


def test_topology_option_does_not_exist(tmp_path, capsys):
    p = write(tmp_path)
    line = fails(capsys, tmp_path, "run", str(p), "--topology", str(tmp_path / "no.yaml"))
    assert line == f"--topology: topology file '{tmp_path / 'no.yaml'}' does not exist"


# --------------------------------------------------------------------------------------------
# Keys and types


def test_unknown_key_with_did_you_mean(tmp_path, capsys):
    p = write(tmp_path, changed("parallelism", tpp=2))
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "parallelism.tpp",
        "unknown key",
        "did you mean 'tp'?",
    )


def test_unknown_top_level_key(tmp_path, capsys):
    p = write(tmp_path, {**BASE_WORK, "modle": {}})
    expect(fails(capsys, tmp_path, "run", str(p)), p, "modle", "did you mean 'model'?")


def test_unknown_topology_key(tmp_path, capsys):
    p = write(tmp_path, topo={**BASE_TOPO, "nic_bandwith_Gbps": 400})
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        tmp_path / "topo.yaml",
        "nic_bandwith_Gbps",
        "unknown key",
        "did you mean 'nic_bandwidth_Gbps'?",
    )


def test_missing_required_key(tmp_path, capsys):
    work = copy.deepcopy(BASE_WORK)
    del work["model"]["hidden"]
    p = write(tmp_path, work)
    expect(fails(capsys, tmp_path, "run", str(p)), p, "model.hidden", "required key is missing")



def test_misspelled_required_key_names_the_spelling(tmp_path, capsys):
    """A required key spelt wrong is both missing and unknown: the line names the spelling
    and the key it stands for, not only that the key is missing."""
    work = copy.deepcopy(BASE_WORK)
    work["training"]["global_bach"] = work["training"].pop("global_batch")
    p = write(tmp_path, work)
    expect(fails(capsys, tmp_path, "run", str(p)), p, "training.global_bach", "unknown key",
           "did you mean 'global_batch'?")  # fmt: skip

@pytest.mark.parametrize(
    "section,key,value,accepted",
    [
        ("model", "layers", "many", "valid integer"),
        ("training", "overlap_grad_reduce", "perhaps", "valid boolean"),
        ("parallelism", "pp_schedule", "zigzag", "'interleaved', 'dualpipe' or 'dualpipev'"),
        ("training", "precision", "fp64", "'fp8', 'mxfp8' or 'nvfp4'"),
    ],
)
def test_wrong_type_or_choice(tmp_path, capsys, section, key, value, accepted):
    p = write(tmp_path, changed(section, **{key: value}))
    expect(
        fails(capsys, tmp_path, "run", str(p)), p, f"{section}.{key}", accepted, f"got {value!r}"
    )


@pytest.mark.parametrize(
    "section,key,value",
    [
        ("model", "hidden", -1024),
        ("model", "layers", 0),
        ("training", "global_batch", 0),
        ("training", "grad_bucket_MB", -25),
    ],
)
def test_negative_or_zero_sizes(tmp_path, capsys, section, key, value):
    p = write(tmp_path, changed(section, **{key: value}))
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        f"{section}.{key}",
        "greater than 0",
        f"got {value}",
    )


@pytest.mark.parametrize(
    "key,value",
    [
        ("nic_bandwidth_Gbps", 0),
        ("nvlink_bandwidth_GBps", -478),
        ("nodes", 0),
        ("pcie_bandwidth_GBps", 0),
    ],
)
def test_negative_or_zero_bandwidths(tmp_path, capsys, key, value):
    p = write(tmp_path, topo={**BASE_TOPO, key: value})
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        tmp_path / "topo.yaml",
        key,
        "greater than",
        f"got {value}",
    )


def test_gpu_not_in_catalog(tmp_path, capsys):
    p = write(tmp_path, topo={**BASE_TOPO, "gpu": "H100-SXM"})
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        tmp_path / "topo.yaml",
        "gpu",
        "unknown GPU 'H100-SXM'",
        "H100-SXM-80GB",
    )


def test_unknown_field_of_an_inline_gpu(tmp_path, capsys):
    # A near miss names the field meant, on a line of readable length (the full list of the
    # catalog's 60-odd fields made it over 900 characters).
    p = write(tmp_path, topo={**BASE_TOPO, "gpu": {"base": "H100-SXM-80GB", "tflops": 5}})
    line = fails(capsys, tmp_path, "run", str(p))
    expect(line, tmp_path / "topo.yaml", "gpu.tflops", "did you mean 'peak_tflops'?")
    assert len(line) < 200, line


# --------------------------------------------------------------------------------------------
# Cross-field rules


def test_tp_pp_dp_not_equal_to_cluster(tmp_path, capsys):
    p = write(tmp_path, changed("parallelism", dp=4))
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "parallelism.dp",
        "tp*pp*dp = 2*2*4 = 16",
        "8 GPUs",
        "dp=2",
        "dp: null to fill the cluster",
    )
    # the way out the message names works
    assert main(["run", str(p), "--no-files", "--json", "--set", "parallelism.dp=null"]) == 0
    capsys.readouterr()


def test_layers_not_divisible_across_stages(tmp_path, capsys):
    work = changed("parallelism", tp=1, pp=4, dp=2)
    work["model"]["layers"] = 10
    p = write(tmp_path, work)
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "parallelism.pp",
        "layers=10",
        "not divisible by pp*virtual_stages=4",
        "stage_layers",
    )


def test_stage_layers_do_not_add_up(tmp_path, capsys):
    p = write(tmp_path, changed("parallelism", stage_layers=[4, 3]))
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "parallelism.stage_layers",
        "adds up to 7 layers",
        "model.layers = 8",
    )


def test_stage_layers_empty_in_the_middle(tmp_path, capsys):
    work = changed("parallelism", pp=2, dp=2, pp_schedule="interleaved", virtual_stages=2,
                   stage_layers=[2, 0, 3, 3])  # fmt: skip
    work["training"]["global_batch"] = 16
    p = write(tmp_path, work)
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "parallelism.stage_layers",
        "virtual stage 1 holds no layer",
        "only the first, with the embedding",
    )


def test_stage_layers_wrong_length(tmp_path, capsys):
    p = write(tmp_path, changed("parallelism", stage_layers=[2, 2, 2, 2]))
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "parallelism.stage_layers",
        "has 4 entries",
        "pp*virtual_stages = 2",
    )


def test_heads_not_divisible_by_tp(tmp_path, capsys):
    work = changed("parallelism", tp=8, pp=1, dp=1)
    work["model"].update(heads=12, kv_heads=12, hidden=1536)
    p = write(tmp_path, work)
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "parallelism.tp",
        "heads=12 is not divisible by tp=8",
    )


def test_kv_heads_not_divisible_by_tp(tmp_path, capsys):
    # 6 KV heads over tp=4: neither splits (6 % 4) nor replicates (4 % 6) evenly.
    work = changed("parallelism", tp=4, pp=1, dp=2)
    work["model"].update(heads=24, kv_heads=6, hidden=1536)
    p = write(tmp_path, work)
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "parallelism.tp",
        "kv_heads=6",
        "tp=4",
        "one must divide the other",
    )


def test_kv_heads_not_dividing_heads(tmp_path, capsys):
    work = copy.deepcopy(BASE_WORK)
    work["model"]["kv_heads"] = 3
    p = write(tmp_path, work)
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "model.kv_heads",
        "kv_heads=3 must divide heads=16",
    )


def test_global_batch_not_divisible(tmp_path, capsys):
    p = write(tmp_path, changed("training", global_batch=9))
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "training.global_batch",
        "global_batch=9 is not divisible by dp*micro_batch = 2*1 = 2",
    )


def test_global_batch_not_divisible_by_micro_batch(tmp_path, capsys):
    p = write(tmp_path, changed("training", global_batch=6, micro_batch=2))
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "training.global_batch",
        "dp*micro_batch = 2*2 = 4",
    )


def test_interleaved_microbatches_not_multiple_of_pp(tmp_path, capsys):
    work = changed("parallelism", pp_schedule="interleaved", virtual_stages=2)
    work["training"]["global_batch"] = 6  # 3 micro-batches per replica, pp = 2
    p = write(tmp_path, work)
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "training.global_batch",
        "interleaved",
        "micro-batches (3)",
        "multiple of pp=2",
    )


def test_virtual_stages_without_interleaved(tmp_path, capsys):
    p = write(tmp_path, changed("parallelism", virtual_stages=2))
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "parallelism.virtual_stages",
        "needs pp_schedule: interleaved",
    )


# --------------------------------------------------------------------------------------------
# Disconnected topologies and faults


def test_nodes_without_nics_are_disconnected(tmp_path, capsys):
    p = write(tmp_path, topo={**BASE_TOPO, "nics_per_node": 0})
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        tmp_path / "topo.yaml",
        "nics_per_node",
        "disconnected",
        "nics_per_node >= 1",
    )


def test_fabric_errors_of_the_topology_graph_name_the_topology_file(tmp_path, capsys):
    # Checks made while the graph is built (tiers, NVLink domain, NICs of several nodes) name
    # the topology file, for every command that builds one.
    p = write(tmp_path, topo={**BASE_TOPO, "network": "rail_only", "tiers": 3})
    topo = tmp_path / "topo.yaml"
    expect(fails(capsys, tmp_path, "run", str(p)), topo, "tiers", "rail-only")
    argv = ["collective", "all_reduce", "--bytes", "1MB", "--topology", str(topo)]
    expect(fails(capsys, tmp_path, *argv), topo, "tiers", "rail-only")
    write(tmp_path, topo=small_topology(1, 4, nics_per_node=0))
    # plan --gpus 8 makes the one-node topology two nodes, which have no NIC to talk through
    line = fails(capsys, tmp_path, "plan", str(p), "--gpus", "8", "--no-files", out=False)
    expect(line, topo, "nics_per_node", "NIC")


def test_link_faults_cutting_a_node_off(tmp_path, capsys):
    # 4 GPUs per node over 8 NICs: GPUs use NICs 0, 2, 4, 6; failing those cuts node 1 off.
    faults = {
        "links": [{"kind": "nic", "node": 1, "nic": i, "bandwidth_factor": 0} for i in (0, 2, 4, 6)]
    }
    p = write(tmp_path, {**BASE_WORK, "faults": faults})
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "faults.links[3].bandwidth_factor",
        "every NIC of node 1 in use (0, 2, 4, 6)",
        "at least one working NIC",
    )


def test_failed_nvlink_port_cuts_a_gpu_off(tmp_path, capsys):
    faults = {"links": [{"kind": "nvlink", "gpu": 5, "bandwidth_factor": 0}]}
    p = write(tmp_path, {**BASE_WORK, "faults": faults})
    expect(
        fails(capsys, tmp_path, "run", str(p)),
        p,
        "faults.links[0].bandwidth_factor",
        "gpu 5",
        "node 1",
        "bandwidth_factor > 0",
    )


@pytest.mark.parametrize(
    "faults,field,words",
    [
        (
            {"stragglers": [{"gpu": 8, "slowdown": 1.2}]},
            "faults.stragglers[0].gpu",
            ("gpu 8 does not exist", "0..7"),
        ),
        (
            {"stragglers": [{"gpu": 1, "node": 0, "slowdown": 1.2}]},
            "faults.stragglers[0]",
            ("exactly one of gpu or node",),
        ),
        (
            {"stragglers": [{"gpu": 1, "slowdown": 0}]},
            "faults.stragglers[0].slowdown",
            ("greater than 0",),
        ),
        ({"links": [{"kind": "nic", "node": 0, "nic": 9}]}, "faults.links[0].nic", ("0..7",)),
        (
            {"links": [{"kind": "nic", "node": 0, "nic": 0, "bandwidth_factor": 1.5}]},
            "faults.links[0].bandwidth_factor",
            ("less than or equal to 1",),
        ),
        (
            {"reliability": {"gpu_mtbf_hours": 0}},
            "faults.reliability.gpu_mtbf_hours",
            ("greater than 0",),
        ),
    ],
)
def test_bad_faults(tmp_path, capsys, faults, field, words):
    p = write(tmp_path, {**BASE_WORK, "faults": faults})
    expect(fails(capsys, tmp_path, "run", str(p)), p, field, *words)


def test_nic_fault_on_a_topology_without_nics(tmp_path, capsys):
    # One node without NICs: the message says so (it read "nic in 0..-1").
    faults = {"links": [{"kind": "nic", "node": 0, "nic": 0, "bandwidth_factor": 0}]}
    work = {**BASE_WORK, "parallelism": {"tp": 2, "pp": 2, "dp": 1}, "faults": faults}
    p = write(tmp_path, work, topo=small_topology(1, 4, nics_per_node=0))
    line = fails(capsys, tmp_path, "run", str(p))
    expect(line, p, "faults.links[0].kind", "no NICs", "kind: nvlink")
    assert "-1" not in line


# --------------------------------------------------------------------------------------------
# --set


def test_set_key_that_does_not_exist(tmp_path, capsys):
    p = write(tmp_path)
    line = fails(capsys, tmp_path, "run", str(p), "--set", "parallelism.tpp=4")
    expect(line, "--set", "parallelism.tpp", "no such key under parallelism", "did you mean 'tp'?")


def test_set_topology_key_that_does_not_exist(tmp_path, capsys):
    p = write(tmp_path)
    line = fails(capsys, tmp_path, "run", str(p), "--set", "topology.nic_bandwith_Gbps=800")
    expect(
        line,
        "--set",
        "topology.nic_bandwith_Gbps",
        "no such key under topology",
        "did you mean 'nic_bandwidth_Gbps'?",
    )


def test_set_topology_key_without_its_prefix(tmp_path, capsys):
    # `--set nodes=2` means topology.nodes: say so, for run and for collective (which takes
    # topology keys only), rather than suggest a workload key.
    p = write(tmp_path)
    line = fails(capsys, tmp_path, "run", str(p), "--set", "nodes=2")
    expect(line, "--set", "nodes", "did you mean 'topology.nodes'?")
    topo = str(tmp_path / "topo.yaml")
    coll = ["collective", "all_reduce", "--bytes", "1MB", "--topology", topo]
    line = fails(capsys, tmp_path, *coll, "--set", "nodez=2")
    expect(line, "--set", "nodez", "only topology keys", "did you mean 'topology.nodes'?")
    line = fails(capsys, tmp_path, *coll, "--set", "parallelism.tp=2")
    expect(line, "--set", "parallelism.tp", "only topology keys")
    assert "accepted" not in line  # no list of workload keys for a topology-only command


def test_collective_size_is_a_whole_number_of_bytes(tmp_path, capsys):
    topo = str(write(tmp_path).parent / "topo.yaml")
    coll = ["collective", "all_reduce", "--topology", topo, "--bytes"]
    line = fails(capsys, tmp_path, *coll, "1.5")
    assert line == "--bytes: size must be a whole number of bytes, got '1.5'"
    assert main([*coll, "1.5KiB", "--json"]) == 0  # 1,536 bytes
    assert '"time_s"' in capsys.readouterr().out


def test_set_without_value(tmp_path, capsys):
    p = write(tmp_path)
    line = fails(capsys, tmp_path, "run", str(p), "--set", "parallelism.tp")
    assert line == "--set: expected dotted.key=value, got 'parallelism.tp'"


def test_set_value_of_wrong_type_names_the_workload(tmp_path, capsys):
    p = write(tmp_path)
    expect(
        fails(capsys, tmp_path, "run", str(p), "--set", "parallelism.tp=two"),
        p,
        "parallelism.tp",
        "valid integer",
        "got 'two'",
    )


def test_a_file_of_another_kind_is_named_for_what_it_is(tmp_path, capsys):
    # A sweep given to run, a workload to sweep, a workload as a topology: one line saying
    # what the file is and which command takes it, not its first key as an unknown key.
    work = write(tmp_path)
    topo = tmp_path / "topo.yaml"
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"name": "s", "base": "work.yaml", "grid": {"seed": [1]}}))
    line = fails(capsys, tmp_path, "run", str(sweep))
    assert line == f"{sweep}: this is a sweep file, not a workload file (run it with `simulator sweep`)"
    line = fails(capsys, tmp_path, "sweep", str(work), "--out", str(tmp_path / "out"))
    assert line.startswith(f"{work}: this is a workload file, not a sweep file"), line
    line = fails(capsys, tmp_path, "run", str(topo))
    assert line.startswith(f"{topo}: this is a topology file, not a workload file"), line
    line = fails(capsys, tmp_path, "run", str(work), "--topology", str(work))
    assert line.startswith(f"{work}: this is a workload file, not a topology file"), line
    coll = ["collective", "all_reduce", "--bytes", "1MB", "--topology", str(sweep)]
    assert fails(capsys, tmp_path, *coll).startswith(f"{sweep}: this is a sweep file"), coll


def test_calibrate_usage_errors_are_one_line(capsys):
    # `python -m simulator.calibrate` reports like the simulator's commands: one error line,
    # no usage block, exit code 2.
    for argv in (["nope"], ["--bogus"]):
        with pytest.raises(SystemExit) as e:
            calibrate_main(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith("error: python -m simulator.calibrate: "), err
    assert "unknown set 'nope'" in calibrate_err(capsys, ["nope"])


def calibrate_err(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit):
        calibrate_main(argv)
    return capsys.readouterr().err


def test_unknown_option_and_command(tmp_path, capsys):
    assert "unrecognized arguments: --bogus" in fails(
        capsys, tmp_path, "run", str(write(tmp_path)), "--bogus", out=False
    )
    assert "invalid choice: 'frobnicate'" in fails(capsys, tmp_path, "frobnicate", out=False)


# --------------------------------------------------------------------------------------------
# Sweeps


def _has_sweep_command() -> bool:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return "sweep" in sub.choices


def sweep_error(capsys, tmp_path: Path, sweep: dict) -> str:
    """The sweep's error line: through ``simulator sweep`` when it is registered, else from
    :func:`load_sweep` (which the command calls first)."""
    p = tmp_path / "sweep.yaml"
    p.write_text(yaml.safe_dump(sweep))
    if _has_sweep_command():
        return fails(
            capsys, tmp_path, "sweep", str(p), "--out", str(tmp_path / "out"), "--no-progress"
        )
    with pytest.raises(ConfigError) as e:
        load_sweep(p)
    return str(e.value)


def test_sweep_key_that_does_not_exist(tmp_path, capsys):
    base = write(tmp_path)
    line = sweep_error(
        capsys, tmp_path, {"name": "s", "base": str(base), "grid": {"parallelism.tpp": [1, 2]}}
    )
    expect(
        line,
        tmp_path / "sweep.yaml",
        "grid.parallelism.tpp",
        "no such key under parallelism",
        "did you mean 'tp'?",
    )


def test_sweep_whose_base_no_point_can_mend(tmp_path, capsys):
    # A base that is not a workload (malformed YAML, not a mapping, a sweep file, a top-level
    # key no override removes) fails every point alike: refused at once, naming the base file.
    grid = {"parallelism.tp": [2]}
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodel: {layers: 2\n")
    line = sweep_error(capsys, tmp_path, {"name": "s", "base": str(bad), "grid": grid})
    assert line.startswith(f"{bad}: malformed YAML"), line
    bad.write_text("- a list\n")
    line = sweep_error(capsys, tmp_path, {"name": "s", "base": str(bad), "grid": grid})
    assert line == f"{bad}: expected a YAML mapping at the top level, got list"
    other = tmp_path / "other-sweep.yaml"
    other.write_text(yaml.safe_dump({"name": "o", "base": "work.yaml", "grid": grid}))
    line = sweep_error(capsys, tmp_path, {"name": "s", "base": str(other), "grid": grid})
    assert line.startswith(f"{other}: this is a sweep file, not a workload file"), line
    work = {**BASE_WORK, "cluster": {"topology": "topo.yaml"}, "trainig": {}}
    write(tmp_path, work)
    line = sweep_error(capsys, tmp_path, {"name": "s", "base": "work.yaml", "grid": grid})
    expect(line, tmp_path / "work.yaml", "trainig", "did you mean 'training'?")


def test_sweep_options_that_mean_nothing(tmp_path, capsys):
    # A negative --limit (read as 0: nothing run), an --address without --engine ray (the
    # sweep ran locally, ignoring it): refused before anything is written.
    sweep = tmp_path / "sweep.yaml"
    write(tmp_path)
    sweep.write_text(yaml.safe_dump({"name": "s", "base": "work.yaml", "grid": {"seed": [1]}}))
    argv = ["sweep", str(sweep), "--out", str(tmp_path / "out"), "--no-progress"]
    assert fails(capsys, tmp_path, *argv, "--limit", "-1") == "--limit: must be >= 0, got -1"
    line = fails(capsys, tmp_path, *argv, "--address", "127.0.0.1:9")
    assert line.startswith("--address: a Ray cluster address is for --engine ray"), line


def test_sweep_topology_key_that_does_not_exist(tmp_path, capsys):
    base = write(tmp_path)
    line = sweep_error(
        capsys, tmp_path, {"name": "s", "base": str(base), "points": [{"topology.nodez": 4}]}
    )
    expect(
        line,
        tmp_path / "sweep.yaml",
        "points[0].topology.nodez",
        "no such key under topology",
        "did you mean 'nodes'?",
    )


def test_empty_sweep(tmp_path, capsys):
    base = write(tmp_path)
    line = sweep_error(capsys, tmp_path, {"name": "s", "base": str(base)})
    expect(line, tmp_path / "sweep.yaml", "grid", "the sweep is empty", "grid or points")


def test_sweep_key_with_no_values(tmp_path, capsys):
    base = write(tmp_path)
    line = sweep_error(
        capsys, tmp_path, {"name": "s", "base": str(base), "grid": {"parallelism.tp": []}}
    )
    expect(line, tmp_path / "sweep.yaml", "grid.parallelism.tp", "no values to sweep")


# --------------------------------------------------------------------------------------------
# Results: old files survive invalid input; writes are atomic


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def test_invalid_input_leaves_old_results_untouched(tmp_path, capsys):
    p = write(tmp_path)
    out = tmp_path / "results"
    assert main(["run", str(p), "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    before = _snapshot(out)
    assert {"summary.json", "events.parquet", "trace.json"} <= set(before)
    (tmp_path / "bad").mkdir()
    bad = write(tmp_path / "bad", changed("parallelism", dp=3))
    rc = main(["run", str(bad), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ")
    assert _snapshot(out) == before
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]


def test_results_are_written_atomically(tmp_path, capsys, monkeypatch):
    """run writes through the temp-file-then-rename writers, so a failure while writing
    leaves the previous file whole and no temporary file behind."""
    from simulator.report import io as rio

    p = write(tmp_path)
    out = tmp_path / "results"
    assert main(["run", str(p), "--out", str(out), "--no-files"]) == 0
    capsys.readouterr()
    target = out / "summary.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text('{"old": true}\n')
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        replaced.append((Path(src).name, Path(dst).name))
        return real_replace(src, dst)

    monkeypatch.setattr(rio.os, "replace", spy)
    assert main(["run", str(p), "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    names = {dst for _, dst in replaced}
    assert {"summary.json", "events.parquet", "trace.json"} <= names
    assert all(src.startswith(f".{dst}.") and src.endswith(".tmp") for src, dst in replaced)

    # A write that fails half-way keeps the old file and removes its temporary file.
    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(rio.os, "replace", boom)
    old = target.read_bytes()
    with pytest.raises(OSError):
        rio.write_json_atomic(target, {"new": True})
    assert target.read_bytes() == old
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
