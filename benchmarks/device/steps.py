"""Training steps of plain-PyTorch Llama-style and MoE models on one multi-GPU host.

Written for the pre-registered held-out set (issue 12) and the MoE measurements (issue 10),
independently of the simulator's op lists: the model code follows Meta's public Llama reference
layout (separate q/k/v and w1/w3/w2 projections, complex-number RoPE, ``repeat_kv`` before
``scaled_dot_product_attention``), and the parallel schemes are written out here (Megatron-style
tensor parallelism, pipeline schedules GPipe / 1F1B / interleaved 1F1B over NCCL send/recv,
PyTorch DDP, FSDP2 ``fully_shard``, expert parallelism with ``all_to_all_single``). The workload
YAMLs describe what this code does, not the other way round.

Usage (one host, from the repository root)::

    python3 benchmarks/device/steps.py --driver --out DIR [--only c1,c2] [--budget-s 400]
    python3 -m torch.distributed.run --standalone --nproc_per_node=N \
        benchmarks/device/steps.py --case NAME --out DIR          # one case (what the driver runs)

``--quick`` shrinks every model and runs on the CPU with gloo (a dry run; the numbers mean
nothing). Each case appends one JSON line to ``DIR/steps.jsonl``; the driver logs each case's
exit code and wall time to ``DIR/phases.jsonl`` and its output to ``DIR/log.txt``.

Step timing: ``torch.cuda.synchronize()`` and a barrier, host clock, every micro-batch's
forward and backward, the gradient reduction the scheme does, ``optimizer.step()``,
``zero_grad(set_to_none=True)``, ``torch.cuda.synchronize()``, host clock. The slowest rank's time
counts for each step; ``step_time_s`` is the median over the timed steps after warm-up.
``peak_memory_gib`` is ``torch.cuda.max_memory_allocated()`` over the timed steps, worst rank.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------- cases

SHAPES = {
    # 16 layers of a 1.3B-class MHA model, GPT-NeoX vocabulary, 2K sequences.
    "A": dict(layers=16, hidden=2048, ffn=5632, heads=16, kv_heads=16, vocab=50304, seq=2048),
    # 12 layers, hidden 3072, GQA 24/8, Llama-3 vocabulary, 8K sequences.
    "B": dict(layers=12, hidden=3072, ffn=8192, heads=24, kv_heads=8, vocab=128256, seq=8192),
    # Llama-2-7B's layer shape (MHA, ffn 11008), 16 layers, 4K sequences.
    "C": dict(layers=16, hidden=4096, ffn=11008, heads=32, kv_heads=32, vocab=32000, seq=4096),
    # Second held-out batch (heldout-freeze-2): 20 layers, hidden 2560, GQA 20/4, ffn 6912,
    # Qwen-2.5's 151,936-token vocabulary, 4K sequences.
    "D": dict(layers=20, hidden=2560, ffn=6912, heads=20, kv_heads=4, vocab=151936, seq=4096),
    # Second held-out MoE shape: 6 layers, hidden 2560, GQA 20/4, 8 experts (ffn 3072), top-2,
    # 2K sequences.
    "N": dict(layers=6, hidden=2560, ffn=3072, heads=20, kv_heads=4, vocab=32000, seq=2048,
              experts=8, top_k=2),
    # Third held-out batch (heldout-freeze-3): 16 layers, hidden 3072, GQA 24/8, ffn 8192,
    # GPT-NeoX vocabulary, 2K sequences (a Llama-3.2-3B-like layer).
    "E": dict(layers=16, hidden=3072, ffn=8192, heads=24, kv_heads=8, vocab=50304, seq=2048),
    # Third held-out MoE shape: 6 layers, hidden 3072, GQA 24/8, 8 experts (ffn 2048), top-2,
    # 1K sequences.
    "P": dict(layers=6, hidden=3072, ffn=2048, heads=24, kv_heads=8, vocab=32000, seq=1024,
              experts=8, top_k=2),
    # Fourth held-out batch (heldout-freeze-4): 16 layers of a Llama-3-8B-like layer (hidden
    # 4096, GQA 32/8, ffn 14336), 32K vocabulary, 4K sequences.
    "F": dict(layers=16, hidden=4096, ffn=14336, heads=32, kv_heads=8, vocab=32000, seq=4096),
    # Fourth held-out batch: 8 layers, hidden 2048, MHA 16/16, ffn 8192, 64K vocabulary, 1K
    # sequences.
    "G": dict(layers=8, hidden=2048, ffn=8192, heads=16, kv_heads=16, vocab=65536, seq=1024),
    # Fourth held-out MoE shape: 8 layers, hidden 1536, GQA 12/4, 8 experts (ffn 1536), top-2,
    # 2K sequences.
    "R": dict(layers=8, hidden=1536, ffn=1536, heads=12, kv_heads=4, vocab=32000, seq=2048,
              experts=8, top_k=2),
    # Fifth held-out batch (heldout-freeze-5, 2-GPU boxes): 12 layers, hidden 2560, MHA 20/20,
    # ffn 6912, GPT-NeoX vocabulary, 2K sequences.
    "S": dict(layers=12, hidden=2560, ffn=6912, heads=20, kv_heads=20, vocab=50304, seq=2048),
    # Fifth held-out MoE shape: 6 layers, hidden 2048, GQA 16/8, 8 experts (ffn 1024), top-2,
    # 1K sequences.
    "T": dict(layers=6, hidden=2048, ffn=1024, heads=16, kv_heads=8, vocab=32000, seq=1024,
              experts=8, top_k=2),
    # MoE: 4 layers, every FFN a mixture of 8 SwiGLU experts (ffn 4096), top-2.
    "M": dict(layers=4, hidden=2048, ffn=4096, heads=16, kv_heads=8, vocab=32000, seq=4096,
              experts=8, top_k=2),
}

# name: shape, world size, tp, pp, dp, scheme, micro_batch, micro-batches per step, extras
CASES = {
    "ho_ddp4_A": dict(shape="A", world=4, dp=4, scheme="ddp", mb=4, n_mb=2),
    "ho_tp4_B": dict(shape="B", world=4, tp=4, scheme="tp", mb=1, n_mb=2),
    "ho_tp4sp_B": dict(shape="B", world=4, tp=4, scheme="tp", sp=True, mb=1, n_mb=2),
    "ho_fsdp4_B": dict(shape="B", world=4, dp=4, scheme="fsdp", mb=1, n_mb=2),
    "ho_fsdp4_B_rc": dict(shape="B", world=4, dp=4, scheme="fsdp", mb=1, n_mb=2, recompute=True),
    "ho_fsdp4_C_rc_mb2": dict(shape="C", world=4, dp=4, scheme="fsdp", mb=2, n_mb=2,
                              recompute=True),
    "ho_pp4_gpipe_C": dict(shape="C", world=4, pp=4, scheme="pp", schedule="gpipe", mb=1, n_mb=8),
    "ho_pp4_1f1b_C": dict(shape="C", world=4, pp=4, scheme="pp", schedule="1f1b", mb=1, n_mb=8),
    "ho_pp4_int2_C": dict(shape="C", world=4, pp=4, scheme="pp", schedule="interleaved", v=2,
                          mb=1, n_mb=8),
    "ho_tp2pp2_C": dict(shape="C", world=4, tp=2, pp=2, scheme="pp", schedule="1f1b", mb=1,
                        n_mb=8),
    "ho_pp2dp2_C": dict(shape="C", world=4, pp=2, dp=2, scheme="pp", schedule="1f1b", mb=1,
                        n_mb=8),
    # Second held-out batch (issue 12): written before heldout-freeze-2, measured after it.
    "h2_moe_ep4_N": dict(shape="N", world=4, ep=4, scheme="moe", mb=2, n_mb=4),
    "h2_tp4sp_D": dict(shape="D", world=4, tp=4, scheme="tp", sp=True, mb=2, n_mb=1),
    "h2_pp4_1f1b_D": dict(shape="D", world=4, pp=4, scheme="pp", schedule="1f1b", mb=1,
                          n_mb=12),
    "h2_fsdp4_D": dict(shape="D", world=4, dp=4, scheme="fsdp", mb=1, n_mb=4),
    "h2_tp2dp2_D": dict(shape="D", world=4, tp=2, dp=2, scheme="tp", mb=1, n_mb=2),
    "h2_ddp4_D": dict(shape="D", world=4, dp=4, scheme="ddp", mb=1, n_mb=2),
    "h2_moe_ep2dp2_N": dict(shape="N", world=4, ep=2, scheme="moe", mb=2, n_mb=4),
    # Third held-out batch (issue 12): written before heldout-freeze-3, measured after it.
    "h3_tp4sp_E": dict(shape="E", world=4, tp=4, scheme="tp", sp=True, mb=1, n_mb=4),
    "h3_moe_ep4_P": dict(shape="P", world=4, ep=4, scheme="moe", mb=4, n_mb=2),
    "h3_tp2dp2_E": dict(shape="E", world=4, tp=2, dp=2, scheme="tp", mb=2, n_mb=2),
    "h3_ddp4_E": dict(shape="E", world=4, dp=4, scheme="ddp", mb=2, n_mb=2),
    "h3_pp2dp2_E": dict(shape="E", world=4, pp=2, dp=2, scheme="pp", schedule="1f1b", mb=1,
                        n_mb=8),
    "h3_tp4_E": dict(shape="E", world=4, tp=4, scheme="tp", mb=2, n_mb=2),
    "h3_moe_ep2dp2_P": dict(shape="P", world=4, ep=2, scheme="moe", mb=4, n_mb=2),
    # Fourth held-out batch (issue 12): written before heldout-freeze-4, measured after it.
    "h4_pp4_int2_F": dict(shape="F", world=4, pp=4, scheme="pp", schedule="interleaved", v=2,
                          mb=1, n_mb=8),
    "h4_tp2pp2_F": dict(shape="F", world=4, tp=2, pp=2, scheme="pp", schedule="1f1b", mb=1,
                        n_mb=8),
    "h4_pp4_gpipe_F": dict(shape="F", world=4, pp=4, scheme="pp", schedule="gpipe", mb=1,
                           n_mb=8),
    "h4_fsdp4_F_rc": dict(shape="F", world=4, dp=4, scheme="fsdp", mb=2, n_mb=2,
                          recompute=True),
    "h4_tp4sp_F": dict(shape="F", world=4, tp=4, scheme="tp", sp=True, mb=1, n_mb=2),
    "h4_ddp4_G": dict(shape="G", world=4, dp=4, scheme="ddp", mb=4, n_mb=2),
    "h4_tp2dp2_G": dict(shape="G", world=4, tp=2, dp=2, scheme="tp", mb=2, n_mb=2),
    "h4_moe_ep4_R": dict(shape="R", world=4, ep=4, scheme="moe", mb=2, n_mb=4),
    "h4_moe_ep2dp2_R": dict(shape="R", world=4, ep=2, scheme="moe", mb=2, n_mb=4),
    # The fourth batch's 2-GPU cases (written after heldout-freeze-4, predicted by its frozen
    # checkout before measuring; for boxes of 2 GPUs).
    "h4x2_ddp2_G": dict(shape="G", world=2, dp=2, scheme="ddp", mb=4, n_mb=2),
    "h4x2_tp2sp_F": dict(shape="F", world=2, tp=2, scheme="tp", sp=True, mb=1, n_mb=2),
    "h4x2_pp2_int2_F": dict(shape="F", world=2, pp=2, scheme="pp", schedule="interleaved", v=2,
                            mb=1, n_mb=4),
    "h4x2_fsdp2_F_rc": dict(shape="F", world=2, dp=2, scheme="fsdp", mb=2, n_mb=2,
                            recompute=True),
    "h4x2_moe_ep2_R": dict(shape="R", world=2, ep=2, scheme="moe", mb=2, n_mb=4),
    # Fifth held-out batch (issue 12): written before heldout-freeze-5, measured after it.
    "h5_tp2_S": dict(shape="S", world=2, tp=2, scheme="tp", mb=2, n_mb=2),
    "h5_pp2_1f1b_S": dict(shape="S", world=2, pp=2, scheme="pp", schedule="1f1b", mb=1, n_mb=8),
    "h5_fsdp2_S": dict(shape="S", world=2, dp=2, scheme="fsdp", mb=2, n_mb=2),
    "h5_ddp2_S": dict(shape="S", world=2, dp=2, scheme="ddp", mb=2, n_mb=2),
    "h5_moe_ep2_T": dict(shape="T", world=2, ep=2, scheme="moe", mb=4, n_mb=4),
    # MoE (issue 10): uniform and skewed routing measured in one process each.
    "moe_ep1": dict(shape="M", world=1, ep=1, scheme="moe", mb=1, n_mb=4),
    "moe_ep2": dict(shape="M", world=2, ep=2, scheme="moe", mb=1, n_mb=4),
    "moe_ep4": dict(shape="M", world=4, ep=4, scheme="moe", mb=1, n_mb=4),
    "moe_ep2dp2": dict(shape="M", world=4, ep=2, scheme="moe", mb=1, n_mb=4),
    # 8 GPUs (issue 13): the same code on a full NVSwitch node.
    "x8_ddp8_A": dict(shape="A", world=8, dp=8, scheme="ddp", mb=4, n_mb=2),
    "x8_tp8_B": dict(shape="B", world=8, tp=8, scheme="tp", mb=1, n_mb=2),
    "x8_tp8sp_B": dict(shape="B", world=8, tp=8, scheme="tp", sp=True, mb=1, n_mb=2),
    "x8_tp4dp2_B": dict(shape="B", world=8, tp=4, dp=2, scheme="tp", mb=1, n_mb=2),
    "x8_fsdp8_B": dict(shape="B", world=8, dp=8, scheme="fsdp", mb=1, n_mb=2),
    "x8_tp2pp4_C": dict(shape="C", world=8, tp=2, pp=4, scheme="pp", schedule="1f1b", mb=1,
                        n_mb=8),
    "x8_pp8_int2_C": dict(shape="C", world=8, pp=8, scheme="pp", schedule="interleaved", v=2,
                          mb=1, n_mb=16),
    "x8_moe_ep8": dict(shape="M", world=8, ep=8, scheme="moe", mb=1, n_mb=4),
    "x8_moe_ep4dp2": dict(shape="M", world=8, ep=4, scheme="moe", mb=1, n_mb=4),
}
# The seventeenth held-out batch's forced-routing cases live beside this script (heldout17_first.py).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from heldout17_first import CASES17, SHAPES17  # noqa: E402
from heldout18_first import CASES18, SHAPES18  # noqa: E402
from heldout19_first import CASES19, SHAPES19  # noqa: E402

SHAPES.update(SHAPES17, **SHAPES18, **SHAPES19)
CASES.update(CASES17, **CASES18, **CASES19)
HELDOUT_4 = [k for k in CASES if k.startswith("ho_")]
HELDOUT_2 = [k for k in CASES if k.startswith("h2_")]
HELDOUT_3 = [k for k in CASES if k.startswith("h3_")]
HELDOUT_4 = [k for k in CASES if k.startswith("h4_")]
MOE = [k for k in CASES if k.startswith("moe_")]
NODE_8 = [k for k in CASES if k.startswith("x8_")]

# Skewed routing: the first expert of each token is drawn with these probabilities, the second
# is the next expert (mod 8), so expert e carries (P[e] + P[e-1]) / 2 of the routed slots.
SKEW_P = [0.30, 0.20] + [0.50 / 6] * 6

TINY = {"on": False}  # --tiny: see case_config
QUICK = dict(layers=8, hidden=64, ffn=128, heads=4, kv_heads=4, vocab=512, seq=32)


def case_config(name: str, quick: bool, world: int | None = None) -> dict:
    c = dict(CASES[name])
    shape = dict(SHAPES[c["shape"]])
    if quick:
        keep = {k: shape[k] for k in ("experts", "top_k") if k in shape}
        shape = dict(QUICK, **keep)
        if c["shape"] == "B":
            shape["kv_heads"] = 4
        tp, pp, v = c.get("tp", 1), c.get("pp", 1), c.get("v", 1)
        if tp > 4:  # a head (and a KV head) per TP rank
            shape["heads"] = shape["kv_heads"] = tp
        shape["layers"] = max(shape["layers"], pp * v)
    if TINY["on"]:  # the case's structure and layer count at a width where the host binds
        shape.update(hidden=256, ffn=512, heads=8, kv_heads=4, vocab=1024, seq=128)
    c["model"] = shape
    c.setdefault("tp", 1)
    c.setdefault("pp", 1)
    c.setdefault("v", 1)
    c.setdefault("recompute", False)
    c.setdefault("sp", False)
    c.setdefault("schedule", None)
    if world is not None and c["scheme"] == "moe":
        c["world"] = world
    if c["scheme"] != "moe":
        c["dp"] = c["world"] // (c["tp"] * c["pp"])
    else:
        c["dp"] = c["world"]
    return c


# ----------------------------------------------------------------------------- the model

def rope_table(head_dim: int, seq: int, theta: float, device) -> torch.Tensor:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    ang = torch.outer(torch.arange(seq, device=device).float(), inv)
    return torch.polar(torch.ones_like(ang), ang)  # complex64 [seq, head_dim/2]


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    out = torch.view_as_real(xc * freqs[None, : x.shape[1], None, :]).flatten(3)
    return out.type_as(x)


def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
    if n == 1:
        return x
    b, s, h, d = x.shape
    return x[:, :, :, None, :].expand(b, s, h, n, d).reshape(b, s, h * n, d)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight


class _CopyToTP(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient over the TP group backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce over the TP group forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


def _seq_collective(x, group, n, gather: bool):
    """All-gather (gather) or reduce-scatter along the sequence (dim 1) of [b, s, h]."""
    xs = x.movedim(1, 0).contiguous()
    rows = xs.shape[0] * n if gather else xs.shape[0] // n
    out = xs.new_empty((rows, *xs.shape[1:]))
    if gather:
        dist.all_gather_into_tensor(out, xs, group=group)
    else:
        dist.reduce_scatter_tensor(out, xs, group=group)
    return out.movedim(0, 1)


class _GatherSeq(torch.autograd.Function):
    """Sequence parallelism: all-gather along the sequence forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x, group, n):
        ctx.group, ctx.n = group, n
        return _seq_collective(x, group, n, True)

    @staticmethod
    def backward(ctx, g):
        return _seq_collective(g, ctx.group, ctx.n, False), None, None


