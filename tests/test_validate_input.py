"""Malformed validation suites: exit 2 with one ``error:`` line (issue 16 family 5, issue 17
item 8), checked before anything is printed, so no blank line or table precedes the error."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.cli_batch import assert_refused, run_batch
from tests.conftest import ROOT

TOPO = ROOT / "topologies" / "h200x4-nvswitch.yaml"
ROW = {"op": "all_reduce", "group": 4, "bytes": 1048576, "time_s": 5e-5}


def _collectives(tmp: Path, name: str, rows: list | str | None = None, **over) -> str:
    data = tmp / f"{name}.jsonl"
    if isinstance(rows, str):
        data.write_text(rows)
    else:
        data.write_text("".join(json.dumps(r) + "\n" for r in (rows or [ROW])))
    suite = {"name": name, "kind": "collectives", "role": "held_out", "data": str(data),
             "topology": str(TOPO), "ops": ["all_reduce"],
             "bands": [{"name": "all", "tolerance_mape": 0.5}], **over}
    suite = {k: v for k, v in suite.items() if v is not None}
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(suite))
    return f"{name}.yaml"


def _workloads(tmp: Path, name: str, case: dict | None = None, **over) -> str:
    case = case or {"name": "c", "workload": str(ROOT / "validation" / "measured" / "d_tp4.yaml"),
                    "measured": {"step_time_s": 1.0}}
    suite = {"name": name, "role": "held_out", "metric": "step_time_s", "cases": [case], **over}
    (tmp / f"{name}.yaml").write_text(yaml.safe_dump(suite))
    return f"{name}.yaml"


def test_malformed_suites_exit_2_with_one_line(tmp_path):
    (tmp_path / "adir").mkdir()
    (tmp_path / "binary.yaml").write_bytes(b"\x00\xff\x01" * 50)
    (tmp_path / "bad.yaml").write_text("name: [x\n")
    w = ROOT / "validation" / "measured" / "d_tp4.yaml"
    cases = {
        "missing": ("nope.yaml", "does not exist"),
        "directory": ("adir", "is a directory"),
        "binary": ("binary.yaml", "not UTF-8"),
        "bad_yaml": ("bad.yaml", "malformed YAML"),
        "no_data": (_collectives(tmp_path, "nodata", data=None), "data: required key"),
        "no_topology": (_collectives(tmp_path, "notopo", topology=None), "topology: required"),
        "group0": (_collectives(tmp_path, "g0", [{**ROW, "group": 0}]), "line 1.group"),
        "group_big": (
            _collectives(tmp_path, "gbig", [{**ROW, "group": 1000}]),
            "line 1.group: a group of 1000 GPUs, but the topology",
        ),
        "time_zero": (_collectives(tmp_path, "t0", [{**ROW, "time_s": 0}]), "line 1.time_s"),
        "bad_jsonl": (_collectives(tmp_path, "bj", "{not json\n"), "line 1: not a JSON object"),
        "nan_jsonl": (_collectives(tmp_path, "nj", '{"time_s": NaN}\n'), "line 1: not a JSON"),
        "no_rows": (_collectives(tmp_path, "nr", ops=["broadcast"]), "data: no measured row"),
        "tolerance_str": (
            _collectives(tmp_path, "ts", bands=[{"name": "a", "tolerance_mape": "0.1"}]),
            "bands[0].tolerance_mape",
        ),
        "unknown_key": (
            _workloads(tmp_path, "uk", tolerance_mapee=0.1),
            "tolerance_mapee: unknown key (did you mean 'tolerance_mape'?)",
        ),
        "measured_zero": (
            _workloads(tmp_path, "m0", {"name": "c", "workload": str(w),
                                        "measured": {"step_time_s": 0}}),
            "cases[0].measured.step_time_s",
        ),
        "measured_str": (
            _workloads(tmp_path, "ms", {"name": "c", "workload": str(w),
                                        "measured": {"step_time_s": "fast"}}),
            "cases[0].measured.step_time_s",
        ),
        "no_measured_metric": (
            _workloads(tmp_path, "nm", {"name": "c", "workload": str(w),
                                        "measured": {"mfu": 0.4}}),
            "metric='step_time_s' is not among cases[0].measured",
        ),
        "bad_layout": (
            _workloads(tmp_path, "bl", {"name": "c", "workload": str(w),
                                        "set": {"parallelism.tp": 3},
                                        "measured": {"step_time_s": 1.0}}),
            # the key the case sets, in the case (d_tp4.yaml alone is valid)
            "bl.yaml (cases[0]): parallelism.tp: tp*pp*dp = 3",
        ),
        "a_workload": (str(w), "d_tp4.yaml: this is a workload file, not a validation suite"),
        "a_sweep": (
            str(ROOT / "sweeps" / "purchase-llama3-70b.yaml"),
            "this is a sweep file, not a validation suite file (run it with `simulator sweep`)",
        ),
        "no_cases": (_workloads(tmp_path, "nc", cases=[]), "cases"),
    }
    outcomes = run_batch([["validate", path] for path, _ in cases.values()], tmp_path)
    for (name, (_, words)), o in zip(cases.items(), outcomes, strict=True):
        line = assert_refused(o)
        assert words in line, (name, line)


def test_every_shipped_suite_is_found_and_loads():
    """`validate` with no argument (what CI runs) finds every suite in validation/ -- nested
    ones too, such as the MoE suites -- and each one passes the suite schema and loads all of
    its cases (the simulation itself is left to `validate` in CI)."""
    from simulator.commands.validate_cmd import default_suites
    from simulator.validate import prepare_suite

    found = {p.relative_to(p.parents[1]).as_posix() if p.parent.name != "validation"
             else p.name for p in default_suites()}
    assert {"moe/parallel-folding.yaml", "moe/qwen3-zoo-h100.yaml", "moe/nemo-mbridge-moe.yaml",
            "heldout/suite.yaml",
            "published.yaml"} <= found
    assert not any(name.startswith("node8/") for name in found)  # cases without measurements
    for path in default_suites():
        prepare_suite(path)
