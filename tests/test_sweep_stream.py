"""Issue 17 item 7: a sweep streams. Points are generated, loaded and digested as workers
need them (the first point runs before the grid is generated), each finished row is appended
to a row log instead of rewriting the table, the table is merged from the log, and a
``kill -9`` between merges loses nothing."""

from __future__ import annotations

import itertools
import os
import signal

import pandas as pd
import pytest

import simulator.sweep as sweep_mod
from simulator.config.load import load_sweep
from simulator.config.schema import SweepConfig
from simulator.report import io
from simulator.sweep import OK, Grid, point_key, run_sweep, varying_keys
from simulator.sweep_engines import IN_FLIGHT_PER_WORKER
from simulator.sweep_table import ROW_LOG, read_log
from tests.test_sweep import write_sweep

GRID = {"seed": list(range(6)), "training.micro_batch": [1, 2], "topology.nic_latency_us": [2.0, 5.0]}


def fake_point(loaded) -> dict:
    """A result made from the point's inputs, without simulating."""
    w = loaded.workload
    return {"status": OK, "reason": "", "step_time_s": 1.0 + w.seed / 8, "n_gpus": 16,
            "layout.micro_batch": w.training.micro_batch}  # fmt: skip


class Watched:
    """Counts how many points the sweep has drawn from its grid."""

    def __init__(self):
        self.drawn = 0
        self.exhausted = False

    def wrap(self, monkeypatch):
        original = Grid.__iter__

        def it(grid):
            for p in original(grid):
                self.drawn += 1
                yield p
            self.exhausted = True

        monkeypatch.setattr(Grid, "__iter__", it)


def test_grid_matches_the_cartesian_product_with_duplicates_dropped():
    """Reference: the product of the axes, then the points, first occurrence of each key."""
    sweep = SweepConfig(
        name="x",
        base="b.yaml",
        grid={"a": (1, 2, 1, 1.0), "b": ("x", "y"), "c": ([1, 2], True)},
        points=({"b": "y", "a": 2, "c": True}, {"d": 3}, {"a": 1}, {"d": 3}),
    )
    raw = [dict(zip("abc", combo, strict=True)) for combo in itertools.product(*sweep.grid.values())]
    raw += [dict(p) for p in sweep.points]
    ref = list(dict.fromkeys(point_key(ov) for ov in raw))
    grid = Grid(sweep)
    points = list(grid)
    assert [p.key for p in points] == ref and len(grid) == len(ref) == 3 * 2 * 2 + 2
    assert [p.index for p in points] == list(range(len(ref)))
    assert all(grid.index_of(p.key) == p.index for p in points)
    assert grid.index_of(point_key({"a": 3, "b": "x", "c": True})) is None
    assert grid.index_of(point_key({"d": 4})) is None
    assert grid.varying_keys() == varying_keys(points) == ["a", "b", "c", "d"]
    kinds = grid.layout().kinds
    assert kinds == {"a": "float64", "b": "object", "c": "json", "d": "Int64"}


def test_first_point_runs_before_the_grid_is_generated(tmp_path, monkeypatch):
    path = write_sweep(tmp_path, grid=GRID)
    watch = Watched()
    watch.wrap(monkeypatch)
    seen = []

    def fake(loaded):
        seen.append((watch.drawn, watch.exhausted))
        return fake_point(loaded)

    monkeypatch.setattr(sweep_mod, "simulate_point", fake)
    out = run_sweep(path, workers=1, out=tmp_path / "one")
    assert len(out.table) == 24 and (out.table["status"] == OK).all()
    assert seen[0] == (1, False)  # one point drawn, loaded and run; 23 not generated yet
    # A pool draws at most its in-flight window before the first result comes back.
    watch2 = Watched()
    watch2.wrap(monkeypatch)
    first = []
    run_sweep(path, workers=2, out=tmp_path / "pool",
              on_row=lambda i, row: first.append(watch2.drawn) if not first else None)  # fmt: skip
    assert first[0] <= IN_FLIGHT_PER_WORKER * 2 + 1 < 24


def test_rows_are_appended_and_the_table_written_once(tmp_path, monkeypatch):
    """With merges held off, every finished row is in the log before the next point runs,
    and the table is written twice in all (empty at the start, merged at the end)."""
    path = write_sweep(tmp_path, grid=GRID)
    out = tmp_path / "out"
    logged = []

    def fake(loaded):
        logged.append(sum(1 for _ in read_log(out / ROW_LOG)))
        return fake_point(loaded)

    writes = []
    real_write = io.write_parquet_atomic
    monkeypatch.setattr(io, "write_parquet_atomic", lambda p, df: (writes.append(len(df)),
                                                                   real_write(p, df)))  # fmt: skip
    monkeypatch.setattr(sweep_mod, "simulate_point", fake)
    monkeypatch.setattr(sweep_mod, "FLUSH_S", 1e9)
    res = run_sweep(path, workers=1, out=out)
    assert logged == list(range(24))
    assert writes == [0, 24]
    assert not (out / ROW_LOG).exists()  # merged, then removed
    assert pd.read_parquet(out / "sweep.parquet")["point_index"].tolist() == list(range(24))
    assert res.n_run == 24


@pytest.mark.parametrize("kill_after", [1, 7])
def test_kill_9_between_merges_loses_nothing(tmp_path, monkeypatch, kill_after):
    """The sweep kills itself (SIGKILL) after some rows, before any merge: the table is still
    empty, the log holds the rows, and the rerun reuses them and ends with the same table as
    an uninterrupted sweep."""
    path = write_sweep(tmp_path, grid=GRID)
    monkeypatch.setattr(sweep_mod, "simulate_point", fake_point)
    clean = run_sweep(path, workers=1, out=tmp_path / "clean")
    out = tmp_path / "killed"
    pid = os.fork()
    if pid == 0:  # the child: hold merges off, die after kill_after rows
        try:
            sweep_mod.FLUSH_S = 1e9
            n = [0]

            def on_row(i, row):
                n[0] += 1
                if n[0] == kill_after:
                    os.kill(os.getpid(), signal.SIGKILL)

            run_sweep(path, workers=1, out=out, on_row=on_row)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert len(pd.read_parquet(out / "sweep.parquet")) == 0
    assert sum(1 for _ in read_log(out / ROW_LOG)) == kill_after
    again = run_sweep(path, workers=1, out=out)
    assert again.n_skipped == kill_after and again.n_run == 24 - kill_after
    assert (out / "sweep.parquet").read_bytes() == clean.path.read_bytes()


def test_a_torn_last_line_is_dropped(tmp_path, monkeypatch):
    path = write_sweep(tmp_path, grid=GRID)
    monkeypatch.setattr(sweep_mod, "simulate_point", fake_point)
    out = tmp_path / "out"
    run_sweep(path, workers=1, out=out, limit=3)
    (out / ROW_LOG).write_text('{"run":1,"columns":["inputs","status"]}\n{"point":"{\\"se')
    again = run_sweep(path, workers=1, out=out)
    assert again.n_skipped == 3 and len(again.table) == 24


def test_shipped_sweep_grid(root):
    grid = Grid(load_sweep(root / "sweeps" / "nic-vs-oversubscription.yaml"))
    assert len(grid) == 16 and grid.swept_keys()[0] == "topology.nodes"
