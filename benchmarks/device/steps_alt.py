"""Training steps of a NanoGPT/GPT-2-style model, a second measuring script for held-out batches.

Written for issue 12 ("a script written differently from the calibration scripts"), from
scratch and independently of both the simulator's op lists and ``steps.py``: a GPT-2 block
(LayerNorm with biases, one fused ``c_attn`` QKV Linear laid out per head as [q|k|v],
``F.scaled_dot_product_attention(is_causal=True)``, a 4x GELU(tanh) MLP, biases on every Linear
but the LM head, a learned positional embedding ``wpe``, no dropout), and every parallel scheme
taken from PyTorch's own library where it has one:

- ``single``: one GPU.  ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` (default 25 MB
  buckets, ``gradient_as_bucket_view=False``), ``no_sync()`` on all but the last micro-batch.
- ``ddp`` with ``straggler``: the same, rank 0's compute made ``straggler`` times as long by
  GPU-side padding (see ``Pacer``).
- ``fsdp``: FSDP2 ``fully_shard`` on every block and on the root, ``MixedPrecisionPolicy``
  (bf16 parameters, fp32 gradient reduce-scatter), optionally ``torch.utils.checkpoint`` per block.
- ``tp``: ``torch.distributed.tensor.parallel`` (DTensor): ``ColwiseParallel`` on ``c_attn``,
  ``c_fc`` and the LM head, ``RowwiseParallel`` on both ``c_proj`` and the token embedding,
  ``SequenceParallel`` on the LayerNorms with ``sp`` (``PrepareModuleInput`` before attention and
  MLP), the loss under ``loss_parallel()``.
- ``pp``: ``torch.distributed.pipelining``: one ``PipelineStage`` per model chunk and
  ``ScheduleGPipe`` / ``Schedule1F1B`` / ``ScheduleInterleaved1F1B``.
- ``moe``: every MLP a mixture of ``experts`` GELU experts, top-2 routing (softmax over all
  experts, the two largest renormalised), experts spread over all ranks (expert parallelism =
  world), tokens dispatched and combined by ``torch.distributed.nn.functional.all_to_all_single``
  (autograd-aware) after one count exchange, local experts computed one after another; the
  replicated (non-expert) gradients all-reduced after the last backward in flat 25 MiB buckets.

Precision: ``torch.autocast(bfloat16)`` over fp32 weights (AMP; fp32 master weights, no bf16
copy) in every scheme but ``fsdp``, which keeps bf16 parameters through its
``MixedPrecisionPolicy`` and runs without autocast (as FSDP2 scripts do). Optimizer:
``torch.optim.AdamW`` with ``foreach=True`` (PyTorch's default on CUDA), lr 3e-4, betas
(0.9, 0.95), weight decay 0.1, no gradient clipping. The loss is ``F.cross_entropy`` on the
logits cast to fp32. Embeddings tied (``lm_head.weight is wte.weight``, as NanoGPT) in ``single``,
``ddp``, ``fsdp`` and ``moe``; untied in ``tp`` and ``pp`` (the two matrices are split
differently there, as TorchTitan does).

Usage (one host, from the repository root)::

    python3 benchmarks/device/steps_alt.py --driver --out DIR [--only c1,c2] [--budget-s 400]
    python3 -m torch.distributed.run --standalone --nproc_per_node=N \
        benchmarks/device/steps_alt.py --case NAME --out DIR      # one case (what the driver runs)

``--quick`` shrinks every model and runs on the CPU with gloo (a dry run; the numbers mean
nothing). Each case appends one JSON line to ``DIR/steps.jsonl``; the driver logs each case's
exit code and wall time to ``DIR/phases.jsonl``.

Step timing: synchronise and barrier, host clock, every micro-batch's forward and backward, the
scheme's gradient reduction, ``optimizer.step()``, ``zero_grad(set_to_none=True)``, synchronise,
host clock. The slowest rank's time counts for each step; ``step_time_s`` is the median over
the timed steps after warm-up; ``peak_memory_gib`` is ``torch.cuda.max_memory_allocated()``
over the timed steps, worst rank.
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
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# ----------------------------------------------------------------------------- cases

SHAPES = {
    # 20 GPT-2 blocks of width 1792 (14 heads of 128), GPT-2's padded vocabulary, 1K sequences.
    "U": dict(layers=20, hidden=1792, heads=14, vocab=50304, seq=1024),
    # 16 blocks of width 2304 (24 heads of 96), a 32K vocabulary, 2K sequences.
    "V": dict(layers=16, hidden=2304, heads=24, vocab=32768, seq=2048),
    # MoE: 8 blocks of width 1280 (10 heads of 128), 8 GELU experts of 2560, top-2, 1K sequences.
    "W": dict(layers=8, hidden=1280, heads=10, vocab=32768, seq=1024, experts=8, top_k=2,
              expert_ffn=2560),
}
QUICK = dict(layers=8, hidden=64, heads=4, vocab=512, seq=32)

# name: shape, world, scheme, micro_batch, micro-batches per step, extras
CASES = {
    # 2-GPU box (and its 1-GPU baselines)
    "h6_single_U": dict(shape="U", world=1, scheme="single", mb=4, n_mb=2),
    "h6_single_V": dict(shape="V", world=1, scheme="single", mb=2, n_mb=2),
    "h6_ddp2_U": dict(shape="U", world=2, scheme="ddp", mb=4, n_mb=2),
    "h6_ddp2_U_straggler": dict(shape="U", world=2, scheme="ddp", mb=4, n_mb=2, straggler=1.2),
    "h6_fsdp2_U": dict(shape="U", world=2, scheme="fsdp", mb=8, n_mb=1),
    "h6_fsdp2_V_ac": dict(shape="V", world=2, scheme="fsdp", mb=4, n_mb=1, ac=True),
    "h6_tp2_U": dict(shape="U", world=2, scheme="tp", mb=8, n_mb=1),
    "h6_tp2sp_V": dict(shape="V", world=2, scheme="tp", sp=True, mb=4, n_mb=2),
    "h6_pp2_1f1b_V": dict(shape="V", world=2, scheme="pp", schedule="1f1b", mb=1, n_mb=8),
    "h6_pp2_int2_V": dict(shape="V", world=2, scheme="pp", schedule="interleaved", v=2, mb=1,
                          n_mb=8),
    "h6_moe_ep2_W": dict(shape="W", world=2, scheme="moe", mb=8, n_mb=2),
    # 4-GPU box
    "h6_ddp4_U": dict(shape="U", world=4, scheme="ddp", mb=4, n_mb=2),
    "h6_fsdp4_V_ac": dict(shape="V", world=4, scheme="fsdp", mb=4, n_mb=1, ac=True),
    "h6_tp4sp_V": dict(shape="V", world=4, scheme="tp", sp=True, mb=4, n_mb=2),
    "h6_pp4_gpipe_V": dict(shape="V", world=4, scheme="pp", schedule="gpipe", mb=1, n_mb=8),
    "h6_pp4_int2_V": dict(shape="V", world=4, scheme="pp", schedule="interleaved", v=2, mb=1,
                          n_mb=8),
    "h6_moe_ep4_W": dict(shape="W", world=4, scheme="moe", mb=8, n_mb=2),
}
# The seventh batch (heldout-freeze-7): new shapes, written after the sixth was measured.
SHAPES.update({
    # 24 GPT-2 blocks of width 2048 (16 heads of 128), GPT-2's padded vocabulary, 2K sequences.
    "X": dict(layers=24, hidden=2048, heads=16, vocab=50304, seq=2048),
    # MoE: 6 blocks of width 1536 (12 heads of 128), 8 GELU experts of 4096, top-2, 2K sequences.
    "Y": dict(layers=6, hidden=1536, heads=12, vocab=32768, seq=2048, experts=8, top_k=2,
              expert_ffn=4096),
})
CASES7 = {
    "h7_single_X": dict(shape="X", world=1, scheme="single", mb=2, n_mb=2),
    "h7_ddp2_X": dict(shape="X", world=2, scheme="ddp", mb=2, n_mb=2),
    "h7_ddp2_X_straggler": dict(shape="X", world=2, scheme="ddp", mb=2, n_mb=2, straggler=1.3),
    "h7_fsdp2_X": dict(shape="X", world=2, scheme="fsdp", mb=4, n_mb=1),
    "h7_fsdp2_X_ac": dict(shape="X", world=2, scheme="fsdp", mb=4, n_mb=1, ac=True),
    "h7_tp2_X": dict(shape="X", world=2, scheme="tp", mb=4, n_mb=1),
    "h7_tp2sp_X": dict(shape="X", world=2, scheme="tp", sp=True, mb=2, n_mb=2),
    "h7_pp2_gpipe_X": dict(shape="X", world=2, scheme="pp", schedule="gpipe", mb=1, n_mb=8),
    "h7_pp2_1f1b_X": dict(shape="X", world=2, scheme="pp", schedule="1f1b", mb=2, n_mb=4),
    "h7_moe_ep2_Y": dict(shape="Y", world=2, scheme="moe", mb=4, n_mb=2),
}
CASES.update(CASES7)
# The eighth batch: new shapes, written after the seventh was measured (2-GPU and 4-GPU cases).
SHAPES.update({
    # 20 GPT-2 blocks of width 2560 (20 heads of 128), GPT-2's padded vocabulary, 1K sequences.
    "Z": dict(layers=20, hidden=2560, heads=20, vocab=50304, seq=1024),
    # MoE: 8 blocks of width 1024 (8 heads of 128), 16 GELU experts of 2048, top-2, 1K sequences.
    "Q": dict(layers=8, hidden=1024, heads=8, vocab=32768, seq=1024, experts=16, top_k=2,
              expert_ffn=2048),
})
CASES8 = {
    "h8_ddp2_Z": dict(shape="Z", world=2, scheme="ddp", mb=4, n_mb=2),
    "h8_tp2sp_Z": dict(shape="Z", world=2, scheme="tp", sp=True, mb=4, n_mb=1),
    "h8_moe_ep2_Q": dict(shape="Q", world=2, scheme="moe", mb=8, n_mb=2),
    "h8_ddp4_Z_straggler": dict(shape="Z", world=4, scheme="ddp", mb=4, n_mb=2, straggler=1.2),
    "h8_fsdp4_Z_ac": dict(shape="Z", world=4, scheme="fsdp", mb=4, n_mb=1, ac=True),
    "h8_tp4sp_Z": dict(shape="Z", world=4, scheme="tp", sp=True, mb=4, n_mb=1),
    "h8_pp4_1f1b_Z": dict(shape="Z", world=4, scheme="pp", schedule="1f1b", mb=2, n_mb=8),
    "h8_moe_ep4_Q": dict(shape="Q", world=4, scheme="moe", mb=8, n_mb=2),
}
CASES.update(CASES8)
# The ninth batch: new shapes, written after the eighth was measured and diagnosed (4-GPU box).
SHAPES.update({
    # 16 GPT-2 blocks of width 3072 (24 heads of 128), GPT-2's padded vocabulary, 2K sequences.
    "R": dict(layers=16, hidden=3072, heads=24, vocab=50304, seq=2048),
    # MoE: 6 blocks of width 2048 (16 heads of 128), 8 GELU experts of 3072, top-2, 1K sequences.
    "S": dict(layers=6, hidden=2048, heads=16, vocab=32768, seq=1024, experts=8, top_k=2,
              expert_ffn=3072),
})
CASES9 = {
    "h9_tp4sp_R": dict(shape="R", world=4, scheme="tp", sp=True, mb=2, n_mb=2),
    "h9_fsdp4_R": dict(shape="R", world=4, scheme="fsdp", mb=2, n_mb=1),
    "h9_pp4_int2_R": dict(shape="R", world=4, scheme="pp", schedule="interleaved", v=2, mb=1,
                          n_mb=8),
    "h9_ddp4_R_straggler": dict(shape="R", world=4, scheme="ddp", mb=1, n_mb=2, straggler=1.3),
    "h9_moe_ep4_S": dict(shape="S", world=4, scheme="moe", mb=8, n_mb=2),
}
CASES.update(CASES9)
# The tenth batch: a new shape, written 2026-11-27 03:35 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 16 GPT-2 blocks of width 2816 (22 heads of 128), GPT-2's padded vocabulary, 1K sequences.
    "T": dict(layers=16, hidden=2816, heads=22, vocab=50304, seq=1024),
})
CASES10 = {
    "h10_tp2sp_T": dict(shape="T", world=2, scheme="tp", sp=True, mb=4, n_mb=1),
    "h10_ddp4_T_straggler": dict(shape="T", world=4, scheme="ddp", mb=4, n_mb=2, straggler=1.2),
    "h10_fsdp4_T_ac": dict(shape="T", world=4, scheme="fsdp", mb=4, n_mb=1, ac=True),
    "h10_pp4_gpipe_T": dict(shape="T", world=4, scheme="pp", schedule="gpipe", mb=2, n_mb=8),
    "h10_pp4_1f1b_T": dict(shape="T", world=4, scheme="pp", schedule="1f1b", mb=2, n_mb=8),
}
CASES.update(CASES10)
# The eleventh batch: new shapes, written 2026-11-27 06:35 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 16 GPT-2 blocks of width 3584 (28 heads of 128), GPT-2's padded vocabulary, 1K sequences.
    "P": dict(layers=16, hidden=3584, heads=28, vocab=50304, seq=1024),
    # MoE: 8 blocks of width 1536 (12 heads of 128), 16 GELU experts of 1024, top-4, 1K sequences.
    "M": dict(layers=8, hidden=1536, heads=12, vocab=32768, seq=1024, experts=16, top_k=4,
              expert_ffn=1024),
})
CASES11 = {
    "h11_ddp2_P_straggler": dict(shape="P", world=2, scheme="ddp", mb=2, n_mb=2, straggler=1.25),
    "h11_ddp4_P": dict(shape="P", world=4, scheme="ddp", mb=2, n_mb=2),
    "h11_fsdp4_P": dict(shape="P", world=4, scheme="fsdp", mb=4, n_mb=1),
    "h11_tp4sp_P": dict(shape="P", world=4, scheme="tp", sp=True, mb=4, n_mb=1),
    "h11_pp4_gpipe_P": dict(shape="P", world=4, scheme="pp", schedule="gpipe", mb=2, n_mb=8),
    "h11_pp4_int2_P": dict(shape="P", world=4, scheme="pp", schedule="interleaved", v=2, mb=1,
                           n_mb=8),
    "h11_moe_ep4_M": dict(shape="M", world=4, scheme="moe", mb=8, n_mb=2),
}
CASES.update(CASES11)
# The twelfth batch: new shapes, written 2026-11-27 09:06 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 24 GPT-2 blocks of width 2560 (20 heads of 128), GPT-2's padded vocabulary, 2K sequences.
    "N": dict(layers=24, hidden=2560, heads=20, vocab=50304, seq=2048),
    # MoE: 6 blocks of width 2048 (16 heads of 128), 16 GELU experts of 2048, top-2, 1K sequences.
    "L": dict(layers=6, hidden=2048, heads=16, vocab=32768, seq=1024, experts=16, top_k=2,
              expert_ffn=2048),
})
CASES12 = {
    "h12_tp2sp_N": dict(shape="N", world=2, scheme="tp", sp=True, mb=2, n_mb=2),
    "h12_ddp4_N_straggler": dict(shape="N", world=4, scheme="ddp", mb=2, n_mb=2, straggler=1.15),
    "h12_fsdp4_N_ac": dict(shape="N", world=4, scheme="fsdp", mb=4, n_mb=1, ac=True),
    "h12_tp4sp_N": dict(shape="N", world=4, scheme="tp", sp=True, mb=2, n_mb=1),
    "h12_pp4_1f1b_N": dict(shape="N", world=4, scheme="pp", schedule="1f1b", mb=1, n_mb=8),
    "h12_pp4_int2_N": dict(shape="N", world=4, scheme="pp", schedule="interleaved", v=2, mb=1,
                           n_mb=8),
    "h12_moe_ep4_L": dict(shape="L", world=4, scheme="moe", mb=8, n_mb=2),
}
CASES.update(CASES12)
# The thirteenth batch: new shapes, written 2026-11-27 11:50 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 16 GPT-2 blocks of width 3072 (24 heads of 128), GPT-2's padded vocabulary, 2K sequences.
    "AA": dict(layers=16, hidden=3072, heads=24, vocab=50304, seq=2048),
    # MoE: 8 blocks of width 1792 (14 heads of 128), 12 GELU experts of 3072, top-2, 1K sequences.
    "AB": dict(layers=8, hidden=1792, heads=14, vocab=32768, seq=1024, experts=12, top_k=2,
               expert_ffn=3072),
})
CASES13 = {
    "h13_tp2sp_AA": dict(shape="AA", world=2, scheme="tp", sp=True, mb=1, n_mb=2),
    "h13_moe_ep2_AB": dict(shape="AB", world=2, scheme="moe", mb=8, n_mb=2),
    "h13_ddp4_AA_straggler": dict(shape="AA", world=4, scheme="ddp", mb=1, n_mb=2, straggler=1.1),
    "h13_fsdp4_AA": dict(shape="AA", world=4, scheme="fsdp", mb=2, n_mb=1),
    "h13_tp4sp_AA": dict(shape="AA", world=4, scheme="tp", sp=True, mb=2, n_mb=1),
    "h13_pp4_gpipe_AA": dict(shape="AA", world=4, scheme="pp", schedule="gpipe", mb=1, n_mb=8),
    "h13_pp4_int2_AA": dict(shape="AA", world=4, scheme="pp", schedule="interleaved", v=2, mb=1,
                            n_mb=8),
    "h13_moe_ep4_AB": dict(shape="AB", world=4, scheme="moe", mb=8, n_mb=2),
}
CASES.update(CASES13)
# The fourteenth batch: new shapes, written 2026-11-27 14:27 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 16 GPT-2 blocks of width 2048 (16 heads of 128), GPT-2's padded vocabulary, 4K sequences.
    "AE": dict(layers=16, hidden=2048, heads=16, vocab=50304, seq=4096),
    # MoE: 6 blocks of width 2304 (18 heads of 128), 8 GELU experts of 4096, top-2, 1K sequences.
    "AF": dict(layers=6, hidden=2304, heads=18, vocab=32768, seq=1024, experts=8, top_k=2,
               expert_ffn=4096),
})
CASES14 = {
    "h14_tp2sp_AE": dict(shape="AE", world=2, scheme="tp", sp=True, mb=1, n_mb=2),
    "h14_moe_ep2_AF": dict(shape="AF", world=2, scheme="moe", mb=8, n_mb=2),
    "h14_ddp4_AE_straggler": dict(shape="AE", world=4, scheme="ddp", mb=1, n_mb=2, straggler=1.2),
    "h14_fsdp4_AE_ac": dict(shape="AE", world=4, scheme="fsdp", mb=2, n_mb=1, ac=True),
    "h14_tp4sp_AE": dict(shape="AE", world=4, scheme="tp", sp=True, mb=2, n_mb=1),
    "h14_pp4_1f1b_AE": dict(shape="AE", world=4, scheme="pp", schedule="1f1b", mb=1, n_mb=8),
    "h14_pp4_int2_AE": dict(shape="AE", world=4, scheme="pp", schedule="interleaved", v=2, mb=1,
                            n_mb=8),
    "h14_moe_ep4_AF": dict(shape="AF", world=4, scheme="moe", mb=8, n_mb=2),
}
CASES.update(CASES14)
# The fifteenth batch: new shapes, written 2026-11-27 17:05 UTC before its freeze (4-GPU box).
SHAPES.update({
    # 8 GPT-2 blocks of width 4096 (32 heads of 128), GPT-2's padded vocabulary, 2K sequences.
    "AI": dict(layers=8, hidden=4096, heads=32, vocab=50304, seq=2048),
    # MoE: 4 blocks of width 2816 (22 heads of 128), 8 GELU experts of 5632, top-1, 1K sequences.
    "AJ": dict(layers=4, hidden=2816, heads=22, vocab=32768, seq=1024, experts=8, top_k=1,
               expert_ffn=5632),
})
CASES15 = {
    "h15_tp2sp_AI": dict(shape="AI", world=2, scheme="tp", sp=True, mb=1, n_mb=2),
    "h15_moe_ep2_AJ": dict(shape="AJ", world=2, scheme="moe", mb=8, n_mb=2),
    "h15_ddp4_AI_straggler": dict(shape="AI", world=4, scheme="ddp", mb=1, n_mb=2,
                                  straggler=1.25),
    "h15_fsdp4_AI": dict(shape="AI", world=4, scheme="fsdp", mb=2, n_mb=1),
    "h15_tp4sp_AI": dict(shape="AI", world=4, scheme="tp", sp=True, mb=2, n_mb=1),
    "h15_pp4_gpipe_AI": dict(shape="AI", world=4, scheme="pp", schedule="gpipe", mb=1, n_mb=8),
    "h15_pp4_int2_AI": dict(shape="AI", world=4, scheme="pp", schedule="interleaved", v=2, mb=1,
                            n_mb=8),
    "h15_moe_ep4_AJ": dict(shape="AJ", world=4, scheme="moe", mb=8, n_mb=2),
}
CASES.update(CASES15)
# The sixteenth batch (MoE-heavy, issue 10): new shapes, written 2026-11-27 19:55 UTC before its
# freeze (4-GPU box).
SHAPES.update({
    # 8 GPT-2 blocks of width 3584 (28 heads of 128), GPT-2's padded vocabulary, 3K sequences.
    "AN": dict(layers=8, hidden=3584, heads=28, vocab=50304, seq=3072),
    # MoE: 6 blocks of width 2560 (20 heads of 128), 16 GELU experts of 2560, top-2, 1K sequences.
    "AO": dict(layers=6, hidden=2560, heads=20, vocab=32768, seq=1024, experts=16, top_k=2,
               expert_ffn=2560),
    # MoE, fine-grained: 4 blocks of width 1536 (12 heads of 128), 64 GELU experts of 768, top-4,
    # 2K sequences.
    "AP": dict(layers=4, hidden=1536, heads=12, vocab=32768, seq=2048, experts=64, top_k=4,
               expert_ffn=768),
})
CASES16 = {
    "h16_ddp4_AN_straggler": dict(shape="AN", world=4, scheme="ddp", mb=1, n_mb=2,
                                  straggler=1.15),
    "h16_fsdp4_AN": dict(shape="AN", world=4, scheme="fsdp", mb=2, n_mb=1),
    "h16_tp4sp_AN": dict(shape="AN", world=4, scheme="tp", sp=True, mb=2, n_mb=1),
    "h16_pp4_int2_AN": dict(shape="AN", world=4, scheme="pp", schedule="interleaved", v=2, mb=1,
                            n_mb=8),
    "h16_moe_ep2_AO": dict(shape="AO", world=2, scheme="moe", mb=8, n_mb=2),
    "h16_moe_ep4_AO": dict(shape="AO", world=4, scheme="moe", mb=8, n_mb=2),
    "h16_moe_ep2_AP": dict(shape="AP", world=2, scheme="moe", mb=4, n_mb=2),
    "h16_moe_ep4_AP": dict(shape="AP", world=4, scheme="moe", mb=4, n_mb=2),
}
CASES.update(CASES16)
# The seventeenth batch (issue 10): new shapes, written 2026-11-27 23:00 UTC before its freeze
# (4-GPU box).
SHAPES.update({
    # 12 GPT-2 blocks of width 3072 (24 heads of 128), GPT-2's padded vocabulary, 2K sequences.
    "AU": dict(layers=12, hidden=3072, heads=24, vocab=50304, seq=2048),
    # MoE: 4 blocks of width 2048 (16 heads of 128), 32 GELU experts of 1536, top-2, 2K
    # sequences.
    "AV": dict(layers=4, hidden=2048, heads=16, vocab=32768, seq=2048, experts=32, top_k=2,
               expert_ffn=1536),
})
CASES17 = {
    "h17_single_AU": dict(shape="AU", world=1, scheme="single", mb=2, n_mb=2),
    "h17_pp2_1f1b_AU": dict(shape="AU", world=2, scheme="pp", schedule="1f1b", mb=1, n_mb=8),
    "h17_ddp4_AU": dict(shape="AU", world=4, scheme="ddp", mb=2, n_mb=2),
    "h17_fsdp4_AU_ac": dict(shape="AU", world=4, scheme="fsdp", mb=4, n_mb=1, ac=True),
    "h17_tp4sp_AU": dict(shape="AU", world=4, scheme="tp", sp=True, mb=2, n_mb=1),
    "h17_pp4_gpipe_AU": dict(shape="AU", world=4, scheme="pp", schedule="gpipe", mb=1, n_mb=8),
    "h17_moe_ep2_AV": dict(shape="AV", world=2, scheme="moe", mb=4, n_mb=2),
    "h17_moe_ep4_AV": dict(shape="AV", world=4, scheme="moe", mb=4, n_mb=2),
}
CASES.update(CASES17)
# The eighteenth batch (issue 10): new shapes, written 2026-11-28 01:13 UTC before its freeze
# (4-GPU box).
SHAPES.update({
    # 8 GPT-2 blocks of width 3840 (30 heads of 128), GPT-2's padded vocabulary, 2K sequences.
    "AY": dict(layers=8, hidden=3840, heads=30, vocab=50304, seq=2048),
    # MoE: 6 blocks of width 2304 (18 heads of 128), 16 GELU experts of 3072, top-2, 2K
    # sequences.
    "AZ": dict(layers=6, hidden=2304, heads=18, vocab=32768, seq=2048, experts=16, top_k=2,
               expert_ffn=3072),
})
CASES18 = {
    "h18_single_AY": dict(shape="AY", world=1, scheme="single", mb=1, n_mb=3),
    "h18_tp2sp_AY": dict(shape="AY", world=2, scheme="tp", sp=True, mb=2, n_mb=1),
    "h18_ddp4_AY_straggler": dict(shape="AY", world=4, scheme="ddp", mb=1, n_mb=2,
                                  straggler=1.2),
    "h18_fsdp4_AY": dict(shape="AY", world=4, scheme="fsdp", mb=2, n_mb=1),
    "h18_pp4_1f1b_AY": dict(shape="AY", world=4, scheme="pp", schedule="1f1b", mb=1, n_mb=8),
    "h18_pp4_int2_AY": dict(shape="AY", world=4, scheme="pp", schedule="interleaved", v=2, mb=1,
                            n_mb=8),
    "h18_moe_ep2_AZ": dict(shape="AZ", world=2, scheme="moe", mb=4, n_mb=2),
    "h18_moe_ep4_AZ": dict(shape="AZ", world=4, scheme="moe", mb=4, n_mb=2),
}
CASES.update(CASES18)
# The nineteenth batch (issue 10): new shapes, written 2026-11-28 03:20 UTC before its freeze
# (4-GPU box).
SHAPES.update({
    # 16 GPT-2 blocks of width 2816 (22 heads of 128), GPT-2's padded vocabulary, 2K sequences.
    "BC": dict(layers=16, hidden=2816, heads=22, vocab=50304, seq=2048),
    # MoE, coarse: 6 blocks of width 3072 (24 heads of 128), 8 GELU experts of 6144, top-2, 2K
    # sequences.
    "BD": dict(layers=6, hidden=3072, heads=24, vocab=32768, seq=2048, experts=8, top_k=2,
               expert_ffn=6144),
})
CASES19 = {
    "h19_single_BC": dict(shape="BC", world=1, scheme="single", mb=2, n_mb=2),
    "h19_tp2sp_BC": dict(shape="BC", world=2, scheme="tp", sp=True, mb=4, n_mb=1),
    "h19_ddp4_BC": dict(shape="BC", world=4, scheme="ddp", mb=2, n_mb=2),
    "h19_fsdp4_BC": dict(shape="BC", world=4, scheme="fsdp", mb=2, n_mb=1),
    "h19_pp4_1f1b_BC": dict(shape="BC", world=4, scheme="pp", schedule="1f1b", mb=1, n_mb=6),
    "h19_pp4_int2_BC": dict(shape="BC", world=4, scheme="pp", schedule="interleaved", v=2, mb=1,
                            n_mb=8),
    "h19_moe_ep2_BD": dict(shape="BD", world=2, scheme="moe", mb=2, n_mb=2),
    "h19_moe_ep4_BD": dict(shape="BD", world=4, scheme="moe", mb=2, n_mb=2),
}
CASES.update(CASES19)
BATCH_X2 = [k for k, c in CASES.items() if c["world"] <= 2]
BATCH_X4 = [k for k, c in CASES.items() if c["world"] == 4]


def case_config(name: str, quick: bool) -> dict:
    c = dict(CASES[name])
    m = dict(SHAPES[c["shape"]])
    if quick:
        keep = {k: m[k] for k in ("experts", "top_k") if k in m}
        m = dict(QUICK, **keep)
        if "experts" in m:
            m["expert_ffn"] = 128
    m["ffn"] = 4 * m["hidden"]
    c["model"] = m
    for k, v in (("sp", False), ("ac", False), ("v", 1), ("schedule", None), ("straggler", None)):
        c.setdefault(k, v)
    return c


# ----------------------------------------------------------------------------- the model

class CausalSelfAttention(nn.Module):
    """GPT-2 attention with one fused QKV projection. Its output columns are grouped per head
    ([q|k|v] of head 0, then of head 1, ...), so a column split over TP ranks keeps whole heads."""

    def __init__(self, h: int, heads: int):
        super().__init__()
        self.hd = h // heads
        self.c_attn = nn.Linear(h, 3 * h)
        self.c_proj = nn.Linear(h, h)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.c_attn(x)
        qkv = qkv.view(b, s, qkv.shape[-1] // (3 * self.hd), 3 * self.hd).transpose(1, 2)
        q, k, v = qkv.split(self.hd, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, h: int, f: int):
        super().__init__()
        self.c_fc = nn.Linear(h, f)
        self.c_proj = nn.Linear(f, h)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, m: dict, mlp: nn.Module | None = None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(m["hidden"])
        self.attn = CausalSelfAttention(m["hidden"], m["heads"])
        self.ln_2 = nn.LayerNorm(m["hidden"])
        self.mlp = mlp if mlp is not None else MLP(m["hidden"], m["ffn"])

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Blocks ``lo``..``hi`` of the model; the embeddings when ``first``, the final LayerNorm and
    LM head when ``last`` (a pipeline stage holds a slice; every other scheme the whole model)."""

    def __init__(self, m: dict, lo: int, hi: int, first: bool, last: bool, tied: bool,
                 moe_factory=None):
        super().__init__()
        self.m, self.first, self.last = m, first, last
        self.ac, self.pacer, self.pos_offset = False, None, 0
        self.wte = nn.Embedding(m["vocab"], m["hidden"]) if first else None
        self.wpe = nn.Embedding(m["seq"], m["hidden"]) if first else None
        self.blocks = nn.ModuleList(
            Block(m, moe_factory() if moe_factory else None) for _ in range(lo, hi))
        self.ln_f = nn.LayerNorm(m["hidden"]) if last else None
        self.lm_head = nn.Linear(m["hidden"], m["vocab"], bias=False) if last else None
        if tied and first and last:
            self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() > 1:
                std = 0.02 / (2 * m["layers"]) ** 0.5 if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, x):
        if self.first:
            tok = self.wte(x)
            s_local = tok.shape[1]  # the rank's slice of the sequence under sequence parallelism
            pos = torch.arange(self.pos_offset, self.pos_offset + s_local, device=x.device)
            x = tok + self.wpe(pos)
        for i, blk in enumerate(self.blocks):
            x = self._run(i, blk, x)
        if self.last:
            x = self._run("head", lambda y: self.lm_head(self.ln_f(y)), x)
        return x

    def _run(self, key, fn, x):
        if self.pacer is not None:
            x = _Mark.apply(x, self.pacer, key, "in")
        if self.ac and key != "head" and torch.is_grad_enabled():
            y = torch.utils.checkpoint.checkpoint(fn, x, use_reentrant=False)
        else:
            y = fn(x)
        if self.pacer is not None:
            y = _Mark.apply(y, self.pacer, key, "out")
        return y


