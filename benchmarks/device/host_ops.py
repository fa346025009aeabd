"""Host time of eager PyTorch calls, measured one kind at a time (issue 12: the host's cost of
eager code from micro-benchmarks rather than from whole steps).

Run on one host with 4 GPUs (NCCL)::

    python3 -m torch.distributed.run --standalone --nproc_per_node=4 \
        benchmarks/device/host_ops.py --out DIR

Method. Each entry builds a chain of ``K`` calls of one kind on a tiny bf16 tensor
([1, 128, 256], under ``torch.autocast`` as the training scripts run) and times, on the host
clock, the forward of the chain and one ``backward()``; no ``torch.cuda.synchronize()`` inside
the timed region (kernel and NCCL launches are asynchronous, the launch queue is far from
full), so the time is the host's, not the GPU's. Each timed run is preceded by a synchronize
and a barrier; 5 warm-up and 25 timed runs; the median. ``per_call_s`` is
``(t(K) - t(0)) / K``: the host time one more call of that kind adds, forward and backward.
The collective wrappers are those of ``steps.py`` (the measured training steps), so their
copies (``contiguous``, ``movedim``) are included, as they are in those steps.

Kinds not in a chain (no autograd): ``dist_all_reduce`` (a bare call), ``count_sync`` (an
all-to-all of 4 int64 counts then ``.tolist()``: what an MoE layer pays to learn its token
counts, the GPU idle before it), ``p2p`` (``batch_isend_irecv`` of one send and one receive,
ranks paired 0-1, 2-3). Rank 0 writes ``host_ops.jsonl``; every rank's medians are in it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from steps import _AllToAll, _CopyToTP, _GatherSeq, _ReduceFromTP, _ScatterSeq  # noqa: E402

WARM, RUNS = 5, 25


def timed(fn) -> float:
    """Median host seconds of ``fn()`` over RUNS runs, each started with the GPU drained."""
    for _ in range(WARM):
        fn()
    out = []
    for _ in range(RUNS):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(out)


def chain_kinds(group, world: int, dev):
    """{kind: one call on y}: what a chain repeats."""
    w = torch.randn(256, 256, device=dev, requires_grad=True)
    splits = [128 // world] * world
    return {
        "identity": lambda y: y,
        "mul": lambda y: y * 1.0001,
        "linear": lambda y: F.linear(y, w),
        "copy_to_tp": lambda y: _CopyToTP.apply(y, group),
        "reduce_from_tp": lambda y: _ReduceFromTP.apply(y, group),
        "gather_scatter_seq": lambda y: _ScatterSeq.apply(_GatherSeq.apply(y, group, world),
                                                          group, world),
        "all_to_all_pair": lambda y: _AllToAll.apply(
            _AllToAll.apply(y.view(128, 256), splits, splits, group), splits, splits,
            group).view(1, 128, 256),
    }


def run_chain(call, x0, k: int) -> None:
    x = x0.detach().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = x
        for _ in range(k):
            y = call(y)
    y.float().sum().backward()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("-k", type=int, default=32, help="calls per chain")
    a = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    group = dist.new_group(list(range(world)))
    x0 = torch.randn(1, 128, 256, device=dev, dtype=torch.bfloat16)
    rows = []
    base = timed(lambda: run_chain(lambda y: y * 1.0, x0, 1))
    for kind, call in chain_kinds(group, world, dev).items():
        t0 = timed(lambda c=call: run_chain(c, x0, 1))
        tk = timed(lambda c=call: run_chain(c, x0, a.k + 1))
        rows.append({"kind": kind, "k": a.k, "chain_1_s": t0, "chain_k1_s": tk,
                     "per_call_s": (tk - t0) / a.k, "base_s": base})
    t = torch.zeros(256, device=dev, dtype=torch.bfloat16)

    def bare(n=a.k):
        for _ in range(n):
            dist.all_reduce(t, group=group)

    rows.append({"kind": "dist_all_reduce", "k": a.k, "per_call_s": timed(bare) / a.k})
    counts = torch.arange(world, device=dev, dtype=torch.int64)
    got = torch.empty_like(counts)

    def sync():
        dist.all_to_all_single(got, counts, group=group)
        got.tolist()

    rows.append({"kind": "count_sync", "k": 1, "per_call_s": timed(sync)})
    peer = rank ^ 1
    buf = torch.zeros(128 * 256, device=dev, dtype=torch.bfloat16)
    rbuf = torch.empty_like(buf)

    def p2p(n=a.k):
        for _ in range(n):
            ops = [dist.P2POp(dist.isend, buf, peer), dist.P2POp(dist.irecv, rbuf, peer)]
            for r in dist.batch_isend_irecv(ops):
                r.wait()

    rows.append({"kind": "p2p", "k": a.k, "per_call_s": timed(p2p) / a.k})
    allrows = [None] * world
    dist.all_gather_object(allrows, rows)
    if rank == 0:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "host_ops.jsonl"), "w") as f:
            for r, rr in enumerate(allrows):
                for row in rr:
                    f.write(json.dumps({"rank": r, **row}) + "\n")
        for row in rows:
            print("HOSTOP", row["kind"], f"{row['per_call_s'] * 1e6:.1f} us", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
