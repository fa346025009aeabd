"""The spread of per-process host speed on one box: how much slower than the mean is the
slowest of ``n`` processes issuing the same host-bound eager kernel stream (issue 12: a
host-bound group step is paced by its slowest rank's host).

Run on one host with ``n`` GPUs (NCCL; ``--cpu``: gloo on the CPU, for a local check)::

    python3 -m torch.distributed.run --standalone --nproc_per_node=N \
        benchmarks/device/host_spread.py --out DIR --label NAME

Method. Every rank builds the same tiny eager model: ``--layers`` blocks of LayerNorm(256),
Linear(256, 1024), GELU(tanh), Linear(1024, 256) and a residual add on an [8, 64, 256]
input under bf16 autocast, a loss, ``backward()`` and a foreach AdamW step: about 25 kernels
a block, each a few microseconds of GPU work, so the GPU idles waiting for the host and a
step's time is its host's time to run the Python. A step starts after a
``torch.cuda.synchronize()`` and a barrier (as the training scripts time steps) and is timed
on the host clock: ``issue_s`` until the host has issued the step's last kernel, ``step_s``
until the GPU has finished it (a synchronize), ``cpu_s`` the main thread's CPU time
(``time.thread_time``: less than ``issue_s`` where the thread was descheduled).

Modes, ``--rounds`` times in turn, ``--steps`` steps each:

* ``solo``: no collective inside the step: each rank's own host rate.
* ``layer``: an all-reduce of the block's [8, 64, 256] output after every block in forward
  and of its gradient in backward (a tensor-parallel group meeting at every layer): NCCL
  launches are asynchronous, so each host runs at its own pace and a rank's GPU waits in
  the collective for the last rank to issue it; the step ends when the slowest host has
  issued everything.
* ``sync``: as ``layer`` and a ``.tolist()`` of a 4-element all-reduce every block (an MoE
  layer's token counts): the host waits at each for its GPU, so every rank waits for the
  slowest host every block.

``--pin``: each rank's process (and the threads it starts, NCCL's included) is bound to its
own slice of the CPUs it may use before NCCL starts (the default, which a user gets, is no
binding). Each rank writes ``host_spread-rank{r}.jsonl``: one row per (mode, round) with the
per-step lists, the CPU it ran on at the start and the end of each phase, its context
switches (``getrusage`` of the main thread) and the box's CPU count.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HIDDEN, FFN, BATCH, SEQ = 256, 1024, 8, 64


class _AllReduce(torch.autograd.Function):
    """All-reduce in forward, all-reduce of the gradient in backward (asynchronous on NCCL)."""

    @staticmethod
    def forward(ctx, x):
        y = x.clone()
        dist.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, FFN)
        self.fc2 = nn.Linear(FFN, HIDDEN)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x)), approximate="tanh"))


def cpu_now() -> int:
    """The CPU this thread runs on now (field 39 of /proc/self/stat; -1 if unknown)."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return -1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--steps", type=int, default=100, help="timed steps per phase")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--modes", default="solo,layer,sync")
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU (a local check)")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    ncpu = os.cpu_count() or 1
    allowed = sorted(os.sched_getaffinity(0))
    if a.pin:  # this rank's slice of the CPUs the process may use (round robin if too few)
        per = max(1, len(allowed) // world)
        os.sched_setaffinity(0, {allowed[(local * per + i) % len(allowed)] for i in range(per)})
    if a.cpu:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    torch.manual_seed(0)
    blocks = nn.ModuleList(Block() for _ in range(a.layers)).to(dev)
    opt = torch.optim.AdamW(blocks.parameters(), lr=1e-4, foreach=True)
    x0 = torch.randn(BATCH, SEQ, HIDDEN, device=dev)
    counts = torch.ones(4, device=dev)
    amp = dev.type if cuda else "cpu"

    def step(mode: str) -> None:
        with torch.autocast(amp, dtype=torch.bfloat16):
            y = x0
            for b in blocks:
                y = b(y)
                if mode != "solo":
                    y = _AllReduce.apply(y)
                if mode == "sync":
                    c = counts.clone()
                    dist.all_reduce(c)
                    c.tolist()
            loss = y.float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    modes = a.modes.split(",")
    for m in modes:
        for _ in range(a.warmup):
            step(m)
    sync()
    rows = []
    for rnd in range(a.rounds):
        for m in modes:
            issue, total, cpu_s = [], [], []
            ru0 = resource.getrusage(resource.RUSAGE_THREAD)
            cpu0 = cpu_now()
            for _ in range(a.steps):
                sync()
                dist.barrier()
                sync()
                t0, c0 = time.perf_counter(), time.thread_time()
                step(m)
                t1, c1 = time.perf_counter(), time.thread_time()
                sync()
                t2 = time.perf_counter()
                issue.append(t1 - t0)
                total.append(t2 - t0)
                cpu_s.append(c1 - c0)
            ru1 = resource.getrusage(resource.RUSAGE_THREAD)
            rows.append({"label": a.label, "world": world, "rank": rank, "mode": m,
                         "round": rnd, "pin": a.pin, "layers": a.layers, "ncpu": ncpu,
                         "ncpu_allowed": len(allowed),
                         "affinity": len(os.sched_getaffinity(0)),
                         "omp_threads": os.environ.get("OMP_NUM_THREADS", ""),
                         "cpu_start": cpu0, "cpu_end": cpu_now(),
                         "nvcsw": ru1.ru_nvcsw - ru0.ru_nvcsw,
                         "nivcsw": ru1.ru_nivcsw - ru0.ru_nivcsw,
                         "issue_s": issue, "step_s": total, "cpu_s": cpu_s})
            med = sorted(total)[len(total) // 2]
            print(f"SPREAD {a.label} n={world} rank {rank} {m} round {rnd}: "
                  f"median step {med * 1e3:.2f} ms", flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"host_spread-rank{rank}.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
