"""Sweeps: many variations of one workload, run in parallel, recorded point by point.

A sweep file (:class:`~simulator.config.schema.SweepConfig`) names a base workload and the
variations by dotted key: ``grid`` (cartesian product, first key outermost) and/or ``points``
(an explicit list). :func:`expand` turns it into numbered :class:`Point` s; each point is its
overrides, identified by the canonical JSON of those overrides (sorted keys, no spaces).

The resume key is that identity plus :func:`inputs_key`, a digest of the point's *resolved*
inputs: the whole workload and topology after the overrides (so an edit of the base workload
or of the topology file counts) and the hardware data files. A recorded row whose digest
differs from the point's current one is stale and is simulated again.

:func:`run_sweep` runs the points that are not yet in ``results/<name>/sweep.parquet``:

* locally in a :class:`~concurrent.futures.ProcessPoolExecutor` (``workers`` processes,
  default ``os.cpu_count()``; ``workers=1`` runs in this process), or on Ray
  (``engine="ray"``: ``ray.init(address)`` or a local instance with ``num_cpus=workers``;
  ray is imported only then);
* every finished point is written at once: the whole table is rewritten atomically with the
  new row, rows sorted by point index, so an interrupted sweep loses nothing and the file is
  the same whichever order the points finished in;
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
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from simulator import sweep_guard
from simulator.config.load import LoadedWorkload, load_sweep, load_workload
from simulator.config.schema import SweepConfig
from simulator.cost import COST_KEYS, PER_MTOKEN_KEYS, with_training_cost
from simulator.engine.records import BREAKDOWN_KEYS
from simulator.errors import ConfigError, SimulatorError
from simulator.hardware.catalog import DATA_DIR
from simulator.network.topology import FABRICS_FILE
from simulator.report import io

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

_DTYPES = {"float": "float64", "int": "Int64", "bool": "boolean", "str": "object"}


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


def expand(sweep: SweepConfig) -> list[Point]:
    """The sweep's points: the grid's cartesian product (first key outermost), then the
    explicit points, each a grid point only once (later duplicates are dropped)."""
    raw: list[dict[str, Any]] = []
    if sweep.grid:
        keys = list(sweep.grid)
        for combo in itertools.product(*(sweep.grid[k] for k in keys)):
            raw.append(dict(zip(keys, combo, strict=True)))
    raw.extend(dict(p) for p in sweep.points)
    out: list[Point] = []
    seen: set[str] = set()
    for ov in raw:
        key = point_key(ov)
        if key in seen:
            continue
        seen.add(key)
        out.append(Point(len(out), ov, key))
    return out


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
# The table


def _swept_dtype(values: list[Any]) -> str:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return "boolean"
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "Int64"
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return "float64"
    if all(isinstance(v, str) for v in present):
        return "object"
    return "json"


def build_table(
    points: Sequence[Point], rows: dict[int, dict[str, Any]], keys: Sequence[str] | None = None
) -> pd.DataFrame:
    """The sweep table of the finished ``rows`` (point index -> result row), sorted by index.

    Column types depend only on the sweep's points, never on which rows are done, so the
    table of the same rows is the same however they were produced.
    """
    keys = list(keys if keys is not None else swept_keys(points))
    done = sorted(i for i in rows if 0 <= i < len(points))
    cols: dict[str, Any] = {
        "point_index": pd.array(done, dtype="Int64"),
        "point": pd.array([points[i].key for i in done], dtype="object"),
        "inputs": pd.array([rows[i].get("inputs") for i in done], dtype="object"),
    }
    for k in keys:
        kind = _swept_dtype([p.overrides.get(k) for p in points])
        values = [points[i].overrides.get(k) for i in done]
        if kind == "json":
            values = [None if v is None else json.dumps(v, sort_keys=True) for v in values]
            kind = "object"
        if kind == "float64":
            values = [math.nan if v is None else float(v) for v in values]
        cols[k] = pd.array(values, dtype=kind)
    for col, t in RESULT_COLUMNS.items():
        values = [rows[i].get(col) for i in done]
        if t == "float":
            values = [math.nan if v is None else float(v) for v in values]
        elif t == "int":
            values = [None if v is None else int(v) for v in values]
        elif t == "bool":
            values = [None if v is None else bool(v) for v in values]
        else:
            values = [None if v is None else str(v) for v in values]
        cols[col] = pd.array(values, dtype=_DTYPES[t])
    return pd.DataFrame(cols)


def read_rows(
    path: Path, points: Sequence[Point], inputs: Sequence[str] | None = None
) -> tuple[dict[int, dict[str, Any]], int, int]:
    """Rows of an existing sweep file that match the current points (by key and, given
    ``inputs`` (each point's :func:`inputs_key`), by their resolved inputs); how many rows
    were dropped (points no longer in the sweep, or internal failures to retry); and how many
    of those were stale (the point is still in the sweep but its inputs changed)."""
    if not path.exists():
        return {}, 0, 0
    try:
        records = pq.read_table(path).to_pylist()
    except Exception as e:
        raise ConfigError(
            f"cannot read the existing sweep table ({type(e).__name__}: {e}); delete it or "
            "pass --fresh",
            file=str(path),
        ) from None
    index_of = {p.key: p.index for p in points}
    rows: dict[int, dict[str, Any]] = {}
    dropped = stale = 0
    for rec in records:
        i = index_of.get(rec.get("point"))
        if i is None or rec.get("status") not in FINAL_STATUSES or i in rows:
            dropped += 1
            continue
        if inputs is not None and rec.get("inputs") != inputs[i]:
            dropped += 1
            stale += 1
            continue
        rows[i] = {c: rec.get(c) for c in ("inputs", *RESULT_COLUMNS)}
    return rows, dropped, stale


# --------------------------------------------------------------------------------------------
# Engines


def _run_inline(tasks: list[tuple[int, LoadedWorkload]]) -> Iterator[tuple[int, dict]]:
    for i, loaded in tasks:
        yield i, simulate_point(loaded)


def die_with_parent(parent: int) -> None:
    """Pool-worker initializer: end this worker when the process that started it dies.

    A sweep killed with SIGKILL (or the crash hook below) cannot shut its pool down, and
    pool workers blocked on their task queue would live on as orphans. On Linux the kernel is
    asked to kill the worker with its parent (``prctl(PR_SET_PDEATHSIG)``); a parent that
    died before that call is caught by the ``getppid`` check.
    """
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)


def process_pool(workers: int, initializer=None, initargs=()) -> ProcessPoolExecutor:
    """A process pool whose workers die with this process (:func:`die_with_parent`), then
    run ``initializer(*initargs)``."""
    return ProcessPoolExecutor(
        max_workers=workers,
        initializer=_init_pool_worker,
        initargs=(os.getpid(), initializer, tuple(initargs)),
    )


def _init_pool_worker(parent: int, initializer, initargs) -> None:
    die_with_parent(parent)
    if initializer is not None:
        initializer(*initargs)


def _run_local(tasks: list[tuple[int, LoadedWorkload]], workers: int) -> Iterator[tuple[int, dict]]:
    pool = process_pool(workers)
    futures = {pool.submit(simulate_point, loaded): i for i, loaded in tasks}
    try:
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=lambda f: futures[f]):
                yield futures[f], f.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _run_ray(
    tasks: list[tuple[int, LoadedWorkload]], workers: int, address: str | None
) -> Iterator[tuple[int, dict]]:
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--engine ray needs the ray package (pip install 'ray>=2.9')", file="--engine"
        ) from None
    started = False
    if not ray.is_initialized():
        pkg = str(Path(__file__).resolve().parent)
        if address:
            # A remote cluster gets this package shipped with the job; its Python must have
            # the dependencies (simpy, networkx, numpy, pandas, pyarrow, pydantic, pyyaml).
            try:
                ray.init(
                    address=address,
                    include_dashboard=False,
                    log_to_driver=False,
                    runtime_env={"py_modules": [pkg]},
                )
            except (ConnectionError, RuntimeError, ValueError) as e:
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise ConfigError(
                    f"cannot connect to the Ray cluster at {address!r}: {first} (a cluster "
                    "with token authentication needs its token, see the Ray docs on "
                    "RAY_AUTH_MODE)",
                    file="--address",
                ) from None
        else:
            root = str(Path(pkg).parent)
            path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
            ray.init(
                num_cpus=workers,
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": path}},
            )
        started = True
    remote = ray.remote(num_cpus=1, max_retries=0)(simulate_point)
    refs = {remote.remote(loaded): i for i, loaded in tasks}
    try:
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield refs[ref], ray.get(ref)
    finally:
        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        if started:
            ray.shutdown()


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
    ``on_row(index, row)`` report progress. The environment variable
    ``SIMULATOR_SWEEP_CRASH_AFTER=k`` ends the process abruptly (``os._exit(70)``) after
    ``k`` new rows are written: a test hook that stands for a killed job.
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
    points = expand(sweep)
    keys = swept_keys(points)
    out_dir = io.output_dir(out, sweep.name)
    table_path = out_dir / "sweep.parquet"
    sweep_guard.claim_folder(out_dir, sweep.name, table_path, fresh=fresh)
    try:
        return _run_claimed(
            sweep, points, keys, base, out_dir, table_path, engine=engine, workers=workers,
            address=address, fresh=fresh, limit=limit, on_start=on_start, on_row=on_row, t0=t0,
        )
    finally:
        sweep_guard.release_folder(out_dir)


#: Seconds between rewrites of the sweep table while points finish (a kill loses at most the
#: rows of this interval; every row is written when the sweep ends or stops).
FLUSH_S = 1.0


def _run_claimed(
    sweep, points, keys, base, out_dir, table_path, *, engine, workers, address, fresh, limit,
    on_start, on_row, t0,
) -> SweepOutcome:
    """:func:`run_sweep` once the output folder is this process's."""
    # Every point is loaded (cheap next to simulating it) so that its resolved inputs can be
    # compared with the ones a recorded row was computed from.
    hardware = _hardware_digest()
    prepared_all = [prepare(base, p) for p in points]
    inputs = [inputs_key(pr, base, hardware) for pr in prepared_all]
    rows, _, n_stale = ({}, 0, 0) if fresh else read_rows(table_path, points, inputs)
    n_skipped = len(rows)

    todo = [p for p in points if p.index not in rows]
    if limit is not None:
        todo = todo[: max(0, limit)]
    tasks: list[tuple[int, LoadedWorkload]] = []
    early: list[tuple[int, dict]] = []
    for p in todo:
        prepared = prepared_all[p.index]
        if isinstance(prepared, dict):
            early.append((p.index, prepared))
        else:
            tasks.append((p.index, prepared))
    if on_start:
        on_start(len(todo), n_skipped)
    crash_after = int(os.environ.get("SIMULATOR_SWEEP_CRASH_AFTER", "0") or 0)
    n_workers = workers or os.cpu_count() or 1

    n_recorded = [0]
    last_flush = [time.monotonic()]

    def flush() -> None:
        io.write_parquet_atomic(table_path, build_table(points, rows, keys))
        last_flush[0] = time.monotonic()

    def record(i: int, row: dict) -> None:
        rows[i] = {"inputs": inputs[i], **row}
        n_recorded[0] += 1
        crash = crash_after and n_recorded[0] >= crash_after
        if crash or time.monotonic() - last_flush[0] >= FLUSH_S:
            flush()
        if on_row:
            on_row(i, row)
        if crash:
            os._exit(70)

    if fresh or todo or not table_path.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        io.write_parquet_atomic(table_path, build_table(points, rows, keys))
    for i, row in early:
        record(i, row)
    if tasks:
        if engine == "ray":
            stream = _run_ray(tasks, min(n_workers, len(tasks)), address)
        elif n_workers == 1 or len(tasks) == 1:
            stream = _run_inline(tasks)
        else:
            stream = _run_local(tasks, min(n_workers, len(tasks)))
        try:
            for i, row in stream:
                record(i, row)
        finally:
            close = getattr(stream, "close", None)
            if close:
                close()
            if n_recorded[0]:
                flush()  # every finished row, also when interrupted
    elif n_recorded[0]:
        flush()
    table = build_table(points, rows, keys)
    return SweepOutcome(
        name=sweep.name,
        table=table,
        keys=varying_keys(points) or keys,
        metric=sweep.metric,
        path=table_path,
        out=out_dir,
        n_points=len(points),
        n_run=len(todo),
        n_skipped=n_skipped,
        wall_s=time.perf_counter() - t0,
        n_stale=n_stale,
    )


def comparable(df: pd.DataFrame) -> pd.DataFrame:
    """The columns whose values must not depend on how the sweep ran (all of them: the table
    carries no wall time). Kept as the one place to change if a timing column is added."""
    return df.drop(columns=[c for c in df.columns if c.endswith("wall_s")])