# ----------------------------------------------------------------------------- straggler

class _Mark(torch.autograd.Function):
    """Identity; tells the pacer where a segment (a block, or the LM head) starts and ends in the
    forward (``in`` then ``out``) and in the backward (``out`` then ``in``)."""

    @staticmethod
    def forward(ctx, x, pacer, key, where):
        ctx.pacer, ctx.key, ctx.where = pacer, key, where
        pacer.forward_mark(key, where)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.pacer.backward_mark(ctx.key, ctx.where)
        return g, None, None, None


class Pacer:
    """Makes one rank's blocks and LM head ``factor`` times as long, on the GPU.

    ``measure``: CUDA events at every segment's edges time each block's (and the LM head's)
    forward and backward on the GPU. ``pad``: after each segment's forward, and after its
    backward, ``torch.cuda._sleep`` spins one GPU thread on the compute stream for
    (factor - 1) x the median time measured for that segment (cycles from a measured clock). The
    spin uses no memory bandwidth and one SM, so the rank's GPU work simply takes longer; its
    NCCL kernels (DDP's bucket all-reduce, on NCCL's own stream) are not slowed. The embedding,
    the loss and the optimizer are not padded. On the CPU (``--quick``) the host sleeps instead.
    """

    def __init__(self, factor: float, dev):
        self.factor, self.dev, self.mode = factor, dev, "off"
        self.cuda = dev.type == "cuda"
        self.marks: list[tuple[str, object, str, object]] = []
        self.samples: dict[tuple, list[float]] = {}
        self.pad: dict[tuple, float] = {}
        self.verify, self.waits = False, []
        self.cycles_per_s = self._clock() if self.cuda else 0.0

    def _clock(self) -> float:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n, rates = 20_000_000, []
        for _ in range(5):
            a.record()
            torch.cuda._sleep(n)
            b.record()
            b.synchronize()
            rates.append(n / (a.elapsed_time(b) / 1e3))
        return statistics.median(rates[1:])

    def _stamp(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def _wait(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if not self.cuda:
            time.sleep(seconds)
            return
        a = self._stamp() if self.verify else None
        torch.cuda._sleep(int(seconds * self.cycles_per_s))
        if self.verify:
            self.waits.append((seconds, a, self._stamp()))

    def recalibrate(self) -> float:
        """After a padded step with ``verify`` on: rescale the clock so that each spin lasts
        what was asked under the step's own load (the SM clock may differ from the idle one
        ``_clock`` saw); returns the ratio found (spun over asked)."""
        ratio = 1.0
        if self.cuda and self.waits:
            torch.cuda.synchronize()
            ratio = statistics.median(a.elapsed_time(b) / 1e3 / s for s, a, b in self.waits)
            self.cycles_per_s /= ratio
        self.verify, self.waits = False, []
        return ratio

    def forward_mark(self, key, where):
        if self.mode == "measure":
            self.marks.append(("fwd", key, where, self._stamp()))
        elif self.mode == "pad" and where == "out":
            self._wait(self.pad.get(("fwd", key), 0.0))

    def backward_mark(self, key, where):
        if self.mode == "measure":
            self.marks.append(("bwd", key, where, self._stamp()))
        elif self.mode == "pad" and where == "in":
            self._wait(self.pad.get(("bwd", key), 0.0))

    def collect(self) -> None:
        """After a measured step: pair each segment's start and end marks into durations."""
        if self.cuda:
            torch.cuda.synchronize()
        start = {}
        for d, key, where, t in self.marks:
            opens = (d == "fwd" and where == "in") or (d == "bwd" and where == "out")
            if opens:
                start[(d, key)] = t
            elif (d, key) in start:
                t0 = start.pop((d, key))
                dt = t0.elapsed_time(t) / 1e3 if self.cuda else t - t0
                self.samples.setdefault((d, key), []).append(dt)
        self.marks = []

    def arm(self) -> dict:
        """Switch to padding; returns what was measured and the padding per step."""
        self.pad = {k: (self.factor - 1.0) * statistics.median(v) for k, v in self.samples.items()}
        self.mode = "pad"
        seg = {f"{d}:{k}": round(statistics.median(v) * 1e3, 4) for (d, k), v in self.samples.items()}
        return {"straggler_segment_ms": seg, "straggler_clock_hz": self.cycles_per_s,
                "straggler_pad_per_microbatch_s": sum(self.pad.values())}


# ----------------------------------------------------------------------------- MoE

class MoE(nn.Module):
    """Top-k of ``experts`` GELU experts; this rank holds experts [rank*E/ep, (rank+1)*E/ep)."""

    def __init__(self, m: dict, group, ep: int, rank: int):
        super().__init__()
        self.E, self.k, self.ep, self.group = m["experts"], m["top_k"], ep, group
        self.local = self.E // ep
        self.router = nn.Linear(m["hidden"], self.E, bias=False)
        self.experts = nn.ModuleList(MLP(m["hidden"], m["expert_ffn"]) for _ in range(self.local))
        for p in self.experts.parameters():
            p._expert = True
        self.load: list[float] = []
        self.rows: list[list[int]] = []  # per call, the rows each local expert ran (--expert-rows)

    def forward(self, x):
        b, s, h = x.shape
        t = x.reshape(-1, h)
        probs = self.router(t).float().softmax(-1)
        w, e = probs.topk(self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        y = self.dispatch_experts(x, e.reshape(-1))
        return (y * w.unsqueeze(-1).to(y.dtype)).sum(1).view(b, s, h)

    def dispatch_experts(self, x, flat):
        """The tokens of ``x`` (b, s, h) sent to the experts ``flat`` (T*k,) chose, each local
        expert run on its rows in turn, and the results brought back: (T, k, h)."""
        h = x.shape[-1]
        t = x.reshape(-1, h)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.E)
        cdt = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) \
            else x.dtype
        send = t.to(cdt)[order // self.k]  # rows sorted by expert, so by destination rank
        if self.ep > 1:
            got = torch.empty_like(counts)
            dist.all_to_all_single(got, counts, group=self.group)  # [src][local expert]
            host = torch.cat([counts, got]).cpu()
            sent, got = host[: self.E].view(self.ep, -1), host[self.E:].view(self.ep, -1)
            in_splits, out_splits = sent.sum(1).tolist(), got.sum(1).tolist()
            recv = dist_nn.all_to_all_single(send.new_empty(sum(out_splits), h), send,
                                             out_splits, in_splits, group=self.group)
        else:
            got = counts.cpu().view(1, -1)
            recv = send
        self.load.append(float(got.sum()) / max(1, flat.numel()))
        # recv is grouped by source rank, then by local expert: run each expert on its rows
        # from every source, one expert after another, and put the results back in place.
        n = got.tolist()
        starts, o = [], 0
        for src in range(len(n)):
            row = []
            for j in range(self.local):
                row.append(o)
                o += n[src][j]
            starts.append(row)
        self.rows.append([sum(n[src][j] for src in range(len(n))) for j in range(self.local)])
        pieces: dict[tuple[int, int], torch.Tensor] = {}
        for j, expert in enumerate(self.experts):
            xs = [recv[starts[src][j]: starts[src][j] + n[src][j]] for src in range(len(n))]
            y = expert(torch.cat(xs))
            for src, part in enumerate(y.split([n[src][j] for src in range(len(n))])):
                pieces[(src, j)] = part
        out = torch.cat([pieces[(src, j)] for src in range(len(n)) for j in range(self.local)])
        if self.ep > 1:
            out = dist_nn.all_to_all_single(out.new_empty(send.shape[0], h), out, in_splits,
                                            out_splits, group=self.group)
        return out.new_empty(out.shape).index_copy(0, order, out).view(-1, self.k, h)


# ----------------------------------------------------------------------------- schemes

import torch.distributed.nn.functional as dist_nn  # noqa: E402  (autograd-aware collectives)

warnings.filterwarnings("ignore", message=".*all_to_all_single is deprecated.*")


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
    return rank, world, dev


def adamw(groups, dev):
    return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)


def amp(dev, on: bool = True):
    if not on:
        return contextlib.nullcontext()
    return torch.autocast(dev.type, dtype=torch.bfloat16)


def ce(logits, y):
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def make_data(c, rank: int, dev, n: int):
    """``n`` micro-batches of random tokens and targets (the same on ranks that share them)."""
    g = torch.Generator(device="cpu").manual_seed(1000 + rank)
    m = c["model"]
    mk = lambda: torch.randint(0, m["vocab"], (c["mb"], m["seq"]), generator=g).to(dev)  # noqa: E731
    return [(mk(), mk()) for _ in range(n)]


def build_plain(c, rank, world, dev):
    """single, ddp (with an optional straggler), fsdp."""
    m = c["model"]
    torch.manual_seed(0)
    with dev:  # parameters created and initialised on the GPU
        model = GPT(m, 0, m["layers"], True, True, tied=True)
    model.ac = c["ac"]
    info = {"tied_embeddings": True}
    data = make_data(c, rank, dev, c["n_mb"])
    if c["scheme"] == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mesh = init_device_mesh(dev.type, (world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        use_amp, wrapped = False, model
        info["precision"] = "FSDP2 MixedPrecisionPolicy(param bf16, reduce fp32), no autocast"
    elif c["scheme"] == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        wrapped = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None)
        use_amp = True
        info["precision"] = "autocast bf16 over fp32 weights; DDP bucket_cap_mb 25, fp32 grads"
    else:
        use_amp, wrapped = True, model
        info["precision"] = "autocast bf16 over fp32 weights"
    if c["straggler"] and rank == 0:
        model.pacer = Pacer(c["straggler"], dev)
    opt = adamw(model.parameters(), dev)

    def step():
        for i, (x, y) in enumerate(data):
            last = i == len(data) - 1
            sync = wrapped.no_sync() if c["scheme"] == "ddp" and not last else \
                contextlib.nullcontext()
            with sync:
                with amp(dev, use_amp):
                    loss = ce(wrapped(x), y) / len(data)
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, step, info


def build_tp(c, rank, world, dev):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )
    m, sp = c["model"], c["sp"]
    torch.manual_seed(0)
    with dev:
        model = GPT(m, 0, m["layers"], True, True, tied=False)
    mesh = init_device_mesh(dev.type, (world,))
    rest = Shard(1) if sp else Replicate()  # the residual stream between the TP regions
    top = {"wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=rest),
           "lm_head": ColwiseParallel(input_layouts=rest, output_layouts=Shard(-1),
                                      use_local_output=False)}
    if sp:
        top["ln_f"] = SequenceParallel()
        model.pos_offset = rank * (m["seq"] // world)
    parallelize_module(model, mesh, top)
    for blk in model.blocks:
        plan = {"attn.c_attn": ColwiseParallel(),
                "attn.c_proj": RowwiseParallel(output_layouts=rest),
                "mlp.c_fc": ColwiseParallel(),
                "mlp.c_proj": RowwiseParallel(output_layouts=rest)}
        if sp:
            plan.update({"ln_1": SequenceParallel(), "ln_2": SequenceParallel(),
                         "attn": PrepareModuleInput(input_layouts=(Shard(1),),
                                                    desired_input_layouts=(Replicate(),)),
                         "mlp": PrepareModuleInput(input_layouts=(Shard(1),),
                                                   desired_input_layouts=(Replicate(),))})
        parallelize_module(blk, mesh, plan)
    from torch.distributed.tensor import DTensor
    dparams = [p for p in model.parameters() if isinstance(p, DTensor)]
    plain = [p for p in model.parameters() if not isinstance(p, DTensor)]
    opt = adamw([{"params": dparams}, {"params": plain}], dev)
    data = make_data(c, 0, dev, c["n_mb"])  # every TP rank reads the same tokens

    def step():
        for x, y in data:
            with loss_parallel():
                with amp(dev):
                    loss = ce(model(x), y) / len(data)
                loss.backward()
        if sp:  # wpe saw only this rank's positions: sum its gradient over the TP group
            dist.all_reduce(model.wpe.weight.grad)
        opt.step()
        opt.zero_grad(set_to_none=True)

    info = {"tied_embeddings": False, "precision": "autocast bf16 over fp32 weights",
            "plain_params": sum(p.numel() for p in plain)}
    return model, step, info


def build_pp(c, rank, world, dev):
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )
    m, v = c["model"], c["v"]
    n_stages = world * v
    per = m["layers"] // n_stages
    assert per * n_stages == m["layers"], "layers must split evenly over the stages"
    chunks, stages = [], []
    for k in range(v):
        idx = rank + k * world
        torch.manual_seed(idx)
        with dev:
            ch = GPT(m, idx * per, (idx + 1) * per, idx == 0, idx == n_stages - 1, tied=False)
        chunks.append(ch)
        stages.append(PipelineStage(ch, idx, n_stages, dev))
    loss_fn = ce
    if c["schedule"] == "interleaved":
        sched = ScheduleInterleaved1F1B(stages, n_microbatches=c["n_mb"], loss_fn=loss_fn)
    else:
        kind = Schedule1F1B if c["schedule"] == "1f1b" else ScheduleGPipe
        sched = kind(stages[0], n_microbatches=c["n_mb"], loss_fn=loss_fn)
    data = make_data(c, 0, dev, c["n_mb"])
    x = torch.cat([d[0] for d in data])
    y = torch.cat([d[1] for d in data])
    has_first = any(ch.first for ch in chunks)
    has_last = any(ch.last for ch in chunks)
    opt = adamw([p for ch in chunks for p in ch.parameters()], dev)

    def step():
        with amp(dev):
            args = (x,) if has_first else ()
            kw = {"target": y, "losses": []} if has_last else {}
            sched.step(*args, **kw)
        opt.step()
        opt.zero_grad(set_to_none=True)

    info = {"tied_embeddings": False, "precision": "autocast bf16 over fp32 weights",
            "layers_per_stage": per}
    return chunks, step, info


def build_moe(c, rank, world, dev):
    m = c["model"]
    group = dist.group.WORLD if world > 1 else None
    torch.manual_seed(0)  # the same replicated weights on every rank
    with dev:
        model = GPT(m, 0, m["layers"], True, True, tied=True,
                    moe_factory=lambda: MoE(m, group, world, rank))
    torch.manual_seed(100 + rank)  # experts differ from rank to rank
    moes = [blk.mlp for blk in model.blocks]
    for mo in moes:
        for name, p in mo.experts.named_parameters():
            if p.dim() > 1:
                std = 0.02 / (2 * m["layers"]) ** 0.5 if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
    shared = [p for p in model.parameters() if not getattr(p, "_expert", False)]
    opt = adamw(model.parameters(), dev)
    data = make_data(c, rank, dev, c["n_mb"])
    cap = 25 * 2**20

    def step():
        for x, y in data:
            with amp(dev):
                loss = ce(model(x), y) / len(data)
            loss.backward()
        if world > 1:  # replicated weights: average their gradients, 25 MiB flat buckets
            bucket, size = [], 0
            for p in shared + [None]:
                if p is not None and p.grad is not None:
                    bucket.append(p.grad)
                    size += p.grad.numel() * p.grad.element_size()
                if bucket and (p is None or size >= cap):
                    flat = torch.cat([g.reshape(-1) for g in bucket])
                    dist.all_reduce(flat)
                    flat /= world
                    for g, part in zip(bucket, flat.split([g.numel() for g in bucket]), strict=True):
                        g.copy_(part.view_as(g))
                    bucket, size = [], 0
        opt.step()
        opt.zero_grad(set_to_none=True)

    info = {"tied_embeddings": True, "precision": "autocast bf16 over fp32 weights; tokens "
            "dispatched in bf16", "ep": world}
    return model, step, info, moes


# ----------------------------------------------------------------------------- timing

def log(msg: str) -> None:
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, flush=True)


