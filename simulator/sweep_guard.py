"""Checks a sweep makes before it writes anything (issue 17, items 3 and 7).

* :func:`check_base` -- the base workload is a regular file other than the sweep file itself,
  a YAML mapping of workload keys (what no point's override can mend: otherwise every point
  would fail alike);
* :func:`check_ray` -- with ``--engine ray``, the package imports and an ``--address`` answers
  within :data:`RAY_CONNECT_TIMEOUT_S` (Ray itself retries an unreachable address for many
  minutes);
* :func:`claim_folder` -- one sweep at a time writes into an output folder (an exclusive,
  non-blocking POSIX record lock, ``lockf``, held until the process ends, so a ``kill -9``
  releases it; unlike ``flock`` it belongs to the process alone, so pool workers forked by the
  sweep do not keep it after the sweep died), and a
  folder that holds another sweep's table is refused instead of silently overwritten.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from simulator.config.load import check_kind, did_you_mean, read_yaml
from simulator.config.schema import WorkloadConfig
from simulator.errors import ConfigError

#: Seconds to wait for a Ray cluster's address to accept a connection.
RAY_CONNECT_TIMEOUT_S = 10.0
#: Hidden files in a sweep's output folder: the lock and the name of the sweep it holds.
LOCK_FILE = ".sweep.lock"
OWNER_FILE = ".sweep.json"

_held: dict[str, int] = {}  # folder -> open lock file descriptor (kept for the process)


def check_base(sweep_path: Path, base: Path) -> None:
    """Refuse a base workload that is missing, not a regular file, or the sweep file."""
    if not base.exists():
        raise ConfigError(
            f"base workload {str(base)!r} does not exist", file=str(sweep_path), field="base"
        )
    if not base.is_file():
        raise ConfigError(
            f"base workload {str(base)!r} is not a file (give a workload YAML)",
            file=str(sweep_path),
            field="base",
        )
    if base.resolve() == sweep_path.resolve():
        raise ConfigError(
            "the base is the sweep file itself (give a workload YAML)",
            file=str(sweep_path),
            field="base",
        )
    # Malformed, empty or not a mapping: refused here, naming the base file. A top-level key
    # the workload does not have stays in every point (an override sets keys, never removes).
    raw = read_yaml(base, what="base workload")
    check_kind(raw, "workload", base)
    fields = list(WorkloadConfig.model_fields)
    unknown = sorted(str(k) for k in raw if k not in WorkloadConfig.model_fields)
    if unknown:
        raise ConfigError(
            "unknown key" + did_you_mean(unknown[0], fields), file=str(base), field=unknown[0]
        )


def check_ray(address: str | None) -> None:
    """Fail fast, on one line, when Ray is missing or ``address`` does not answer."""
    try:
        import ray  # noqa: F401  (imported only to check it is there)
    except ImportError:
        raise ConfigError(
            "--engine ray needs the ray package (pip install 'ray>=2.9')", file="--engine"
        ) from None
    if not address or address == "auto" or address.startswith("local"):
        return
    parsed = urlparse(address if "://" in address else f"ray://{address}")
    host, port = parsed.hostname, parsed.port
    if not host or not port:
        raise ConfigError(
            f"cannot read {address!r} as host:port or ray://host:port", file="--address"
        )
    try:
        with socket.create_connection((host, port), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise ConfigError(
            f"cannot reach the Ray cluster at {address!r} within "
            f"{RAY_CONNECT_TIMEOUT_S:g} s ({why})",
            file="--address",
        ) from None


def claim_folder(out_dir: Path, sweep_name: str, table: Path, *, fresh: bool) -> None:
    """Take the folder for this process's sweep (see the module docstring)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    key = str(out_dir.resolve())
    if key not in _held:
        fd = os.open(out_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ConfigError(
                f"another sweep is writing into {str(out_dir)!r} right now; wait for it or give "
                "another --out",
                file="--out",
            ) from None
        _held[key] = fd
    owner = out_dir / OWNER_FILE
    try:
        recorded = json.loads(owner.read_text()).get("sweep") if owner.exists() else None
    except (OSError, ValueError, AttributeError):
        recorded = None
    if table.exists() and recorded not in (None, sweep_name) and not fresh:
        raise ConfigError(
            f"{str(out_dir)!r} holds the results of sweep {recorded!r}, not {sweep_name!r}; "
            "give another --out (or --fresh to replace them)",
            file="--out",
        )
    if recorded != sweep_name:
        owner.write_text(json.dumps({"sweep": sweep_name}) + "\n")


def release_folder(out_dir: Path) -> None:
    """Release :func:`claim_folder`'s lock (it is also released when the process ends)."""
    fd = _held.pop(str(out_dir.resolve()), None)
    if fd is not None:
        os.close(fd)
