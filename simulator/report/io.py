"""Atomic, deterministic writers for the files a run leaves behind.

Every writer renders the whole file in memory, writes it to a temporary file in the target's
directory and renames it over the target with :func:`os.replace` (atomic on POSIX and Windows
when source and target share a file system). A reader therefore sees either the old file or the
new one, never half of one, and a crash leaves at most a hidden ``.NAME.*.tmp`` file, which the
writer removes itself when it fails with an exception.

Identical input gives byte-identical files: JSON keeps insertion order with a fixed layout,
Parquet is written by pyarrow with fixed options and no pandas index, PNGs carry no software
version or timestamp.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from simulator.config.schema import NAME_PATTERN, NAME_RULE
from simulator.errors import ConfigError

#: Parquet codec and level used for every table (fixed so bytes do not depend on defaults).
PARQUET_COMPRESSION = "zstd"
PARQUET_COMPRESSION_LEVEL = 3

#: PNG metadata: drop the "Software: matplotlib version ..." chunk so files do not change
#: with the matplotlib version. (PNG output has no creation date by default.)
PNG_METADATA = {"Software": None}


def output_dir(out: str | None, name: str, *, results: str | os.PathLike = "results") -> Path:
    """The folder a command writes into: ``--out`` when given, else ``results/<name>``.

    ``name`` must be one safe path component (the schemas enforce
    :data:`~simulator.config.schema.NAME_PATTERN`; this re-checks it so that no caller can
    write outside ``results/``). An empty ``--out`` is refused rather than taken as "default".
    """
    if out is not None:
        if not str(out).strip():
            raise ConfigError("the output folder is empty (give a folder, or leave --out out "
                              "for results/<name>)", file="--out")
        return Path(out)
    if not NAME_PATTERN.fullmatch(name):
        raise ConfigError(f"{NAME_RULE}, got {name[:40]!r}", field="name")
    base = Path(results)
    folder = base / name
    if folder.resolve().parent != base.resolve():
        raise ConfigError(f"{NAME_RULE}, got {name[:40]!r}", field="name")
    return folder


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` atomically (temporary file in the same directory + rename).

    ``str`` is encoded as UTF-8. Missing parent directories are created. The new file keeps the
    permission bits of the file it replaces, or gets ``0o644`` when there was none.
    """
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def to_jsonable(obj: Any) -> Any:
    """Convert ``obj`` into plain JSON types, keeping the insertion order of mappings.

    numpy scalars and arrays become Python numbers and lists, tuples and sets become lists
    (sets sorted), paths become strings, pandas frames become lists of records. Non-finite
    floats (NaN, +-inf) become ``None`` (``null``) because JSON has no spelling for them.
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (np.bool_,)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else None
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return [to_jsonable(v) for v in sorted(obj, key=repr)]
    if isinstance(obj, np.ndarray):
        return [to_jsonable(v) for v in obj.tolist()]
    if isinstance(obj, pd.DataFrame):
        return [to_jsonable(r) for r in obj.to_dict(orient="records")]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "model_dump"):  # pydantic models
        return to_jsonable(obj.model_dump())
    raise TypeError(f"cannot write {type(obj).__name__} as JSON: {obj!r}")


def dumps_json(obj: Any, *, indent: int | None = 2, convert: bool = True) -> str:
    """Deterministic JSON text of ``obj`` (see :func:`to_jsonable`); ends with a newline.

    Keys keep their insertion order; floats are written with Python's shortest round-trip
    ``repr``; ``indent=None`` gives the compact form (no spaces), used for large traces.
    ``convert=False`` skips :func:`to_jsonable` for objects already made of plain JSON types
    (faster for large traces); NaN or infinity then raise ``ValueError``.
    """
    separators = (",", ": ") if indent is not None else (",", ":")
    text = json.dumps(
        to_jsonable(obj) if convert else obj,
        indent=indent,
        separators=separators,
        ensure_ascii=False,
        allow_nan=False,
    )
    return text + "\n"


def write_json_atomic(
    path: str | os.PathLike, obj: Any, *, indent: int | None = 2, convert: bool = True
) -> None:
    """Write ``obj`` as deterministic JSON (:func:`dumps_json`) to ``path`` atomically."""
    write_atomic(path, dumps_json(obj, indent=indent, convert=convert))


def parquet_bytes(df: pd.DataFrame) -> bytes:
    """The Parquet file of ``df`` as bytes: pyarrow, no pandas index, fixed codec and options."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    buf = io.BytesIO()
    pq.write_table(
        table,
        buf,
        compression=PARQUET_COMPRESSION,
        compression_level=PARQUET_COMPRESSION_LEVEL,
        use_dictionary=True,
        write_statistics=True,
        version="2.6",
    )
    return buf.getvalue()


def write_parquet_atomic(path: str | os.PathLike, df: pd.DataFrame) -> None:
    """Write ``df`` to ``path`` as Parquet (:func:`parquet_bytes`) atomically."""
    write_atomic(path, parquet_bytes(df))


def png_bytes(fig: Any, *, dpi: float | None = None) -> bytes:
    """Render a matplotlib figure to PNG bytes with no version or timestamp metadata."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi if dpi is not None else fig.dpi, metadata=PNG_METADATA)
    return buf.getvalue()


def write_png_atomic(path: str | os.PathLike, fig: Any, *, dpi: float | None = None) -> None:
    """Save a matplotlib figure to ``path`` as PNG atomically and deterministically.

    The figure is rendered at its own ``dpi`` unless one is given; the caller keeps ownership
    of ``fig`` (it is not closed here).
    """
    write_atomic(path, png_bytes(fig, dpi=dpi))
