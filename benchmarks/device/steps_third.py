"""Training steps of a Llama-style model, a third measuring script for held-out batches.

Written for issue 12 item 3 ("a script written differently from the calibration scripts") from
scratch, without reading the simulator's op lists or the model code of ``steps.py`` and
``steps_alt.py`` (only their output format is shared, so the same tooling reads all three).

The model: a Llama block written by hand -- RMSNorm (fp32 statistics, bf16 weight), rotary
position embeddings applied by hand with cos/sin tables (rotate-half form), grouped-query
attention (separate ``wq``/``wk``/``wv``/``wo`` Linears, K and V heads repeated with
``repeat_interleave`` and ``F.scaled_dot_product_attention(is_causal=True)``), a SwiGLU MLP
(``w2(silu(w1 x) * w3 x)``), no biases anywhere, untied token embedding and LM head, a final
RMSNorm, ``F.cross_entropy`` on the logits cast to fp32.

Precision and optimizer (one recipe for every scheme, as many small scripts do): the model is
cast to bf16 with ``model.to(torch.bfloat16)`` and runs without autocast; there are no fp32
master weights: ``torch.optim.AdamW(fused=True)`` (``foreach`` on the CPU) keeps its two moments
in bf16 beside the bf16 parameters; lr 3e-4, betas (0.9, 0.95), weight decay 0.1, eps 1e-8.
Gradients are clipped to a global norm of 1.0 every step: ``torch.nn.utils.clip_grad_norm_`` in
``single``, ``ddp`` and ``fsdp``; in ``tp``, ``pp`` and ``moe`` a hand-written equivalent (local
squared norms summed, one scalar all-reduce, the gradients scaled in place).

Schemes:

- ``single``: one GPU, gradient accumulation over the micro-batches.
- ``ddp``: ``DistributedDataParallel(bucket_cap_mb=50, gradient_as_bucket_view=True)``,
  ``no_sync()`` on all but the last micro-batch.
- ``fsdp``: FSDP2 ``fully_shard`` on every block and then on the root,
  ``reshard_after_forward=True``, no mixed-precision policy (the parameters are already bf16, so
  gathers and reduce-scatters move bf16); with ``ac`` every block's forward runs under
  ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``.
- ``tp``: Megatron-style tensor parallelism written by hand: column-parallel ``wq``/``wk``/
  ``wv``/``w1``/``w3`` and LM head, row-parallel ``wo``/``w2``, with two autograd Functions
  (identity forward / all-reduce backward before each column pair; all-reduce forward /
  identity backward after each row Linear); the LM head's vocabulary-split logits are
  all-gathered (a third Function) before an ordinary cross entropy; the token embedding and the
  norms are replicated; no sequence parallelism.
- ``pp``: the layers split evenly over 2 or 4 stages (embedding on the first, final norm, head
  and loss on the last), a hand-written 1F1B schedule (warm-up forwards, steady one-forward-
  one-backward, cool-down backwards) whose activation and gradient transfers are
  ``dist.batch_isend_irecv`` groups pairing each send with the receive it meets (the pairing
  Megatron-LM uses), waited on at once.
- ``moe``: every MLP a mixture of ``experts`` SwiGLU experts with a learned router (a bias-free
  Linear, softmax over the top-2 logits), experts spread over all ranks (expert parallelism =
  world); per layer the per-expert counts are exchanged first with ``all_to_all_single`` and
  read to the host with ``.tolist()``, the tokens (sorted by expert) dispatched with
  ``all_to_all_single`` inside a hand-written autograd Function, the received rows sorted by
  local expert and each local expert run on its contiguous run one after another (a Python
  loop), the results sent back by the reverse ``all_to_all_single`` and combined with the
  router weights. After the last backward every replicated (non-expert) gradient is
  all-reduced with its own ``dist.all_reduce`` (a loop, no bucketing) and divided by the world
  size; expert gradients are divided by the world size locally.

Usage (one host, from the repository root)::

    python3 benchmarks/device/steps_third.py --driver --out DIR [--only c1,c2] [--budget-s 400]
    python3 -m torch.distributed.run --standalone --nproc_per_node=N \
        benchmarks/device/steps_third.py --case NAME --out DIR   # one case (what the driver runs)

``--quick`` shrinks every model and runs on the CPU with gloo (a dry run; the numbers mean
nothing). Each case appends one JSON line to ``DIR/steps.jsonl``; the driver logs each case's
exit code and wall time to ``DIR/phases.jsonl``.

Step timing: synchronise and barrier, host clock, every micro-batch's forward and backward, the
scheme's gradient reduction, clipping, ``optimizer.step()``, ``zero_grad(set_to_none=True)``,
synchronise, host clock. The slowest rank's time counts for each step; ``step_time_s`` is the
median over the timed steps after warm-up; ``peak_memory_gib`` is
``torch.cuda.max_memory_allocated()`` over the timed steps, worst rank.
"""

from __future__ import annotations

import argparse
import contextlib
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

SCRIPT = "steps_third.py"

# ----------------------------------------------------------------------------- cases

SHAPES = {
    # Llama-ish: 12 blocks of width 2048, 16 query heads / 4 KV heads of 128, SwiGLU 5632,
    # a 32000-token vocabulary, 2K sequences (about 0.67 B parameters).
    "A": dict(layers=12, hidden=2048, heads=16, kv_heads=4, ffn=5632, vocab=32000, seq=2048),
    # MoE: 8 blocks of width 1024, 8 query / 2 KV heads of 128, 8 SwiGLU experts of 2816, top-2,
    # a 32000-token vocabulary, 2K sequences.
    "B": dict(layers=8, hidden=1024, heads=8, kv_heads=2, ffn=2816, vocab=32000, seq=2048,
              experts=8, top_k=2),
}
QUICK = dict(layers=4, hidden=64, heads=8, kv_heads=4, ffn=96, vocab=256, seq=32)

