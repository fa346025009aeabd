"""Host and GPU time of Megatron-Core's DeepEP routing-map step, unfused and fused.

Megatron-Core's flex dispatcher with DeepEP turns each dispatch's received routes
([n, k] local expert indices, -1 where an expert lives elsewhere, and their fp32
probabilities) into the local experts' routing map with ``_DeepepManager._indices_to_multihot``
(PyTorch: boolean indexing twice and ``repeat_interleave`` of a tensor, each reading a count
on the host) unless ``--enable-experimental`` selects ``fused_indices_to_multihot`` (Triton).
This script calls Megatron-Core's own functions (the installed package) on one GPU per rank:

* ``idle``: the GPU idle before each call: host time of the call (perf_counter around it),
  and its wall time to the GPU's end;
* ``busy``: a chain of bf16 GEMMs (about ``busy_ms``) queued first: the host time then
  includes waiting for that queue at the first synchronisation;
* ``profile``: kernels launched and host synchronisations (cudaStreamSynchronize /
  cudaMemcpy* from device) in one call, by torch.profiler;
* ``op``: host time of one ``x.add_(1)`` (the box's plain per-kernel launch cost).

Shapes: the ModelZoo Qwen3 TP 4 / EP 8 row (1,024 tokens a rank, top 8 of 128 experts, 16
local): n = tokens with at least one local expert among the 8 ranks' 8,192, drawn at random.
Writes one JSON line per (rank, mode, function) to OUT/multihot-rank{r}.jsonl.
"""

from __future__ import annotations

import json
import os
import sys
import time
import types

import torch


def routes(n_src: int, E: int, k: int, local: int, dev, gen):
    picks = torch.rand(n_src, E, generator=gen).argsort(dim=1)[:, :k]  # uniform, distinct
    hit = (picks < local).any(dim=1)
    idx = torch.where(picks < local, picks, torch.full_like(picks, -1))[hit]
    probs = torch.rand(idx.shape, generator=gen)
    return idx.to(dev), probs.to(dev)


def main() -> None:
    out_dir = sys.argv[1]
    rank = int(os.environ.get("RANK", "0"))
    cuda = torch.cuda.is_available()
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(dev)
    from megatron.core.transformer.moe.token_dispatcher import _DeepepManager

    fused = None
    if cuda:
        try:
            from megatron.core.fusions.fused_indices_converter import fused_indices_to_multihot
            fused = fused_indices_to_multihot
        except Exception as e:  # noqa: BLE001 (Triton missing: report and go on)
            print(f"rank {rank}: no fused_indices_to_multihot: {e!r}", flush=True)
    local, E, k, tokens, ep = 16, 128, 8, 1024, 8
    gen = torch.Generator().manual_seed(1234 + rank)
    idx, probs = routes(tokens * ep, E, k, local, dev, gen)
    mgr = types.SimpleNamespace(num_local_experts=local)
    fns = {"unfused": lambda: _DeepepManager._indices_to_multihot(mgr, idx, probs)}
    if fused is not None:
        fns["fused"] = lambda: fused(idx, probs, local)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16 if cuda else torch.float32)
    busy_ms = 5.0

    def busy():  # about busy_ms of GEMMs queued on the stream
        for _ in range(int(busy_ms / 0.25) if cuda else 1):
            torch.mm(a, a)

    rows = []
    x = torch.zeros(1024, device=dev)
    for name, fn in fns.items():
        for _ in range(20):
            fn()
        sync()
        for mode in ("idle", "busy"):
            host, wall = [], []
            for _ in range(100 if cuda else 5):
                sync()
                if mode == "busy":
                    busy()
                t0 = time.perf_counter()
                fn()
                t1 = time.perf_counter()
                sync()
                t2 = time.perf_counter()
                host.append(t1 - t0)
                wall.append(t2 - t0)
            host.sort()
            wall.sort()
            rows.append(dict(rank=rank, fn=name, mode=mode, n=int(idx.shape[0]), k=k,
                             local=local, host_med_s=host[len(host) // 2],
                             host_p10_s=host[len(host) // 10], wall_med_s=wall[len(wall) // 2],
                             busy_ms=busy_ms if mode == "busy" else 0.0))
        acts = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        sync()
        with torch.profiler.profile(activities=acts) as prof:
            fn()
            sync()
        kernels = syncs = memcpy = 0
        names = []
        for ev in prof.events():
            dt = str(getattr(ev, "device_type", ""))
            if dt.endswith("CUDA") and "Memcpy" not in ev.name and "Memset" not in ev.name:
                kernels += 1
                names.append(ev.name[:60])
            elif dt.endswith("CUDA"):
                memcpy += 1
            if ev.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize"):
                syncs += 1
        rows.append(dict(rank=rank, fn=name, mode="profile", kernels=kernels, memcpy=memcpy,
                         stream_syncs=syncs - 1, kernel_names=names))  # less the sync() above
    ops = []
    for _ in range(20):
        x.add_(1)
    for _ in range(500 if cuda else 5):
        sync()
        t0 = time.perf_counter()
        x.add_(1)
        ops.append(time.perf_counter() - t0)
    ops.sort()
    rows.append(dict(rank=rank, fn="add_", mode="op", host_med_s=ops[len(ops) // 2]))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"multihot-rank{rank}.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"rank {rank}: " + "; ".join(
        f"{r['fn']}/{r['mode']}: " + (f"host {r['host_med_s'] * 1e6:.0f} us" if "host_med_s" in r
                                      else f"{r['kernels']} kernels, {r['stream_syncs']} syncs")
        for r in rows), flush=True)


if __name__ == "__main__":
    main()