class _ScatterSeq(torch.autograd.Function):
    """Sequence parallelism: reduce-scatter along the sequence forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, group, n):
        ctx.group, ctx.n = group, n
        return _seq_collective(x, group, n, False)

    @staticmethod
    def backward(ctx, g):
        return _seq_collective(g, ctx.group, ctx.n, True), None, None


class TP:
    """The tensor-parallel group of a rank (size 1: no tensor parallelism). With ``sp``
    (Megatron sequence parallelism) the residual stream is split along the sequence: the
    input of a column-parallel GEMM is cast to the compute dtype and all-gathered, the output of
    a row-parallel GEMM reduce-scattered."""

    def __init__(self, group=None, size: int = 1, rank: int = 0, sp: bool = False):
        self.group, self.size, self.rank, self.sp = group, size, rank, sp and size > 1

    def copy_in(self, x):
        if self.sp:
            if torch.is_autocast_enabled(x.device.type):
                x = x.to(torch.get_autocast_dtype(x.device.type))
            return _GatherSeq.apply(x, self.group, self.size)
        return _CopyToTP.apply(x, self.group) if self.size > 1 else x

    def reduce_out(self, x):
        if self.sp:
            return _ScatterSeq.apply(x, self.group, self.size)
        return _ReduceFromTP.apply(x, self.group) if self.size > 1 else x


class Attention(nn.Module):
    def __init__(self, m: dict, tp: TP):
        super().__init__()
        self.tp = tp
        self.hd = m["hidden"] // m["heads"]
        self.nh = m["heads"] // tp.size
        self.nkv = m["kv_heads"] // tp.size
        h = m["hidden"]
        self.wq = nn.Linear(h, self.nh * self.hd, bias=False)
        self.wk = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.wv = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.wo = nn.Linear(self.nh * self.hd, h, bias=False)

    def forward(self, x, freqs):
        x = self.tp.copy_in(x)
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.nh, self.hd)
        k = self.wk(x).view(b, s, self.nkv, self.hd)
        v = self.wv(x).view(b, s, self.nkv, self.hd)
        q, k = apply_rope(q, freqs), apply_rope(k, freqs)
        k, v = repeat_kv(k, self.nh // self.nkv), repeat_kv(v, self.nh // self.nkv)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        o = self.wo(o.transpose(1, 2).reshape(b, s, self.nh * self.hd))
        return self.tp.reduce_out(o)


class FeedForward(nn.Module):
    def __init__(self, hidden: int, ffn: int, tp: TP):
        super().__init__()
        self.tp = tp
        self.w1 = nn.Linear(hidden, ffn // tp.size, bias=False)
        self.w3 = nn.Linear(hidden, ffn // tp.size, bias=False)
        self.w2 = nn.Linear(ffn // tp.size, hidden, bias=False)

    def forward(self, x):
        x = self.tp.copy_in(x)
        return self.tp.reduce_out(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class Block(nn.Module):
    def __init__(self, m: dict, tp: TP, recompute: bool = False, moe=None):
        super().__init__()
        self.attention_norm = RMSNorm(m["hidden"])
        self.attention = Attention(m, tp)
        self.ffn_norm = RMSNorm(m["hidden"])
        self.feed_forward = moe if moe is not None else FeedForward(m["hidden"], m["ffn"], tp)
        self.recompute = recompute

    def _forward(self, x, freqs):
        h = x + self.attention(self.attention_norm(x), freqs)
        return h + self.feed_forward(self.ffn_norm(h))

    def forward(self, x, freqs):
        if self.recompute and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(self._forward, x, freqs, use_reentrant=False)
        return self._forward(x, freqs)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab: int, hidden: int, tp: TP):
        super().__init__()
        self.tp = tp
        self.per = vocab // tp.size
        self.start = tp.rank * self.per
        self.weight = nn.Parameter(torch.randn(self.per, hidden) * 0.02)

    def forward(self, tokens):
        if self.tp.size == 1:
            return F.embedding(tokens, self.weight)
        local = tokens - self.start
        outside = (local < 0) | (local >= self.per)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside[..., None], 0.0)
        return self.tp.reduce_out(out)


class _VocabParallelCE(torch.autograd.Function):
    """Mean cross-entropy over logits split by vocabulary across the TP group."""

    @staticmethod
    def forward(ctx, logits, target, start, group):
        z = logits.float()
        zmax = z.max(dim=-1).values
        dist.all_reduce(zmax, op=dist.ReduceOp.MAX, group=group)
        z = z - zmax[..., None]
        local = target - start
        outside = (local < 0) | (local >= z.shape[-1])
        local = local.masked_fill(outside, 0)
        zt = z.gather(-1, local[..., None]).squeeze(-1).masked_fill(outside, 0.0)
        dist.all_reduce(zt, group=group)
        e = z.exp()
        se = e.sum(dim=-1)
        dist.all_reduce(se, group=group)
        loss = (se.log() - zt).mean()
        e.div_(se[..., None])
        ctx.save_for_backward(e, local, outside)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, g):
        p, local, outside = ctx.saved_tensors
        p.scatter_add_(-1, local[..., None], -(~outside).float()[..., None])
        p.mul_(g / local.numel())
        return p.to(ctx.dtype), None, None, None


class Transformer(nn.Module):
    """Layers ``[lo, hi)`` of the model; with the embedding when ``first``, the final norm,
    the LM head and the loss when ``last`` (a pipeline stage, or the whole model)."""

    def __init__(self, m: dict, tp: TP, lo: int, hi: int, first: bool, last: bool,
                 recompute: bool = False, moe_factory=None):
        super().__init__()
        self.m, self.tp, self.first, self.last = m, tp, first, last
        self.tok_embeddings = VocabParallelEmbedding(m["vocab"], m["hidden"], tp) if first else None
        self.layers = nn.ModuleList(
            Block(m, tp, recompute, moe_factory() if moe_factory else None) for _ in range(lo, hi))
        if last:
            self.norm = RMSNorm(m["hidden"])
            self.output = nn.Linear(m["hidden"], m["vocab"] // tp.size, bias=False)
        self.freqs = None
        if CHECK["on"]:
            deterministic_init(self, lo, tp)

    def forward(self, x, targets=None):
        if self.freqs is None or self.freqs.device != x.device:
            self.freqs = rope_table(self.m["hidden"] // self.m["heads"], self.m["seq"], 5e5,
                                    x.device)
        h = self.tok_embeddings(x) if self.first else x
        for layer in self.layers:
            h = layer(h, self.freqs)
        if not self.last:
            return h
        logits = self.output(self.tp.copy_in(self.norm(h)))
        if self.tp.size > 1:
            return _VocabParallelCE.apply(logits, targets, self.tp.rank * logits.shape[-1],
                                          self.tp.group)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


CHECK = {"on": False}


def deterministic_init(model: Transformer, lo: int, tp: TP) -> None:
    """--check: weights drawn from a seed per (global layer, name), full size, then this TP
    rank's shard (rows of column-parallel and vocabulary-split weights, columns of row-parallel
    ones), so that any layout holds the same model as one unsplit copy."""
    rows = ("wq", "wk", "wv", "w1", "w3", "tok_embeddings", "output")
    for name, p in model.named_parameters():
        if "norm" in name:
            continue
        parts = name.split(".")
        layer = lo + int(parts[1]) if parts[0] == "layers" else -1
        key = f"{layer}:{'.'.join(parts[2:] if layer >= 0 else parts)}"
        g = torch.Generator().manual_seed(sum(ord(ch) * 131 ** i for i, ch in enumerate(key)) % 2**31)
        full = list(p.shape)
        dim = 0 if any(r in name for r in rows) else 1
        full[dim] *= tp.size
        w = torch.randn(full, generator=g) * 0.05
        w = w.narrow(dim, tp.rank * p.shape[dim], p.shape[dim])
        with torch.no_grad():
            p.copy_(w)


# ----------------------------------------------------------------------------- MoE layer

class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.args = (out_splits, in_splits, group)
        out = x.new_empty((sum(out_splits), x.shape[1]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        out_splits, in_splits, group = ctx.args
        gi = g.new_empty((sum(in_splits), g.shape[1]))
        dist.all_to_all_single(gi, g.contiguous(), in_splits, out_splits, group=group)
        return gi, None, None, None


class MoE(nn.Module):
    """Softmax router, top-k, experts sharded over the EP group, dispatch and combine by
    ``all_to_all_single`` (bf16), local experts computed one after another."""

    def __init__(self, m: dict, ep_group, ep: int, ep_rank: int):
        super().__init__()
        self.E, self.k, self.ep, self.ep_rank, self.group = m["experts"], m["top_k"], ep, \
            ep_rank, ep_group
        self.L = self.E // ep
        h = m["hidden"]
        self.router = nn.Linear(h, self.E, bias=False)
        self.experts = nn.ModuleList(FeedForward(h, m["ffn"], TP()) for _ in range(self.L))
        self.forced = None  # [tokens, k] expert ids, set per micro-batch (uniform / skewed)
        self.loads = []

    def forward(self, x):
        b, s, h = x.shape
        xt = x.reshape(b * s, h).to(torch.float32 if CHECK["on"] else torch.bfloat16)
        probs = torch.softmax(self.router(xt).float(), dim=-1)
        topi = self.forced if self.forced is not None else probs.topk(self.k, dim=-1).indices
        topv = probs.gather(1, topi)
        topv = topv / topv.sum(-1, keepdim=True)
        flat = topi.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tok = order // self.k
        xs = xt[tok]
        counts = torch.bincount(flat, minlength=self.E)
        if self.ep > 1:
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.group)
            c_send = counts.view(self.ep, self.L).sum(1).tolist()
            rc = recv_counts.view(self.ep, self.L).tolist()  # [source rank][local expert]
            c_recv = [sum(r) for r in rc]
            xr = _AllToAll.apply(xs, c_recv, c_send, self.group)
            offs, o = [], 0
            for r in rc:
                offs.append(o)
                o += sum(r)
            pieces, per_expert = [], []
            for e in range(self.L):
                n = 0
                for j in range(self.ep):
                    st = offs[j] + sum(rc[j][:e])
                    pieces.append(torch.arange(st, st + rc[j][e], device=x.device))
                    n += rc[j][e]
                per_expert.append(n)
            perm = torch.cat(pieces)
            xr = xr[perm]
        else:
            per_expert = counts.tolist()
            xr = xs
        self.loads.append(sum(per_expert))
        outs, st = [], 0
        for e, n in enumerate(per_expert):
            outs.append(self.experts[e](xr[st:st + n]))
            st += n
        yr = torch.cat(outs)
        if self.ep > 1:
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(perm.numel(), device=x.device)
            yr = _AllToAll.apply(yr[inv], c_send, c_recv, self.group)
        w = topv.reshape(-1)[order].to(yr.dtype)
        out = torch.zeros(b * s, h, device=x.device, dtype=yr.dtype)
        out = out.index_add(0, tok, yr * w[:, None])
        return out.view(b, s, h).type_as(x)


# ----------------------------------------------------------------------------- pipeline

def schedule(kind: str, rank: int, pp: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """(phase, chunk, micro-batch) in the order this pipeline rank runs them."""
    if kind == "gpipe":
        return [("F", 0, i) for i in range(m)] + [("B", 0, i) for i in range(m)]
    if kind == "1f1b":
        w = min(pp - rank - 1, m)
        out = [("F", 0, i) for i in range(w)]
        for i in range(m - w):
            out += [("F", 0, w + i), ("B", 0, i)]
        return out + [("B", 0, i) for i in range(m - w, m)]
    assert kind == "interleaved" and m % pp == 0, "interleaved needs micro-batches % pp == 0"
    total = m * v

    def unit(k, fwd):
        c = (k // pp) % v
        return (c if fwd else v - 1 - c), (k // (pp * v)) * pp + k % pp

    w = total if m == pp else min((pp - rank - 1) * 2 + (v - 1) * pp, total)
    out = [("F",) + unit(k, True) for k in range(w)]
    for k in range(total - w):
        out += [("F",) + unit(w + k, True), ("B",) + unit(k, False)]
    return out + [("B",) + unit(k, False) for k in range(total - w, total)]


class Links:
    """One 2-rank process group per directed pipeline edge and direction, so that each
    communicator carries messages one way, in schedule order (no send/recv ordering cycles)."""

    def __init__(self, world: int, tp: int, dp: int, pp: int, v: int, me: int, dev):
        self.groups = {}
        order = []
        for d in range(dp):
            for t in range(tp):
                chain = [t + tp * (d + dp * p) for p in range(pp)]
                edges = [(chain[p], chain[p + 1]) for p in range(pp - 1)]
                if v > 1:
                    edges.append((chain[-1], chain[0]))
                for a, b in edges:
                    for kind in ("F", "B"):
                        src, dst = (a, b) if kind == "F" else (b, a)
                        g = dist.new_group([a, b])
                        self.groups[(kind, src, dst)] = g
                        order.append((kind, src, dst, g))
        # initialise every communicator in one global order (lazy NCCL init blocks the host)
        for _kind, src, dst, g in order:
            if me in (src, dst):
                t = torch.zeros(1, device=dev)
                dist.all_reduce(t, group=g)
                if me == src:
                    dist.send(t, dst, group=g)
                else:
                    dist.recv(t, src, group=g)
        self.pending = []

    def send(self, kind, t, src, dst):
        self.pending.append((dist.isend(t.contiguous(), dst, group=self.groups[(kind, src, dst)]),
                             t))

    def recv(self, kind, shape, dtype, src, dst, dev):
        t = torch.empty(shape, dtype=dtype, device=dev)
        dist.irecv(t, src, group=self.groups[(kind, src, dst)]).wait()
        return t

    def drain(self):
        for w, _ in self.pending:
            w.wait()
        self.pending = []


# ----------------------------------------------------------------------------- gradients

def bucketed_all_reduce(params, group, size: int, divisor: int | None = None,
                        bucket_bytes: int = 25 * 2**20):
    """Sum gradients over ``group`` and divide by ``divisor`` (default ``size``): flattened into
    fp32 buckets of at most ``bucket_bytes`` (parameters in reverse order), one all-reduce per
    bucket, copied back."""
    divisor = divisor or size
    if size == 1:
        if divisor != 1:
            for p in params:
                if p.grad is not None:
                    p.grad.div_(divisor)
        return
    grads = [p.grad for p in reversed(list(params)) if p.grad is not None]
    bucket, nbytes = [], 0
    for g in grads + [None]:
        if g is not None and (not bucket or nbytes + g.numel() * 4 <= bucket_bytes):
            bucket.append(g)
            nbytes += g.numel() * 4
            continue
        if bucket:
            flat = torch.cat([b.reshape(-1) for b in bucket])
            dist.all_reduce(flat, group=group)
            flat.div_(divisor)
            o = 0
            for b in bucket:
                b.copy_(flat[o:o + b.numel()].view_as(b))
                o += b.numel()
        bucket, nbytes = ([g], g.numel() * 4) if g is not None else ([], 0)


# ----------------------------------------------------------------------------- running a case

def log(msg: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def setup(quick: bool):
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local = int(os.environ.get("LOCAL_RANK", 0))
    if quick or not torch.cuda.is_available():
        dev = torch.device("cpu")
        if world > 1:
            dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        if world > 1:
            dist.init_process_group("nccl", device_id=dev)
    return rank, world, dev


def batches(c: dict, rank_seed: int, dev):
    """Fixed random token micro-batches (inputs, targets), generated on the host."""
    g = torch.Generator().manual_seed(1234 + rank_seed)
    m = c["model"]
    out = []
    for _ in range(c["n_mb"]):
        t = torch.randint(0, m["vocab"], (c["mb"], m["seq"] + 1), generator=g)
        out.append((t[:, :-1].to(dev), t[:, 1:].to(dev)))
    return out


def make_optimizer(params, dev):
    return torch.optim.AdamW(params, lr=1e-2 if CHECK["on"] else 1e-4, betas=(0.9, 0.95), weight_decay=0.1,
                             fused=dev.type == "cuda")


def autocast(dev, on: bool = True):
    return torch.autocast(dev.type, dtype=torch.bfloat16, enabled=on)


def build_dense(c, rank, world, dev):
    """DDP / FSDP2 / TP over the whole model (pp = 1). Returns (model, step_fn, info)."""
    m, tp = c["model"], c["tp"]
    tpg = TP()
    if tp > 1:
        groups = [dist.new_group(list(range(i, i + tp))) for i in range(0, world, tp)]
        tpg = TP(groups[rank // tp], tp, rank % tp, c["sp"])
    torch.manual_seed(0)
    model = Transformer(m, tpg, 0, m["layers"], True, True, c["recompute"]).to(dev)
    info = {}
    if c["scheme"] == "ddp" or (c["scheme"] == "tp" and c["dp"] > 1):
        from torch.nn.parallel import DistributedDataParallel as DDP
        dpg = None
        for t in range(tp):
            rs = [t + tp * d for d in range(c["dp"])]
            g = dist.new_group(rs) if tp > 1 else dist.group.WORLD
            if rank in rs:
                dpg = g
        model = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None,
                    bucket_cap_mb=25, gradient_as_bucket_view=True, process_group=dpg)
        info["ddp"] = "DistributedDataParallel(bucket_cap_mb=25, gradient_as_bucket_view=True), " \
                      "fp32 grads, no_sync() for all but the last micro-batch"
        amp = True
    elif c["scheme"] == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = MixedPrecisionPolicy(param_dtype=torch.float32 if CHECK["on"] else torch.bfloat16,
                                  reduce_dtype=torch.float32)
        for blk in model.layers:
            fully_shard(blk, mp_policy=mp, reshard_after_forward=True)
        fully_shard(model, mp_policy=mp, reshard_after_forward=True)
        info["fsdp"] = "FSDP2 fully_shard per Block then root, reshard_after_forward=True, " \
                       "MixedPrecisionPolicy(bf16 params, fp32 reduce), default prefetch, " \
                       "reduce-scatter every micro-batch; no autocast"
        amp = False
    else:
        amp = True
    opt = make_optimizer(model.parameters(), dev)
    data = batches(c, rank // tp, dev)

    def step():
        for i, (x, y) in enumerate(data):
            last = i == len(data) - 1
            ctx = model.no_sync() if info.get("ddp") and not last else _Null()
            with ctx:
                with autocast(dev, amp and not CHECK["on"]):
                    loss = model(x, y)
                CHECK.setdefault("losses", {})[i] = loss.detach()
                (loss / len(data)).backward()
        if tpg.sp:  # norm weights saw only this rank's part of the sequence
            grads = [p.grad for n, p in model.named_parameters() if "norm" in n]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=tpg.group)
            for g, f in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                g.copy_(f.view_as(g))
        opt.step()
        opt.zero_grad(set_to_none=True)

    if tpg.sp:
        info["sp"] = "Megatron sequence parallelism: residual stream split along the sequence; " \
                     "bf16 all-gather before each column-parallel GEMM (and the head), " \
                     "reduce-scatter after each row-parallel GEMM (bf16) and the embedding " \
                     "(fp32); norm weight gradients all-reduced over TP after the last backward"
    info["autocast_bf16"] = amp
    return model, step, info


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def build_pipeline(c, rank, world, dev):
    m, tp, pp, dp, v = c["model"], c["tp"], c["pp"], c["dp"], c["v"]
    tp_r, dp_r, pp_r = rank % tp, (rank // tp) % dp, rank // (tp * dp)
    tpg = TP()
    if tp > 1:
        for d in range(dp):
            for p in range(pp):
                rs = [t + tp * (d + dp * p) for t in range(tp)]
                g = dist.new_group(rs)
                if rank in rs:
                    tpg = TP(g, tp, tp_r)
    dpg = None
    for t in range(tp):
        for p in range(pp):
            rs = [t + tp * (d + dp * p) for d in range(dp)]
            g = dist.new_group(rs) if dp > 1 else None
            if rank in rs:
                dpg = g
    links = Links(world, tp, dp, pp, v, rank, dev)
    nvs = pp * v
    per = m["layers"] // nvs
    assert per * nvs == m["layers"], "layers must divide into pp * v stages"
    chunks = []
    for ch in range(v):
        vs = ch * pp + pp_r
        torch.manual_seed(100 + vs)
        chunks.append(Transformer(m, tpg, vs * per, (vs + 1) * per, vs == 0, vs == nvs - 1,
                                  c["recompute"]).to(dev))
    params = [p for ch in chunks for p in ch.parameters()]
    opt = make_optimizer(params, dev)
    data = batches(c, dp_r, dev)
    order = schedule(c["schedule"], pp_r, pp, c["n_mb"], v)
    act_shape = (c["mb"], m["seq"], m["hidden"])

    def peer(p):
        return tp_r + tp * (dp_r + dp * (p % pp))

    def step():
        saved = {}
        for phase, ch, i in order:
            vs = ch * pp + pp_r
            first, last = vs == 0, vs == nvs - 1
            if phase == "F":
                if first:
                    x = data[i][0]
                else:
                    x = links.recv("F", act_shape, torch.float32, peer(pp_r - 1), rank, dev)
                    x.requires_grad_()
                with autocast(dev, not CHECK["on"]):
                    y = chunks[ch](x, data[i][1] if last else None)
                if last:
                    CHECK.setdefault("losses", {})[i] = y.detach()
                    y = y / c["n_mb"]
                else:
                    links.send("F", y.detach(), rank, peer(pp_r + 1))
                saved[(ch, i)] = (x, y)
            else:
                x, y = saved.pop((ch, i))
                if last:
                    y.backward()
                else:
                    dy = links.recv("B", act_shape, torch.float32, peer(pp_r + 1), rank, dev)
                    torch.autograd.backward(y, dy)
                if not first:
                    links.send("B", x.grad, rank, peer(pp_r - 1))
        links.drain()
        if dp > 1:
            bucketed_all_reduce(params, dpg, dp)
        opt.step()
        opt.zero_grad(set_to_none=True)

    info = {"pipeline": f"schedule {c['schedule']}, {v} chunk(s) per rank, {per} layers per "
                        f"virtual stage; activations and their gradients sent as fp32 "
                        f"[{c['mb']},{m['seq']},{m['hidden']}] by isend/irecv (every TP rank "
                        f"sends its full copy)",
            "pp_rank": pp_r, "autocast_bf16": True}
    if dp > 1:
        info["dp"] = "fp32 gradients all-reduced over the DP group after the last backward, " \
                     "25 MB buckets (torch.cat, all_reduce, copy back), not overlapped"
    return chunks, step, info


def make_routes(c, rank, dev) -> dict:
    """Forced expert choices [tokens, top_k] per (micro-batch, layer), uniform and skewed."""
    m = c["model"]
    tokens, E, k = c["mb"] * m["seq"], m["experts"], m["top_k"]
    gen = torch.Generator().manual_seed(77 + rank)
    routes = {}
    for kind in ("uniform", "skewed"):
        per_mb = []
        for _ in range(c["n_mb"] * m["layers"]):
            if kind == "uniform":
                base = torch.randperm(tokens, generator=gen) % E
            else:
                base = torch.multinomial(torch.tensor(SKEW_P), tokens, replacement=True,
                                         generator=gen)
            per_mb.append(torch.stack([(base + j) % E for j in range(k)], 1).to(dev))
        routes[kind] = per_mb
    return routes


def moe_init(model, moes, ep_rank: int) -> None:
    """--check: every weight from a seed per (layer, global expert, name)."""
    deterministic_init(model, 0, TP())
    for li, mo in enumerate(moes):
        for e, ex in enumerate(mo.experts):
            for name, p in ex.named_parameters():
                key = f"moe{li}:{ep_rank * mo.L + e}:{name}"
                g = torch.Generator().manual_seed(
                    sum(ord(ch) * 131 ** i for i, ch in enumerate(key)) % 2**31)
                with torch.no_grad():
                    p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def check_moe(c, rank, world, step, state, dev) -> dict:
    """--check: rank 0's first-micro-batch loss (steps 1 and 2, uniform routing) against one
    unsplit copy (all experts, EP 1) fed every rank's batch with the same routes."""
    got = []
    for _ in range(2):
        CHECK["losses"] = {}
        step()
        got.append(float(CHECK["losses"][0]))
    out = {}
    if rank == 0:
        m = c["model"]
        moes = []

        def factory():
            mo = MoE(m, None, 1, 0)
            moes.append(mo)
            return mo

        ref = Transformer(m, TP(), 0, m["layers"], True, True, False, factory).to(dev)
        moe_init(ref, moes, 0)
        opt = make_optimizer(ref.parameters(), dev)
        r1 = None
        for r in range(world):
            routes = make_routes(c, r, dev)["uniform"]
            for i, (x, y) in enumerate(batches(c, r, dev)):
                for li, mo in enumerate(moes):
                    mo.forced = routes[i * m["layers"] + li]
                loss = ref(x, y)
                if r == 0 and i == 0:
                    r1 = float(loss)
                (loss / (c["n_mb"] * world)).backward()
        opt.step()
        routes = make_routes(c, 0, dev)["uniform"]
        for li, mo in enumerate(moes):
            mo.forced = routes[li]
        with torch.no_grad():
            r2 = float(ref(*batches(c, 0, dev)[0]))
        e1 = abs(got[0] - r1) / abs(r1)
        e2 = abs((got[1] - got[0]) - (r2 - r1)) / abs(r2 - r1)
        out = {"loss_step1": got[0], "ref_step1": r1, "loss_step2": got[1], "ref_step2": r2,
               "rel_err_loss": e1, "rel_err_loss_change": e2,
               "passed": e1 < 1e-4 and e2 < 1e-2}
        print(f"CHECK {c['name']}: {out}", flush=True)
    return out