# name: shape, world, scheme, micro_batch, micro-batches per step, extras
CASES8 = {
    # 2-GPU box (and its 1-GPU baseline)
    "h8t_single_A": dict(shape="A", world=1, scheme="single", mb=4, n_mb=2),
    "h8t_ddp2_A": dict(shape="A", world=2, scheme="ddp", mb=4, n_mb=2),
    "h8t_fsdp2_A": dict(shape="A", world=2, scheme="fsdp", mb=8, n_mb=1),
    "h8t_fsdp2_A_ac": dict(shape="A", world=2, scheme="fsdp", mb=8, n_mb=1, ac=True),
    "h8t_tp2_A": dict(shape="A", world=2, scheme="tp", mb=8, n_mb=1),
    "h8t_pp2_1f1b_A": dict(shape="A", world=2, scheme="pp", mb=2, n_mb=8),
    "h8t_moe_ep2_B": dict(shape="B", world=2, scheme="moe", mb=4, n_mb=2),
    # 4-GPU box
    "h8t_ddp4_A": dict(shape="A", world=4, scheme="ddp", mb=4, n_mb=2),
    "h8t_fsdp4_A": dict(shape="A", world=4, scheme="fsdp", mb=8, n_mb=1),
    "h8t_tp4_A": dict(shape="A", world=4, scheme="tp", mb=8, n_mb=1),
    "h8t_pp4_1f1b_A": dict(shape="A", world=4, scheme="pp", mb=2, n_mb=8),
    "h8t_moe_ep4_B": dict(shape="B", world=4, scheme="moe", mb=4, n_mb=2),
}
# The ninth batch: new shapes, written after the eighth was measured and diagnosed.
SHAPES.update({
    # 16 blocks of width 2560, 20 query heads / 4 KV heads of 128, SwiGLU 6912, a 49152-token
    # vocabulary, 4K sequences (about 1.35 B parameters).
    "C": dict(layers=16, hidden=2560, heads=20, kv_heads=4, ffn=6912, vocab=49152, seq=4096),
    # MoE: 6 blocks of width 1536, 12 query / 4 KV heads of 128, 16 SwiGLU experts of 2048,
    # top-2, a 32000-token vocabulary, 2K sequences.
    "D": dict(layers=6, hidden=1536, heads=12, kv_heads=4, ffn=2048, vocab=32000, seq=2048,
              experts=16, top_k=2),
})
CASES9 = {
    "h9t_single_C": dict(shape="C", world=1, scheme="single", mb=2, n_mb=2),
    "h9t_fsdp2_C": dict(shape="C", world=2, scheme="fsdp", mb=2, n_mb=1),
    "h9t_tp2_C": dict(shape="C", world=2, scheme="tp", mb=2, n_mb=1),
    "h9t_moe_ep2_D": dict(shape="D", world=2, scheme="moe", mb=4, n_mb=2),
    "h9t_ddp4_C": dict(shape="C", world=4, scheme="ddp", mb=2, n_mb=2),
    "h9t_fsdp4_C_ac": dict(shape="C", world=4, scheme="fsdp", mb=4, n_mb=1, ac=True),
    "h9t_tp4_C": dict(shape="C", world=4, scheme="tp", mb=4, n_mb=1),
    "h9t_pp4_1f1b_C": dict(shape="C", world=4, scheme="pp", mb=1, n_mb=8),
    "h9t_moe_ep4_D": dict(shape="D", world=4, scheme="moe", mb=4, n_mb=2),
}
# The tenth batch: new shapes, written 2026-11-27 03:35 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 24 blocks of width 1536, 12 query heads / 4 KV heads of 128, SwiGLU 4096, a 32768-token
    # vocabulary, 2K sequences (about 0.65 B parameters).
    "E": dict(layers=24, hidden=1536, heads=12, kv_heads=4, ffn=4096, vocab=32768, seq=2048),
    # MoE: 8 blocks of width 1280, 10 query / 2 KV heads of 128, 8 SwiGLU experts of 2560,
    # top-2, a 32000-token vocabulary, 2K sequences.
    "F": dict(layers=8, hidden=1280, heads=10, kv_heads=2, ffn=2560, vocab=32000, seq=2048,
              experts=8, top_k=2),
})
CASES10 = {
    "h10t_single_E": dict(shape="E", world=1, scheme="single", mb=4, n_mb=2),
    "h10t_fsdp2_E_ac": dict(shape="E", world=2, scheme="fsdp", mb=8, n_mb=1, ac=True),
    "h10t_ddp4_E": dict(shape="E", world=4, scheme="ddp", mb=4, n_mb=2),
    "h10t_fsdp4_E": dict(shape="E", world=4, scheme="fsdp", mb=4, n_mb=1),
    "h10t_tp4_E": dict(shape="E", world=4, scheme="tp", mb=8, n_mb=1),
    "h10t_pp4_1f1b_E": dict(shape="E", world=4, scheme="pp", mb=2, n_mb=8),
    "h10t_moe_ep4_F": dict(shape="F", world=4, scheme="moe", mb=4, n_mb=2),
}
# The eleventh batch: new shapes, written 2026-11-27 06:35 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 20 blocks of width 2048, 16 query heads / 8 KV heads of 128, SwiGLU 5632, GPT-2's padded
    # vocabulary, 3K sequences (about 1.15 B parameters).
    "G": dict(layers=20, hidden=2048, heads=16, kv_heads=8, ffn=5632, vocab=50304, seq=3072),
    # MoE: 6 blocks of width 1792, 14 query / 2 KV heads of 128, 16 SwiGLU experts of 1536,
    # top-2, a 32000-token vocabulary, 2K sequences.
    "H": dict(layers=6, hidden=1792, heads=14, kv_heads=2, ffn=1536, vocab=32000, seq=2048,
              experts=16, top_k=2),
})
CASES11 = {
    "h11t_single_G": dict(shape="G", world=1, scheme="single", mb=2, n_mb=2),
    "h11t_tp2_G": dict(shape="G", world=2, scheme="tp", mb=4, n_mb=1),
    "h11t_moe_ep2_H": dict(shape="H", world=2, scheme="moe", mb=4, n_mb=2),
    "h11t_ddp4_G": dict(shape="G", world=4, scheme="ddp", mb=2, n_mb=2),
    "h11t_fsdp4_G_ac": dict(shape="G", world=4, scheme="fsdp", mb=4, n_mb=1, ac=True),
    "h11t_tp4_G": dict(shape="G", world=4, scheme="tp", mb=4, n_mb=1),
    "h11t_pp4_1f1b_G": dict(shape="G", world=4, scheme="pp", mb=1, n_mb=8),
    "h11t_moe_ep4_H": dict(shape="H", world=4, scheme="moe", mb=4, n_mb=2),
}
# The twelfth batch: new shapes, written 2026-11-27 09:06 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 16 blocks of width 3072, 24 query heads / 8 KV heads of 128, SwiGLU 8192, a 32000-token
    # vocabulary, 2K sequences (about 1.8 B parameters).
    "J": dict(layers=16, hidden=3072, heads=24, kv_heads=8, ffn=8192, vocab=32000, seq=2048),
    # MoE: 8 blocks of width 2048, 16 query / 4 KV heads of 128, 32 SwiGLU experts of 1024,
    # top-4, a 32000-token vocabulary, 1K sequences.
    "K": dict(layers=8, hidden=2048, heads=16, kv_heads=4, ffn=1024, vocab=32000, seq=1024,
              experts=32, top_k=4),
})
CASES12 = {
    "h12t_single_J": dict(shape="J", world=1, scheme="single", mb=2, n_mb=2),
    "h12t_ddp2_J": dict(shape="J", world=2, scheme="ddp", mb=2, n_mb=2),
    "h12t_fsdp2_J_ac": dict(shape="J", world=2, scheme="fsdp", mb=4, n_mb=1, ac=True),
    "h12t_moe_ep2_K": dict(shape="K", world=2, scheme="moe", mb=4, n_mb=2),
    "h12t_fsdp4_J": dict(shape="J", world=4, scheme="fsdp", mb=4, n_mb=1),
    "h12t_tp4_J": dict(shape="J", world=4, scheme="tp", mb=4, n_mb=1),
    "h12t_pp4_1f1b_J": dict(shape="J", world=4, scheme="pp", mb=1, n_mb=8),
    "h12t_moe_ep4_K": dict(shape="K", world=4, scheme="moe", mb=4, n_mb=2),
}
# The thirteenth batch: new shapes, written 2026-11-27 11:50 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 12 blocks of width 4096, 32 query heads / 8 KV heads of 128, SwiGLU 11008, a 32000-token
    # vocabulary, 2K sequences (about 2.4 B parameters).
    "I": dict(layers=12, hidden=4096, heads=32, kv_heads=8, ffn=11008, vocab=32000, seq=2048),
    # MoE: 6 blocks of width 2560, 20 query / 4 KV heads of 128, 24 SwiGLU experts of 1536,
    # top-3, a 32000-token vocabulary, 2K sequences.
    "O": dict(layers=6, hidden=2560, heads=20, kv_heads=4, ffn=1536, vocab=32000, seq=2048,
              experts=24, top_k=3),
})
CASES13 = {
    "h13t_single_I": dict(shape="I", world=1, scheme="single", mb=1, n_mb=2),
    "h13t_tp2_I": dict(shape="I", world=2, scheme="tp", mb=4, n_mb=1),
    "h13t_moe_ep2_O": dict(shape="O", world=2, scheme="moe", mb=2, n_mb=2),
    "h13t_ddp4_I": dict(shape="I", world=4, scheme="ddp", mb=1, n_mb=2),
    "h13t_fsdp4_I_ac": dict(shape="I", world=4, scheme="fsdp", mb=2, n_mb=1, ac=True),
    "h13t_tp4_I": dict(shape="I", world=4, scheme="tp", mb=4, n_mb=1),
    "h13t_pp4_1f1b_I": dict(shape="I", world=4, scheme="pp", mb=1, n_mb=8),
    "h13t_moe_ep4_O": dict(shape="O", world=4, scheme="moe", mb=2, n_mb=2),
}
# The fourteenth batch: new shapes, written 2026-11-27 14:27 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 12 blocks of width 3584, 28 query heads / 4 KV heads of 128, SwiGLU 9728, a 65536-token
    # vocabulary, 2K sequences (about 2.1 B parameters).
    "AC": dict(layers=12, hidden=3584, heads=28, kv_heads=4, ffn=9728, vocab=65536, seq=2048),
    # MoE: 8 blocks of width 2048, 16 query / 4 KV heads of 128, 20 SwiGLU experts of 1792,
    # top-2, a 32000-token vocabulary, 1K sequences.
    "AD": dict(layers=8, hidden=2048, heads=16, kv_heads=4, ffn=1792, vocab=32000, seq=1024,
               experts=20, top_k=2),
})
CASES14 = {
    "h14t_single_AC": dict(shape="AC", world=1, scheme="single", mb=1, n_mb=2),
    "h14t_fsdp2_AC": dict(shape="AC", world=2, scheme="fsdp", mb=2, n_mb=1),
    "h14t_moe_ep2_AD": dict(shape="AD", world=2, scheme="moe", mb=4, n_mb=2),
    "h14t_ddp4_AC": dict(shape="AC", world=4, scheme="ddp", mb=1, n_mb=2),
    "h14t_fsdp4_AC_ac": dict(shape="AC", world=4, scheme="fsdp", mb=4, n_mb=1, ac=True),
    "h14t_tp4_AC": dict(shape="AC", world=4, scheme="tp", mb=4, n_mb=1),
    "h14t_pp4_1f1b_AC": dict(shape="AC", world=4, scheme="pp", mb=1, n_mb=8),
    "h14t_moe_ep4_AD": dict(shape="AD", world=4, scheme="moe", mb=4, n_mb=2),
}
# The fifteenth batch: new shapes, written 2026-11-27 17:05 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 8 blocks of width 4608, 36 query heads / 4 KV heads of 128, SwiGLU 12288, a 40960-token
    # vocabulary, 1.5K sequences (about 2.1 B parameters).
    "AG": dict(layers=8, hidden=4608, heads=36, kv_heads=4, ffn=12288, vocab=40960, seq=1536),
    # MoE: 6 blocks of width 2304, 18 query / 6 KV heads of 128, 12 SwiGLU experts of 2048,
    # top-3, a 32000-token vocabulary, 1K sequences.
    "AH": dict(layers=6, hidden=2304, heads=18, kv_heads=6, ffn=2048, vocab=32000, seq=1024,
               experts=12, top_k=3),
})
CASES15 = {
    "h15t_single_AG": dict(shape="AG", world=1, scheme="single", mb=1, n_mb=2),
    "h15t_tp2_AG": dict(shape="AG", world=2, scheme="tp", mb=2, n_mb=1),
    "h15t_moe_ep2_AH": dict(shape="AH", world=2, scheme="moe", mb=4, n_mb=2),
    "h15t_ddp4_AG": dict(shape="AG", world=4, scheme="ddp", mb=1, n_mb=2),
    "h15t_fsdp4_AG": dict(shape="AG", world=4, scheme="fsdp", mb=2, n_mb=1),
    "h15t_tp4_AG": dict(shape="AG", world=4, scheme="tp", mb=4, n_mb=1),
    "h15t_pp4_1f1b_AG": dict(shape="AG", world=4, scheme="pp", mb=1, n_mb=8),
    "h15t_moe_ep4_AH": dict(shape="AH", world=4, scheme="moe", mb=4, n_mb=2),
}
# The sixteenth batch (MoE-heavy, issue 10): new shapes, written 2026-11-27 19:55 UTC before its
# freeze (4-GPU box).
SHAPES.update({
    # 8 blocks of width 5120, 40 query heads / 8 KV heads of 128, SwiGLU 13824, a 48000-token
    # vocabulary, 2K sequences (about 2.7 B parameters).
    "AK": dict(layers=8, hidden=5120, heads=40, kv_heads=8, ffn=13824, vocab=48000, seq=2048),
    # MoE: 6 blocks of width 2048, 16 query / 4 KV heads of 128, 16 SwiGLU experts of 1408,
    # top-2, a 32000-token vocabulary, 2K sequences.
    "AL": dict(layers=6, hidden=2048, heads=16, kv_heads=4, ffn=1408, vocab=32000, seq=2048,
               experts=16, top_k=2),
    # MoE, fine-grained: 4 blocks of width 2560, 20 query / 4 KV heads of 128, 40 SwiGLU experts
    # of 768, top-4, a 32000-token vocabulary, 1K sequences.
    "AM": dict(layers=4, hidden=2560, heads=20, kv_heads=4, ffn=768, vocab=32000, seq=1024,
               experts=40, top_k=4),
})
CASES16 = {
    "h16t_single_AK": dict(shape="AK", world=1, scheme="single", mb=1, n_mb=2),
    "h16t_ddp4_AK": dict(shape="AK", world=4, scheme="ddp", mb=2, n_mb=2),
    "h16t_tp4_AK": dict(shape="AK", world=4, scheme="tp", mb=4, n_mb=1),
    "h16t_pp4_1f1b_AK": dict(shape="AK", world=4, scheme="pp", mb=1, n_mb=8),
    "h16t_moe_ep2_AL": dict(shape="AL", world=2, scheme="moe", mb=4, n_mb=2),
    "h16t_moe_ep4_AL": dict(shape="AL", world=4, scheme="moe", mb=4, n_mb=2),
    "h16t_moe_ep2_AM": dict(shape="AM", world=2, scheme="moe", mb=8, n_mb=2),
    "h16t_moe_ep4_AM": dict(shape="AM", world=4, scheme="moe", mb=8, n_mb=2),
}
# The seventeenth batch (issue 10): new shapes, written 2026-11-27 23:00 UTC before its freeze
# (4-GPU box).
SHAPES.update({
    # 12 blocks of width 4096, 32 query heads / 4 KV heads of 128, SwiGLU 11264, a 64000-token
    # vocabulary, 2K sequences (about 2.7 B parameters).
    "AQ": dict(layers=12, hidden=4096, heads=32, kv_heads=4, ffn=11264, vocab=64000, seq=2048),
    # MoE: 6 blocks of width 3072, 24 query / 8 KV heads of 128, 24 SwiGLU experts of 1536,
    # top-3, a 32000-token vocabulary, 2K sequences.
    "AR": dict(layers=6, hidden=3072, heads=24, kv_heads=8, ffn=1536, vocab=32000, seq=2048,
               experts=24, top_k=3),
})
CASES17 = {
    "h17t_single_AQ": dict(shape="AQ", world=1, scheme="single", mb=1, n_mb=2),
    "h17t_tp2_AQ": dict(shape="AQ", world=2, scheme="tp", mb=2, n_mb=1),
    "h17t_ddp4_AQ": dict(shape="AQ", world=4, scheme="ddp", mb=1, n_mb=2),
    "h17t_fsdp4_AQ": dict(shape="AQ", world=4, scheme="fsdp", mb=2, n_mb=1),
    "h17t_tp4_AQ": dict(shape="AQ", world=4, scheme="tp", mb=2, n_mb=2),
    "h17t_pp4_1f1b_AQ": dict(shape="AQ", world=4, scheme="pp", mb=1, n_mb=8),
    "h17t_moe_ep2_AR": dict(shape="AR", world=2, scheme="moe", mb=4, n_mb=2),
    "h17t_moe_ep4_AR": dict(shape="AR", world=4, scheme="moe", mb=4, n_mb=2),
}
# The eighteenth batch (issue 10): new shapes, written 2026-11-28 01:13 UTC before its freeze
# (4-GPU box).
SHAPES.update({
    # 12 blocks of width 3584, 28 query heads / 4 KV heads of 128, SwiGLU 9728, a 50000-token
    # vocabulary, 3K sequences (about 2.0 B parameters).
    "AW": dict(layers=12, hidden=3584, heads=28, kv_heads=4, ffn=9728, vocab=50000, seq=3072),
    # MoE, fine-grained: 6 blocks of width 2560, 20 query / 4 KV heads of 128, 32 SwiGLU experts
    # of 1024, top-4, a 32000-token vocabulary, 2K sequences.
    "AX": dict(layers=6, hidden=2560, heads=20, kv_heads=4, ffn=1024, vocab=32000, seq=2048,
               experts=32, top_k=4),
})
CASES18 = {
    "h18t_single_AW": dict(shape="AW", world=1, scheme="single", mb=1, n_mb=3),
    "h18t_tp2_AW": dict(shape="AW", world=2, scheme="tp", mb=2, n_mb=2),
    "h18t_ddp4_AW": dict(shape="AW", world=4, scheme="ddp", mb=1, n_mb=3),
    "h18t_fsdp4_AW": dict(shape="AW", world=4, scheme="fsdp", mb=1, n_mb=2),
    "h18t_tp4_AW": dict(shape="AW", world=4, scheme="tp", mb=4, n_mb=1),
    "h18t_pp4_1f1b_AW": dict(shape="AW", world=4, scheme="pp", mb=1, n_mb=12),
    "h18t_moe_ep2_AX": dict(shape="AX", world=2, scheme="moe", mb=2, n_mb=3),
    "h18t_moe_ep4_AX": dict(shape="AX", world=4, scheme="moe", mb=2, n_mb=3),
}
# The nineteenth batch (issue 10): new shapes, written 2026-11-28 03:20 UTC before its freeze
# (4-GPU box).
SHAPES.update({
    # 8 blocks of Llama 3 8B's width: 4096, 32 query / 8 KV heads of 128, SwiGLU 14336, a
    # 32768-token vocabulary, 2K sequences (about 2.0 B parameters).
    "BA": dict(layers=8, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32768, seq=2048),
    # MoE, very fine-grained: 6 blocks of width 2048, 16 query / 4 KV heads of 128, 48 SwiGLU
    # experts of 768, top-6, a 32000-token vocabulary, 2K sequences.
    "BB": dict(layers=6, hidden=2048, heads=16, kv_heads=4, ffn=768, vocab=32000, seq=2048,
               experts=48, top_k=6),
})
CASES19 = {
    "h19t_single_BA": dict(shape="BA", world=1, scheme="single", mb=1, n_mb=3),
    "h19t_tp2_BA": dict(shape="BA", world=2, scheme="tp", mb=2, n_mb=2),
    "h19t_ddp4_BA": dict(shape="BA", world=4, scheme="ddp", mb=1, n_mb=2),
    "h19t_fsdp4_BA": dict(shape="BA", world=4, scheme="fsdp", mb=2, n_mb=1),
    "h19t_tp4_BA": dict(shape="BA", world=4, scheme="tp", mb=4, n_mb=1),
    "h19t_pp4_1f1b_BA": dict(shape="BA", world=4, scheme="pp", mb=1, n_mb=8),
    "h19t_moe_ep2_BB": dict(shape="BB", world=2, scheme="moe", mb=2, n_mb=2),
    "h19t_moe_ep4_BB": dict(shape="BB", world=4, scheme="moe", mb=2, n_mb=2),
}
CASES = dict(CASES8, **CASES9, **CASES10, **CASES11, **CASES12, **CASES13, **CASES14, **CASES15,
             **CASES16, **CASES17, **CASES18, **CASES19)
