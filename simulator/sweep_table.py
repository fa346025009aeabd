"""A sweep's results on disk: an append-only row log, merged into ``sweep.parquet``.

Every finished point is appended at once to the row log (:data:`ROW_LOG`, one JSON line per
row, in the sweep's folder) instead of rewriting the whole table: a 67,200-point sweep would
otherwise rewrite an ever larger table tens of thousands of times. The table
(``sweep.parquet``) is the merge of the previous table and the log (:func:`merge`): written
now and then while the sweep runs, and when it ends or stops, after which the log is
removed. A ``kill -9`` loses nothing: the next run reads the table *and* the log.

Log format: a header line ``{"run": n, "columns": [...]}`` opens each run's rows; a row is
``{"point": KEY, "values": [...]}`` in the header's column order (``inputs`` then
:data:`~simulator.sweep.RESULT_COLUMNS`). A line cut short by a kill is ignored (and cut off
before the next run appends). Floats are written with ``repr``, so they read back exactly.

Merging keeps, per point, its *latest* record (the log is newer than the table, later lines
newer than earlier ones). A record of this run is kept whatever its status; an older one is
kept only if its status is final, its point is still in the sweep and, where this run has
computed the point's inputs digest, it was computed from the same inputs. The table is
built in chunks and sorted by point index, so memory follows the table, not Python objects
per row, and the file is the same however and in whatever order the rows were produced.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq

from simulator.errors import ConfigError

#: The row log's file name, in the sweep's output folder.
ROW_LOG = ".sweep-rows.jsonl"
#: Rows turned into a DataFrame at a time while merging.
CHUNK_ROWS = 4096

_DTYPES = {"float": "float64", "int": "Int64", "bool": "boolean", "str": "object"}


@dataclass(frozen=True)
class Layout:
    """The columns of a sweep table: the swept keys with their pandas dtypes (from the
    sweep's points, never from which rows are done), then the result columns."""

    keys: tuple[str, ...]
    kinds: dict[str, str]  # swept key -> pandas dtype, or "json" (stored as JSON text)
    results: dict[str, str]  # result column -> "float" | "int" | "bool" | "str"
    final: tuple[str, ...]  # statuses a later run keeps


def swept_dtype(values: Sequence[Any]) -> str:
    """The dtype of a swept key's column from the values it takes (``None``: unset)."""
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


def frame(entries: Sequence[tuple[int, str, dict[str, Any]]], layout: Layout) -> pd.DataFrame:
    """The table of ``entries`` (point index, point key, row with ``inputs``), in the given
    order. A point's swept values are read back from its key (canonical JSON)."""
    overrides = [json.loads(key) for _, key, _ in entries]
    cols: dict[str, Any] = {
        "point_index": pd.array([i for i, _, _ in entries], dtype="Int64"),
        "point": pd.array([key for _, key, _ in entries], dtype="object"),
        "inputs": pd.array([row.get("inputs") for _, _, row in entries], dtype="object"),
    }
    for k in layout.keys:
        kind = layout.kinds[k]
        values = [ov.get(k) for ov in overrides]
        if kind == "json":
            values = [None if v is None else json.dumps(v, sort_keys=True) for v in values]
            kind = "object"
        if kind == "float64":
            values = [math.nan if v is None else float(v) for v in values]
        cols[k] = pd.array(values, dtype=kind)
    for col, t in layout.results.items():
        values = [row.get(col) for _, _, row in entries]
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


# --------------------------------------------------------------------------------------------
# Reading what is recorded


def _table_batches(path: Path, columns: Sequence[str] | None = None) -> Iterator[list[dict]]:
    """The rows of an existing table, a record batch at a time (nothing if there is none)."""
    if not path.exists():
        return
    try:
        f = pq.ParquetFile(path)
        names = set(f.schema_arrow.names)
        cols = None if columns is None else [c for c in columns if c in names]
        for batch in f.iter_batches(batch_size=CHUNK_ROWS, columns=cols):
            yield batch.to_pylist()
    except Exception as e:
        raise ConfigError(
            f"cannot read the existing sweep table ({type(e).__name__}: {e}); delete it or "
            "pass --fresh",
            file=str(path),
        ) from None


def read_log(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """The rows of a row log as (run number, point key, row); unreadable lines (a line cut
    short by a kill) are skipped."""
    if not path.exists():
        return
    run, columns = 0, None
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            if "run" in rec:
                run, columns = int(rec["run"]), list(rec.get("columns") or [])
            elif columns is not None and isinstance(rec.get("point"), str):
                values = rec.get("values") or []
                yield run, rec["point"], dict(zip(columns, values, strict=False))


def records(table: Path, log: Path, columns: Sequence[str] | None = None):
    """Every recorded row, oldest first: ``(source, position, run, key, row)``; ``source``
    is ``"table"`` (run 0) or ``"log"``. ``columns`` limits what is read of the table."""
    pos = 0
    for batch in _table_batches(table, columns):
        for rec in batch:
            yield "table", pos, 0, rec.get("point"), rec
            pos += 1
    for pos, (run, key, row) in enumerate(read_log(log)):
        yield "log", pos, run, key, row


def recorded(table: Path, log: Path, final: Sequence[str]) -> dict[str, str | None]:
    """Point key -> inputs digest of every point whose latest record has a final status."""
    latest: dict[str, tuple[str | None, str | None]] = {}
    for _, _, _, key, row in records(table, log, ("point", "status", "inputs")):
        if isinstance(key, str):
            latest[key] = (row.get("status"), row.get("inputs"))
    return {k: inputs for k, (status, inputs) in latest.items() if status in final}


def last_run(log: Path) -> int:
    """The highest run number in a row log (0 when there is none)."""
    return max((run for run, _, _ in read_log(log)), default=0)


# --------------------------------------------------------------------------------------------
# Appending and merging


class RowLog:
    """This run's appender to the row log: a header line, then one line per finished row,
    each written with one ``write`` call as soon as the row is known."""

    def __init__(self, path: Path, columns: Sequence[str]):
        self.path = path
        self.columns = list(columns)
        self.run = last_run(path) + 1
        _cut_torn_line(path)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._write({"run": self.run, "columns": self.columns})

    def append(self, key: str, row: dict[str, Any]) -> None:
        self._write({"point": key, "values": [row.get(c) for c in self.columns]})

    def _write(self, obj: dict) -> None:
        line = json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=_plain)
        os.write(self._fd, (line + "\n").encode())

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _plain(obj: Any) -> Any:
    """numpy scalars and other number-likes as plain Python values."""
    item = getattr(obj, "item", None)
    return item() if callable(item) else str(obj)


def _cut_torn_line(path: Path) -> None:
    """Cut a last line left unfinished by a kill, so that the next line starts clean."""
    if not path.exists():
        return
    with open(path, "rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return
        step, end = 65536, size
        while end > 0:
            start = max(0, end - step)
            fh.seek(start)
            nl = fh.read(end - start).rfind(b"\n")
            if nl >= 0:
                fh.truncate(start + nl + 1)
                return
            end = start
        fh.truncate(0)


def merge(
    table: Path,
    log: Path,
    layout: Layout,
    index_of: Callable[[str], int | None],
    *,
    run: int,
    verified: dict[str, str],
) -> pd.DataFrame:
    """The merged table (module docstring): ``index_of(key)`` is a point's index, ``None``
    for a point no longer in the sweep; ``run`` is this run's number in the log;
    ``verified`` maps the points whose inputs this run has digested to that digest."""
    latest: dict[str, tuple[str, int]] = {}
    for source, pos, _, key, _ in records(table, log, ("point",)):
        if isinstance(key, str):
            latest[key] = (source, pos)

    def keep(run_of: int, key: str, row: dict) -> int | None:
        i = index_of(key)
        if i is None:
            return None
        if run_of == run:
            return i
        if row.get("status") not in layout.final:
            return None
        if key in verified and row.get("inputs") != verified[key]:
            return None
        return i

    chunks: list[pd.DataFrame] = []
    entries: list[tuple[int, str, dict]] = []
    for source, pos, run_of, key, row in records(table, log):
        if not isinstance(key, str) or latest.get(key) != (source, pos):
            continue
        i = keep(run_of, key, row)
        if i is not None:
            entries.append((i, key, row))
        if len(entries) >= CHUNK_ROWS:
            chunks.append(frame(entries, layout))
            entries = []
    if entries or not chunks:
        chunks.append(frame(entries, layout))
    df = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
    return df.sort_values("point_index", kind="stable").reset_index(drop=True)
