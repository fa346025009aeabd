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
import shutil
import sys
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


def first_non_finite(obj: Any, where: str = "") -> str | None:
    """The dotted path of the first NaN or infinity in a summary-like object, or None."""
    if isinstance(obj, (float, np.floating)):
        return None if math.isfinite(float(obj)) else (where or "value")
    if isinstance(obj, dict):
        for k, v in obj.items():
            found = first_non_finite(v, f"{where}.{k}" if where else str(k))
            if found:
                return found
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found = first_non_finite(v, f"{where}[{i}]")
            if found:
                return found
    return None


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


# --------------------------------------------------------------------------------------------
# Result folders written as a set

_STAGE_PREFIX = "."
_RENAME_EXCHANGE = 2  # renameat2(2) flag: swap two paths atomically (Linux >= 3.15)


#: Written last into a result folder: marks it as the simulator's, so a later run may
#: replace it as a whole.
MARKER = ".simulator-result"


#: Files that ``compare`` and ``plan`` write into a workload's result folder (by default
#: ``results/<name>``, as ``run``); a run, which replaces its folder as a whole, keeps them.
SHARED_RESULT_FILES = ("compare.csv", "compare.png", "compare.html", "plan.csv")


def check_out_dir(
    out: str | os.PathLike,
    *,
    option: str = "--out",
    known: frozenset[str] = frozenset(),
    replace: bool = True,
) -> Path:
    """Refuse an output folder that cannot be one, before anything is simulated: an empty
    name, an existing file or device (``/dev/null``), a path under a file, a parent that
    cannot be written (permissions, a read-only file system), or -- for a command that
    replaces the folder as a whole (``replace``, ``run``) -- an existing folder that holds
    other things than a previous result (no :data:`MARKER` and files not in ``known``).
    ``compare`` and ``plan`` add their files to the folder (``replace=False``). Returns the
    folder as a :class:`Path`."""
    text = os.fspath(out)
    if not text.strip():
        raise ConfigError("an empty folder name (give a folder, or leave --out out)", file=option)
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise ConfigError(f"{text!r} exists and is not a folder", file=option)
    parent = p
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{str(parent)!r} is a file, so {text!r} cannot be a folder", file=option)
    if not os.access(parent, os.W_OK | os.X_OK):
        why = "permission denied"
        try:
            if os.statvfs(parent).f_flag & os.ST_RDONLY:
                why = "a read-only file system"
        except (OSError, AttributeError):
            pass
        raise ConfigError(f"cannot write into {str(parent)!r} ({why})", file=option)
    if replace and p.is_dir() and not (p / MARKER).exists():
        other = sorted(e.name for e in p.iterdir() if e.name not in known)
        if other:
            raise ConfigError(
                f"{text!r} holds other files ({', '.join(other[:3])}{', ...' if other[3:] else ''}"
                "); a result folder is replaced as a whole: give a new or empty folder",
                file=option,
            )
    return p


def _rename_exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically with ``renameat2(RENAME_EXCHANGE)``; False where the
    system cannot (not Linux, old kernel, some file systems)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    return rc == 0


def clean_stale_stages(out: Path) -> None:
    """Remove staging folders beside ``out`` left by runs that were killed (their process
    is gone)."""
    parent = out.parent if out.parent.exists() else None
    if parent is None:
        return
    prefix = f"{_STAGE_PREFIX}{out.name}.stage-"
    for p in parent.glob(f"{prefix}*"):
        pid = p.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(p, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def publish_folder(stage: Path, out: Path) -> None:
    """Put the fully written folder ``stage`` in the place of ``out`` as one step: a reader
    (or a crash) sees the old set of files or the new one, never a mix. An existing ``out``
    is swapped out atomically (``renameat2``), or renamed aside first where the system cannot
    swap, then deleted."""
    (stage / MARKER).write_text("")
    if not out.exists():
        os.rename(stage, out)
        return
    if _rename_exchange(stage, out):
        shutil.rmtree(stage, ignore_errors=True)  # it now holds the old files
        return
    old = stage.with_name(stage.name + "-old")
    os.rename(out, old)
    os.rename(stage, out)
    shutil.rmtree(old, ignore_errors=True)


def stage_folder(out: Path) -> Path:
    """A new, empty hidden folder beside ``out`` to write a result set into (see
    :func:`publish_folder`); stale ones of killed runs are removed first."""
    out.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_stages(out)
    stage = Path(
        tempfile.mkdtemp(dir=out.parent, prefix=f"{_STAGE_PREFIX}{out.name}.stage-{os.getpid()}-")
    )
    os.chmod(stage, 0o755)  # mkdtemp makes it private; a result folder is an ordinary one
    return stage
