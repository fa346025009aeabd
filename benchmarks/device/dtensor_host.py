"""Host time of PyTorch DTensor tensor parallelism, per op, beside its plain-tensor equivalent
(issue 12, item 4: the host cost that ``torch.distributed.tensor.parallel`` adds to eager TP).

Run on one host with 2 GPUs (NCCL)::

    python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
        benchmarks/device/dtensor_host.py --out DIR

``--quick`` runs the same on the CPU with gloo (a dry run; the numbers mean nothing).

Method (as ``host_ops.py``). Each entry is a chain of ``K`` units of one kind on a tiny
activation ([1, 128, 256] per rank, fp32, under ``torch.autocast(bfloat16)`` over fp32
weights, as ``steps_alt.py`` trains), so the GPU does next to nothing and the host clock is
the cost. The forward of the chain and one ``backward()`` are timed on the host clock without
a synchronisation inside (kernel and NCCL launches are asynchronous), each run started with the
GPU drained and the ranks at a barrier; 5 warm-up and 25 timed runs, the median.
``fwd_s`` / ``bwd_s`` per unit are ``(t(K+1) - t(1)) / K`` of the forward and of the backward.
Every unit of a chain is its own module (gradients set to None between runs), as in a model.

Kinds, each a DTensor unit and its plain equivalent (local shards, the collectives of
``steps.py``'s Megatron-style TP), the difference being what DTensor adds:

- ``colwise``: ``nn.Linear(h, 2h)`` under ``ColwiseParallel()`` (input a local tensor, taken as
  Replicate; output local, ``use_local_output=True``); its backward all-reduces the input's
  gradient. Plain: identity/all-reduce (``_CopyToTP``) then ``nn.Linear(h, h)``.
- ``sp_colwise``: the front of ``steps_alt.py``'s SP half-block: ``nn.LayerNorm(h)`` under
  ``SequenceParallel()`` (local Shard(1) input, DTensor output), a module under
  ``PrepareModuleInput(Shard(1) -> Replicate)`` (the all-gather; backward the gradient's
  reduce-scatter) holding ``nn.Linear(h, 2h)`` under ``ColwiseParallel()``, then the rank's own
  sequence slice. Plain: ``nn.LayerNorm``, ``_GatherSeq``, ``nn.Linear(h, h)``, the slice.
- ``rowwise``: ``nn.Linear(2h, h)`` under ``RowwiseParallel()`` (output Replicate: all-reduce).
  Plain: ``nn.Linear(h, h)`` then all-reduce (``_ReduceFromTP``).
- ``rowwise_rs``: ``RowwiseParallel(output_layouts=Shard(1))`` (reduce-scatter; the sequence
  split back by a plain ``cat``). Plain: ``nn.Linear`` then ``_ScatterSeq``.
- ``sp_layernorm``: ``nn.LayerNorm(h)`` under ``SequenceParallel()`` on a DTensor Shard(1)
  chain (its output stays a DTensor). Plain: ``nn.LayerNorm`` on the local shard.
- ``redist_ag``: Shard(1) -> Replicate (all-gather; the gradient taken as Partial, so its
  backward reduce-scatters), then the own slice. Plain: ``_GatherSeq`` then the slice.
- ``redist_rs``: Partial -> Shard(1) (reduce-scatter; backward all-gather), then a ``cat``.
  Plain: ``_ScatterSeq`` then the ``cat``.
- ``redist_ar``: Partial -> Replicate (all-reduce). Plain: ``_ReduceFromTP``.
- ``dt_mul``: an elementwise multiply of a DTensor (Replicate). Plain: of a tensor. (In
  ``steps_alt.py``'s plan the attention and MLP interiors and the residual adds run on local
  tensors: ``ColwiseParallel``/``RowwiseParallel`` return local outputs.)
- ``loss_parallel``: ``steps_alt.ce`` (``.float().flatten(0, 1)``, ``F.cross_entropy``) of
  vocabulary-sharded DTensor logits (Shard(-1), 1 x 128 x 2 x 512) under ``loss_parallel()``;
  plain: of full local logits. One call per unit, the losses summed.

``block``: the whole tiny GPT-2 of ``steps_alt.py`` (hidden 256, 4 heads, vocab 1024, seq 256,
micro-batch 1) built by its own ``build_tp`` (with and without SP) and ``build_plain``
(``single``), at 2 and 6 layers: host time of forward+backward (no sync inside) and of the
optimizer step, each the median of 15 runs; per layer = the difference / 4. Checks the per-op
sum. Rank 0 writes ``dtensor_host.jsonl`` (every rank's rows) and prints ``DTHOST`` lines.
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
import torch.nn as nn

sys.path.insert(0, os.path.dirname(__file__))
import steps_alt  # noqa: E402
from steps import _CopyToTP, _GatherSeq, _ReduceFromTP, _ScatterSeq  # noqa: E402

WARM, RUNS = 5, 25
S, H = 128, 256


class Ctx:
    def __init__(self, quick: bool):
        self.rank, self.world, self.dev = steps_alt.setup(quick)
        self.cuda = self.dev.type == "cuda"
        from torch.distributed.device_mesh import init_device_mesh
        self.mesh = init_device_mesh(self.dev.type, (self.world,))
        self.group = dist.group.WORLD

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def amp(self):
        return torch.autocast(self.dev.type, dtype=torch.bfloat16)


def timed(ctx: Ctx, fn, reset=None, runs: int = RUNS) -> tuple[float, float]:
    """Median host seconds of (forward, backward) of ``fn()``, each run begun with the GPU
    drained and the ranks at a barrier; ``fn`` returns (t_forward_done, t_backward_done)."""
    fw, bw = [], []
    for i in range(WARM + runs):
        if reset is not None:
            reset()
        ctx.sync()
        dist.barrier()
        ctx.sync()
        t0 = time.perf_counter()
        t1, t2 = fn()
        if i >= WARM:
            fw.append(t1 - t0)
            bw.append(t2 - t1)
    ctx.sync()
    return statistics.median(fw), statistics.median(bw)


def run_chain(ctx: Ctx, units, x0, k: int):
    """Forward through units[:k] from a leaf copy of ``x0``, then backward of a sum."""
    x = x0.detach().requires_grad_()
    with ctx.amp():
        y = x
        for u in units[:k]:
            y = u(y)
    t1 = time.perf_counter()
    if hasattr(y, "to_local"):  # a DTensor chain ends in a local tensor
        y = y.to_local()
    y.float().sum().backward()
    return t1, time.perf_counter()


def kinds(ctx: Ctx, n: int):
    """{kind: (dtensor units, plain units, input maker)} with ``n`` units each."""
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )
    mesh, w, g, dev = ctx.mesh, ctx.world, ctx.group, ctx.dev
    local = lambda: torch.randn(1, S, H, device=dev)  # noqa: E731

    def lin(i, o, style=None):
        with dev:
            m = nn.Linear(i, o)
        return parallelize_module(m, mesh, style) if style is not None else m

    def ln(style=None):
        with dev:
            m = nn.LayerNorm(H)
        return parallelize_module(m, mesh, style) if style is not None else m

    def seq_cat(t):  # [1, S/w, H] -> [1, S, H] (a plain copy)
        return torch.cat([t] * w, dim=1)

    def own_slice(t):  # [1, wS, H] -> [1, S, H]
        return t.narrow(1, ctx.rank * S, S)

    out = {}
    out["colwise"] = ([lin(H, w * H, ColwiseParallel()) for _ in range(n)],
                      [(lambda m: lambda y: m(_CopyToTP.apply(y, g)))(lin(H, H)) for _ in range(n)],
                      local)

    def sp_front(ln_mod, holder):
        def f(y):  # SP LayerNorm -> PrepareModuleInput (Shard(1) -> Replicate) -> colwise
            return own_slice(holder(ln_mod(y)))
        return f

    def holder():
        with dev:
            m = nn.Sequential(nn.Linear(H, w * H))
        parallelize_module(m, mesh, {"0": ColwiseParallel()})
        return parallelize_module(m, mesh, PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)))

    out["sp_colwise"] = (
        [sp_front(ln(SequenceParallel()), holder()) for _ in range(n)],
        [(lambda a, b: lambda y: own_slice(b(_GatherSeq.apply(a(y), g, w))))(ln(), lin(H, H))
         for _ in range(n)], local)
    out["rowwise"] = ([lin(w * H, H, RowwiseParallel()) for _ in range(n)],
                      [(lambda m: lambda y: _ReduceFromTP.apply(m(y), g))(lin(H, H))
                       for _ in range(n)], local)
    out["rowwise_rs"] = (
        [(lambda m: lambda y: seq_cat(m(y)))(lin(w * H, H, RowwiseParallel(
            output_layouts=Shard(1)))) for _ in range(n)],
        [(lambda m: lambda y: seq_cat(_ScatterSeq.apply(m(y), g, w)))(lin(H, H))
         for _ in range(n)], local)
    out["sp_layernorm"] = ([ln(SequenceParallel()) for _ in range(n)], [ln() for _ in range(n)],
                           None)
    out["redist_ag"] = (
        [lambda y: own_slice(DTensor.from_local(y, mesh, [Shard(1)], run_check=False)
                             .redistribute(mesh, [Replicate()])
                             .to_local(grad_placements=[Partial()])) for _ in range(n)],
        [lambda y: own_slice(_GatherSeq.apply(y, g, w)) for _ in range(n)], local)
    out["redist_rs"] = (
        [lambda y: seq_cat(DTensor.from_local(y, mesh, [Partial()], run_check=False)
                           .redistribute(mesh, [Shard(1)]).to_local()) for _ in range(n)],
        [lambda y: seq_cat(_ScatterSeq.apply(y, g, w)) for _ in range(n)], local)
    out["redist_ar"] = (
        [lambda y: DTensor.from_local(y, mesh, [Partial()], run_check=False)
         .redistribute(mesh, [Replicate()]).to_local() for _ in range(n)],
        [lambda y: _ReduceFromTP.apply(y, g) for _ in range(n)], local)
    out["dt_mul"] = ([lambda y: y * 1.0001 for _ in range(n)],
                     [lambda y: y * 1.0001 for _ in range(n)], None)
    return out


def run_kind(ctx: Ctx, name: str, dt_units, plain_units, make, k: int) -> dict:
    from torch.distributed.tensor import DTensor, Replicate, Shard
    mods = [u for u in dt_units + plain_units if isinstance(u, nn.Module)]
    params = [p for m in mods for p in m.parameters()]

    def reset():
        for p in params:
            p.grad = None

    row = {"kind": name, "k": k}
    for side, units in (("dtensor", dt_units), ("plain", plain_units)):
        if make is not None:
            x0 = make()
        elif name == "sp_layernorm" and side == "dtensor":
            x0 = DTensor.from_local(torch.randn(1, S, H, device=ctx.dev), ctx.mesh, [Shard(1)],
                                    run_check=False)
        elif side == "dtensor":  # dt_mul: a DTensor Replicate chain
            x0 = DTensor.from_local(torch.randn(1, S, H, device=ctx.dev), ctx.mesh,
                                    [Replicate()], run_check=False)
        else:
            x0 = torch.randn(1, S, H, device=ctx.dev)
        f1, b1 = timed(ctx, lambda u=units, x=x0: run_chain(ctx, u, x, 1), reset)
        fk, bk = timed(ctx, lambda u=units, x=x0: run_chain(ctx, u, x, k + 1), reset)
        row[f"{side}_fwd_s"] = (fk - f1) / k
        row[f"{side}_bwd_s"] = (bk - b1) / k
    row["extra_fwd_s"] = row["dtensor_fwd_s"] - row["plain_fwd_s"]
    row["extra_bwd_s"] = row["dtensor_bwd_s"] - row["plain_bwd_s"]
    return row


def loss_row(ctx: Ctx, k: int) -> dict:
    """``loss_parallel``'s cross-entropy per call, beside the plain one."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel
    v = 512
    y = torch.randint(0, v * ctx.world, (1, S), device=ctx.dev)
    row = {"kind": "loss_parallel", "k": k, "vocab_per_rank": v}
    for side in ("dtensor", "plain"):
        width = v if side == "dtensor" else v * ctx.world
        leaf = torch.randn(1, S, width, device=ctx.dev, dtype=torch.bfloat16)

        def go(n, side=side, leaf=leaf):
            lg = leaf.detach().requires_grad_()
            cm = loss_parallel() if side == "dtensor" else _null()
            with cm:
                total = 0.0
                for _ in range(n):
                    x = DTensor.from_local(lg, ctx.mesh, [Shard(-1)], run_check=False) \
                        if side == "dtensor" else lg
                    total = total + steps_alt.ce(x, y)
                t1 = time.perf_counter()
                total.backward()
            return t1, time.perf_counter()

        f1, b1 = timed(ctx, lambda: go(1))
        fk, bk = timed(ctx, lambda: go(k + 1))
        row[f"{side}_fwd_s"], row[f"{side}_bwd_s"] = (fk - f1) / k, (bk - b1) / k
    row["extra_fwd_s"] = row["dtensor_fwd_s"] - row["plain_fwd_s"]
    row["extra_bwd_s"] = row["dtensor_bwd_s"] - row["plain_bwd_s"]
    return row


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def block_rows(ctx: Ctx, quick: bool) -> list[dict]:
    """The tiny GPT-2 of ``steps_alt.py`` under its own TP plans and single-GPU code."""
    rows = []
    for scheme, sp in (("single", False), ("tp", False), ("tp", True)):
        times = {}
        for layers in (2, 6):
            m = dict(layers=layers, hidden=H, heads=4, vocab=1024, seq=2 * S, ffn=4 * H)
            c = dict(model=m, scheme=scheme, sp=sp, mb=1, n_mb=1, ac=False, straggler=None,
                     world=ctx.world if scheme == "tp" else 1)
            if scheme == "tp":
                model, _, _ = steps_alt.build_tp(c, ctx.rank, ctx.world, ctx.dev)
            else:
                model, _, _ = steps_alt.build_plain(c, 0, 1, ctx.dev)
            from torch.distributed.tensor.parallel import loss_parallel
            x, y = steps_alt.make_data(c, 0, ctx.dev, 1)[0]
            dps = [p for p in model.parameters() if hasattr(p, "to_local")]
            pls = [p for p in model.parameters() if not hasattr(p, "to_local")]
            opt = steps_alt.adamw([{"params": dps}, {"params": pls}], ctx.dev)

            def fb(model=model, x=x, y=y, tp=scheme == "tp"):
                with loss_parallel() if tp else _null():
                    with ctx.amp():
                        loss = steps_alt.ce(model(x), y)
                    t1 = time.perf_counter()
                    loss.backward()
                return t1, time.perf_counter()

            def step_opt(opt=opt):
                opt.step()
                t1 = time.perf_counter()
                return t1, t1

            fwd, bwd = timed(ctx, fb, lambda o=opt: o.zero_grad(set_to_none=True), runs=15)
            ctx.sync()
            # the optimizer on the gradients of one more backward (kept between runs)
            fb()
            o_s, _ = timed(ctx, step_opt, runs=15)
            opt.zero_grad(set_to_none=True)
            times[layers] = (fwd, bwd, o_s)
            del model, opt
        d = [(times[6][i] - times[2][i]) / 4 for i in range(3)]
        rows.append({"kind": "block", "scheme": scheme, "sp": sp, "hidden": H, "seq": 2 * S,
                     "fwd_2l_s": times[2][0], "bwd_2l_s": times[2][1], "opt_2l_s": times[2][2],
                     "fwd_6l_s": times[6][0], "bwd_6l_s": times[6][1], "opt_6l_s": times[6][2],
                     "per_layer_fwd_s": d[0], "per_layer_bwd_s": d[1], "per_layer_opt_s": d[2]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("-k", type=int, default=24, help="units per chain")
    ap.add_argument("--quick", action="store_true", help="CPU and gloo, a dry run")
    ap.add_argument("--only", default="", help="comma-separated kinds (default: all)")
    a = ap.parse_args()
    global RUNS
    if a.quick:
        RUNS = 3
        a.k = min(a.k, 4)
    ctx = Ctx(a.quick)
    only = set(a.only.split(",")) if a.only else None
    rows = []
    for name, (dt, pl, make) in kinds(ctx, a.k + 1).items():
        if only and name not in only:
            continue
        rows.append(run_kind(ctx, name, dt, pl, make, a.k))
        _print(ctx, rows[-1])
    if not only or "loss_parallel" in only:
        rows.append(loss_row(ctx, a.k))
        _print(ctx, rows[-1])
    if not only or "block" in only:
        for r in block_rows(ctx, a.quick):
            rows.append(r)
            _print(ctx, r)
    env = {"kind": "env", "torch": torch.__version__, "world": ctx.world,
           "gpu": torch.cuda.get_device_name(ctx.dev) if ctx.cuda else "cpu",
           "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "shape_per_rank": [1, S, H], "warmup": WARM, "runs": RUNS}
    allrows = [None] * ctx.world
    dist.all_gather_object(allrows, rows)
    if ctx.rank == 0:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "dtensor_host.jsonl"), "w") as f:
            f.write(json.dumps({**env, "script": "dtensor_host.py"}) + "\n")
            for r, rr in enumerate(allrows):
                for row in rr:
                    f.write(json.dumps({"rank": r, **row}) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _print(ctx: Ctx, row: dict) -> None:
    if ctx.rank != 0:
        return
    if row["kind"] == "block":
        print(f"DTHOST block {row['scheme']} sp={row['sp']}: per layer fwd "
              f"{row['per_layer_fwd_s'] * 1e6:.0f} us, bwd {row['per_layer_bwd_s'] * 1e6:.0f} us,"
              f" opt {row['per_layer_opt_s'] * 1e6:.0f} us", flush=True)
        return
    print(f"DTHOST {row['kind']}: dtensor fwd {row['dtensor_fwd_s'] * 1e6:.1f} bwd "
          f"{row['dtensor_bwd_s'] * 1e6:.1f} us; plain fwd {row['plain_fwd_s'] * 1e6:.1f} bwd "
          f"{row['plain_bwd_s'] * 1e6:.1f} us; extra {row['extra_fwd_s'] * 1e6:.1f} + "
          f"{row['extra_bwd_s'] * 1e6:.1f} us", flush=True)


if __name__ == "__main__":
    sys.exit(main())
