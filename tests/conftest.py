"""Shared fixtures: paths and small workloads built in memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# Subprocesses started by tests import this checkout's package, not whatever copy is installed
# (a git worktree beside an editable install of another checkout).
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)


@pytest.fixture
def root() -> Path:
    return ROOT


def write_case(tmp_path: Path, workload: dict, topology: dict) -> Path:
    """Write a workload and its topology into tmp_path; return the workload path."""
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(topology))
    workload = {**workload, "cluster": {"topology": "topo.yaml"}}
    path = tmp_path / "work.yaml"
    path.write_text(yaml.safe_dump(workload))
    return path


def run_summary(tmp_path: Path, capsys, workload: dict, topology: dict) -> dict:
    """``simulator run --json --no-files`` of ``workload`` on ``topology`` (written into
    tmp_path): its summary, without the wall time of the simulation (it varies run to run)."""
    import json

    from simulator.cli import main

    assert main(["run", str(write_case(tmp_path, workload, topology)), "--json", "--no-files"]) == 0
    out = json.loads(capsys.readouterr().out)
    out.pop("sim_wall_s", None)
    return out


SMALL_MODEL = {
    "layers": 8,
    "hidden": 1024,
    "ffn_hidden": 4096,
    "heads": 16,
    "kv_heads": 16,
    "vocab": 32000,
    "seq_len": 1024,
    "activation": "gelu",
}


def small_topology(nodes: int = 1, gpus_per_node: int = 8, **kw) -> dict:
    return {"name": "t", "gpu": "H100-SXM-80GB", "nodes": nodes, "gpus_per_node": gpus_per_node,
            "nodes_per_leaf": 2, **kw}


def small_workload(name: str) -> dict:
    """A valid 8-GPU workload (TP 2 x PP 2 x DP 2, ZeRO-1) of :data:`SMALL_MODEL` on
    ``topo.yaml`` beside it (``small_topology(2, 4)``): the base the CLI input tests mutate."""
    return {
        "name": name,
        "model": dict(SMALL_MODEL),
        "training": {"global_batch": 8, "micro_batch": 1},
        "parallelism": {"tp": 2, "pp": 2, "dp": 2, "zero": 1},
        "cluster": {"topology": "topo.yaml"},
    }