def gather(x: float, world: int, dev) -> list[float]:
    t = torch.tensor([x], dtype=torch.float64, device=dev)
    if world == 1:
        return [x]
    out = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(out, t)
    return [float(o) for o in out]


def time_steps(step, dev, warmup: int, timed: int, world: int, straggler: bool = False,
               pacer=None) -> dict:
    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    extra = {}
    for i in range(warmup):
        if pacer is not None and i in (1, 2):
            pacer.mode = "measure"
        step()
        if pacer is not None and pacer.mode == "measure":
            pacer.collect()
            pacer.mode = "off"
        log(f"  warm-up {i + 1}/{warmup}")
    if pacer is not None:
        extra = pacer.arm()
        pacer.verify = True
    if straggler:  # two more warm-up steps on every rank, padded on the straggler: the first
        step()     # times the spins, the second runs with the spin clock rescaled
        if pacer is not None:
            extra["straggler_spin_ratio_before_rescale"] = pacer.recalibrate()
        step()
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
    by_rank = [statistics.median(r[k] for r in per_rank) for k in range(world)]
    return dict(extra, step_time_s=statistics.median(slowest), step_time_min_s=min(slowest),
                step_time_max_s=max(slowest), step_times_s=slowest, step_time_s_by_rank=by_rank,
                peak_memory_gib=max(peaks), peak_memory_gib_by_rank=[round(p, 3) for p in peaks],
                warmup_steps=warmup, timed_steps=timed)