BATCH_X2 = [k for k, c in CASES.items() if c["world"] <= 2]
BATCH_X4 = [k for k, c in CASES.items() if c["world"] == 4]


TINY = {"on": False}  # --tiny: see case_config


def case_config(name: str, quick: bool) -> dict:
    """The case's settings with its model shape (shrunk with ``quick``) under ``model``; with
    ``--tiny`` the same layers, heads and vocabulary at head dim 16, ffn 2x hidden and 128-token
    sequences on the GPU: a host-bound step, to measure the host's time per launched kernel."""
    c = dict(CASES[name])
    m = dict(SHAPES[c["shape"]])
    if quick:
        keep = {k: m[k] for k in ("experts", "top_k") if k in m}
        m = dict(QUICK, **keep)
    elif TINY["on"]:
        m.update(hidden=16 * m["heads"], ffn=32 * m["heads"], seq=128)
    c["model"] = m
    c.setdefault("ac", False)
    return c


# ----------------------------------------------------------------------------- collectives

class _CopyToTP(torch.autograd.Function):
    """Identity forward, gradient all-reduced over the TP group backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g)
        return g


class _ReduceFromTP(torch.autograd.Function):
    """Partial sums all-reduced forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class _GatherLast(torch.autograd.Function):
    """All-gather along the last dimension forward; the local slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x):
        world, rank = dist.get_world_size(), dist.get_rank()
        ctx.rank, ctx.n = rank, x.shape[-1]
        parts = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(parts, x.contiguous())
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, g):
        return g[..., ctx.rank * ctx.n:(ctx.rank + 1) * ctx.n].contiguous()


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows with uneven splits; backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits):
        ctx.out_splits, ctx.in_splits = out_splits, in_splits
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits)
        return out

    @staticmethod
    def backward(ctx, g):
        back = g.new_empty((sum(ctx.in_splits),) + tuple(g.shape[1:]))
        dist.all_to_all_single(back, g.contiguous(), ctx.in_splits, ctx.out_splits)
        return back, None, None


# ----------------------------------------------------------------------------- the model

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight


def rope_tables(seq: int, head_dim: int, base: float = 10000.0):
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)  # (seq, head_dim)
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):
    """x: (batch, heads, seq, head_dim); rotate-half form."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class Attention(nn.Module):
    """GQA; with ``tp`` > 1 the heads are split over the TP ranks (column wq/wk/wv, row wo)."""

    def __init__(self, m: dict, tp: int = 1):
        super().__init__()
        h, hd = m["hidden"], m["hidden"] // m["heads"]
        self.nh, self.nkv, self.hd, self.tp = m["heads"] // tp, m["kv_heads"] // tp, hd, tp
        self.wq = nn.Linear(h, self.nh * hd, bias=False)
        self.wk = nn.Linear(h, self.nkv * hd, bias=False)
        self.wv = nn.Linear(h, self.nkv * hd, bias=False)
        self.wo = nn.Linear(self.nh * hd, h, bias=False)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        if self.tp > 1:
            x = _CopyToTP.apply(x)
        q = self.wq(x).view(b, s, self.nh, self.hd).transpose(1, 2)
        k = self.wk(x).view(b, s, self.nkv, self.hd).transpose(1, 2)
        v = self.wv(x).view(b, s, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = self.wo(o.transpose(1, 2).reshape(b, s, self.nh * self.hd))
        return _ReduceFromTP.apply(o) if self.tp > 1 else o


class SwiGLU(nn.Module):
    def __init__(self, h: int, f: int, tp: int = 1):
        super().__init__()
        self.tp = tp
        self.w1 = nn.Linear(h, f // tp, bias=False)
        self.w3 = nn.Linear(h, f // tp, bias=False)
        self.w2 = nn.Linear(f // tp, h, bias=False)

    def forward(self, x):
        if self.tp > 1:
            x = _CopyToTP.apply(x)
        y = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return _ReduceFromTP.apply(y) if self.tp > 1 else y


class MoE(nn.Module):
    """Top-k routed SwiGLU experts, ``experts / world`` of them on this rank."""

    def __init__(self, m: dict, world: int, rank: int):
        super().__init__()
        self.E, self.k, self.world = m["experts"], m["top_k"], world
        self.local = self.E // world
        self.first = rank * self.local
        self.router = nn.Linear(m["hidden"], self.E, bias=False)
        self.experts = nn.ModuleList(SwiGLU(m["hidden"], m["ffn"]) for _ in range(self.local))
        self.rows: list[list[int]] = []  # per call, the rows each local expert ran (--expert-rows)

    def forward(self, x):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits = self.router(x).float()
        top, idx = logits.topk(self.k, dim=-1)           # (T, k)
        weights = top.softmax(dim=-1).type_as(x)
        back = self.dispatch_experts(x, idx.reshape(-1))
        y = (back.view(-1, self.k, shape[-1]) * weights.unsqueeze(-1)).sum(1)
        return y.view(shape)

    def dispatch_experts(self, x, flat):
        """The rows ``x`` (T, h) sent to the experts ``flat`` (T*k,) chose, each local expert
        run on its rows in turn, and the results brought back: (T*k, h) in ``flat``'s order."""
        order = flat.argsort(stable=True)
        sent = x[order // self.k]                        # rows sorted by expert
        counts = torch.bincount(flat, minlength=self.E)  # per expert, this rank's tokens
        if self.world > 1:
            got = torch.empty_like(counts)
            dist.all_to_all_single(got, counts)          # [source][local expert]
            send = counts.view(self.world, self.local).sum(1).tolist()
            got_l = got.tolist()
            recv = [sum(got_l[s * self.local:(s + 1) * self.local]) for s in range(self.world)]
            rows = _AllToAll.apply(sent, recv, send)
            local_ids = torch.arange(self.local, device=x.device).repeat(self.world)
            local_ids = local_ids.repeat_interleave(got)
            by_exp = local_ids.argsort(stable=True)
            rows = rows[by_exp]
            runs = got.view(self.world, self.local).sum(0).tolist()
        else:
            rows, runs, by_exp = sent, counts.tolist(), None
        self.rows.append(list(runs))
        outs, start = [], 0
        for e, n in enumerate(runs):  # each local expert on its contiguous run, in turn
            outs.append(self.experts[e](rows[start:start + n]))
            start += n
        y = torch.cat(outs, dim=0)
        if self.world > 1:
            undo = torch.empty_like(by_exp)
            undo[by_exp] = torch.arange(by_exp.numel(), device=x.device)
            y = _AllToAll.apply(y[undo], send, recv)
        back = torch.empty_like(y)
        back[order] = y
        return back


class Block(nn.Module):
    def __init__(self, m: dict, tp: int = 1, moe: tuple | None = None):
        super().__init__()
        self.attn_norm = RMSNorm(m["hidden"])
        self.attn = Attention(m, tp)
        self.mlp_norm = RMSNorm(m["hidden"])
        self.mlp = MoE(m, *moe) if moe else SwiGLU(m["hidden"], m["ffn"], tp)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    """Blocks ``lo..hi`` of the model, with the embedding when ``first`` and the final norm and
    LM head when ``last`` (the whole model by default)."""

    def __init__(self, m: dict, tp: int = 1, moe: tuple | None = None, lo: int = 0,
                 hi: int | None = None, first: bool = True, last: bool = True):
        super().__init__()
        hi = m["layers"] if hi is None else hi
        self.tp, self.ac = tp, False
        self.embed = nn.Embedding(m["vocab"], m["hidden"]) if first else None
        self.layers = nn.ModuleList(Block(m, tp, moe) for _ in range(lo, hi))
        self.norm = RMSNorm(m["hidden"]) if last else None
        self.head = nn.Linear(m["hidden"], m["vocab"] // tp, bias=False) if last else None
        cos, sin = rope_tables(m["seq"], m["hidden"] // m["heads"])
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for blk in self.layers:
            if self.ac:
                from torch.utils.checkpoint import checkpoint
                x = checkpoint(blk, x, cos, sin, use_reentrant=False)
            else:
                x = blk(x, cos, sin)
        if self.head is None:
            return x
        x = self.norm(x)
        if self.tp > 1:
            return _GatherLast.apply(self.head(_CopyToTP.apply(x)))
        return self.head(x)


# ----------------------------------------------------------------------------- steps

def loss_fn(logits, y):
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def make_optimizer(params, dev):
    fused = dev.type == "cuda"
    return torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8,
                             fused=fused, foreach=None if fused else True)


def clip_distributed(params, max_norm: float = 1.0, sharded=None) -> None:
    """Global-norm clipping by hand: squared norms of this rank's gradients (``sharded`` decides
    which ones are counted; replicated ones are counted on rank 0 only), one all-reduce."""
    with_grad = [p for p in params if p.grad is not None]
    grads = [p.grad for p in with_grad]
    if not grads:
        return
    rank = dist.get_rank()
    counted = [p.grad for p in with_grad if sharded is None or sharded(p) or rank == 0]
    norms = torch._foreach_norm(counted) if counted else []
    sq = (torch.stack([n.float() for n in norms]).pow(2).sum() if norms
          else torch.zeros((), device=grads[0].device))
    dist.all_reduce(sq)
    coef = (max_norm / (sq.sqrt() + 1e-6)).clamp(max=1.0)
    torch._foreach_mul_(grads, coef.to(grads[0].dtype))


def make_data(c, seed: int, dev, n: int):
    g = torch.Generator(device="cpu").manual_seed(seed)
    m = c["model"]
    mk = lambda: torch.randint(0, m["vocab"], (c["mb"], m["seq"]), generator=g).to(dev)  # noqa: E731
    return [(mk(), mk()) for _ in range(n)]


def to_bf16(model, dev):
    return model.to(device=dev, dtype=torch.bfloat16)


def build_plain(c, rank, world, dev):
    """single, ddp and fsdp."""
    torch.manual_seed(0)
    model = to_bf16(Llama(c["model"]), dev)
    data = make_data(c, 1000 + rank, dev, c["n_mb"])
    wrapped = model
    if c["scheme"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        wrapped = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None,
                      bucket_cap_mb=50, gradient_as_bucket_view=True)
    elif c["scheme"] == "fsdp":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # PyTorch < 2.6
            from torch.distributed._composable.fsdp import fully_shard
        model.ac = c["ac"]
        for blk in model.layers:
            fully_shard(blk, reshard_after_forward=True)
        fully_shard(model, reshard_after_forward=True)
    opt = make_optimizer(model.parameters(), dev)

    def step():
        for i, (x, y) in enumerate(data):
            last = i == len(data) - 1
            ctx = (wrapped.no_sync() if c["scheme"] == "ddp" and not last
                   else contextlib.nullcontext())
            with ctx:
                (loss_fn(wrapped(x), y) / len(data)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return [model], step


def build_tp(c, rank, world, dev):
    torch.manual_seed(0)
    model = to_bf16(Llama(c["model"], tp=world), dev)
    data = make_data(c, 1000, dev, c["n_mb"])  # the same batch on every TP rank
    opt = make_optimizer(model.parameters(), dev)
    # the norms and the embedding are replicated (identical gradients on every rank)
    replicated = {id(p) for n, p in model.named_parameters() if "norm" in n or "embed" in n}
    params = list(model.parameters())

    def step():
        for x, y in data:
            (loss_fn(model(x), y) / len(data)).backward()
        clip_distributed(params, 1.0, sharded=lambda p: id(p) not in replicated)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return [model], step


def _p2p(ops):
    """Post a group of sends/receives and wait for all of them."""
    if ops:
        for r in dist.batch_isend_irecv(ops):
            r.wait()


def build_pp(c, rank, world, dev):
    m = c["model"]
    per = m["layers"] // world
    torch.manual_seed(rank)
    first, last = rank == 0, rank == world - 1
    model = to_bf16(Llama(m, lo=rank * per, hi=(rank + 1) * per, first=first, last=last), dev)
    data = make_data(c, 1000, dev, c["n_mb"])
    opt = make_optimizer(model.parameters(), dev)
    params = list(model.parameters())
    shape = (c["mb"], m["seq"], m["hidden"])
    prev, nxt = rank - 1, rank + 1
    n_mb = c["n_mb"]

    def recv_buf():
        return torch.empty(shape, dtype=torch.bfloat16, device=dev)

    def forward(i, x_in):
        x = data[i][0] if first else x_in
        out = model(x)
        if last:
            return x_in, (loss_fn(out, data[i][1]) / n_mb)
        return x_in, out

    def backward(x_in, out, g):
        if last:
            out.backward()
        else:
            torch.autograd.backward(out, g)
        return None if first else x_in.grad

    def step():
        warm = min(world - rank - 1, n_mb)
        inflight = []
        for i in range(warm):
            x = None
            if not first:
                x = recv_buf().requires_grad_(True)
                _p2p([dist.P2POp(dist.irecv, x, prev)])
            x, out = forward(i, x)
            _p2p([dist.P2POp(dist.isend, out.detach(), nxt)])
            inflight.append((x, out))
        x = None
        if n_mb > warm and not first:
            x = recv_buf().requires_grad_(True)
            _p2p([dist.P2POp(dist.irecv, x, prev)])
        steady = n_mb - warm
        for j in range(steady):
            x, out = forward(warm + j, x)
            inflight.append((x, out))
            g = None
            if not last:  # send this activation, receive the oldest gradient
                g = recv_buf()
                _p2p([dist.P2POp(dist.isend, out.detach(), nxt), dist.P2POp(dist.irecv, g, nxt)])
            gx = backward(*inflight.pop(0), g)
            x = None
            if j == steady - 1:
                if not first:
                    _p2p([dist.P2POp(dist.isend, gx, prev)])
            elif not first:  # send the input gradient, receive the next activation
                x = recv_buf().requires_grad_(True)
                _p2p([dist.P2POp(dist.isend, gx, prev), dist.P2POp(dist.irecv, x, prev)])
        for _ in range(warm):
            g = recv_buf()
            _p2p([dist.P2POp(dist.irecv, g, nxt)])
            gx = backward(*inflight.pop(0), g)
            if not first:
                _p2p([dist.P2POp(dist.isend, gx, prev)])
        clip_distributed(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return [model], step


def build_moe(c, rank, world, dev):
    torch.manual_seed(0)  # replicated parts identical on every rank
    model = Llama(c["model"], moe=(world, rank))
    torch.manual_seed(100 + rank)
    for blk in model.layers:  # this rank's experts differ from the other ranks'
        for e in blk.mlp.experts:
            for p in e.parameters():
                nn.init.normal_(p, std=0.02)
    model = to_bf16(model, dev)
    data = make_data(c, 1000 + rank, dev, c["n_mb"])
    opt = make_optimizer(model.parameters(), dev)
    expert = {id(p) for blk in model.layers for p in blk.mlp.experts.parameters()}
    params = list(model.parameters())
    shared = [p for p in params if id(p) not in expert]
    local = [p for p in params if id(p) in expert]

    def step():
        for x, y in data:
            (loss_fn(model(x), y) / len(data)).backward()
        for p in shared:  # one all-reduce per replicated parameter, no bucketing
            dist.all_reduce(p.grad)
            p.grad.div_(world)
        grads = [p.grad for p in local if p.grad is not None]
        if grads:
            torch._foreach_div_(grads, world)
        clip_distributed(params, 1.0, sharded=lambda p: id(p) in expert)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return [model], step


# ----------------------------------------------------------------------------- measuring

def setup(quick: bool):
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if quick:
        dev = torch.device("cpu")
        torch.set_num_threads(1)
    else:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(dev)
    if world > 1:
        dist.init_process_group("gloo" if quick else "nccl", device_id=None if quick else dev)
        dist.barrier()
    return rank, world, dev


def log(msg: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, flush=True)


def gather(x: float, world: int, dev) -> list[float]:
    if world == 1:
        return [x]
    t = torch.tensor([x], dtype=torch.float64, device=dev)
    out = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(out, t)
    return [float(o) for o in out]


def time_steps(step, dev, warmup: int, timed: int, world: int) -> dict:
    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for i in range(warmup):
        step()
        log(f"  warm-up {i + 1}/{warmup}")
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    for _ in range(timed):
        sync()
        if world > 1:
            dist.barrier()
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    per_rank = [gather(t, world, dev) for t in times]  # [step][rank]
    slowest = [max(r) for r in per_rank]
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0
    peaks = gather(peak, world, dev)
    return dict(step_time_s=statistics.median(slowest), step_time_min_s=min(slowest),
                step_time_max_s=max(slowest), step_times_s=slowest,
                step_time_s_by_rank=[statistics.median(r[k] for r in per_rank)
                                     for k in range(world)],
                peak_memory_gib=max(peaks), peak_memory_gib_by_rank=[round(p, 3) for p in peaks],
                warmup_steps=warmup, timed_steps=timed)


def model_flops(c, world: int) -> float:
    """Model FLOPs of a step: 6 x tokens x matrix parameters (experts top_k times, router and LM
    head included) plus causal attention, 3 x 2 x b x s^2 x h per layer."""
    m = c["model"]
    h, L, s = m["hidden"], m["layers"], m["seq"]
    kv = m["kv_heads"] * (h // m["heads"])
    attn = 2 * h * h + 2 * h * kv
    mlp = 3 * h * m["ffn"] * (m["top_k"] if "experts" in m else 1)
    if "experts" in m:
        mlp += h * m["experts"]
    replicas = world if c["scheme"] in ("ddp", "fsdp", "moe") else 1
    seqs = c["mb"] * c["n_mb"] * replicas
    fwd = 2 * seqs * s * (L * (attn + mlp) + h * m["vocab"]) + L * 2 * seqs * s * s * h
    return 3.0 * fwd


def run_case(args) -> None:
    rank, world, dev = setup(args.quick)
    c = case_config(args.case, args.quick)
    assert c["world"] == world, f"{args.case} needs {c['world']} ranks, got {world}"
    warmup, timed = (2, 2) if args.quick else (args.warmup, args.steps)
    t_start = time.time()
    rec = {"op": "train_step", "script": SCRIPT, "case": args.case, "gpus": world,
           "run": args.label, "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "model": c["model"], "scheme": c["scheme"], "micro_batch": c["mb"],
           "micro_batches": c["n_mb"], "activation_checkpointing": c["ac"],
           "schedule": "1f1b" if c["scheme"] == "pp" else None,
           "optimizer": "AdamW(lr 3e-4, betas (0.9,0.95), wd 0.1, fused=True) on bf16 params, "
                        "clip 1.0",
           "block": "Llama: RMSNorm, RoPE cos/sin, GQA repeat_interleave + SDPA is_causal, "
                    "SwiGLU, no biases, untied", "model_flops_per_step": model_flops(c, world),
           "env": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev)
                   if dev.type == "cuda" else "cpu",
                   "nccl": ".".join(map(str, torch.cuda.nccl.version()))
                   if dev.type == "cuda" else None}}
    build = {"tp": build_tp, "pp": build_pp, "moe": build_moe}.get(c["scheme"], build_plain)
    mods, step = build(c, rank, world, dev)
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                for mod in mods for p in mod.parameters())  # a DTensor's own shard
    rec["params_per_rank"] = [int(n) for n in gather(float(local), world, dev)]
    log(f"{args.case} built ({rec['params_per_rank'][0]:,} parameters on rank 0)")
    rec.update(time_steps(step, dev, warmup, timed, world))
    if args.profile and dev.type == "cuda":  # diagnostics only: steps.py's profiler record
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from steps import profile_step
        profile_step(args, step, args.case, rank, world, dev)
    moes = [m for mod in mods for m in mod.modules() if isinstance(m, MoE)]
    if args.expert_rows and moes:
        os.makedirs(args.out, exist_ok=True)  # diagnostics: each MoE call's rows per expert
        with open(os.path.join(args.out, f"expert_rows-{args.case}-r{rank}.json"), "w") as f:
            json.dump({"script": SCRIPT, "case": args.case, "rank": rank, "warmup": warmup,
                       "timed": timed, "layers": [m.rows for m in moes]}, f)
    if rank == 0:
        rec["tflops_per_gpu"] = rec["model_flops_per_step"] / rec["step_time_s"] / world / 1e12
        print(f"RESULT {args.case}: step {rec['step_time_s']:.4f} s (min "
              f"{rec['step_time_min_s']:.4f}, max {rec['step_time_max_s']:.4f}), peak "
              f"{rec['peak_memory_gib']:.2f} GiB", flush=True)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "steps.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
    log(f"{args.case} done in {time.time() - t_start:.1f} s")
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- driver

def phase(args, name, rc, wall, note):
    with open(os.path.join(args.out, "phases.jsonl"), "a") as f:
        f.write(json.dumps({"script": SCRIPT, "case": name, "rc": rc,
                            "wall_s": round(wall, 2), "note": note}) + "\n")


def driver(args) -> int:
    """One torchrun per case, each under ``--case-timeout-s``, all under ``--budget-s``."""
    names = args.only.split(",") if args.only else BATCH_X2
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
               f"--nproc_per_node={c['world']}", os.path.abspath(__file__), "--case", name,
               "--out", args.out, "--warmup", str(args.warmup), "--steps", str(args.steps),
               "--label", args.label]
        if args.quick:
            cmd.append("--quick")
        if args.profile:
            cmd.append("--profile")
        if args.expert_rows:
            cmd.append("--expert-rows")
        if TINY["on"]:
            cmd.append("--tiny")
        print(f"=== {name} ({c['world']} ranks, limit {limit:.0f} s)", flush=True)
        t = time.time()
        p = subprocess.Popen(cmd, start_new_session=True)
        try:
            rc, note = p.wait(timeout=limit), ""
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.wait()
            rc, note = -9, "timed out"
        phase(args, name, rc, time.time() - t, note)
        print(f"=== {name} rc={rc} {time.time() - t:.1f} s {note}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--driver", action="store_true")
    ap.add_argument("--case", choices=sorted(CASES))
    ap.add_argument("--only", default="", help="comma-separated cases (default: the 2-GPU batch)")
    ap.add_argument("--out", default="/tmp/steps_third")
    ap.add_argument("--quick", action="store_true", help="tiny models on the CPU with gloo")
    ap.add_argument("--label", default="first", help="recorded as 'run' in each line")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--case-timeout-s", type=float, default=75)
    ap.add_argument("--expert-rows", action="store_true",
                    help="write each MoE call's rows per local expert (expert_rows-CASE-rN.json)")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, one more step under torch.profiler (steps.py's record)")
    ap.add_argument("--tiny", action="store_true",
                    help="each case at head dim 16, ffn 2x hidden, 128-token sequences (same "
                         "layers, scheme and vocabulary) on the GPU: a host-bound step")
    args = ap.parse_args()
    TINY["on"] = args.tiny
    if args.driver:
        return driver(args)
    if not args.case:
        ap.error("give --driver or --case")
    run_case(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
