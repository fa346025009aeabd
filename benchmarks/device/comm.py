"""NCCL collectives and all-to-all through PyTorch on one multi-GPU host.

Run under ``torch.distributed.run`` with one process per GPU::

    python3 -m torch.distributed.run --standalone --nproc_per_node=4 \
        benchmarks/device/comm.py --out DIR [--ops all_to_all] [--timing events,host_sync]

Ops: ``all_reduce``, ``all_gather`` (``all_gather_into_tensor``), ``reduce_scatter``
(``reduce_scatter_tensor``), ``all_to_all`` (``all_to_all_single``) with ``splits`` uniform,
``rotated`` (rank r sends share W[(j - r) mod n] to group rank j: every rank sends and receives
the same total, pairs carry unequal bytes) and ``hot`` (every rank sends share H[j] to group rank
j: group rank 0 receives most), and ``sendrecv`` (group rank 0 sends to group rank 1). Groups:
all ``world`` GPUs, and disjoint groups of ``g`` GPUs running the same op at the same time
({0,1},{2,3}... for g = 2), or with ``--solo`` the first such group alone. Sizes: ``bytes`` is the whole (unsharded) buffer as nccl-tests counts
it, per rank for all-to-all (each rank's send buffer), per pair for sendrecv; bf16.

Timing (``timing`` field):

- ``events``: a CUDA event between back-to-back launches (no barrier or host sync between
  iterations, as nccl-tests); a rank's value is the median of its per-iteration times;
- ``loop`` (since 2026-11-28): barrier, then 50 calls (10 above 64 MiB) back to back between
  one pair of CUDA events, the interval over the calls; a rank's value is the median of 5
  such loops (3 above 64 MiB), as nccl-tests and PyTorch benchmark loops time collectives;
- ``host_sync``: each call bracketed by ``dist.barrier()`` + ``torch.cuda.synchronize()`` and a
  host clock; includes PyTorch's launch overhead and the synchronisation.

``time_s`` is the slowest rank's median, ``best_s`` the slowest rank's minimum, ``mean_s`` its
mean; ``algbw_GBps`` = bytes / time_s, ``busbw_GBps`` = algbw x the nccl-tests factor
(2(n-1)/n all-reduce; (n-1)/n all-gather, reduce-scatter, all-to-all; 1 sendrecv).
``--quick`` runs on the CPU with gloo and tiny sizes (a dry run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

ROTATED_W = {2: [3, 1], 3: [3, 2, 1], 4: [4, 3, 2, 1], 8: [8, 7, 6, 5, 4, 3, 2, 1]}
HOT_H = {2: [7, 3], 3: [6, 2, 2], 4: [55, 15, 15, 15], 8: [44, 8, 8, 8, 8, 8, 8, 8]}
BUS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
       "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
       "sendrecv": lambda n: 1.0}


def splits_for(kind: str, n: int, r: int, elems: int) -> tuple[list[int], list[int]]:
    """(input_split_sizes, output_split_sizes) in elements for group rank r of n."""
    if kind == "uniform":
        w = [[1] * n for _ in range(n)]
    elif kind == "rotated":
        w = [[ROTATED_W[n][(j - s) % n] for j in range(n)] for s in range(n)]
    else:
        w = [list(HOT_H[n]) for _ in range(n)]

    def cut(s):  # elements rank s sends to each j: proportional to w[s], summing to elems
        tot = sum(w[s])
        sizes = [elems * x // tot for x in w[s]]
        sizes[0] += elems - sum(sizes)
        return sizes

    table = [cut(s) for s in range(n)]
    return table[r], [table[s][r] for s in range(n)]


class Bench:
    def __init__(self, args):
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.quick = args.quick or not torch.cuda.is_available()
        if self.quick:
            self.dev = torch.device("cpu")
            dist.init_process_group("gloo")
        else:
            local = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local)
            self.dev = torch.device("cuda", local)
            dist.init_process_group("nccl", device_id=self.dev)
        self.args = args
        self.groups = {}
        sizes = {int(x) for x in args.groups.split(",")} | ({self.world} if args.world else set())
        for g in sorted(sizes, reverse=True):
            if g > self.world or self.world % g:
                continue
            mine = None
            for i in range(0, self.world, g):
                pg = dist.new_group(list(range(i, i + g))) if g < self.world else dist.group.WORLD
                if self.rank in range(i, i + g):
                    mine = pg
            self.groups[g] = mine

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def active(self, g: int) -> bool:
        """With --solo, only the first group of g GPUs runs (the others wait at barriers)."""
        return not (self.args.solo and g < self.world and self.rank >= g)

    def launcher(self, op: str, nbytes: int, g: int, split: str):
        """A closure launching one op on this rank's group, and a description."""
        pg, n, gr = self.groups[g], g, self.rank % g
        if not self.active(g):
            return (lambda: None), ({"splits": split} if op == "all_to_all" else {})
        el = max(nbytes // 2, n)
        el -= el % n
        dt = torch.bfloat16
        if op == "all_reduce":
            x = torch.randn(el, device=self.dev).to(dt)
            return lambda: dist.all_reduce(x, group=pg), {}
        if op == "all_gather":
            x = torch.randn(el // n, device=self.dev).to(dt)
            y = torch.empty(el, device=self.dev, dtype=dt)
            return lambda: dist.all_gather_into_tensor(y, x, group=pg), {}
        if op == "reduce_scatter":
            x = torch.randn(el, device=self.dev).to(dt)
            y = torch.empty(el // n, device=self.dev, dtype=dt)
            return lambda: dist.reduce_scatter_tensor(y, x, group=pg), {}
        if op == "all_to_all":
            ins, outs = splits_for(split, n, gr, el)
            x = torch.randn(el, device=self.dev).to(dt)
            y = torch.empty(sum(outs), device=self.dev, dtype=dt)
            if split == "uniform":
                return lambda: dist.all_to_all_single(y, x, group=pg), {"splits": split}
            return (lambda: dist.all_to_all_single(y, x, outs, ins, group=pg),
                    {"splits": split, "send_elems_rank0": splits_for(split, n, 0, el)[0]})
        if op == "sendrecv":
            x = torch.randn(el, device=self.dev).to(dt)
            peer = (self.rank // g) * g + (1 - gr) if gr < 2 else None
            if gr == 0:
                return lambda: dist.send(x, peer), {}
            if gr == 1:
                return lambda: dist.recv(x, peer), {}
            return (lambda: None), {}
        raise ValueError(op)

    def measure(self, op, nbytes, g, split, timing):
        fn, extra = self.launcher(op, nbytes, g, split)
        big = nbytes > 64 * 2**20
        warm, iters = (2, 3) if self.quick else ((5, 10) if big else (5, 30))
        if timing == "host_sync":
            iters = max(3, iters // 2)
        for _ in range(warm):
            fn()
        self.sync()
        dist.barrier()
        times = []
        calls = None
        if timing == "loop" and self.dev.type == "cuda":
            # nccl-tests' and most PyTorch benchmark loops' method: barrier, then `calls` calls
            # back to back between ONE pair of CUDA events; a repetition's value is the interval
            # over the calls, a rank's value the median of the repetitions
            calls = 10 if big else 50
            iters = 3 if big else 5
            for _ in range(iters):
                dist.barrier()
                self.sync()
                e0, e1 = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                e0.record()
                for _ in range(calls):
                    fn()
                e1.record()
                self.sync()
                times.append(e0.elapsed_time(e1) / 1e3 / calls)
        elif timing == "events" and self.dev.type == "cuda":
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
            ev[0].record()
            for i in range(iters):
                fn()
                ev[i + 1].record()
            self.sync()
            times = [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(iters)]
        else:
            for _ in range(iters):
                dist.barrier()
                self.sync()
                t0 = time.perf_counter()
                fn()
                self.sync()
                times.append(time.perf_counter() - t0)
        mine = torch.tensor([statistics.median(times), min(times), statistics.mean(times)],
                            dtype=torch.float64, device=self.dev)
        allr = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(allr, mine)
        if op == "sendrecv":  # only the pairs' members time something
            allr = [a for i, a in enumerate(allr) if i % g < 2]
        if self.args.solo and g < self.world:
            allr = allr[:g] if op != "sendrecv" else allr[:2]
        worst = max(allr, key=lambda a: float(a[0]))
        t = float(worst[0])
        rec = {"op": op, "group": g, "bytes": nbytes, "time_s": t, "best_s": float(worst[1]),
               "mean_s": float(worst[2]), "algbw_GBps": nbytes / t / 1e9,
               "busbw_GBps": nbytes / t / 1e9 * BUS[op](g), "dtype": "bf16", "timing": timing,
               "iters": iters, "warmup": warm,
               "concurrent_groups": 1 if self.args.solo else self.world // g,
               "per_rank_median_s": [float(a[0]) for a in allr],
               "nvls": os.environ.get("NCCL_NVLS_ENABLE")}
        if calls:
            rec["loop_calls"] = calls
        rec.update(extra)
        return rec


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--file", default="comm.jsonl")
    ap.add_argument("--ops", default="all_to_all,all_reduce,all_gather,reduce_scatter,sendrecv")
    ap.add_argument("--groups", default="2")
    ap.add_argument("--timing", default="events,host_sync")
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=2**30)
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-world", dest="world", action="store_false",
                    help="only the --groups sizes, not the whole world")
    ap.add_argument("--solo", action="store_true",
                    help="groups smaller than the world: only the first group runs")
    args = ap.parse_args()
    b = Bench(args)
    if args.quick:
        args.max_bytes = min(args.max_bytes, 2**20)
    sizes = []
    s = args.min_bytes
    while s <= args.max_bytes:
        sizes.append(s)
        s *= 4
    t0 = time.time()
    path = os.path.join(args.out, args.file)
    os.makedirs(args.out, exist_ok=True)
    stop = torch.zeros(1, device=b.dev)
    for op in args.ops.split(","):
        splits = ["uniform", "rotated", "hot"] if op == "all_to_all" else ["-"]
        for g in sorted(b.groups, reverse=True):
            if op == "sendrecv" and g != 2:
                continue
            for split in splits:
                for timing in args.timing.split(","):
                    for nbytes in sizes:
                        stop.fill_(1.0 if time.time() - t0 > args.budget_s else 0.0)
                        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
                        if stop.item():
                            if b.rank == 0:
                                print("budget used up", flush=True)
                            dist.destroy_process_group()
                            return 0
                        rec = b.measure(op, nbytes, g, split, timing)
                        if b.rank == 0:
                            with open(path, "a") as f:
                                f.write(json.dumps(rec) + "\n")
                        if b.rank == 0 and nbytes in (sizes[0], sizes[-1]):
                            print(f"{op} g{g} {split} {timing} {nbytes} B: "
                                  f"{rec['time_s'] * 1e6:.1f} us busbw "
                                  f"{rec['busbw_GBps']:.1f} GB/s", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