def build_moe(c, rank, world, dev, quick):
    m, ep = c["model"], c["ep"]
    edp = world // ep
    ep_groups = [list(range(i, i + ep)) for i in range(0, world, ep)]
    ep_g = None
    for rs in ep_groups:
        g = dist.new_group(rs) if ep > 1 else None
        if rank in rs:
            ep_g = g
    edp_g = None
    for e in range(ep):
        rs = [e + ep * d for d in range(edp)]
        g = dist.new_group(rs) if edp > 1 else None
        if rank in rs:
            edp_g = g
    world_g = dist.group.WORLD if world > 1 else None
    torch.manual_seed(0)
    moes = []

    def factory():
        torch.manual_seed(1000 + len(moes) * 10 + rank % ep)
        mod = MoE(m, ep_g, ep, rank % ep)
        moes.append(mod)
        return mod

    model = Transformer(m, TP(), 0, m["layers"], True, True, False, factory).to(dev)
    expert_params = [p for mo in moes for p in mo.experts.parameters()]
    ids = {id(p) for p in expert_params}
    dense_params = [p for p in model.parameters() if id(p) not in ids]
    opt = make_optimizer(model.parameters(), dev)
    data = batches(c, rank, dev)
    routes = make_routes(c, rank, dev)
    E, k = m["experts"], m["top_k"]
    state = {"kind": "uniform"}
    if CHECK["on"]:
        moe_init(model, moes, rank % ep)

    def step():
        for i, (x, y) in enumerate(data):
            for li, mo in enumerate(moes):
                mo.forced = routes[state["kind"]][i * m["layers"] + li]
            with autocast(dev, not CHECK["on"]):
                loss = model(x, y)
            CHECK.setdefault("losses", {})[i] = loss.detach()
            (loss / len(data)).backward()
        bucketed_all_reduce(dense_params, world_g, world)
        # expert gradients hold the sum over the EP group's tokens: divide by all ranks so
        # that every gradient is that of the mean loss over the global batch
        bucketed_all_reduce(expert_params, edp_g, edp, world)
        opt.step()
        opt.zero_grad(set_to_none=True)

    info = {"ep": ep, "edp": edp, "experts": E, "top_k": k, "local_experts": E // ep,
            "expert_params_per_rank": sum(p.numel() for p in expert_params),
            "dense_params": sum(p.numel() for p in dense_params),
            "skew_first_expert_p": SKEW_P,
            "moe": "router Linear(h, E) under autocast, softmax in fp32; routing forced per "
                   "micro-batch and layer (uniform: each expert gets exactly tokens*k/E slots; "
                   "skewed: first expert drawn from skew_first_expert_p, second = first+1 mod E), "
                   "gate weights = softmax probs at the chosen experts renormalised; tokens cast "
                   "to bf16, sorted by expert (argsort), per-expert counts exchanged by "
                   "all_to_all_single (int64) then .tolist() (host sync), tokens dispatched by "
                   "all_to_all_single, regrouped by local expert (index), experts (SwiGLU, "
                   "w1/w3/w2 Linear) run one after another, un-permuted, combined by "
                   "all_to_all_single, weighted and summed back with index_add; backward: the "
                   "transposed all_to_all_single for dispatch and combine",
            "grads": "after the last micro-batch: dense (non-expert) fp32 gradients all-reduced "
                     "over all ranks, expert gradients over the expert-data-parallel group, 25 MB "
                     "buckets, not overlapped"}
    return model, step, info, state, moes


