"""Host synchronisations that cut a host-bound eager stream into segments (issue 12, eager MoE).

An eager MoE layer reads its token counts on the host (``.tolist()``) before the dispatch's
``all_to_all_single``: the host waits for its GPU, which waits in the count exchange for the
slowest rank, so every MoE layer is a cross-rank barrier of the hosts. This synthetic loop
(not a training step) asks what such a barrier costs a host-bound stream, and whether the
step then pays, per segment between barriers, the slowest rank's time (a sum of maxima)
rather than the slowest rank over the whole step.

Method. Every rank issues the same host-bound stream: ``--ops`` tiny kernels a step (a cycle
of ``tanh``, ``* c``, ``+ b`` and a [64, 256] x [256, 256] bf16 GEMM, a few microseconds of
GPU work each, under ``torch.no_grad``), cut into ``k`` segments of ``L = ops / k`` kernels.
Each segment ends with an exchange of a rank's uneven split sizes (an ``all_to_all_single`` of
a ``world``-element int64 tensor, the sizes from a fixed table, different per rank and
segment) and an uneven ``all_to_all_single`` of ``[rows, 64]`` bf16 rows. Modes:

* ``solo``: the kernels only (each rank's own pace; no collective);
* ``async``: the two collectives, the split sizes known on the host (no host read);
* ``sync``: as ``async``, but the sizes are read on the host from the exchanged tensor
  (``torch.cat([sent, got]).tolist()``, as ``steps_alt.py`` does) before the row exchange.

Steps start after ``synchronize``, a barrier and ``synchronize``. Per step and rank: the host
clock (``perf_counter``) at each segment's start, after its last kernel and count exchange are
issued (``issue``), and after the read returns (``ret``; = ``issue`` without a read); CUDA
events recorded on the stream at each segment's start and after its count exchange
(``counts``), timed from an event recorded at the step's start (the host's ``t0``; the GPU is
idle then, so the two clocks agree to a launch latency). ``--segments`` lists the k to run,
``--rounds`` repeats all (mode, k) in turn.

Output ``OUT/sync_segments-w{world}-{label}-r{rank}.jsonl``: one row per (round, mode, k)
with per step ``wall_s`` (host, until synchronized), ``cpu_s`` (main thread CPU time) and the
per-segment lists ``h_start, h_issue, h_ret, g_start, g_counts`` (seconds from the step's
start). ``--cpu``: gloo on the CPU (a local check of the script).

Usage: ``torchrun --standalone --nproc_per_node=4 benchmarks/device/sync_segments.py --out DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="a")
    ap.add_argument("--ops", type=int, default=2048)
    ap.add_argument("--segments", default="4,16,64,256")
    ap.add_argument("--modes", default="solo,async,sync")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", type=int, default=256, help="mean rows a rank sends a peer")
    ap.add_argument("--cpu", action="store_true")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if a.cpu:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
    cuda = dev.type == "cuda"
    dt = torch.bfloat16 if cuda else torch.float32

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def event():
        if not cuda:
            return None
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    # uneven split sizes: table[s][src][dst], the same on every rank (so both sides agree)
    g = torch.Generator().manual_seed(1)
    tab_n = 64
    table = (torch.rand(tab_n, world, world, generator=g) * 1.5 + 0.25) * a.rows
    table = table.long().tolist()
    sent_dev = [torch.tensor(table[s][rank], dtype=torch.int64, device=dev) for s in range(tab_n)]
    torch.manual_seed(0)
    y0 = torch.randn(64, 256, device=dev, dtype=dt)
    w = torch.randn(256, 256, device=dev, dtype=dt) / 16
    b = torch.randn(256, device=dev, dtype=dt) / 16
    maxrows = int(max(sum(table[s][r]) for s in range(tab_n) for r in range(world))) + 1
    xbuf = torch.randn(maxrows, 64, device=dev, dtype=dt)
    maxin = int(max(sum(table[s][src][d] for src in range(world))
                    for s in range(tab_n) for d in range(world))) + 1
    obuf = torch.empty(maxin, 64, device=dev, dtype=dt)

    def chain(y, n: int):
        for i in range(n):
            j = i & 3
            if j == 0:
                y = torch.tanh(y)
            elif j == 1:
                y = y * 1.0001
            elif j == 2:
                y = y + b
            else:
                y = y @ w
        return y

    def step(mode: str, k: int):
        L = max(1, a.ops // k)
        y = y0
        hs, hi, hr, gs, gc = [], [], [], [], []
        t0 = time.perf_counter()
        e0 = event()
        evs = []
        for s in range(k):
            hs.append(time.perf_counter() - t0)
            es = event()
            y = chain(y, L)
            ec = None
            if mode != "solo":
                row = table[s % tab_n]
                sent = sent_dev[s % tab_n].clone()
                got = torch.empty_like(sent)
                dist.all_to_all_single(got, sent)
                ec = event()
                hi.append(time.perf_counter() - t0)
                if mode == "sync":
                    host = torch.cat([sent, got]).tolist()
                    in_s, out_s = host[:world], host[world:]
                else:
                    in_s = row[rank]
                    out_s = [row[src][rank] for src in range(world)]
                hr.append(time.perf_counter() - t0)
                dist.all_to_all_single(obuf[: sum(out_s)], xbuf[: sum(in_s)], out_s, in_s)
            else:
                hi.append(time.perf_counter() - t0)
                hr.append(hi[-1])
            evs.append((es, ec))
        t1 = time.perf_counter()
        c1 = time.thread_time()
        sync()
        t2 = time.perf_counter()
        if cuda:
            for es, ec in evs:
                gs.append(e0.elapsed_time(es) / 1e3)
                gc.append(e0.elapsed_time(ec) / 1e3 if ec is not None else None)
        return {"wall_s": t2 - t0, "issue_s": t1 - t0, "c1": c1, "h_start": hs, "h_issue": hi,
                "h_ret": hr, "g_start": gs, "g_counts": gc}

    ks = [int(x) for x in a.segments.split(",")]
    modes = a.modes.split(",")
    with torch.no_grad():
        for m in modes:
            for k in ks:
                for _ in range(a.warmup):
                    step(m, k)
        sync()
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, f"sync_segments-w{world}-{a.label}-r{rank}.jsonl")
        with open(path, "w") as f:
            for rnd in range(a.rounds):
                for k in ks:
                    for m in modes:
                        steps = []
                        for _ in range(a.steps):
                            sync()
                            dist.barrier()
                            sync()
                            c0 = time.thread_time()
                            r = step(m, k)
                            r["cpu_s"] = r.pop("c1") - c0
                            steps.append(r)
                        f.write(json.dumps({"label": a.label, "world": world, "rank": rank,
                                            "round": rnd, "mode": m, "k": k, "ops": a.ops,
                                            "steps": steps}) + "\n")
                        f.flush()
                if rank == 0:
                    print(f"w{world} {a.label} round {rnd} done", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
