"""Sweeps: many variations of one workload, run in parallel, recorded point by point.

A sweep file (:class:`~simulator.config.schema.SweepConfig`) names a base workload and the
variations by dotted key: ``grid`` (cartesian product, first key outermost) and/or ``points``
(an explicit list). :class:`Grid` generates the numbered :class:`Point` s one at a time (a
67,200-point grid is never a list); each point is its overrides, identified by the canonical
JSON of those overrides (sorted keys, no spaces).

The resume key is that identity plus :func:`inputs_key`, a digest of the point's *resolved*
inputs: the whole workload and topology after the overrides (so an edit of the base workload
or of the topology file counts) and the hardware data files, computed for each point as it
is reached. A recorded row whose digest differs from the point's current one is stale and is
simulated again.

:func:`run_sweep` runs the points that are not yet in ``results/<name>/sweep.parquet``:

* locally in a process pool (``workers`` processes, default ``os.cpu_count()``;
  ``workers=1`` runs in this process), or on Ray (``engine="ray"``), a bounded number of
  points in flight (:mod:`simulator.sweep_engines`): points are loaded and digested as
  workers need them, so the first result comes before the grid is generated;
* every finished point is appended at once to a row log, merged into the table now and then
  and when the sweep ends or stops (:mod:`simulator.sweep_table`): an interrupted sweep loses
  nothing, and the table, rows sorted by point index, is the same whichever order the points
  finished in;
* a point that is invalid (:class:`~simulator.errors.SimulatorError`) or does not fit in GPU
  memory is a row with ``status`` ``"invalid"`` / ``"does_not_fit"`` and a ``reason``; an
  internal failure is ``status="error"`` (retried by the next run, unlike the others).

Workers receive the validated configs (:class:`~simulator.config.load.LoadedWorkload`), not
file paths, so a remote Ray cluster needs the ``simulator`` package (shipped with
``runtime_env.py_modules``) and its dependencies, not the YAML files.

The table holds no wall-clock column: ``sim_wall_s`` is dropped so that the file is
byte-identical whichever engine, worker count or finishing order produced it. Columns:
``point_index``, ``point`` (the overrides), ``inputs`` (:func:`inputs_key`), one column per
swept key, then :data:`RESULT_COLUMNS`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from simulator import sweep_engines, sweep_guard, sweep_table
from simulator.config.load import LoadedWorkload, load_sweep, load_workload
from simulator.config.schema import SweepConfig
from simulator.cost import COST_KEYS, PER_MTOKEN_KEYS, with_training_cost
from simulator.engine.records import BREAKDOWN_KEYS
from simulator.errors import ConfigError, SimulatorError
from simulator.hardware.catalog import DATA_DIR
from simulator.network.topology import FABRICS_FILE
from simulator.report import io
from simulator.sweep_engines import die_with_parent, process_pool  # noqa: F401 (public here)

OK, DOES_NOT_FIT, INVALID, ERROR = "ok", "does_not_fit", "invalid", "error"
#: Statuses a rerun keeps; an ``error`` row (internal failure) is run again.
FINAL_STATUSES = (OK, DOES_NOT_FIT, INVALID)

MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "total", "capacity")
LAYOUT_KEYS = (
    "tp",
    "pp",
    "dp",
    "zero",
    "sequence_parallel",
    "pp_schedule",
    "virtual_stages",
    "micro_batch",
    "microbatches",
    "recompute",
)

#: Result columns of a sweep row, in file order, with their pandas dtype.
RESULT_COLUMNS: dict[str, str] = {
    "status": "str",
    "reason": "str",
    "step_time_s": "float",
    "tokens_per_s": "float",
    "mfu": "float",
    "hfu": "float",
    "tflops_per_gpu": "float",
    **{f"breakdown_s.{k}": "float" for k in BREAKDOWN_KEYS},
    **{f"memory_gib.{k}": "float" for k in MEMORY_KEYS},
    "fits": "bool",
    "n_gpus": "int",
    "gpu": "str",
    "topology": "str",
    **{
        f"layout.{k}": (
            "bool"
            if k == "sequence_parallel"
            else "str"
            if k in ("pp_schedule", "recompute")
            else "int"
        )
        for k in LAYOUT_KEYS
    },
    "events": "int",
    **{k: "float" for k in COST_KEYS},
    **{k: "float" for k in PER_MTOKEN_KEYS},
}

#: Columns a sweep's ``metric`` may name.
METRICS = tuple(k for k, t in RESULT_COLUMNS.items() if t in ("float", "int"))

# --------------------------------------------------------------------------------------------
# Points


@dataclass(frozen=True)
class Point:
    """One variation: its position in the sweep, its overrides and its resume key."""

    index: int
    overrides: dict[str, Any]
    key: str


def point_key(overrides: dict[str, Any]) -> str:
    """Canonical JSON of a point's overrides (sorted keys, compact): the resume key."""
    return json.dumps(overrides, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canonical(value: Any) -> str:
    """A value's canonical JSON, as it appears inside a :func:`point_key`."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class Grid:
    """The points of a sweep, generated as they are needed (a grid of 67,200 points is not
    built as a list): the grid's cartesian product (first key outermost), then the explicit
    points, each point only once (a value repeated in a grid axis, or an explicit point that
    is a grid point or repeats an earlier one, is dropped). Counting, membership and a
    point's index are computed from the axes, without expanding them."""

    def __init__(self, sweep: SweepConfig):
        self.grid_keys = list(sweep.grid)
        self.axes: list[list[Any]] = []
        self._axis_pos: list[dict[str, int]] = []
        for k in self.grid_keys:
            pos: dict[str, int] = {}
            axis = []
            for v in sweep.grid[k]:
                c = _canonical(v)
                if c not in pos:
                    pos[c] = len(axis)
                    axis.append(v)
            self.axes.append(axis)
            self._axis_pos.append(pos)
        self.n_grid = math.prod(len(a) for a in self.axes) if self.axes else 0
        self.explicit: list[dict[str, Any]] = []
        self._explicit_pos: dict[str, int] = {}
        for ov in sweep.points:
            key = point_key(dict(ov))
            if self._grid_index(key) is None and key not in self._explicit_pos:
                self._explicit_pos[key] = self.n_grid + len(self.explicit)
                self.explicit.append(dict(ov))

    def __len__(self) -> int:
        return self.n_grid + len(self.explicit)

    def __iter__(self) -> Iterator[Point]:
        index = 0
        if self.axes:
            for combo in itertools.product(*self.axes):
                ov = dict(zip(self.grid_keys, combo, strict=True))
                yield Point(index, ov, point_key(ov))
                index += 1
        for ov in self.explicit:
            yield Point(index, ov, point_key(ov))
            index += 1

    def _grid_index(self, key: str) -> int | None:
        if not self.axes:
            return None
        ov = json.loads(key)
        if not isinstance(ov, dict) or sorted(ov) != sorted(self.grid_keys):
            return None
        index = 0
        for k, axis, pos in zip(self.grid_keys, self.axes, self._axis_pos, strict=True):
            j = pos.get(_canonical(ov[k]))
            if j is None:
                return None
            index = index * len(axis) + j
        return index

    def index_of(self, key: str) -> int | None:
        """The index of the point whose :func:`point_key` is ``key``; None if not a point."""
        try:
            i = self._grid_index(key)
        except ValueError:
            return None
        return i if i is not None else self._explicit_pos.get(key)

    def _values(self) -> dict[str, tuple[list[Any], bool]]:
        """Per swept key (first-appearance order): its distinct values, and whether some
        point leaves it unset."""
        out: dict[str, tuple[list[Any], bool]] = {}
        for k, axis in zip(self.grid_keys, self.axes, strict=True):
            out[k] = (list(axis), False)
        for ov in self.explicit:
            for k, v in ov.items():
                vals, _ = out.setdefault(k, ([], bool(self.n_grid)))
                vals.append(v)
        for k, (vals, unset) in out.items():
            missing = unset or any(k not in ov for ov in self.explicit)
            out[k] = (vals, missing)
        return out

    def swept_keys(self) -> list[str]:
        """Every key any point sets, in order of first appearance."""
        return list(self._values())

    def varying_keys(self) -> list[str]:
        """The swept keys that take more than one value (an unset key counts as a value)."""
        out = []
        for k, (vals, missing) in self._values().items():
            if len({_canonical(v) for v in vals} | ({"null"} if missing else set())) > 1:
                out.append(k)
        return out

    def layout(self) -> sweep_table.Layout:
        """The table's columns: swept keys with their dtypes, then :data:`RESULT_COLUMNS`."""
        values = self._values()
        return sweep_table.Layout(
            keys=tuple(values),
            kinds={k: sweep_table.swept_dtype(v) for k, (v, _) in values.items()},
            results=RESULT_COLUMNS,
            final=FINAL_STATUSES,
        )


def expand(sweep: SweepConfig) -> list[Point]:
    """The sweep's points as a list (:class:`Grid` generates them one at a time)."""
    return list(Grid(sweep))


def swept_keys(points: Sequence[Point]) -> list[str]:
    """Every key any point sets, in order of first appearance."""
    return list(dict.fromkeys(k for p in points for k in p.overrides))


def varying_keys(points: Sequence[Point]) -> list[str]:
    """The swept keys that take more than one value (constants are left out of plots)."""
    out = []
    for k in swept_keys(points):
        values = {point_key({"v": p.overrides.get(k)}) for p in points}
        if len(values) > 1:
            out.append(k)
    return out


def base_path(sweep_path: str | Path, sweep: SweepConfig) -> Path:
    """The base workload file: ``sweep.base`` relative to the sweep file."""
    b = Path(sweep.base)
    return b if b.is_absolute() else Path(sweep_path).parent / b


# --------------------------------------------------------------------------------------------
# Running one point


def summary_row(summary: dict) -> dict[str, Any]:
    """The :data:`RESULT_COLUMNS` of a run summary (status ``ok`` or ``does_not_fit``)."""
    row: dict[str, Any] = {}
    for col in RESULT_COLUMNS:
        if col in ("status", "reason"):
            continue
        cur: Any = summary
        for part in col.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        row[col] = cur
    fits = bool(summary.get("fits", True))
    row["status"] = OK if fits else DOES_NOT_FIT
    reason = ""
    if not fits:
        warn = [w for w in summary.get("warnings") or [] if "fit" in w]
        reason = warn[0] if warn else "does not fit in GPU memory"
    row["reason"] = reason
    return row


def failed_row(status: str, reason: str) -> dict[str, Any]:
    return {"status": status, "reason": reason}


def error_reason(e: SimulatorError) -> str:
    """An input error as a row's reason: ``field: what is wrong`` (the file is the sweep's
    base workload or its topology, the same for every point, so it is left out)."""
    if isinstance(e, ConfigError):
        return f"{e.field}: {e.detail}" if e.field else e.detail
    return str(e)


def simulate_point(loaded: LoadedWorkload) -> dict[str, Any]:
    """Simulate one point and return its result row; never raises for bad input."""
    from simulator.run import simulate  # imported here: workers only need it when they run

    try:
        result = simulate(loaded)
        summary = with_training_cost(result.summary, loaded)
    except SimulatorError as e:
        return failed_row(INVALID, error_reason(e))
    except Exception as e:  # an internal failure is recorded, not fatal to the sweep
        return failed_row(ERROR, f"{type(e).__name__}: {e}")
    return summary_row(summary)


def _hardware_digest() -> str:
    """Digest of the hardware data a result depends on beyond its input files: the GPU
    catalog, its calibration data and the NCCL fabric constants."""
    h = hashlib.sha256()
    files = sorted(p for p in DATA_DIR.rglob("*") if p.is_file() and p.suffix != ".py")
    for f in [*files, FABRICS_FILE]:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def inputs_key(prepared: LoadedWorkload | dict[str, Any], base: Path, hardware: str) -> str:
    """A digest (16 hex digits) of everything a point's result depends on: the validated
    workload and topology (overrides applied, defaults filled in) and the hardware data
    (``hardware``, :func:`_hardware_digest`). For a point that failed to load, the base
    workload's text and the reason stand in for the resolved inputs."""
    if isinstance(prepared, LoadedWorkload):
        body = {
            "workload": prepared.workload.model_dump(mode="json"),
            "topology": prepared.topology.model_dump(mode="json"),
        }
    else:
        body = {"base": base.read_text(errors="replace"), "failed": prepared.get("reason")}
    text = json.dumps({**body, "hardware": hardware}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prepare(base: Path, point: Point) -> LoadedWorkload | dict[str, Any]:
    """Load the base workload with the point's overrides; a failed row when that is invalid."""
    try:
        return load_workload(base, point.overrides)
    except SimulatorError as e:
        return failed_row(INVALID, error_reason(e))


# --------------------------------------------------------------------------------------------
# The sweep


@dataclass
class SweepOutcome:
    """What :func:`run_sweep` did."""

    name: str
    table: pd.DataFrame
    keys: list[str]  # varying swept keys (plots and table)
    metric: str
    path: Path  # sweep.parquet
    out: Path
    n_points: int
    n_run: int  # points simulated by this call
    n_skipped: int  # already in the file with the same inputs: reused
    wall_s: float
    n_stale: int = 0  # in the file, but their inputs changed since: simulated again
    written: list[Path] = field(default_factory=list)


def check_metric(sweep: SweepConfig, file: str) -> None:
    if sweep.metric not in METRICS:
        raise ConfigError(
            f"unknown metric {sweep.metric!r} (accepted: {', '.join(METRICS)})",
            file=file,
            field="metric",
        )


def run_sweep(
    sweep_path: str | Path,
    *,
    engine: str = "local",
    workers: int | None = None,
    address: str | None = None,
    out: str | Path | None = None,
    fresh: bool = False,
    limit: int | None = None,
    on_start: Callable[[int, int], None] | None = None,
    on_row: Callable[[int, dict], None] | None = None,
) -> SweepOutcome:
    """Run the points of a sweep file not yet recorded; see the module docstring.

    ``limit`` stops after that many new points (the rest are left for a rerun);
    ``fresh`` ignores (and replaces) an existing table. ``on_start(n_todo, n_done)`` and
    ``on_row(index, row)`` report progress; ``on_start`` is called again with new counts
    when a recorded point turns out stale (its inputs are digested only when it is reached).
    The environment variable ``SIMULATOR_SWEEP_CRASH_AFTER=k`` merges the table and ends the
    process abruptly (``os._exit(70)``) after ``k`` new rows: a test hook for a killed job.
    """
    t0 = time.perf_counter()
    sweep_path = Path(sweep_path)
    sweep = load_sweep(sweep_path)
    check_metric(sweep, str(sweep_path))
    if engine not in ("local", "ray"):
        raise ConfigError(f"unknown engine {engine!r} (accepted: local, ray)", file="--engine")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers must be >= 1, got {workers}", file="--workers")
    base = base_path(sweep_path, sweep)
    sweep_guard.check_base(sweep_path, base)
    if engine == "ray":
        sweep_guard.check_ray(address)
    grid = Grid(sweep)
    out_dir = io.check_out_dir(io.output_dir(out, sweep.name), replace=False)
    table_path = out_dir / "sweep.parquet"
    sweep_guard.claim_folder(out_dir, sweep.name, table_path, fresh=fresh)
    try:
        return _run_claimed(
            sweep, grid, base, out_dir, table_path, engine=engine, workers=workers,
            address=address, fresh=fresh, limit=limit, on_start=on_start, on_row=on_row, t0=t0,
        )
    finally:
        sweep_guard.release_folder(out_dir)


#: Least seconds between merges of the row log into the table while points finish; a merge
#: is also kept to at most 1/:data:`MERGE_SHARE` of the time (a big table merges less often).
#: Nothing is lost in between: every row is in the log as soon as it is finished.
FLUSH_S = 1.0
MERGE_SHARE = 20.0


@dataclass
class _Progress:
    """Counts of one run of a sweep."""

    n_run: int = 0  # points dispatched (simulated, or recorded as invalid) by this run
    n_skipped: int = 0  # recorded with the same inputs: reused
    n_stale: int = 0  # recorded, but their inputs changed: run again
    n_recorded: int = 0  # rows written by this run


def _run_claimed(
    sweep, grid, base, out_dir, table_path, *, engine, workers, address, fresh, limit,
    on_start, on_row, t0,
) -> SweepOutcome:
    """:func:`run_sweep` once the output folder is this process's: points are generated,
    loaded and digested one at a time as workers need them; each result is appended to the
    row log at once; the table is merged from the log now and then and at the end."""
    layout = grid.layout()
    log_path = out_dir / sweep_table.ROW_LOG
    if fresh:
        log_path.unlink(missing_ok=True)
    done = {} if fresh else sweep_table.recorded(table_path, log_path, FINAL_STATUSES)
    in_sweep = {k for k in done if grid.index_of(k) is not None}
    hardware = _hardware_digest()
    counts, verified = _Progress(), {}
    cap = len(grid) if limit is None else max(0, limit)

    def estimate() -> None:  # progress: points still to run, points recorded
        if on_start:
            todo = len(grid) - len(in_sweep) + counts.n_stale
            on_start(min(cap, todo), len(in_sweep) - counts.n_stale)

    estimate()
    if fresh or not table_path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        io.write_parquet_atomic(table_path, sweep_table.frame([], layout))
    log = sweep_table.RowLog(log_path, ["inputs", *RESULT_COLUMNS])
    crash_after = int(os.environ.get("SIMULATOR_SWEEP_CRASH_AFTER", "0") or 0)
    last = {"merge": time.monotonic(), "cost": 0.0}

    def merge(write: bool = True) -> pd.DataFrame:
        t = time.monotonic()
        df = sweep_table.merge(
            table_path, log_path, layout, grid.index_of, run=log.run, verified=verified
        )
        if write:
            io.write_parquet_atomic(table_path, df)
        last["merge"], last["cost"] = time.monotonic(), time.monotonic() - t
        return df

    def record(p: Point, digest: str, row: dict) -> None:
        log.append(p.key, {"inputs": digest, **row})
        counts.n_recorded += 1
        crash = crash_after and counts.n_recorded >= crash_after
        due = max(FLUSH_S, MERGE_SHARE * last["cost"])
        if crash or time.monotonic() - last["merge"] >= due:
            merge()
        if on_row:
            on_row(p.index, row)
        if crash:
            os._exit(70)

    def tasks() -> Iterator[tuple[int, tuple[Point, str, LoadedWorkload]]]:
        unseen = len(in_sweep)  # recorded points not reached yet
        for p in grid:
            previous = done.get(p.key) if p.key in in_sweep else None
            unseen -= p.key in in_sweep
            if counts.n_run >= cap and p.key not in in_sweep:
                if unseen == 0:
                    return
                continue
            prepared = prepare(base, p)
            digest = inputs_key(prepared, base, hardware)
            if p.key in in_sweep:
                verified[p.key] = digest
                if previous == digest:
                    counts.n_skipped += 1
                    continue
                counts.n_stale += 1
                estimate()
            if counts.n_run >= cap:
                continue
            counts.n_run += 1
            if isinstance(prepared, dict):
                record(p, digest, prepared)
            else:
                yield p.index, (p, digest, prepared)

    n_workers = workers or os.cpu_count() or 1
    expected = min(cap, len(grid) - len(in_sweep))
    try:
        stream = _engine(engine, tasks(), n_workers, expected, address)
        try:
            for _, (p, digest, row) in stream:
                record(p, digest, row)
        finally:
            stream.close()
        table = merge(write=True)
        log.close()
        log_path.unlink(missing_ok=True)  # every row is in the table now
    finally:
        if not log.closed:
            log.close()
            if counts.n_recorded:
                merge()  # every finished row, also when interrupted (the log keeps them too)
    return SweepOutcome(
        name=sweep.name,
        table=table,
        keys=grid.varying_keys() or list(layout.keys),
        metric=sweep.metric,
        path=table_path,
        out=out_dir,
        n_points=len(grid),
        n_run=counts.n_run,
        n_skipped=counts.n_skipped,
        wall_s=time.perf_counter() - t0,
        n_stale=counts.n_stale,
    )


def _simulate_task(task: tuple[Point, str, LoadedWorkload]) -> tuple[Point, str, dict]:
    p, digest, loaded = task
    return p, digest, simulate_point(loaded)


def _engine(engine: str, tasks, n_workers: int, expected: int, address: str | None):
    """The engine's stream of ``(index, (point, digest, row))``."""
    if engine == "ray":
        return sweep_engines.run_ray(tasks, _simulate_task, min(n_workers, max(1, expected)),
                                     address)  # fmt: skip
    if n_workers == 1 or expected <= 1:
        return sweep_engines.run_inline(tasks, _simulate_task)
    return sweep_engines.run_local(tasks, _simulate_task, min(n_workers, expected))


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    """The columns whose values must not depend on how the sweep ran (all of them: the table
    carries no wall time). Kept as the one place to change if a timing column is added."""
    return df.drop(columns=[c for c in df.columns if c.endswith("wall_s")])
