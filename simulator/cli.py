"""Command line: ``python -m simulator COMMAND ...`` (see README.md).

Exit codes: 0 success; 2 invalid input (one ``error:`` line on stderr, no traceback); 1 an
internal failure. Set ``SIMULATOR_DEBUG=1`` to see the traceback of an internal failure.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence

from simulator.errors import ConfigError, SimulatorError

#: command -> (its module under ``simulator.commands``, the one-line help of ``--help``).
#: Only the module of the command being run is imported (with what it needs: pandas,
#: matplotlib, pyarrow, ray), so ``--help`` and a usage error start in a fraction of a second;
#: the other commands are listed with their help line only. tests/test_cli_imports.py holds
#: these lines equal to the ones each module registers.
COMMANDS = {
    "run": ("run_cmd", "simulate one training step of a workload"),
    "compare": (
        "compare_cmd",
        "run a workload on several topologies / variants and compare them side by side",
    ),
    "sweep": ("sweep_cmd", "run variations of a workload (grid and/or points) in parallel"),
    "plan": ("plan_cmd", "search tp/pp/dp, micro-batch, ZeRO, recompute and schedule for N GPUs"),
    "collective": ("collective_cmd", "predict one NCCL collective (nccl-tests figures)"),
    "validate": ("validate_cmd", "run validation suites: predicted vs measured"),
}


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line with exit code 2."""

    def error(self, message: str):  # noqa: D102
        raise ConfigError(f"{self.prog}: {message} (see --help)")


def command_module(name: str):
    """The module of command ``name`` (imported on first use)."""
    return importlib.import_module(f"simulator.commands.{COMMANDS[name][0]}")


def build_parser(only: str | None = "*") -> argparse.ArgumentParser:
    """The argument parser: every command in full (``only="*"``, the default), or command
    ``only`` in full and the others by their help line (``None``: all by their help line)."""
    parser = _Parser(prog="simulator", description="Discrete-event simulator of GPU clusters "
                     "running distributed LLM training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, (_, help_line) in COMMANDS.items():
        if only in ("*", name):
            command_module(name).register(sub)
        else:
            sub.add_parser(name, help=help_line)
    return parser


def _command_word(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option), if it is one."""
    word = next((a for a in argv if not a.startswith("-")), None)
    return word if word in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m simulator`` and the ``simulator`` console script."""
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        parser = build_parser(_command_word(argv))
        args = parser.parse_args(argv)
        if not hasattr(args, "func"):  # a command argv did not name first: parse in full
            args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except SimulatorError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as e:  # an internal failure: one line, traceback on request
        if os.environ.get("SIMULATOR_DEBUG"):
            traceback.print_exc()
        print(f"internal error: {type(e).__name__}: {e} (set SIMULATOR_DEBUG=1 for the "
              "traceback)", file=sys.stderr)
        return 1
