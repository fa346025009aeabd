"""Run many CLI invocations in one subprocess with a wall-time ceiling.

A hang or a runaway simulation must fail a test, not stall the suite; a subprocess per case
would cost a Python start-up each. :func:`run_batch` starts one ``python`` that calls
:func:`simulator.cli.main` for every argv in turn (stdout and stderr captured per case) and
kills it after ``timeout`` seconds: the ceiling is the subprocess timeout, not a timing
assertion.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_DRIVER = r"""
import contextlib, io, json, sys
from simulator.cli import main
results = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code
    results.append({"rc": rc, "out": out.getvalue(), "err": err.getvalue()})
sys.__stdout__.write(json.dumps(results))
"""


@dataclass(frozen=True)
class Outcome:
    argv: list[str]
    rc: int
    out: str
    err: str


def run_batch(cases: list[list[str]], cwd: Path, *, timeout: float = 120.0) -> list[Outcome]:
    """Run ``simulator`` with each argv in ``cases`` inside one subprocess (cwd ``cwd``);
    raises ``subprocess.TimeoutExpired`` when the whole batch takes over ``timeout`` s."""
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [Outcome(argv, **r) for argv, r in zip(cases, json.loads(proc.stdout), strict=True)]


def assert_refused(o: Outcome) -> str:
    """``o`` is an invalid-input exit: code 2, nothing on stdout, one ``error:`` line and no
    traceback; returns that line without ``error: ``."""
    assert o.rc == 2, (o.argv, o.rc, o.err)
    assert o.out == "", (o.argv, o.out)
    assert o.err.startswith("error: ") and o.err.count("\n") == 1, (o.argv, o.err)
    assert "Traceback" not in o.err
    return o.err[len("error: ") : -1]
