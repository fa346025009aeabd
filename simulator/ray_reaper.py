"""Ends a local Ray instance's processes when the sweep that started it ends.

``ray.init()`` without an address starts a Ray head (GCS server, raylet, dashboard and
runtime-env agents, workers) from the sweep process. Killed with ``kill -9``, the sweep
cannot shut it down, and Ray's agents outlive it (measured with Ray 2.60: the dashboard and
runtime-env agents still ran a minute after the sweep died). So
:mod:`simulator.sweep_engines` starts the head with a marker in its environment
(``SIMULATOR_RAY_SESSION=<marker>``, inherited by every process Ray starts) and runs this
file as a script beside it, in its own session, with a pipe from the sweep on its stdin::

    python ray_reaper.py MARKER SWEEP_PID

When the pipe closes (the sweep closed it after ``ray.shutdown()``, or the sweep died and the
kernel closed it), the reaper SIGKILLs every process whose environment holds the marker
(read from ``/proc/PID/environ``), again until none is left, then exits. Standard library
only: it runs as a plain script, outside the package. Linux only (``/proc``).
"""

from __future__ import annotations

import os
import signal
import sys
import time

#: The environment variable that marks a sweep's Ray processes.
VAR = "SIMULATOR_RAY_SESSION"
#: Seconds the reaper keeps looking for marked processes after the sweep ended.
GIVE_UP_S = 30.0


def marked(token: bytes, skip: set[int]) -> list[int]:
    """Processes (but ``skip``) whose environment holds ``token`` (``VAR=marker``)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:
            continue
        if token in env.split(b"\0"):
            out.append(int(name))
    return out


def reap(marker: str, skip: set[int]) -> None:
    """SIGKILL the marked processes until three scans in a row find none (or give up)."""
    token = f"{VAR}={marker}".encode()
    deadline = time.monotonic() + GIVE_UP_S
    quiet = 0
    while quiet < 3 and time.monotonic() < deadline:
        pids = marked(token, skip)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        quiet = 0 if pids else quiet + 1
        time.sleep(0.1)


def main(argv: list[str]) -> None:
    marker, parent = argv[0], int(argv[1])
    sys.stdin.buffer.read()  # returns when the sweep closes the pipe or dies
    reap(marker, {os.getpid(), parent})


if __name__ == "__main__":
    main(sys.argv[1:])
