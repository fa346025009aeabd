"""Ends a local Ray instance's processes when the sweep that started it ends.

``ray.init()`` without an address starts a Ray head (GCS server, raylet, dashboard and
runtime-env agents, workers) from the sweep process. Killed with ``kill -9``, the sweep
cannot shut it down: the GCS server and raylet die with it (Ray starts them with
``PR_SET_PDEATHSIG``), but the raylet's dashboard and runtime-env agents are orphaned and
outlive it (measured with Ray 2.60: still running a minute later). So
:mod:`simulator.sweep_engines` runs this file as a script beside the sweep, in its own
session, with a pipe from the sweep on its stdin::

    python ray_reaper.py MARKER SWEEP_PID

**Which processes are the sweep's.** While the pipe is open, the reaper notes every
descendant of the sweep, by parent pid from ``/proc/PID/stat``, every :data:`POLL_S`
seconds, as (pid, start time) so that a pid the kernel later reuses is never taken for one
of them; descendants of a noted process are noted too, so a process whose parent died
stays in the family. A process's environment is no reliable mark: Ray's agents and
workers rename themselves with ``setproctitle``, which overwrites the start of the
``/proc/PID/environ`` area, and the raylet orders their environment variables
differently from run to run, so an environment marker survived in some runs and not in
others (the flaky cause of a surviving ``DashboardAgent``). The marker
(``SIMULATOR_RAY_SESSION=<marker>``) is still read, as a second way to find a process
started between two polls.

**When the pipe closes** (the sweep closed it after ``ray.shutdown()``, or it died and the
kernel closed it), the reaper SIGKILLs every noted or marked process and their
descendants, and scans again until no such process has been seen for :data:`QUIET_S`
seconds (at most :data:`GIVE_UP_S`), then exits. Standard library only: it runs as a plain
script, outside the package. Linux only (``/proc``).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

#: The environment variable that marks a sweep's Ray processes.
VAR = "SIMULATOR_RAY_SESSION"
#: Seconds between two notes of the sweep's descendants while it runs.
POLL_S = 0.25
#: Seconds without any process of the family left before the reaper exits.
QUIET_S = 2.0
#: Seconds the reaper keeps killing after the sweep ended, at most.
GIVE_UP_S = 60.0

Proc = tuple[int, int]  # (pid, start time in clock ticks after boot)


def snapshot() -> dict[int, tuple[int, int]]:
    """Every process now: ``{pid: (parent pid, start time)}`` from ``/proc/PID/stat``."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        # after the command name in parentheses: state, ppid, ..., starttime (field 22)
        fields = stat.rsplit(b")", 1)[-1].split()
        try:
            out[int(name)] = (int(fields[1]), int(fields[19]))
        except (IndexError, ValueError):
            continue
    return out


def family(procs: dict[int, tuple[int, int]], known: set[Proc], roots: set[Proc]) -> set[Proc]:
    """The processes of ``procs`` that are ``known`` or descend from ``known`` or ``roots``."""
    alive = {(pid, start) for pid, (_, start) in procs.items()}
    tops = {pid for pid, start in (known | roots) if (pid, start) in alive}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    found = {pid for pid, start in known if (pid, start) in alive}
    stack = [*tops]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return {(pid, procs[pid][1]) for pid in found}


def marked(token: bytes, procs: dict[int, tuple[int, int]]) -> set[Proc]:
    """Processes whose (readable part of the) environment holds ``token`` (``VAR=marker``)."""
    out = set()
    for pid, (_, start) in procs.items():
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if token in env.split(b"\0"):
            out.add((pid, start))
    return out


def watch(sweep: Proc, skip: int) -> set[Proc]:
    """Note the sweep's descendants until its pipe on stdin closes; returns them."""
    known: set[Proc] = set()
    while True:
        readable, _, _ = select.select([0], [], [], POLL_S)
        if readable and not os.read(0, 4096):
            return known
        known = {p for p in family(snapshot(), known, {sweep}) if p[0] != skip}


def reap(marker: str, known: set[Proc], sweep: Proc, skip: int) -> None:
    """SIGKILL the noted or marked processes and their descendants until none has been seen
    for QUIET_S (or GIVE_UP_S). New children of the sweep are not taken: a sweep that closed
    the pipe itself lives on and may start other processes."""
    token = f"{VAR}={marker}".encode()
    start = time.monotonic()
    last_seen = start
    while time.monotonic() - last_seen < QUIET_S and time.monotonic() - start < GIVE_UP_S:
        procs = snapshot()
        procs.pop(skip, None)
        procs.pop(sweep[0], None)
        found = family(procs, known, set()) | marked(token, procs)
        known |= found
        for pid, _ in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if found:
            last_seen = time.monotonic()
        time.sleep(0.1)


def main(argv: list[str]) -> None:
    """``MARKER SWEEP_PID``: watch the sweep's descendants, reap them once stdin closes."""
    marker, parent = argv[0], int(argv[1])
    me = os.getpid()
    start = snapshot().get(parent, (0, -1))[1]
    sweep = (parent, start)
    known = watch(sweep, me)
    reap(marker, known, sweep, me)


if __name__ == "__main__":
    main(sys.argv[1:])
