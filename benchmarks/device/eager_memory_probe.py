"""Where the memory of an eager PyTorch training step goes, on a small model (a diagnostic).

Runs measure.py's Llama model (``build_model_classes``) wrapped as measure.py wraps it
(single GPU, DDP, FSDP1, FSDP2, tensor parallel) at a small shape, and writes, per case:

* ``saved``: every tensor autograd saves in one forward (``saved_tensors_hooks``), by module,
  deduplicated by storage (what a saved view keeps alive is its whole storage), with its dtype,
  shape and bytes; parameters are flagged (they cost nothing extra);
* ``layer_deltas``: ``torch.cuda.memory_allocated`` growth over each decoder layer's forward;
* ``peak``: the allocator's trace (``torch.cuda.memory._record_memory_history``) replayed over
  two optimizer steps of two micro-batches; at the peak of allocated bytes, the live blocks
  allocated during the steps, grouped by the innermost Python frame that allocated them.

It checks the simulator's tensor-by-tensor accounting (``simulator/model/memory.py``, eager
kernels) against what PyTorch actually keeps; it does not measure the held-out training steps
(other, larger shapes: ``measure.py``). Usage on the device::

    python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/device/eager_memory_probe.py \
        --case ddp --out $OUT
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure as M  # noqa: E402  (sets the NCCL environment before torch loads)

PROBE = M.ModelCfg(layers=4, hidden=2048, ffn=5632, heads=16, kv_heads=4, vocab=16000, seq=2048)


def build(case: str, torch, dist, device, world: int, rank: int):
    """The model (wrapped as measure.py does) and its unwrapped core."""
    cdtype = torch.bfloat16
    sdpa = M.make_sdpa(device, cdtype)
    Llama, DecoderLayer = M.build_model_classes()
    cfg = PROBE
    if case == "tp":
        with torch.device(device):
            model = Llama(cfg, sdpa, cdtype, tp=world, rank=rank, group=None)
        return model, model
    with torch.device(device):
        model = Llama(cfg, sdpa, cdtype)
    if case == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index], bucket_cap_mb=25), model
    if case == "fsdp":
        from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        w = FSDP(
            model,
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
            auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
            backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
            forward_prefetch=False,
            limit_all_gathers=True,
            use_orig_params=False,
            device_id=device,
        )
        return w, model
    if case == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for layer in model.layers:
            fully_shard(layer, mp_policy=mp, reshard_after_forward=True)
        fully_shard(model, mp_policy=mp, reshard_after_forward=True)
        return model, model
    return model, model


def saved_inventory(torch, model, core, tokens, labels, cdtype):
    """Storages autograd saves in one forward, attributed to the module that saved them first."""
    params = {
        (p.to_local() if hasattr(p, "to_local") else p).untyped_storage().data_ptr()
        for p in model.parameters()
    }
    seen: dict[int, dict] = {}
    cur = ["root"]

    def pack(t):
        st = t.untyped_storage()
        k = st.data_ptr()
        if k not in seen:
            seen[k] = {
                "module": cur[0],
                "bytes": st.nbytes(),
                "dtype": str(t.dtype).replace("torch.", ""),
                "shape": list(t.shape),
                "param": k in params,
                "grad_fn": t.grad_fn.name() if t.grad_fn is not None else "leaf",
            }
        return t

    hooks = []
    for name, sub in core.named_modules():

        def pre(m, a, name=name):
            cur[0] = name or "root"

        hooks.append(sub.register_forward_pre_hook(pre))
    deltas = []
    for layer in core.layers:
        box = {}

        def lpre(m, a, box=box):
            box["a"] = torch.cuda.memory_allocated()

        def lpost(m, a, o, box=box):
            deltas.append(torch.cuda.memory_allocated() - box["a"])

        hooks.append(layer.register_forward_pre_hook(lpre))
        hooks.append(layer.register_forward_hook(lpost))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cuda", dtype=cdtype):
            loss = model(tokens, labels)
    for h in hooks:
        h.remove()
    loss.backward()
    return list(seen.values()), deltas


def replay_peak(snapshot: dict, device: int, baseline: int) -> dict:
    """Replay the allocator trace: the peak of allocated bytes and the blocks live at it."""
    trace = snapshot["device_traces"][device]
    live: dict[int, tuple[int, str]] = {}
    cur = peak = baseline
    peak_live: dict[int, tuple[int, str]] = {}
    peak_i = -1
    for i, ev in enumerate(trace):
        a = ev["action"]
        if a == "alloc":
            live[ev["addr"]] = (ev["size"], _site(ev.get("frames") or []))
            cur += ev["size"]
            if cur > peak:
                peak, peak_i = cur, i
                peak_live = dict(live)
        elif a == "free_requested" and ev["addr"] in live:
            cur -= live.pop(ev["addr"])[0]
    groups: dict[str, list] = defaultdict(lambda: [0, 0])
    for size, site in peak_live.values():
        groups[site][0] += size
        groups[site][1] += 1
    top = sorted(groups.items(), key=lambda kv: -kv[1][0])
    return {
        "baseline_bytes": baseline,
        "peak_bytes": peak,
        "peak_event": peak_i,
        "peak_site": _site(trace[peak_i].get("frames") or []) if peak_i >= 0 else "",
        "live_at_peak": [{"site": s, "bytes": b, "blocks": n} for s, (b, n) in top[:40]],
    }


def _site(frames: list[dict]) -> str:
    """The innermost frame in the model code, else in torch's Python, else the innermost."""
    for f in frames:
        fn = f.get("filename", "")
        if fn.endswith(("measure.py", "eager_memory_probe.py")):
            return f"{os.path.basename(fn)}:{f['line']} {f['name']}"
    for f in frames:
        fn = f.get("filename", "")
        if "/torch/" in fn and fn.endswith(".py"):
            return f"{fn.split('/torch/')[-1]}:{f['line']} {f['name']}"
    if frames:
        f = frames[0]
        return f"{f.get('filename', '?')}:{f.get('line', 0)} {f.get('name', '?')}"
    return "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, choices=["single", "ddp", "fsdp", "fsdp2", "tp"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--microbatches", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", timeout=_dt.timedelta(seconds=120), device_id=device)
    torch.manual_seed(1234)
    model, core = build(args.case, torch, dist, device, world, rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=True)
    cfg = PROBE
    g = torch.Generator().manual_seed(99)
    shape = (args.microbatches, 1, cfg.seq)
    tokens = torch.randint(0, cfg.vocab, shape, generator=g).to(device)
    labels = torch.randint(0, cfg.vocab, shape, generator=g).to(device)
    use_no_sync = args.case == "ddp"

    saved, deltas = saved_inventory(torch, model, core, tokens[0], labels[0], torch.bfloat16)
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=500000, context="alloc", stacks="python")
    for _ in range(args.steps):
        for i in range(args.microbatches):
            ctx = (
                model.no_sync()
                if use_no_sync and i < args.microbatches - 1
                else contextlib.nullcontext()
            )
            with ctx:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(tokens[i], labels[i])
                (loss / args.microbatches).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    rec = {
        "case": args.case,
        "rank": rank,
        "world": world,
        "model": vars(cfg) if hasattr(cfg, "__dict__") else str(cfg),
        "params_local": sum(
            (p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters()
        ),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "saved": saved,
        "layer_deltas": deltas,
        "peak": replay_peak(snap, local, baseline),
    }
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"probe_{args.case}.json"), "w") as f:
            json.dump(rec, f, indent=1, default=str)
        print(args.case, "max_memory_allocated", rec["max_memory_allocated"], flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
