"""Issue 16: absurd values, YAML hazards and wrong types are refused at once, with exit 2.

Each family runs as one batch in a subprocess (:mod:`tests.cli_batch`) whose timeout is the
wall-time ceiling: a hang or a runaway simulation fails the test. Every case must exit 2 with
one ``error:`` line naming the field, and leave no output folder.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from simulator.config.yaml_safe import MAX_DEPTH, MAX_FILE_BYTES
from tests.cli_batch import assert_refused, run_batch
from tests.conftest import small_topology, small_workload

WORK = small_workload("bad")


@pytest.fixture
def case_dir(tmp_path: Path) -> Path:
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(small_topology(2, 4)))
    (tmp_path / "work.yaml").write_text(yaml.safe_dump(WORK))
    return tmp_path


def check_all(case_dir: Path, cases: dict[str, tuple[list[str], str]], timeout: float = 120):
    """Run every ``(argv, expected text)`` case; each is refused, names what it should and
    leaves no output folder."""
    argvs = []
    for name, (argv, _) in cases.items():
        argv = list(argv)
        if argv[0] == "run":
            argv += ["--out", f"out-{name}"]
        argvs.append(argv)
    for (name, (_, words)), o in zip(
        cases.items(), run_batch(argvs, case_dir, timeout=timeout), strict=True
    ):
        line = assert_refused(o)
        assert words in line, (name, line)
        assert not (case_dir / f"out-{name}").exists(), name
    leftovers = {p.name for p in case_dir.iterdir()} - {"topo.yaml", "work.yaml"}
    assert not {p for p in leftovers if p.startswith(("out-", "results"))}, leftovers


def run_set(*sets: str) -> list[str]:
    argv = ["run", "work.yaml"]
    for s in sets:
        argv += ["--set", s]
    return argv


# --------------------------------------------------------------------------------------------
# Family 1: absurd but well-typed values hit a documented bound


def test_absurd_sizes_are_refused_quickly(case_dir):
    check_all(
        case_dir,
        {
            "layers": (run_set(f"model.layers={10**30}"), "model.layers: input should be less"),
            "hidden": (run_set("model.hidden=1000000000"), "model.hidden"),
            "seq_len": (run_set(f"model.seq_len={10**12}"), "model.seq_len"),
            "global_batch": (run_set(f"training.global_batch={10**15}"), "global_batch"),
            "micro_batch": (run_set(f"training.micro_batch={10**15}"), "training.micro_batch"),
            "micro_batches": (
                run_set("training.global_batch=4194304"),
                "training.global_batch: 2,097,152 micro-batches",
            ),
            "slowdown": (
                run_set("faults.stragglers=[{gpu: 1, slowdown: 1e300}]"),
                "faults.stragglers[0].slowdown",
            ),
            "link_factor": (
                run_set("faults.links=[{kind: nvlink, gpu: 1, bandwidth_factor: 1e-300}]"),
                "faults.links[0].bandwidth_factor",
            ),
            "nic": (run_set("topology.nic_bandwidth_Gbps=1e-300"), "nic_bandwidth_Gbps"),
            "million_gpus": (run_set("topology.nodes=125000"), "topo.yaml: nodes"),
            "cluster_size": (
                run_set("topology.nodes=32768", "topology.gpus_per_node=8"),
                "GPUs; the simulator takes up to 131,072",
            ),
            "plan_gpus": (["plan", "work.yaml", "--gpus", "1000000000"], "--gpus: must be in"),
            "plan_no_layout": (["plan", "work.yaml", "--gpus", "44"], "no parallel layout"),
            "variant_layout": (
                ["compare", "work.yaml", "--topology", "topo.yaml", "--variant",
                 "deep:parallelism.pp=3"],
                "variant 'deep':",
            ),
            "variant_slowdown": (
                [
                    "compare", "work.yaml", "--topology", "topo.yaml",
                    "--variant", "slow:faults.stragglers=[{gpu: 1, slowdown: 1e12}]",
                ],
                "slowdown",
            ),
        },
    )


# --------------------------------------------------------------------------------------------
# Family 2: YAML hazards


def test_yaml_hazards_are_refused(case_dir):
    laughs = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        laughs.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    (case_dir / "laughs.yaml").write_text("\n".join(laughs) + "\n")
    (case_dir / "dup.yaml").write_text(yaml.safe_dump(WORK) + "name: again\n")
    (case_dir / "deep.yaml").write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    (case_dir / "deep2.yaml").write_text("x: " + "[" * (MAX_DEPTH + 2) + "]" * (MAX_DEPTH + 2))
    (case_dir / "big.yaml").write_text("# pad\n" * (MAX_FILE_BYTES // 6 + 10) + "name: x\n")
    (case_dir / "binary.yaml").write_bytes(b"\x00\xff\xfe" * 100)
    os.mkfifo(case_dir / "fifo.yaml")
    check_all(
        case_dir,
        {
            "laughs": (["run", "laughs.yaml"], "aliases are expanded"),
            "dup": (["run", "dup.yaml"], "duplicate key 'name'"),
            "deep": (["run", "deep.yaml"], "nested deeper than"),
            "deep2": (["run", "deep2.yaml"], "nested deeper than"),
            "big": (["run", "big.yaml"], "is larger than"),
            "binary": (["run", "binary.yaml"], "not UTF-8 text"),
            "fifo": (["run", "fifo.yaml"], "not a regular file"),
            "set_laughs": (
                run_set("seed=" + "[" * 5000 + "]" * 5000),
                "--set: seed: malformed YAML: nested deeper",
            ),
        },
    )


def test_yaml_12_exponent_floats_are_numbers(tmp_path):
    """``1e9`` is a float (YAML 1.2), not the string YAML 1.1 makes of it."""
    from simulator.config.yaml_safe import parse_yaml

    assert parse_yaml("a: 300.0e9\nb: 1e9\nc: -2.5E-3\nd: 1e\ne: 10") == {
        "a": 300.0e9, "b": 1e9, "c": -2.5e-3, "d": "1e", "e": 10,
    }


# --------------------------------------------------------------------------------------------
# Family 3: a value of the wrong type is refused, not coerced


def test_wrong_types_are_not_coerced(case_dir):
    grid_nan = {"name": "s", "base": "work.yaml", "grid": {"training.grad_bucket_MB": [1, ".nan"]}}
    text = yaml.safe_dump(grid_nan).replace("'.nan'", ".nan")
    (case_dir / "nan.yaml").write_text(text)
    check_all(
        case_dir,
        {
            "zero_true": (run_set("parallelism.zero=true"), "parallelism.zero: a bool is not"),
            "zero_float": (run_set("parallelism.zero=1.0"), "parallelism.zero"),
            "tp_float": (run_set("parallelism.tp=2.0"), "parallelism.tp: input should be a valid"),
            "tp_str": (run_set("parallelism.tp='2'"), "parallelism.tp"),
            "stage_float": (run_set("parallelism.stage_layers=[4.0, 4]"), "stage_layers[0]"),
            "bucket_inf": (run_set("training.grad_bucket_MB=.inf"), "finite number"),
            "sp_int": (run_set("parallelism.sequence_parallel=1"), "valid boolean"),
            "slowdown_bool": (
                run_set("faults.stragglers=[{gpu: 1, slowdown: true}]"),
                "faults.stragglers[0].slowdown",
            ),
            "hbm_nan": (run_set("topology.nvlink_latency_us=.nan"), "finite number"),
            "sweep_nan": (["sweep", "nan.yaml", "--no-progress"], "grid.training.grad_bucket_MB"),
        },
    )


def test_base_case_still_runs(case_dir):
    """The cases above fail for their one change, not because the base case is broken."""
    base = copy.deepcopy(WORK)
    (case_dir / "work.yaml").write_text(yaml.safe_dump(base))
    [o] = run_batch([["run", "work.yaml", "--no-files", "--json"]], case_dir)
    assert o.rc == 0, o.err