def check(c, rank, world, step, dev) -> dict:
    """--check (fp32, CPU): the first micro-batch's loss of data-parallel rank 0 in steps 1 and
    2 against one unsplit model (same weights) that takes the same global batch and one AdamW
    step: checks the forward of the layout and every gradient path (TP, pipeline, DP)."""
    got = []
    for _ in range(2):
        CHECK["losses"] = {}
        step()
        got.append(CHECK["losses"].get(0))
    tp, dp, pp = c["tp"], c["dp"], c["pp"]
    mine = (rank % tp == 0 and (rank // tp) % dp == 0 and rank // (tp * dp) == pp - 1)
    t = torch.tensor([float(got[0]), float(got[1])] if mine else [0.0, 0.0], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(t)
    out = {}
    if rank == 0:
        m = c["model"]
        ref = Transformer(m, TP(), 0, m["layers"], True, True).to(dev)
        opt = make_optimizer(ref.parameters(), dev)
        data = [batches(c, d, dev) for d in range(dp)]
        r1 = float(ref(*data[0][0]))
        for d in range(dp):
            for x, y in data[d]:
                (ref(x, y) / (len(data[d]) * dp)).backward()
        opt.step()
        with torch.no_grad():
            r2 = float(ref(*data[0][0]))
        e1 = abs(float(t[0]) - r1) / abs(r1)
        e2 = abs((float(t[1]) - float(t[0])) - (r2 - r1)) / abs(r2 - r1)
        out = {"loss_step1": float(t[0]), "ref_step1": r1, "loss_step2": float(t[1]),
               "ref_step2": r2, "rel_err_loss": e1, "rel_err_loss_change": e2,
               "passed": e1 < 1e-4 and e2 < 1e-2}
        print(f"CHECK {c['name']}: {out}", flush=True)
    return out


def time_steps(step, dev, warmup: int, timed: int, world: int):
    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for i in range(warmup):
        step()
        log(f"  warm-up step {i + 1}/{warmup} done")
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times, issued = [], []
    for _ in range(timed):
        sync()
        if world > 1:
            dist.barrier()
        sync()
        t0 = time.perf_counter()
        step()
        issued.append(time.perf_counter() - t0)  # host back from step(): all work launched
        sync()
        times.append(time.perf_counter() - t0)
    t = torch.tensor(times, dtype=torch.float64, device=dev)
    peak = torch.tensor([torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda"
                         else 0.0], dtype=torch.float64, device=dev)
    per_rank_t = [t.clone() for _ in range(world)] if world > 1 else [t]
    per_rank_p = [peak.clone() for _ in range(world)] if world > 1 else [peak]
    if world > 1:
        dist.all_gather(per_rank_t, t)
        dist.all_gather(per_rank_p, peak)
    slowest = torch.stack(per_rank_t).max(0).values.tolist()
    # host issue time: from the step's start until the host has launched its last kernel
    # (median per rank); close to the step time when the GPU waits for the host
    iss = torch.tensor(issued, dtype=torch.float64, device=dev)
    per_rank_i = [iss.clone() for _ in range(world)] if world > 1 else [iss]
    if world > 1:
        dist.all_gather(per_rank_i, iss)
    return {"host_issue_s_by_rank": [statistics.median(x.tolist()) for x in per_rank_i],
            "step_time_s": statistics.median(slowest), "step_time_min_s": min(slowest),
            "step_time_max_s": max(slowest), "step_times_s": slowest,
            "step_time_s_by_rank": [statistics.median(x.tolist()) for x in per_rank_t],
            "peak_memory_gib": max(float(p) for p in per_rank_p),
            "peak_memory_gib_by_rank": [round(float(p), 3) for p in per_rank_p],
            "warmup_steps": warmup, "timed_steps": timed}


def model_flops(c) -> float:
    """3 x forward matmul FLOPs (2 x tokens x matrix parameters, experts counted top_k times)
    plus causal attention 2 x b x heads x s^2 x head_dim per layer (forward x 3)."""
    m = c["model"]
    h, L, s = m["hidden"], m["layers"], m["seq"]
    hd = h // m["heads"]
    attn_p = h * (m["heads"] * hd) * 2 + h * (m["kv_heads"] * hd) * 2
    ffn_p = 3 * h * m["ffn"] * m.get("top_k", 1)
    tokens = c["mb"] * c["n_mb"] * s * c["dp"]
    fwd = 2 * tokens * (L * (attn_p + ffn_p) + h * m["vocab"])
    fwd += L * 2 * c["mb"] * c["n_mb"] * c["dp"] * m["heads"] * s * s * hd
    return 3.0 * fwd


def env_info(dev) -> dict:
    d = {"torch": torch.__version__, "nvls": os.environ.get("NCCL_NVLS_ENABLE")}
    if dev.type == "cuda":
        d.update(gpu=torch.cuda.get_device_name(dev), cuda=torch.version.cuda,
                 nccl=".".join(map(str, torch.cuda.nccl.version())),
                 cudnn=torch.backends.cudnn.version())
    return d


def run_case(args) -> None:
    rank, world, dev = setup(args.quick)
    c = case_config(args.case, args.quick, world)
    c["name"] = args.case
    CHECK["on"] = args.check
    assert c["world"] == world, f"{args.case} needs {c['world']} ranks, got {world}"
    warmup, timed = (1, 2) if args.quick else (args.warmup, args.steps)
    t_start = time.time()
    rec = {"op": "train_step", "script": "steps.py", "case": args.case, "gpus": world,
           "run": args.label, "tiny": args.tiny,
           "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "model": c["model"], "parallelism": {k: c[k] for k in ("tp", "pp", "dp", "v")},
           "scheme": c["scheme"], "schedule": c["schedule"], "recompute": c["recompute"],
           "micro_batch": c["mb"], "micro_batches": c["n_mb"], "env": env_info(dev),
           "optimizer": "AdamW(lr 1e-4, betas (0.9,0.95), wd 0.1, fused on CUDA)",
           "attention": "F.scaled_dot_product_attention(is_causal=True) after repeat_kv",
           "model_flops_per_step": model_flops(c)}
    if c["scheme"] == "moe":
        model, step, info, state, moes = build_moe(c, rank, world, dev, args.quick)
        rec["params_per_rank"] = sum(p.numel() for p in model.parameters())
        rec.update(info)
        if args.check:
            rec["check"] = check_moe(c, rank, world, step, state, dev)
            write(args, rec, rank, "check.jsonl")
            return
        for kind in ("uniform", "skewed"):
            state["kind"] = kind
            for mo in moes:
                mo.loads = []
            log(f"{args.case} {kind}")
            r = time_steps(step, dev, warmup, timed, world)
            loads = torch.tensor([sum(mo.loads) / len(mo.loads) for mo in moes],
                                 dtype=torch.float64, device=dev).mean().reshape(1)
            all_loads = [loads.clone() for _ in range(world)] if world > 1 else [loads]
            if world > 1:
                dist.all_gather(all_loads, loads)
            r["routed_slots_per_rank_per_mb_layer"] = [float(x) for x in all_loads]
            r["routing"] = kind
            out = dict(rec, **r)
            out["case"] = f"{args.case}_{kind}"
            write(args, out, rank)
            if args.profile and dev.type == "cuda":
                profile_step(args, step, out["case"], rank, world, dev)
    else:
        if c["scheme"] == "pp":
            model, step, info = build_pipeline(c, rank, world, dev)
            n = sum(p.numel() for ch in model for p in ch.parameters())
        else:
            model, step, info = build_dense(c, rank, world, dev)
            n = sum(p.numel() for p in model.parameters())
        t = torch.tensor([float(n)], dtype=torch.float64, device=dev)
        ns = [t.clone() for _ in range(world)] if world > 1 else [t]
        if world > 1:
            dist.all_gather(ns, t)
        rec["params_per_rank"] = [int(x) for x in ns]
        rec.update(info)
        log(f"{args.case} built, {int(n)} params on rank 0")
        if args.check:
            rec["check"] = check(c, rank, world, step, dev)
            write(args, rec, rank, "check.jsonl")
            return
        rec.update(time_steps(step, dev, warmup, timed, world))
        write(args, rec, rank)
        if args.profile and dev.type == "cuda":
            profile_step(args, step, args.case, rank, world, dev)
    log(f"{args.case} done in {time.time() - t_start:.1f} s")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- profile

def _union(iv: list[tuple[float, float]]) -> float:
    """Length of the union of intervals (us)."""
    tot, end = 0.0, -1e300
    for a, b in sorted(iv):
        if b <= end:
            continue
        tot += b - max(a, end)
        end = b
    return tot


def _kind(name: str) -> str:
    n = name.lower()
    if "nccl" in n:
        return "nccl"
    if any(x in n for x in ("flash", "fmha", "attention", "attn")):
        return "attention"
    if any(x in n for x in ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_")):
        return "gemm"
    if "memcpy" in n or "memset" in n:
        return "copy"
    return "other"


def _annotation(name: str, is_user_annotation: bool) -> bool:
    """Whether a GPU-timeline event is a range around kernels rather than a kernel: a user
    annotation, NCCL's ``nccl:<op>`` range, or a ``record_function`` range such as
    ``Optimizer.step#AdamW.step`` (a '#' and no argument list). A kernel's demangled name has
    an argument list, and PyTorch's elementwise kernels name their lambda with a '#'
    (``...direct_copy_kernel_cuda(...)::{lambda(float)#1}...>(int, ...)``: casts, pow, rsqrt,
    SiLU, GELU), so a '#' alone does not mark an annotation (before 2026-11-27 it did, and
    profile.jsonl left those kernels out of busy time, counting them as GPU idle)."""
    if is_user_annotation or name.startswith("nccl:"):
        return True
    return "#" in name and "(" not in name


SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize")


def _host_side(prof, iv: list[tuple[float, float]]) -> dict:
    """What the host did in the profiled step: its synchronisations (count, seconds), the
    GPU's idle gaps between kernels (total, and those over 50 us), the CUDA launch calls and
    the 60 aten ops of most host time (self and total, count)."""
    syncs = [e for e in prof.events() if e.name in SYNC_CALLS]
    launches = [e for e in prof.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel",
                                                       "cudaLaunchKernelExC", "cuLaunchKernelEx")]
    gaps, end = [], None
    for a, b in sorted(iv):
        if end is not None and a > end:
            gaps.append(a - end)
        end = b if end is None else max(end, b)
    ops: dict[str, list[float]] = {}
    for e in prof.key_averages():
        if e.key.startswith("aten::") or e.key.startswith("autograd::"):
            ops[e.key] = [e.self_cpu_time_total / 1e6, e.cpu_time_total / 1e6, e.count]
    top = sorted(ops.items(), key=lambda kv: -kv[1][0])[:60]
    return {"host_syncs": len(syncs), "host_sync_s": sum(e.cpu_time_total for e in syncs) / 1e6,
            "launch_calls": len(launches), "gpu_idle_s": sum(gaps) / 1e6,
            "gpu_idle_over_50us_s": sum(g for g in gaps if g > 50) / 1e6,
            "gpu_idle_gaps_over_50us": sum(1 for g in gaps if g > 50),
            "top_host_ops": [{"op": k, "self_s": v[0], "total_s": v[1], "count": v[2]}
                             for k, v in top]}


def profile_step(args, step, name, rank, world, dev) -> None:
    """One more step under torch.profiler: per rank, the step's wall time, the union of its
    kernels' busy time (all kernels, compute kernels, NCCL kernels), kernel time by kind, the
    kernel count and the 400 kernels of most total time. Appends one line to profile.jsonl."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    if world > 1:
        dist.barrier()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    # kernels and copies on the GPU; user annotations ("nccl:all_to_all", "Optimizer.step#...")
    # are GPU-timeline ranges around kernels, not kernels
    kern = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
            and not _annotation(e.name, getattr(e, "is_user_annotation", False))]
    iv = {"all": [], "compute": [], "nccl": []}
    by_kind: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for e in kern:
        a, b = e.time_range.start, e.time_range.end
        k = _kind(e.name)
        iv["all"].append((a, b))
        iv["nccl" if k == "nccl" else "compute"].append((a, b))
        by_kind[k] = by_kind.get(k, 0.0) + (b - a) / 1e6
        r = by_name.setdefault(e.name[:120], [0.0, 0])
        r[0] += (b - a) / 1e6
        r[1] += 1
    span = (max(b for _, b in iv["all"]) - min(a for a, _ in iv["all"])) / 1e6 if kern else 0.0
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:400]
    rec = {"case": name, "rank": rank, "wall_s": wall, "kernel_span_s": span,
           **_host_side(prof, iv["all"]),
           "busy_s": _union(iv["all"]) / 1e6, "compute_busy_s": _union(iv["compute"]) / 1e6,
           "nccl_busy_s": _union(iv["nccl"]) / 1e6, "kernels": len(kern),
           "time_by_kind_s": by_kind,
           "top_kernels": [{"name": k, "total_s": v[0], "count": v[1]} for k, v in top]}
    recs = [None] * world
    if world > 1:
        dist.all_gather_object(recs, rec)
    else:
        recs = [rec]
    if rank == 0:
        with open(os.path.join(args.out, "profile.jsonl"), "a") as f:
            for r in recs:
                f.write(json.dumps(r) + "\n")
        r = recs[0]
        print(f"PROFILE {name}: wall {r['wall_s']:.4f} s, busy {r['busy_s']:.4f}, compute "
              f"{r['compute_busy_s']:.4f}, nccl {r['nccl_busy_s']:.4f}, {r['kernels']} kernels, "
              f"{r['host_syncs']} syncs, GPU idle {r['gpu_idle_s']:.4f} s", flush=True)


def write(args, rec, rank, fname="steps.jsonl"):
    if rank != 0:
        return
    if fname != "steps.jsonl":
        with open(os.path.join(args.out, fname), "a") as f:
            f.write(json.dumps(rec) + "\n")
        return
    if rec.get("model_flops_per_step") and rec.get("step_time_s"):
        rec["tflops_per_gpu"] = rec["model_flops_per_step"] / rec["step_time_s"] / rec["gpus"] / 1e12
    print(f"RESULT {rec['case']}: step {rec['step_time_s']:.4f} s "
          f"(min {rec['step_time_min_s']:.4f}, max {rec['step_time_max_s']:.4f}), "
          f"peak {rec['peak_memory_gib']:.2f} GiB", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, fname), "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


# ----------------------------------------------------------------------------- driver

def driver(args) -> int:
    names = args.only.split(",") if args.only else HELDOUT_4 + MOE
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    for name in names:
        c = case_config(name, args.quick)
        left = args.budget_s - (time.time() - t0)
        if left < 30:
            print(f"budget used up: skipping {name}", flush=True)
            phase(args, name, None, 0.0, "skipped: budget")
            continue
        limit = min(args.case_timeout_s, left)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={c['world']}", __file__, "--case", name, "--out", args.out,
               "--warmup", str(args.warmup), "--steps", str(args.steps), "--label", args.label]
        if args.quick:
            cmd.append("--quick")
        if args.check:
            cmd.append("--check")
        if args.profile:
            cmd.append("--profile")
        if args.tiny:
            cmd.append("--tiny")
        print(f"=== {name} ({c['world']} ranks, limit {limit:.0f} s)", flush=True)
        t = time.time()
        p = subprocess.Popen(cmd, start_new_session=True)
        try:
            rc = p.wait(timeout=limit)
            note = ""
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            rc, note = -9, "timed out"
        phase(args, name, rc, time.time() - t, note)
        print(f"=== {name} rc={rc} {time.time() - t:.1f} s {note}", flush=True)
    return 0


def phase(args, name, rc, wall, note):
    with open(os.path.join(args.out, "phases.jsonl"), "a") as f:
        f.write(json.dumps({"script": "steps.py", "case": name, "rc": rc,
                            "wall_s": round(wall, 2), "note": note}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--driver", action="store_true")
    ap.add_argument("--case")
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default="/tmp/steps")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--check", action="store_true",
                    help="with --quick: compare the layout's losses with one unsplit model")
    ap.add_argument("--label", default="first", help="recorded as 'run' in each line")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--case-timeout-s", type=float, default=90)
    ap.add_argument("--profile", action="store_true",
                    help="after timing, one more step under torch.profiler (profile.jsonl)")
    ap.add_argument("--tiny", action="store_true",
                    help="each case at hidden 256, seq 128 (same layers and scheme) on the GPU: "
                         "a host-bound step, to measure the host's time per launched kernel")
    args = ap.parse_args()
    TINY["on"] = args.tiny
    if args.driver:
        return driver(args)
    run_case(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
