"""``simulator collective OP --bytes N --topology FILE``: predict one collective."""

from __future__ import annotations

import json
import re
import sys

from rich.console import Console
from rich.table import Table

from simulator.config.load import load_topology
from simulator.errors import ConfigError
from simulator.hardware.catalog import load_gpu
from simulator.network.collectives import OPS, TIMINGS, collective_summary
from simulator.network.topology import build_topology
from simulator.report.table import format_bytes

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


#: Largest message accepted (1 PiB).
MAX_BYTES = float(2**50)


def parse_bytes(text: str) -> float:
    """``1073741824``, ``1GiB``, ``64MB`` -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"cannot read {text!r} as a size (e.g. 1048576, 64MiB, 1GB)",
                          file="--bytes")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not 0 < value <= MAX_BYTES:
        raise ConfigError(f"size must be in (0, 1 PiB], got {text!r}", file="--bytes")
    if value != round(value):  # 1.5, 0.5KB: no collective moves part of a byte
        raise ConfigError(f"size must be a whole number of bytes, got {text!r}", file="--bytes")
    return value


def register(sub) -> None:
    p = sub.add_parser("collective", help="predict one NCCL collective (nccl-tests figures)")
    p.add_argument("op", help=" | ".join(OPS) + " (or alltoall, allreduce, allgather, ...)")
    p.add_argument("--bytes", required=True,
                   help="message size as nccl-tests counts it: 1073741824, 64MiB, 1GB")
    p.add_argument("--topology", required=True, help="topology YAML")
    p.add_argument("--gpus", type=int, help="GPUs taking part, 0..N-1 (default all)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a topology key (topology.nodes=4)")
    p.add_argument("--timing", default="device", metavar="|".join(TIMINGS),
                   help="also show what a measurement timed so sees of the call (timed_s): "
                   "device (default: the GPU's time only, as nccl-tests' C loop shows it), loop "
                   "(a PyTorch loop of N calls between one pair of CUDA events, over N), events (a CUDA event after each "
                   "call), host_sync (a barrier and a synchronisation around each call); a "
                   "Python loop's host interval where it is longer (gpus.yaml "
                   "host_events_*, host_event_record_s)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=main)


#: nccl-tests' names (``alltoall_perf``, ``all_reduce_perf`` ...) and spellings without the
#: underscore, accepted beside the simulator's own.
ALIASES = {"alltoall": "all_to_all", "allreduce": "all_reduce", "allgather": "all_gather",
           "reducescatter": "reduce_scatter", "sendrecv": "send"}


def main(args) -> int:
    args.op = ALIASES.get(args.op.lower(), args.op)
    if args.op not in OPS:
        raise ConfigError(f"unknown collective {args.op!r} (accepted: {', '.join(OPS)})",
                          file="collective")
    if args.timing not in TIMINGS:
        raise ConfigError(f"unknown timing {args.timing!r} (accepted: {', '.join(TIMINGS)})",
                          file="--timing")
    nbytes = parse_bytes(args.bytes)
    cfg = load_topology(args.topology, args.overrides)
    gpu = load_gpu(cfg.gpu, file=args.topology, field="gpu")
    topo = build_topology(cfg, gpu, file=args.topology)
    if topo.n_gpus < 2:
        raise ConfigError(
            f"a collective needs at least 2 GPUs; this topology has {topo.n_gpus}",
            file=args.topology,
            field="nodes",
        )
    if args.gpus is not None and not (2 <= args.gpus <= topo.n_gpus):
        raise ConfigError(f"--gpus must be in 2..{topo.n_gpus} for this topology, got {args.gpus}",
                          file="--gpus")
    res = collective_summary(topo, args.op, nbytes, args.gpus, args.timing)
    if args.json:
        sys.stdout.write(json.dumps(res, allow_nan=False) + "\n")
        return 0
    console = Console(width=max(100, Console().width))
    console.print(
        f"[bold]{args.op}[/bold] of {format_bytes(nbytes)} ({nbytes:,.0f} B) on "
        f"{args.gpus or topo.n_gpus} GPUs of {cfg.name}"
    )
    t = Table()
    t.add_column("quantity")
    t.add_column("value", justify="right")
    t.add_row("time", f"{res['time_s'] * 1e6:,.1f} µs")
    t.add_row("algbw", f"{res['algbw_GBps']:,.1f} GB/s")
    t.add_row("busbw", f"{res['busbw_GBps']:,.1f} GB/s")
    t.add_row("launch", f"{res['launch_s'] * 1e6:,.1f} µs")  # the JSON's launch_s, in µs
    if "timed_s" in res:  # the JSON's timed_s, in µs
        t.add_row(f"timed ({res['timing']})", f"{res['timed_s'] * 1e6:,.1f} µs")
    for k, v in res.items():
        if k not in {"time_s", "algbw_GBps", "busbw_GBps", "launch_s", "timed_s", "timing"}:
            t.add_row(k, str(v))
    console.print(t)
    return 0