def model_flops(c, world: int) -> float:
    """Model FLOPs of a step: 6 x tokens x matrix parameters (experts top_k times, LM head
    included) plus causal attention, 3 x 2 x b x s^2 x h per layer."""
    m = c["model"]
    h, L, s = m["hidden"], m["layers"], m["seq"]
    mlp = 2 * h * m["expert_ffn"] * m["top_k"] if "experts" in m else 2 * h * m["ffn"]
    replicas = world if c["scheme"] in ("ddp", "fsdp", "moe") else 1
    tokens = c["mb"] * c["n_mb"] * s * replicas
    fwd = 2 * tokens * (L * (4 * h * h + mlp) + h * m["vocab"])
    fwd += L * 2 * c["mb"] * c["n_mb"] * replicas * s * s * h
    return 3.0 * fwd


def write_expert_rows(args, rank: int, warmup: int, timed: int, moes) -> None:
    """Diagnostics: every MoE layer call's rows per local expert (the M of its GEMMs), in
    call order (warm-up steps, timed steps, then any profiled step), one file per rank."""
    os.makedirs(args.out, exist_ok=True)
    rec = {"script": "steps_alt.py", "case": args.case, "rank": rank, "warmup": warmup,
           "timed": timed, "layers": [mo.rows for mo in moes]}
    with open(os.path.join(args.out, f"expert_rows-{args.case}-r{rank}.json"), "w") as f:
        json.dump(rec, f)


