"""What an expert GEMM's first-launch drain waits for when an all-to-all is queued before it,
with 4 processes (issue 12, helper emoe8; follow-up of ``gemm_drain.py``).

Every rank runs the same trials. A trial: synchronise, barrier, synchronise; the host of rank
``r`` then waits ``r x --stagger-ms`` (so rank 0 issues first, the last rank last), queues a
spin kernel of ``--sleep-ms`` and an ``all_to_all_single`` of ``--a2a-kib`` KiB a peer on the
default stream (as ``steps_alt.py``'s combine backward: the compute stream waits for it), then
calls one data-gradient GEMM of ``steps_alt.py``'s expert MLP (``b2x`` or ``b1x`` of
``gemm_drain.Shape``) at a row count; the host clock (``CLOCK_MONOTONIC``, one clock for the
processes of a box) is read before the stagger (``t_b``), after the all-to-all's call
(``t_a``), after the GEMM's call (``t_g``) and after the final synchronise (``t_s``). Passes:
``new`` (``--count`` row counts drawn log-uniform in [1, 32768], every rank the same ones in
the same order, each with both GEMMs: the first launches of many kernels) and ``seen``
(``--repeat`` of them again: no new kernel). A call whose GEMM waits for the GPU to drain
returns after the last rank has issued its all-to-all (``max_r t_a``) and the exchange has
run; one that does not returns in its ordinary host time.

Output ``OUT/drain-a2a-TAG.json`` (rank 0: every rank's trials). Usage: ``torchrun --standalone
--nproc_per_node=4 benchmarks/device/gemm_drain_a2a.py --tag st2 --out DIR``; ``--quick``:
CPU, gloo, tiny shapes, no spin (a dry run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str):
    path = os.path.join(HERE, f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


GD = _load("gemm_drain")


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="2304x4096")
    ap.add_argument("--count", type=int, default=80)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--sleep-ms", type=float, default=1.0)
    ap.add_argument("--stagger-ms", type=float, default=2.0)
    ap.add_argument("--a2a-kib", type=int, default=1024)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cuda = not args.quick
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if cuda:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    dt = torch.bfloat16

    def sync():
        if cuda:
            torch.cuda.synchronize()

    n = args.a2a_kib * 512 * world  # bf16 elements: a2a_kib KiB to each peer
    inp = torch.ones(n, dtype=dt, device=dev)
    out = torch.empty_like(inp)
    cyc_ms = 0.0
    if cuda:
        torch.mm(torch.ones(8, 8, device=dev), torch.ones(8, 8, device=dev))
        torch.cuda._sleep(1000)
        sync()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.cuda._sleep(20_000_000)
        e1.record()
        sync()
        cyc_ms = 20_000_000 / e0.elapsed_time(e1)
        big = torch.empty(3 * 2**30, dtype=torch.uint8, device=dev)
        del big
    spin = int(args.sleep_ms * cyc_ms)
    for _ in range(5):  # the exchange's kernels and connections set up
        dist.all_to_all_single(out, inp)
    sync()
    dist.barrier()
    sync()
    h, f = (16, 32) if args.quick else tuple(int(v) for v in args.shape.split("x"))
    mmax = 64 if args.quick else 32768
    sh = GD.Shape(h, f, mmax, dev, dt)
    ms = GD.row_counts(12 if args.quick else args.count, args.seed, 1, mmax)
    seen = ms[:]
    random.Random(args.seed + 100).shuffle(seen)
    trials = []
    for phase, lst in (("new", ms), ("seen", seen[: 4 if args.quick else args.repeat])):
        for m in lst:
            for op in ("b2x", "b1x"):
                sync()
                dist.barrier()
                sync()
                t_b = now()
                wait = rank * args.stagger_ms * 1e-3
                while now() - t_b < wait:
                    pass
                if cuda:
                    torch.cuda._sleep(spin)
                dist.all_to_all_single(out, inp)
                t_a = now()
                y = sh.call(op, m)
                t_g = now()
                sync()
                t_s = now()
                del y
                trials.append([phase, m, op, t_b, t_a, t_g, t_s])
    got = [None] * world
    dist.all_gather_object(got, trials)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        rec = {"tag": args.tag, "world": world, "shape": args.shape, "count": args.count,
               "repeat": args.repeat, "seed": args.seed, "sleep_ms": args.sleep_ms,
               "stagger_ms": args.stagger_ms, "a2a_kib": args.a2a_kib, "spin_cycles": spin,
               "fields": ["phase", "m", "op", "t_b", "t_a", "t_g", "t_s"], "ranks": got,
               "env": {"torch": torch.__version__, "cuda": torch.version.cuda,
                       "gpu": torch.cuda.get_device_name(dev) if cuda else "cpu"}}
        with open(os.path.join(args.out, f"drain-a2a-{args.tag}.json"), "w") as fh:
            json.dump(rec, fh)
        nd = sum(1 for t in got[0] if t[5] - t[4] > 0.5e-3 * max(args.sleep_ms, 1.0))
        print(f"RESULT {args.tag}: {len(got[0])} trials a rank, rank 0 {nd} long GEMM calls",
              flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
