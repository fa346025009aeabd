"""Where a sweep's points run: in this process, in a process pool, or on Ray.

Each engine takes an *iterator* of tasks ``(index, payload)`` and a function, and yields
``(index, fn(payload))`` as results come in. Tasks are drawn from the iterator only as work
is needed: at most :data:`IN_FLIGHT_PER_WORKER` per worker are submitted and not yet
finished, so a sweep of 67,200 points never holds more than a few prepared points, and its
first point runs before the last is generated.

* :func:`run_inline` -- one at a time in this process;
* :func:`run_local` -- a :class:`~concurrent.futures.ProcessPoolExecutor` whose workers die
  with this process (:func:`die_with_parent`);
* :func:`run_ray` -- Ray tasks: ``ray.init(address)``, or without an address a local Ray
  instance whose processes end with this one, also on ``kill -9``
  (:mod:`simulator.ray_reaper`). ray is imported only here.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

from simulator import ray_reaper
from simulator.errors import ConfigError

#: Tasks submitted and not yet finished, per worker (one running, one queued).
IN_FLIGHT_PER_WORKER = 2

Task = tuple[int, Any]


def run_inline(tasks: Iterable[Task], fn: Callable) -> Iterator[tuple[int, Any]]:
    """Run each task in this process, in order."""
    for i, payload in tasks:
        yield i, fn(payload)


def die_with_parent(parent: int) -> None:
    """Pool-worker initializer: end this worker when the process that started it dies.

    A sweep killed with SIGKILL (or the crash hook of :func:`~simulator.sweep.run_sweep`)
    cannot shut its pool down, and pool workers blocked on their task queue would live on as
    orphans. On Linux the kernel is asked to kill the worker with its parent
    (``prctl(PR_SET_PDEATHSIG)``); a parent that died before that call is caught by the
    ``getppid`` check.
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


def run_local(tasks: Iterable[Task], fn: Callable, workers: int) -> Iterator[tuple[int, Any]]:
    """Run the tasks in a process pool of ``workers``, a bounded number at a time."""
    it = iter(tasks)
    window = IN_FLIGHT_PER_WORKER * workers
    pool = process_pool(workers)
    pending: dict[Any, int] = {}
    try:
        while True:
            for i, payload in it:
                pending[pool.submit(fn, payload)] = i
                if len(pending) >= window:
                    break
            if not pending:
                return
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=pending.__getitem__):
                yield pending.pop(f), f.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def run_ray(
    tasks: Iterable[Task], fn: Callable, workers: int, address: str | None
) -> Iterator[tuple[int, Any]]:
    """Run the tasks as Ray tasks (one CPU each), a bounded number at a time."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--engine ray needs the ray package (pip install 'ray>=2.9')", file="--engine"
        ) from None
    started, reaper, session = False, None, None
    if not ray.is_initialized():
        reaper, session = _init_ray(ray, workers, address)
        started = True
    remote = ray.remote(num_cpus=1, max_retries=0)(fn)
    it = iter(tasks)
    window = IN_FLIGHT_PER_WORKER * workers
    refs: dict[Any, int] = {}
    try:
        while True:
            for i, payload in it:
                refs[remote.remote(payload)] = i
                if len(refs) >= window:
                    break
            if not refs:
                return
            done, _ = ray.wait(list(refs), num_returns=1)
            for ref in done:
                yield refs.pop(ref), ray.get(ref)
    finally:
        for ref in refs:
            try:
                ray.cancel(ref, force=True)
            except Exception:
                pass
        if started:
            ray.shutdown()
        if reaper is not None:
            reaper.stdin.close()  # the reaper ends whatever of the local instance is left
        if session is not None:
            _remove_session(session)


def _remove_session(session: str) -> None:
    """Remove a local Ray instance's session folder (its logs and sockets, under
    ``/tmp/ray`` or ``$RAY_TMPDIR/ray``), which Ray leaves behind, and the ``session_latest``
    link to it: the sweep writes only into its output folder."""
    shutil.rmtree(session, ignore_errors=True)
    latest = Path(session).parent / "session_latest"
    try:
        if latest.is_symlink() and os.path.realpath(latest) == os.path.realpath(session):
            latest.unlink()
    except OSError:
        pass


def _start_reaper(marker: str) -> subprocess.Popen | None:
    """Start :mod:`simulator.ray_reaper` for the processes marked ``marker`` (Linux)."""
    if not os.path.isdir("/proc/self"):
        return None
    env = {k: v for k, v in os.environ.items() if k != ray_reaper.VAR}
    script = Path(ray_reaper.__file__)
    return subprocess.Popen(
        [sys.executable, str(script), marker, str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,  # a Ctrl-C meant for the sweep does not stop the cleanup
    )


def _init_ray(
    ray, workers: int, address: str | None
) -> tuple[subprocess.Popen | None, str | None]:
    """Connect to the cluster at ``address``, or start a local instance of ``workers`` CPUs
    whose processes end with this one (:mod:`simulator.ray_reaper`). Returns the reaper
    (or None) and the local instance's session folder, to remove after the shutdown (None
    for a cluster of its own)."""
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
        return None, None
    root = str(Path(pkg).parent)
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    marker = f"{os.getpid()}-{secrets.token_hex(8)}"
    reaper = _start_reaper(marker)
    os.environ[ray_reaper.VAR] = marker  # inherited by every process the head starts
    try:
        ctx = ray.init(
            # "local": always a new instance; without it Ray joins the cluster named in
            # RAY_ADDRESS or in /tmp/ray/ray_current_cluster, even a stale one
            address="local",
            num_cpus=workers,
            include_dashboard=False,
            log_to_driver=False,
            # Ray's start-up notes (token authentication, "Started a local Ray instance")
            # are not the sweep's; its errors still show.
            logging_level=logging.ERROR,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
    except BaseException:
        if reaper is not None:
            reaper.stdin.close()
        raise
    finally:
        os.environ.pop(ray_reaper.VAR, None)
    session = getattr(ctx, "address_info", {}).get("session_dir")
    return reaper, session