def run_case(args) -> None:
    rank, world, dev = setup(args.quick)
    c = case_config(args.case, args.quick)
    assert c["world"] == world, f"{args.case} needs {c['world']} ranks, got {world}"
    warmup, timed = (3, 2) if args.quick else (args.warmup, args.steps)
    t_start = time.time()
    rec = {"op": "train_step", "script": "steps_alt.py", "case": args.case, "gpus": world,
           "run": args.label, "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "model": c["model"], "scheme": c["scheme"], "sp": c["sp"], "schedule": c["schedule"],
           "virtual_stages": c["v"], "activation_checkpointing": c["ac"],
           "straggler": c["straggler"], "micro_batch": c["mb"], "micro_batches": c["n_mb"],
           "optimizer": "AdamW(lr 3e-4, betas (0.9,0.95), wd 0.1, foreach=True)",
           "block": "GPT-2: LayerNorm, fused c_attn, SDPA is_causal, GELU(tanh) 4x MLP, biases, "
                    "learned positions", "model_flops_per_step": model_flops(c, world),
           "env": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev)
                   if dev.type == "cuda" else "cpu",
                   "nccl": ".".join(map(str, torch.cuda.nccl.version()))
                   if dev.type == "cuda" else None}}
    pacer, moes = None, None
    if c["scheme"] == "tp":
        model, step, info = build_tp(c, rank, world, dev)
    elif c["scheme"] == "pp":
        model, step, info = build_pp(c, rank, world, dev)
    elif c["scheme"] == "moe":
        model, step, info, moes = build_moe(c, rank, world, dev)
    else:
        model, step, info = build_plain(c, rank, world, dev)
        pacer = model.pacer
    mods = model if isinstance(model, list) else [model]
    local = sum((p.to_local() if hasattr(p, "to_local") else p).numel()
                for mod in mods for p in mod.parameters())  # a DTensor's own shard
    rec["params_per_rank"] = [int(n) for n in gather(float(local), world, dev)]
    rec.update(info)
    log(f"{args.case} built ({rec['params_per_rank'][0]:,} parameters on rank 0)")
    if c["straggler"] and pacer is None and rank == 0:
        raise RuntimeError("straggler needs the ddp scheme")
    r = time_steps(step, dev, warmup, timed, world, bool(c["straggler"]), pacer)
    if c["straggler"]:  # the padding was measured on rank 0 only: share it
        r["straggler_pad_per_microbatch_s"] = gather(
            r.get("straggler_pad_per_microbatch_s", 0.0), world, dev)[0]
    if moes:
        loads = [sum(mo.load) / len(mo.load) for mo in moes]
        r["routed_share_per_rank"] = gather(sum(loads) / len(loads), world, dev)
    rec.update(r)
    if args.profile and dev.type == "cuda":  # diagnostics only: steps.py's profiler record
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from steps import profile_step
        profile_step(args, step, args.case, rank, world, dev)
    if args.expert_rows and moes:
        write_expert_rows(args, rank, warmup, timed, moes)
    if rank == 0:
        if rec["step_time_s"]:
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

