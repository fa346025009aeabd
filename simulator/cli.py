"""Command line: ``python -m simulator COMMAND ...`` (see README.md).

Exit codes: 0 success; 2 invalid input (one ``error:`` line on stderr, no traceback); 1 an
internal failure. Set ``SIMULATOR_DEBUG=1`` to see the traceback of an internal failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence

from simulator.commands import (
    collective_cmd,
    compare_cmd,
    plan_cmd,
    run_cmd,
    sweep_cmd,
    validate_cmd,
)
from simulator.errors import ConfigError, SimulatorError


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors as one ``error:`` line with exit code 2."""

    def error(self, message: str):  # noqa: D102
        raise ConfigError(f"{self.prog}: {message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="simulator", description="Discrete-event simulator of GPU clusters "
                     "running distributed LLM training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for mod in COMMANDS:
        mod.register(sub)
    return parser


COMMANDS = [run_cmd, compare_cmd, sweep_cmd, plan_cmd, collective_cmd, validate_cmd]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m simulator`` and the ``simulator`` console script."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
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
