"""Sweeps: expansion, parallel engines (process pool and Ray) agree byte for byte, an
interrupted sweep resumes without losing or duplicating a point, bad points are rows."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from simulator.cli import main as cli_main
from simulator.config.load import load_sweep
from simulator.config.schema import SweepConfig
from simulator.errors import ConfigError
from simulator.sweep import (
    DOES_NOT_FIT,
    INVALID,
    OK,
    RESULT_COLUMNS,
    comparable,
    expand,
    point_key,
    run_sweep,
    varying_keys,
)
from tests.conftest import ROOT, SMALL_MODEL, small_topology

NICS = [100, 200, 400, 800]
OVERSUB = [1.0, 2.0, 3.0, 4.0]


def write_sweep(tmp_path, *, grid=None, points=None, metric="tokens_per_s", name="s"):
    """A 2-node (16-GPU) small workload and a sweep over it; returns the sweep path."""
    # One node per leaf: every inter-node hop crosses the spine, so oversubscription shows.
    topo = small_topology(2, 8, nodes_per_leaf=1)
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(topo))
    work = {
        "name": "w",
        "model": {**SMALL_MODEL, "layers": 4},
        "training": {"global_batch": 8, "micro_batch": 1, "overlap_grad_reduce": False},
        "parallelism": {"tp": 8, "pp": 1, "dp": 2, "zero": 1},
        "cluster": {"topology": "topo.yaml"},
    }
    (tmp_path / "work.yaml").write_text(yaml.safe_dump(work))
    sweep = {"name": name, "base": "work.yaml", "metric": metric}
    if grid is not None:
        sweep["grid"] = grid
    if points is not None:
        sweep["points"] = points
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    return path


GRID = {"topology.nic_bandwidth_Gbps": NICS, "topology.oversubscription": OVERSUB}


@pytest.fixture(scope="module")
def full_local(tmp_path_factory):
    """The 4x4 sweep, run once with the process pool."""
    d = tmp_path_factory.mktemp("full")
    path = write_sweep(d, grid=GRID)
    out = run_sweep(path, engine="local", workers=2, out=d / "out")
    return path, out


# --------------------------------------------------------------------------------------------
# Expansion


def test_expand_grid_then_points_dedup():
    sweep = SweepConfig(
        name="x",
        base="b.yaml",
        grid={"a.b": (1, 2), "c": ("x", "y", "z")},
        points=({"c": "x", "a.b": 1}, {"d": [1, 2]}),
    )
    pts = expand(sweep)
    # Cartesian product, first key outermost; the explicit duplicate of (1, x) is dropped.
    assert [p.overrides for p in pts[:3]] == [
        {"a.b": 1, "c": "x"},
        {"a.b": 1, "c": "y"},
        {"a.b": 1, "c": "z"},
    ]
    assert len(pts) == 7 and pts[-1].overrides == {"d": [1, 2]}
    assert [p.index for p in pts] == list(range(7))
    # The key is canonical: key order does not matter.
    assert point_key({"c": "x", "a.b": 1}) == point_key({"a.b": 1, "c": "x"}) == pts[0].key
    assert varying_keys(pts) == ["a.b", "c", "d"]


def test_shipped_sweep_is_4x4_on_512_gpus():
    sweep = load_sweep(ROOT / "sweeps" / "nic-vs-oversubscription.yaml")
    pts = expand(sweep)
    assert len(pts) == 16
    assert varying_keys(pts) == ["topology.nic_bandwidth_Gbps", "topology.oversubscription"]
    from simulator.config.checks import resolve
    from simulator.sweep import base_path, prepare

    base = base_path(ROOT / "sweeps" / "nic-vs-oversubscription.yaml", sweep)
    loaded = prepare(base, pts[0])
    res = resolve(loaded.workload, loaded.topology, file="x")
    assert res.n_gpus == 512


# --------------------------------------------------------------------------------------------
# Engines agree; results make sense


def test_local_sweep_table(full_local):
    path, out = full_local
    df = out.table
    assert len(df) == 16 and list(df["point_index"]) == list(range(16))
    assert (df["status"] == OK).all()
    assert out.keys == list(GRID)
    assert list(df.columns) == ["point_index", "point", "inputs", *GRID, *RESULT_COLUMNS]
    assert "sim_wall_s" not in df.columns
    # The file on disk is the table.
    disk = pd.read_parquet(out.path)
    assert disk["point"].tolist() == df["point"].tolist()
    assert (out.out / "sweep.png").exists() is False  # plots are the command's job
    # More NIC bandwidth never slows DP down; more oversubscription never speeds it up;
    # TP time (NVLink) does not move at all.
    dp = df.pivot(
        index="topology.nic_bandwidth_Gbps",
        columns="topology.oversubscription",
        values="breakdown_s.dp_comm",
    )
    assert (dp.diff(axis=0).dropna() <= 1e-12).all().all()
    assert (dp.diff(axis=1).dropna() >= -1e-12).all().all()
    assert dp.loc[400, 2.0] > 1.3 * dp.loc[400, 1.0]
    assert df["breakdown_s.tp_comm"].nunique() == 1


def test_ray_gives_the_same_bytes(full_local, tmp_path):
    """The Ray engine writes the same table as the process pool. Run as the CLI in a process
    of its own: a Ray driver that loses its local cluster (a GCS or raylet health check missed
    on a loaded 2-core machine) ends its process with exit 1, which inside pytest ended the
    whole test run without a word."""
    pytest.importorskip("ray")
    path, local = full_local
    out = tmp_path / "ray"
    # Ray's own folder, short (its socket paths must fit 107 characters) and our own: the
    # local instance's session folder is removed when the sweep ends.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    env = dict(os.environ, RAY_TMPDIR=str(ray_tmp), PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "simulator", "sweep", str(path), "--engine", "ray",
           "--workers", "2", "--out", str(out), "--no-progress"]
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        assert list(ray_tmp.glob("ray/session_*")) == []
        assert "Started a local Ray instance" not in proc.stderr  # Ray's notes stay quiet
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert (out / "sweep.parquet").read_bytes() == local.path.read_bytes()
    table = pd.read_parquet(out / "sweep.parquet")
    pd.testing.assert_frame_equal(comparable(table), comparable(local.table))


def test_inline_equals_pool(full_local, tmp_path):
    path, local = full_local
    out = run_sweep(path, engine="local", workers=1, out=tmp_path / "one")
    assert out.path.read_bytes() == local.path.read_bytes()


# --------------------------------------------------------------------------------------------
# Resume


def test_resume_after_limit(full_local, tmp_path):
    path, local = full_local
    out_dir = tmp_path / "part"
    first = run_sweep(path, workers=2, out=out_dir, limit=5)
    assert first.n_run == 5 and len(first.table) == 5
    second = run_sweep(path, workers=2, out=out_dir)
    assert second.n_skipped == 5 and second.n_run == 11
    assert second.path.read_bytes() == local.path.read_bytes()
    third = run_sweep(path, workers=2, out=out_dir)  # nothing left to do
    assert third.n_run == 0 and third.path.read_bytes() == local.path.read_bytes()


def test_resume_after_crash(full_local, tmp_path):
    """Kill the sweep (hard exit) after 3 points, rerun: nothing lost, nothing duplicated."""
    path, local = full_local
    out_dir = tmp_path / "crash"
    env = {**os.environ, "SIMULATOR_SWEEP_CRASH_AFTER": "3", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "simulator",
        "sweep",
        str(path),
        "--workers",
        "2",
        "--out",
        str(out_dir),
        "--no-progress",
    ]
    log = tmp_path / "log.txt"
    with open(log, "w") as fh:
        # Own session and no pipes: nothing left behind can block the test.
        proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=120)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert rc == 70, log.read_text()
    rows = pq.read_table(out_dir / "sweep.parquet").to_pylist()
    assert len(rows) == 3
    done = {r["point"] for r in rows}
    again = run_sweep(path, workers=2, out=out_dir)
    assert again.n_skipped == 3 and again.n_run == 13
    keys = again.table["point"].tolist()
    assert len(keys) == len(set(keys)) == 16 and done <= set(keys)
    assert again.path.read_bytes() == local.path.read_bytes()


# --------------------------------------------------------------------------------------------
# Bad points are rows


def test_invalid_and_unfit_points_are_rows(tmp_path):
    path = write_sweep(
        tmp_path,
        points=[
            {"parallelism.tp": 8},
            {"training.global_batch": 7},  # not divisible by dp = 2
            {"parallelism.tp": "eight"},  # not an integer: fails validation
            {"topology.gpu": {"base": "H100-SXM-80GB", "hbm_GiB": 0.02}},  # does not fit
        ],
    )
    out = run_sweep(path, workers=2, out=tmp_path / "out")
    df = out.table.set_index("point_index")
    assert df.loc[0, "status"] == OK and df.loc[0, "reason"] == ""
    assert df.loc[1, "status"] == INVALID and "global_batch=7" in df.loc[1, "reason"]
    assert df.loc[2, "status"] == INVALID and "parallelism.tp" in df.loc[2, "reason"]
    assert df.loc[3, "status"] == DOES_NOT_FIT and "does not fit" in df.loc[3, "reason"]
    assert df.loc[3, "fits"] == False  # noqa: E712 (pandas boolean)
    assert df.loc[3, "tokens_per_s"] > 0  # the step was simulated all the same
    # Mixed-type values of a key are stored as JSON text.
    assert json.loads(df.loc[3, "topology.gpu"])["hbm_GiB"] == 0.02
    # A rerun keeps them (they are final), it does not retry them.
    again = run_sweep(path, workers=2, out=tmp_path / "out")
    assert again.n_run == 0 and len(again.table) == 4


def test_bad_metric_and_missing_base(tmp_path):
    path = write_sweep(tmp_path, grid={"parallelism.zero": [0, 1]}, metric="speed")
    with pytest.raises(ConfigError, match="metric"):
        run_sweep(path, out=tmp_path / "o")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "b", "base": "nope.yaml", "grid": {"seed": [1]}}))
    with pytest.raises(ConfigError, match="base"):
        run_sweep(bad, out=tmp_path / "o")


def test_cli_writes_plot_and_table(tmp_path, capsys):
    path = write_sweep(tmp_path, grid={"parallelism.zero": [0, 1, 2, 3]}, metric="memory_gib.total")
    rc = cli_main(
        ["sweep", str(path), "--workers", "2", "--out", str(tmp_path / "o"), "--no-progress"]
    )
    assert rc == 0
    text = capsys.readouterr().out
    assert "4/4 points done" in text and text.startswith("zero ")  # the key's last part
    assert (tmp_path / "o" / "sweep.png").stat().st_size > 10_000
    df = pd.read_parquet(tmp_path / "o" / "sweep.parquet")
    # ZeRO shards more state at every stage: memory falls monotonically.
    assert df["memory_gib.total"].is_monotonic_decreasing
    rc = cli_main(["sweep", str(path), "--out", str(tmp_path / "o"), "--json"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["parallelism.zero"] for r in rows] == [0, 1, 2, 3]


def test_resume_recomputes_points_whose_inputs_changed(tmp_path):
    """Issue 15.1: a point is reused only if its resolved inputs are unchanged. Changing the
    base workload (global_batch) or the topology file's contents between two runs recomputes
    every point instead of keeping the stale rows beside new ones."""
    path = write_sweep(tmp_path, grid={"topology.nic_bandwidth_Gbps": [100, 400]})
    out_dir = tmp_path / "out"
    first = run_sweep(path, workers=1, out=out_dir)
    assert first.n_run == 2
    again = run_sweep(path, workers=1, out=out_dir)
    assert again.n_run == 0 and again.n_skipped == 2 and again.n_stale == 0

    work = yaml.safe_load((tmp_path / "work.yaml").read_text())
    work["training"]["global_batch"] = 16
    (tmp_path / "work.yaml").write_text(yaml.safe_dump(work))
    changed = run_sweep(path, workers=1, out=out_dir)
    assert changed.n_skipped == 0 and changed.n_stale == 2 and changed.n_run == 2
    # Fresh numbers: twice the batch, about twice the step of the first run.
    ratio = changed.table["step_time_s"] / first.table["step_time_s"]
    assert (ratio > 1.5).all()
    fresh = run_sweep(path, workers=1, out=tmp_path / "fresh")
    assert fresh.path.read_bytes() == changed.path.read_bytes()

    topo = yaml.safe_load((tmp_path / "topo.yaml").read_text())
    topo["nic_latency_us"] = 50.0
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(topo))
    moved = run_sweep(path, workers=1, out=out_dir)
    assert moved.n_stale == 2 and moved.n_run == 2
