"""Host time of Megatron-Core's MoE layer (issue 10: the fused path's host model).

The simulator's fused (Megatron-Core) programs had no measured host time (``host_fused_op_s``
and ``host_fused_collective_s`` were 0 in gpus.yaml, so only the MoE count synchronisation,
``host_sync_s``, cost the GPU anything). This script measures what Megatron-Core's Python
costs its host per MoE layer, which replaced that assumption. Run on one host with 2 GPUs::

    python3 -m torch.distributed.run --standalone --nproc_per_node=2 \\
        benchmarks/device/megatron_moe_host.py --out DIR

It needs ``megatron-core`` (pure Python, about 2.4 MB; the lent machines do not have it, so
``call_megatron_moe_host.sh`` installs it from a carried wheel). Transformer Engine is not on
the lent machines and its wheels are larger than what a call may carry, so the layer is
Megatron-Core's own (``get_gpt_layer_local_spec``): its router, token dispatcher (with the
device-to-host copy of the split sizes and the synchronisation before the all-to-all),
``SequentialMLP`` experts (one expert MLP after another: the host cost per local expert that
Transformer Engine's grouped GEMM also pays, one cuBLAS call per expert), and Megatron-Core's
own linear layers and attention. Transformer Engine's modules add their own Python per call,
so this is a lower bound for a TE run.

Method (as ``host_ops.py``): the layer runs at a width where its GPU work is negligible
(hidden 256, 512 tokens a rank), so a forward (autograd recording) and its backward, each
started with the GPU drained and timed on the host clock up to a ``torch.cuda.synchronize()``,
take their host's time. 5 warm-up and 25 timed runs, the median, every rank. Then one more
forward and backward under ``torch.profiler`` counts the kernels and copies launched and the
host synchronisations (``cudaStreamSynchronize`` / ``cudaEventSynchronize`` /
``cudaDeviceSynchronize`` calls). Configurations: the MoE block alone (``MoELayer``) and a
whole transformer layer, a dense layer for comparison, with 8, 32 and 128 experts (EP = the
world size: 4, 16, 64 local experts), top-2 and top-8, dispatchers ``alltoall`` and
``allgather``; and the same MoE block at a real width (hidden 4096, 4096 tokens, 32 experts
of 1536, top 8) where the GPU time shows.

Rank 0 writes ``megatron_moe_host.jsonl``, one row per configuration and rank: ``fwd_s``,
``bwd_s`` (host seconds), ``fwd_kernels``, ``bwd_kernels`` (kernels and memcpy/memset
launched), ``fwd_syncs``, ``bwd_syncs``. How it is used: ``simulator/calibrate/host.py``
``fit_fused`` takes the host time per kernel launched (59-63 us over the whole-layer rows),
``host_fused_op_s`` and ``host_fused_collective_s`` in gpus.yaml, charged per part of the
simulator's fused program (its docstring says why per kernel launched, not per part of this
unfused layer). ``fwd_syncs`` reads 2 per MoE layer forward here (the simulator charges one
count synchronisation; the second's host time is inside the per-kernel rate).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F

WARM, RUNS = 5, 25
SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")


def setup(world: int) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    ps.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=world)
    model_parallel_cuda_manual_seed(1234)


def build(kind: str, hidden: int, experts: int, topk: int, dispatcher: str, moe_ffn: int):
    """A Megatron-Core layer: ``moe`` (the MoE block), ``layer`` (attention + MoE block) or
    ``dense`` (attention + dense MLP), bf16 on this GPU."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    moe = kind != "dense"
    cfg = dict(
        num_layers=1, hidden_size=hidden, num_attention_heads=max(1, hidden // 128),
        ffn_hidden_size=4 * hidden, add_bias_linear=False, gated_linear_unit=True,
        activation_func=F.silu, normalization="RMSNorm", bf16=True, params_dtype=torch.bfloat16,
        hidden_dropout=0.0, attention_dropout=0.0,
    )  # fmt: skip
    if moe:
        cfg.update(
            num_moe_experts=experts, moe_router_topk=topk, moe_ffn_hidden_size=moe_ffn,
            moe_token_dispatcher_type=dispatcher, moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-3, moe_grouped_gemm=False, moe_router_dtype="fp32",
            moe_permute_fusion=False,
        )  # fmt: skip
    config = TransformerConfig(**cfg)
    spec = get_gpt_layer_local_spec(num_experts=experts if moe else None,
                                    moe_grouped_gemm=False, normalization="RMSNorm")  # fmt: skip
    layer = build_module(spec, config=config, layer_number=1).cuda()
    if kind == "moe":
        return layer.mlp, lambda m, x: m(x)[0]
    return layer, lambda m, x: m(x, attention_mask=None)[0]


def host_seconds(fn, before=None) -> float:
    """Median host seconds of ``fn()``, started with the GPU drained, ended by a synchronize
    (``before()``, untimed, runs ahead of each call: a backward's forward)."""
    out = []
    for i in range(WARM + RUNS):
        if before is not None:
            before()
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i >= WARM:
            out.append(time.perf_counter() - t0)
    return statistics.median(out)


def counts(fn) -> tuple[int, int]:
    """(kernels and copies launched, host synchronisations) while ``fn()`` runs."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = syncs = 0
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            kernels += 1
        elif ev.name in SYNC_CALLS:
            syncs += 1
    return kernels, max(0, syncs - 1)  # less the closing synchronize


def measure(kind, hidden, tokens, experts, topk, dispatcher, moe_ffn) -> dict:
    module, call = build(kind, hidden, experts, topk, dispatcher, moe_ffn)
    x = torch.randn(tokens, 1, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    state = {}

    def fwd():
        state["y"] = call(module, x)

    def bwd():
        state["y"].backward(torch.ones_like(state["y"]))

    def both():
        fwd()
        bwd()

    both()
    fwd_s = host_seconds(fwd)
    bwd_s = host_seconds(bwd, before=fwd)
    fk, fsync = counts(fwd)
    bk, bsync = counts(bwd)
    ws = dist.get_world_size()
    return dict(layer=kind, hidden=hidden, tokens=tokens, experts=experts if kind != "dense" else 0,
                local_experts=experts // ws if kind != "dense" else 0, topk=topk,
                dispatcher=dispatcher, ep=ws, fwd_s=fwd_s, bwd_s=bwd_s,
                fwd_kernels=fk, bwd_kernels=bk, fwd_syncs=fsync, bwd_syncs=bsync)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    setup(world)
    configs = [("dense", 256, 512, 8, 2, "alltoall", 512)]
    for kind in ("moe", "layer"):
        for experts, topk in ((8, 2), (32, 8), (128, 8)):
            configs.append((kind, 256, 512, experts, topk, "alltoall", 512))
    configs += [("moe", 256, 512, 32, 8, "allgather", 512),
                ("moe", 4096, 4096, 32, 8, "alltoall", 1536)]  # fmt: skip
    rows = []
    for cfg in configs:
        try:
            row = measure(*cfg)
        except Exception as e:  # a configuration this megatron-core cannot build: say so, go on
            row = dict(config=list(cfg), error=f"{type(e).__name__}: {e}")
            if rank == 0:
                traceback.print_exc()
        row["rank"] = rank
        gathered = [None] * world
        dist.all_gather_object(gathered, row)
        rows += gathered
        if rank == 0:
            print("MCOREHOST", json.dumps(gathered[0]), flush=True)
        torch.cuda.empty_cache()
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "megatron_moe_host.jsonl"), "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
