"""What NCCL chooses per message size, and a collective's device time without the host's
call rate (issue 12, collectives between pairs of GPUs).

Run under ``torch.distributed.run`` with one process per GPU, with NCCL's tuning log on::

    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_DEBUG_FILE=DIR/nccl-LABEL.%h.%p.log \\
    python3 -m torch.distributed.run --standalone --nproc_per_node=2 \\
        benchmarks/device/nccl_tuning.py --out DIR --label LABEL [--ops ...] [--timing ...]

and afterwards ``python3 benchmarks/device/nccl_tuning.py --parse DIR/nccl-*.log`` turns
NCCL 2.28's per-call lines (``enqueue.cc``: ``AllGather: N Bytes -> Algo RING proto SIMPLE
channel{Lo..Hi}={0..23}``, printed by rank 0 with ``NCCL_DEBUG_SUBSYS=TUNING``) and its
init lines (``N coll channels, ... p2p channels per peer``) into JSON lines.

Timing (``timing`` field), every op on all ``WORLD_SIZE`` GPUs as one group, bf16:

- ``events``: a CUDA event between back-to-back calls, as ``comm.py`` (and nccl-tests'
  loop) does. Where the host issues a call more slowly than the GPU runs it (small
  messages, Python), this is the host's call interval, not the collective.
- ``single``: one call at a time on the device: the stream sleeps 2 ms (the host enqueues the
  call behind it), then an event, the call, an event; median of ``k`` such calls. No call
  runs before or after it on the GPU, as in a host-synchronised loop, but without the host's
  launch in the time. ``time_s`` is the slowest rank's, ``per_rank_s`` all (the rank whose
  sleep ends first also waits for its peers' sleeps to end: the fastest rank is the call).
- ``device``: the current stream first sleeps (``torch.cuda._sleep``) long enough for the
  host to enqueue all ``k`` calls behind it, so the GPU then runs them back to back as a
  training step does when its host is ahead. Time per call = (event after the last call -
  event after the first) / (k - 1): the first call is left out because the two ranks'
  sleeps end at slightly different times. ``host_ahead`` says whether the sleep was still
  running when the last call had been enqueued (if not, the row is not device-bound).

Records: ``op, group, bytes, label, timing, time_s`` (median over repeats), ``best_s``,
``times_s``, ``env`` (the NCCL_* variables in force: the label's variant), ``nccl``.
``bytes`` is the whole (unsharded) buffer as nccl-tests counts it; per rank for all-to-all.
``--quick`` runs on the CPU with gloo and tiny sizes (a dry run; no sleep, no events).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys
import time

FUNCS = {"AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
         "AllReduce": "all_reduce", "Broadcast": "broadcast", "Reduce": "reduce"}
CALL_RE = re.compile(r"(\w+): (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
INIT_RE = re.compile(r"(\d+) coll channels, (\d+) collnet channels, (\d+) nvls channels, "
                     r"(\d+) p2p channels, (\d+) p2p channels per peer")


def parse_logs(paths: list[str]) -> list[dict]:
    """NCCL's per-call choices and channel counts from its INFO logs, one record per distinct
    (log label, op, bytes, algorithm, protocol, channels) with how many calls made it."""
    out: dict[tuple, dict] = {}
    for path in paths:
        label = re.sub(r"^nccl-|\..*$", "", os.path.basename(path))
        with open(path, errors="replace") as f:
            for line in f:
                m = INIT_RE.search(line)
                if m:
                    key = (label, "init")
                    out.setdefault(key, {"label": label, "kind": "init", "coll_channels": int(m[1]),
                                         "nvls_channels": int(m[3]), "p2p_channels": int(m[4]),
                                         "p2p_channels_per_peer": int(m[5])})
                    continue
                m = CALL_RE.search(line)
                if m and m[1] in FUNCS:
                    # NCCL prints count x element size: the per-rank buffer for all-gather,
                    # the output (per rank) for reduce-scatter, the buffer for all-reduce.
                    key = (label, FUNCS[m[1]], int(m[2]), m[3], m[4], int(m[6]) - int(m[5]) + 1)
                    rec = out.setdefault(key, {"label": label, "kind": "call", "op": key[1],
                                               "nccl_bytes": key[2], "algorithm": key[3],
                                               "protocol": key[4], "channels": key[5],
                                               "calls": 0})
                    rec["calls"] += 1
    return list(out.values())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--file", default="tuning.jsonl")
    ap.add_argument("--label", default="auto")
    ap.add_argument("--ops", default="all_gather,reduce_scatter,all_reduce,all_to_all")
    ap.add_argument("--timing", default="device,events")
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=2**30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--factor", type=int, default=4, help="size step (x factor)")
    ap.add_argument("--budget-s", type=float, default=100)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--parse", nargs="*", help="NCCL log files to parse (no measurement)")
    args = ap.parse_args()
    if args.parse is not None:
        paths = [p for x in args.parse for p in sorted(glob.glob(x))]
        for rec in parse_logs(paths):
            print(json.dumps(rec))
        return 0
    return measure(args)


def measure(args) -> int:
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    quick = args.quick or not torch.cuda.is_available()
    if quick:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
        args.max_bytes = min(args.max_bytes, 2**20)
    else:
        dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", device_id=dev)
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if not quick else "-"
    env = {k: v for k, v in sorted(os.environ.items())
           if k.startswith("NCCL_") and not k.startswith("NCCL_DEBUG")}

    def launcher(op, nbytes):
        el = max(nbytes // 2, world)
        el -= el % world
        dt = torch.bfloat16
        x = torch.randn(el, device=dev).to(dt)
        if op == "all_reduce":
            return lambda: dist.all_reduce(x)
        if op == "all_gather":
            xs, y = x[: el // world].clone(), torch.empty(el, device=dev, dtype=dt)
            return lambda: dist.all_gather_into_tensor(y, xs)
        if op == "reduce_scatter":
            y = torch.empty(el // world, device=dev, dtype=dt)
            return lambda: dist.reduce_scatter_tensor(y, x)
        if op == "all_to_all":
            y = torch.empty_like(x)
            return lambda: dist.all_to_all_single(y, x)
        raise ValueError(op)

    cycles_per_s = None
    if not quick:  # calibrate torch.cuda._sleep: cycles per second of this GPU
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(10**6)
        a.record()
        torch.cuda._sleep(5 * 10**7)
        b.record()
        torch.cuda.synchronize()
        cycles_per_s = 5 * 10**7 / (a.elapsed_time(b) / 1e3)

    def one(fn, timing, k):
        """Seconds per call, and whether the host stayed ahead of the GPU."""
        if quick:
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            return (time.perf_counter() - t0) / k, None
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(k + 1)]
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        ahead = None
        if timing == "single":
            ts = []
            for _ in range(k):
                torch.cuda._sleep(int(cycles_per_s * 2e-3))
                ev[0].record()
                fn()
                ev[1].record()
                ahead = (ahead is not False) and not ev[0].query()
                torch.cuda.synchronize()
                ts.append(ev[0].elapsed_time(ev[1]) / 1e3)
                dist.barrier()
                torch.cuda.synchronize()
            return statistics.median(ts), ahead
        if timing == "device":  # 300 us of enqueueing per call is ample for Python + NCCL
            torch.cuda._sleep(int(cycles_per_s * (2e-3 + 3e-4 * k)))
        ev[0].record()
        for i in range(k):
            fn()
            ev[i + 1].record()
        if timing == "device":
            ahead = not ev[0].query()
        torch.cuda.synchronize()
        if timing == "device":
            return ev[1].elapsed_time(ev[k]) / 1e3 / (k - 1), ahead
        return statistics.median(ev[i].elapsed_time(ev[i + 1]) for i in range(k)) / 1e3, None

    sizes, s = [], args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= args.factor
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, args.file)
    t0 = time.time()
    stop = torch.zeros(1, device=dev)
    for op in args.ops.split(","):
        for nbytes in sizes:
            stop.fill_(1.0 if time.time() - t0 > args.budget_s else 0.0)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item():
                if rank == 0:
                    print("budget used up", flush=True)
                dist.destroy_process_group()
                return 0
            fn = launcher(op, nbytes)
            for _ in range(3):
                fn()
            k = 20 if nbytes <= 2**24 else (8 if nbytes <= 2**27 else 4)
            for timing in args.timing.split(","):
                reps = [one(fn, timing, k) for _ in range(args.repeats)]
                mine = torch.tensor([statistics.median(t for t, _ in reps),
                                     min(t for t, _ in reps),
                                     float(all(a is not False for _, a in reps))],
                                    dtype=torch.float64, device=dev)
                allr = [torch.zeros_like(mine) for _ in range(world)]
                dist.all_gather(allr, mine)
                worst = max(allr, key=lambda t: float(t[0]))
                rec = {"op": op, "group": world, "bytes": nbytes, "label": args.label,
                       "timing": timing, "time_s": float(worst[0]), "best_s": float(worst[1]),
                       "calls_per_repeat": k, "repeats": args.repeats,
                       "host_ahead": (bool(min(float(t[2]) for t in allr))
                                      if timing in ("device", "single") and not quick
                                      else None),
                       "per_rank_s": [float(t[0]) for t in allr], "nccl": nccl, "env": env,
                       "dtype": "bf16"}
                if rank == 0:
                    with open(path, "a") as f:
                        f.write(json.dumps(rec) + "\n")
                    print(f"{args.label} {op} {timing} {nbytes} B: {rec['time_s'] * 1e6:.1f} us",
                          flush=True)
            del fn
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
