"""FSDP's fixed cost per unit (hooks, gathers and reduce-scatters launched per unit, stream
waits) and how much of its communication prefetch hides. Writes JSON lines.

    python3 -m torch.distributed.run --standalone --nproc_per_node=4 \
        benchmarks/device/fsdp_units.py --out DIR [--quick]

Why: FSDP steps of validation/measured come out 9-11 % fast while DDP steps of the same model
are within 3-4 %, and the simulator models FSDP's collectives and gradient casts but no
per-unit fixed cost. This separates the two without any training step: the same total
parameters (``--params``, bf16, fp32 reduce) split into ``units`` in {2, 4, 8, 16, 32, 64}
fully_shard units (FSDP2) of equal Linear blocks, at two batch sizes: ``tokens`` 512 (the
step is the fixed cost: launch-bound) and 16384 (compute-bound: what prefetch hides). Each
line: ``units, tokens, hidden, step_s`` (median of 10 steps after 3, CUDA events around
forward+backward), ``alone_compute_s`` (the same blocks unsharded on one GPU, no
communication), ``ag_s, rs_s`` (one unit's all-gather / reduce-scatter alone). The per-unit
cost is the slope of ``step_s - alone_compute_s - units * (ag_s + rs_s)`` against ``units``
at 512 tokens.

``--tensors K`` (K > 1) instead runs 16 and 64 units at 512 tokens twice, as above and with
every layer given K - 1 more parameter tensors, vectors of ``hidden`` elements applied as
``x * w`` (one elementwise kernel each, in the unsharded reference too): the parameter count
barely moves while the tensors per unit grow K-fold, so the excess's change between the two
is FSDP2's host cost per parameter tensor, which the default rows (64 tensors in every row)
cannot separate from a constant (``simulator/calibrate/host.py``). Rows carry ``tensors``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist
from torch import nn


def step_time(model, x, iters: int = 10, warm: int = 3) -> float:
    ts = []
    for i in range(warm + iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        model(x).float().pow(2).mean().backward()
        b.record()
        torch.cuda.synchronize()
        if i >= warm:
            ts.append(a.elapsed_time(b) / 1e3)
        model.zero_grad(set_to_none=True)
    return statistics.median(ts)


class Scaled(nn.Module):
    """A Linear layer and ``extra`` vectors that scale its output, one tensor each."""

    def __init__(self, hidden: int, extra: int):
        super().__init__()
        self.lin = nn.Linear(hidden, hidden, bias=False)
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(hidden)) for _ in range(extra)])

    def forward(self, x):
        x = self.lin(x)
        for w in self.scales:
            x = x * w
        return x


def blocks(hidden: int, per_unit: int, units: int, tensors: int = 1) -> nn.Sequential:
    def layer() -> nn.Module:
        if tensors == 1:
            return nn.Linear(hidden, hidden, bias=False)
        return Scaled(hidden, tensors - 1)

    return nn.Sequential(*[nn.Sequential(*[layer() for _ in range(per_unit)])
                           for _ in range(units)])


def main() -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tensors", type=int, default=1, help="parameter tensors per layer")
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    hidden = 1024 if args.quick else 4096
    total_layers = 8 if args.quick else 64  # 64 x 4096^2 = 1.07e9 parameters
    out = open(os.path.join(args.out, "fsdp_units.jsonl"), "a")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if args.tensors > 1:
        runs = [(k, u, 512) for u in (16, 64) for k in (1, args.tensors)]
    else:
        runs = [(1, u, t) for u in ((2, 4, 8) if args.quick else (2, 4, 8, 16, 32, 64))
                for t in (512, 16384)]
    for k, units, tokens in runs:
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        ref = blocks(hidden, total_layers // units, units, k).cuda().to(torch.bfloat16)
        alone = step_time(ref, x)
        del ref
        m = blocks(hidden, total_layers // units, units, k).cuda()
        for u in m:
            fully_shard(u, mp_policy=mp)
        fully_shard(m, mp_policy=mp)
        t = step_time(m, x)
        # a unit's parameters: a sharded DTensor's numel() is already the global count (the
        # rows of data/measured/fsdp-units-h100x2 multiplied it by the world size, so their
        # ag_s and rs_s time collectives of twice FSDP's size)
        n = sum(p.numel() for p in m[0].parameters())
        flat = torch.empty(n // dist.get_world_size(), device="cuda", dtype=torch.bfloat16)
        full = torch.empty(n, device="cuda", dtype=torch.bfloat16)
        g32 = torch.empty(n, device="cuda", dtype=torch.float32)
        s32 = torch.empty(n // dist.get_world_size(), device="cuda", dtype=torch.float32)
        ag = step_time_fn(lambda: dist.all_gather_into_tensor(full, flat))
        rs = step_time_fn(lambda: dist.reduce_scatter_tensor(s32, g32))
        vals = torch.tensor([t, alone, ag, rs], device="cuda")
        dist.all_reduce(vals, op=dist.ReduceOp.MAX)
        if rank == 0:
            t, alone, ag, rs = vals.tolist()
            out.write(json.dumps({"units": units, "tokens": tokens, "hidden": hidden,
                                  "layers": total_layers, "tensors": k, "step_s": t,
                                  "alone_compute_s": alone, "ag_s": ag, "rs_s": rs}) + "\n")
            out.flush()
        del m
        torch.cuda.empty_cache()
    dist.destroy_process_group()


def step_time_fn(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) / 1e3 for a, b in zip(ev, ev[1:], strict=False))


if __name__ == "__main__":
    main()