def driver(args) -> int:
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
               f"--nproc_per_node={c['world']}", __file__, "--case", name, "--out", args.out,
               "--warmup", str(args.warmup), "--steps", str(args.steps), "--label", args.label]
        if args.quick:
            cmd.append("--quick")
        if args.profile:
            cmd.append("--profile")
        if args.expert_rows:
            cmd.append("--expert-rows")
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


def phase(args, name, rc, wall, note):
    with open(os.path.join(args.out, "phases.jsonl"), "a") as f:
        f.write(json.dumps({"script": "steps_alt.py", "case": name, "rc": rc,
                            "wall_s": round(wall, 2), "note": note}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--driver", action="store_true")
    ap.add_argument("--case", choices=sorted(CASES))
    ap.add_argument("--only", default="", help="comma-separated cases (default: the 2-GPU batch)")
    ap.add_argument("--out", default="/tmp/steps_alt")
    ap.add_argument("--quick", action="store_true", help="tiny models on the CPU with gloo")
    ap.add_argument("--label", default="first", help="recorded as 'run' in each line")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--budget-s", type=float, default=400)
    ap.add_argument("--case-timeout-s", type=float, default=75)
    ap.add_argument("--expert-rows", action="store_true",
                    help="write each MoE call's rows per local expert (expert_rows-CASE-rN.json)")
    ap.add_argument("--profile", action="store_true",
                    help="after timing, one more step under torch.profiler (profile.jsonl, "
                         "steps.py's record: kernels, GPU idle, host syncs, host ops)")
    args = ap.parse_args()
    if args.driver:
        return driver(args)
    if not args.case:
        ap.error("give --driver or --case")
    run_case(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
