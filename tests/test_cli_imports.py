"""The command line imports the heavy libraries only for the commands that use them.

``python -m simulator --help`` lists every command without importing its module; ``run``
imports matplotlib (timeline, report page) only when it writes files. Start-up time itself is
printed by ``benchmarks/scale.py --imports``, not asserted here.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from simulator.cli import COMMANDS, command_module

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("matplotlib", "pandas", "pyarrow", "ray", "networkx")


def _loaded_after(argv: list[str]) -> list[str]:
    """The heavy libraries imported by ``simulator.cli.main(argv)`` in a fresh interpreter."""
    code = (
        "import contextlib, io, json, sys\n"
        "from simulator.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        f"        main({argv!r})\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_help_imports_no_heavy_library():
    assert _loaded_after(["--help"]) == []


def test_run_help_imports_no_plotting_or_graph_library():
    assert not {"matplotlib", "ray", "networkx"} & set(_loaded_after(["run", "--help"]))


def test_run_without_files_imports_no_plotting_library():
    loaded = _loaded_after(["run", "workloads/llama3-8b.yaml", "--no-files", "--json"])
    assert "matplotlib" not in loaded and "ray" not in loaded


def test_help_lines_are_the_ones_each_command_registers():
    for name, (_, help_line) in COMMANDS.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        command_module(name).register(sub)
        action = next(a for a in sub._choices_actions if a.dest == name)
        assert action.help == help_line, name
