"""``python -m simulator.calibrate [SET ...]``: refit each constant set and print the refit
beside the shipped value (see the package docstring)."""

from __future__ import annotations

import argparse
import importlib
import sys

SETS = ("network", "alltoall", "p2p", "unaligned", "launch", "interference", "memory", "compute",
        "host", "routes", "sync", "deepep", "host_spread", "host_barrier", "ports", "power",
        "kernel_bands", "blockwise", "blackwell_gemm", "mx_cast")


class _Parser(argparse.ArgumentParser):
    """Usage errors as one ``error:`` line with exit code 2, as the ``simulator`` commands
    report them (argparse prints its usage first)."""

    def error(self, message: str):  # noqa: D102
        sys.stderr.write(f"error: {self.prog}: {message} (see --help)\n")
        raise SystemExit(2)


def main(argv=None) -> int:
    ap = _Parser(prog="python -m simulator.calibrate")
    ap.add_argument("sets", nargs="*", help=f"constant sets (default: all of {', '.join(SETS)})")
    args = ap.parse_args(argv)
    bad = [s for s in args.sets if s not in SETS]
    if bad:
        ap.error(f"unknown set {bad[0]!r} (accepted: {', '.join(SETS)})")
    for name in args.sets or SETS:
        mod = importlib.import_module(f"simulator.calibrate.{name}")
        print(f"# {name}: {mod.__doc__.strip().splitlines()[0]}")
        print(f"{'constant':<44} {'refit':>14} {'shipped':>14}")
        for k, (new, old) in mod.refit().items():
            print(f"{k:<44} {new:>14.6g} {old:>14.6g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
