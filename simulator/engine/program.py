"""Per-stage programs: the timed parts a GPU runs for one layer, embedding, head or optimizer.

A *part* is one kernel-level op (a GEMM, the attention kernel, a memory-bound kernel) or one
tensor-parallel collective. Parts are priced once per pipeline stage with the calibrated compute
model and the collective model, then replayed by the engine for every layer and micro-batch.

Tensor-parallel communication follows Megatron-LM (Shoeybi et al. 2019; Korthikanti et al.
2022): per layer, forward has an all-reduce after the attention output projection and after the
second MLP GEMM (with sequence parallelism: an all-gather before QKV and before the first MLP
GEMM, and a reduce-scatter in place of each all-reduce). Backward mirrors them. Megatron-LM
overlaps the input-gradient all-reduce (sequence parallel: reduce-scatter) of a column-parallel
GEMM with its weight-gradient GEMM, and with sequence parallelism the re-gather of the sharded
input with the data-gradient GEMM; those collectives are marked ``overlap_next``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simulator.hardware.compute import ComputeModel
from simulator.model import transformer as tf
from simulator.model.transformer import Op


@dataclass(frozen=True)
class Part:
    """One timed piece of a program.

    ``kind`` is ``"compute"`` (duration at nominal speed, scaled by a straggler's slowdown) or
    ``"tp"`` (a tensor-parallel collective ``op`` of ``nbytes``; ``dur`` is its folded cost).
    A ``tp`` part with ``overlap_next`` runs beside the next compute part instead of before it.
    """

    name: str
    kind: str
    dur: float
    flops: float = 0.0
    op: str = ""
    nbytes: float = 0.0
    overlap_next: bool = False


Program = tuple[Part, ...]


@dataclass(frozen=True)
class StagePrograms:
    """Everything one pipeline stage runs, priced for its GPUs and TP group."""

    layer_fwd: Program
    layer_bwd: Program
    layer_recompute: Program  # extra forward work before a layer's backward (recompute)
    embed_fwd: Program
    embed_bwd: Program
    head_fwd: Program
    head_bwd: Program


def memory_access(name: str, kernels: str = "fused", param_dtype: str = "bf16") -> str:
    """The access class of a memory-bound kernel, by what the kernel does (see
    ``memory_access`` in the hardware catalog): the measured bandwidth of fused norms,
    softmax, broadcasts, strided views, up-casts, mixed-dtype adds, concatenation and dropout
    differs from a streaming copy."""
    if name in ("norm1", "norm2", "final_norm") or name.endswith("_ln"):
        return "norm"
    if name == "softmax":
        return "softmax"
    if "dropout" in name:
        return "dropout"
    if name.endswith("_cat") or name == "cat":
        return "cat"
    if "upcast" in name or name.endswith("_gcast") or name.endswith("_bgcast"):
        return "upcast"
    if kernels == "eager":
        if name.endswith("_gain") or name.endswith("_scale") or name.endswith(("_cos", "_sin")):
            return "broadcast"
        if name in ("act_silu", "act_mul"):
            return "strided"
        if name in ("residual1", "residual2") and param_dtype == "fp32":
            return "mixed"
    return "stream"


def _op_time(
    cm: ComputeModel, op: Op, dtype: str, kernels: str = "fused", param_dtype: str = "bf16"
) -> float:
    if op.kind == "gemm":
        # A batched GEMM (unfused attention: one product per head) fills the GPU like one
        # GEMM with the batch folded into m.
        t = cm.gemm_s(op.m * max(op.batch, 1), op.k, op.n, dtype)
        if dtype == "fp8" and not op.batch:
            # Transformer Engine's FP8 GEMMs take FP8 operands: the activation (forward,
            # dgrad: the left [m, k] operand) or both activation-side operands (wgrad) are
            # quantized from bf16 first (read 2, write 1 byte per element, plus the
            # transposed copy a wgrad needs). Weights are cast once per step (cached across
            # micro-batches) and amax/scale updates are negligible.
            elems = op.m * op.k + (op.m * op.n if op.name.endswith("_wgrad") else 0)
            t += cm.memory_s(3.0 * elems) + cm.gpu.kernel_launch_s
    elif op.kind == "attention":
        t = cm.attention_s(
            op.batch,
            op.heads,
            op.seq,
            op.head_dim,
            kv_heads=op.kv_heads or None,
            causal=True,
            backward=op.backward,
            dtype="bf16" if dtype == "fp8" else dtype,
        )
    else:
        t = cm.memory_s(op.bytes, memory_access(op.name, kernels, param_dtype))
    # kernel_launch_s: the measured gap between back-to-back kernels on one stream.
    return t + cm.gpu.kernel_launch_s


@dataclass(frozen=True)
class Pricer:
    """Prices kernels: the compute model, the compute dtype and how the kernels are written."""

    cm: ComputeModel
    dtype: str
    kernels: str = "fused"
    param_dtype: str = "bf16"

    def time(self, op: Op) -> float:
        return _op_time(self.cm, op, self.dtype, self.kernels, self.param_dtype)

    def part(self, op: Op) -> Part:
        return Part(op.name, "compute", self.time(op), op.flops)


def _is_column_parallel(op: Op) -> bool:
    """QKV and the first MLP GEMM are column-parallel (their input is replicated / gathered)."""
    return op.kind == "gemm" and (op.name.startswith("qkv") or op.name.startswith("fc1"))


def _is_row_parallel(op: Op) -> bool:
    return op.kind == "gemm" and (op.name.startswith("out_proj") or op.name.startswith("fc2"))


def build_layer_forward(
    ops: Sequence[Op], pr: Pricer, tp_part: Callable[[str], Part] | None, sp: bool
) -> Program:
    """Forward layer program: compute parts with TP collectives inserted (Megatron placement)."""
    parts: list[Part] = []
    for op in ops:
        if tp_part and sp and _is_column_parallel(op):
            parts.append(tp_part("all_gather"))
        parts.append(pr.part(op))
        if tp_part and _is_row_parallel(op):
            parts.append(tp_part("reduce_scatter" if sp else "all_reduce"))
    return tuple(parts)


def build_layer_backward(
    ops: Sequence[Op], pr: Pricer, tp_part: Callable[[str], Part] | None, sp: bool
) -> Program:
    """Backward layer program.

    Row-parallel GEMMs (out_proj, fc2): with SP their output gradient is all-gathered first
    (mirror of the forward reduce-scatter). Column-parallel GEMMs (qkv, fc1): the input-gradient
    all-reduce (SP: reduce-scatter) overlaps the weight-gradient GEMM; with SP the re-gather of
    the sharded input overlaps the data-gradient GEMM.
    """
    parts: list[Part] = []
    seen_row: set[str] = set()
    for op in ops:
        base = op.name.rsplit("_", 1)[0] if op.kind == "gemm" else op.name
        if tp_part and op.kind == "gemm" and _is_row_parallel(op) and sp and base not in seen_row:
            parts.append(tp_part("all_gather"))
            seen_row.add(base)
        if tp_part and _is_column_parallel(op):
            if "dgrad" in op.name:
                if sp:
                    parts.append(_overlapping(tp_part("all_gather")))
                parts.append(pr.part(op))
                parts.append(_overlapping(tp_part("reduce_scatter" if sp else "all_reduce")))
                continue
        parts.append(pr.part(op))
    return tuple(parts)


def _overlapping(p: Part) -> Part:
    return Part(p.name, p.kind, p.dur, p.flops, p.op, p.nbytes, overlap_next=True)


def build_stage_programs(
    *,
    model,
    micro_batch: int,
    tp: int,
    sp: bool,
    recompute: str,
    dtype: str,
    cm: ComputeModel,
    tp_cost: Callable[[str, float], float] | None,
    flash_attention: bool = True,
    kernels: str = "fused",
    param_dtype: str = "bf16",
) -> StagePrograms:
    """Price every program of one stage.

    ``tp_cost(op, nbytes)`` returns the folded cost of a TP collective on this stage's TP
    group(s); ``None`` when ``tp == 1``. ``kernels`` and ``param_dtype`` select the op lists
    of :mod:`simulator.model.transformer` (fused or eager kernels; fp32 master weights add
    per-micro-batch weight casts and gradient accumulation).
    """
    pr = Pricer(cm, dtype, kernels, param_dtype)
    kw = dict(
        micro_batch=micro_batch, tp=tp, sequence_parallel=sp, kernels=kernels,
        param_dtype=param_dtype,
    )  # fmt: skip
    nbytes = tf.tp_comm_bytes(model, micro_batch=micro_batch)

    tp_part = None
    if tp_cost is not None and tp > 1:

        def tp_part(op: str) -> Part:
            return Part(f"tp_{op}", "tp", tp_cost(op, nbytes), 0.0, op, nbytes)

    fwd_ops = tf.layer_forward_ops(model, flash_attention=flash_attention, **kw)
    bwd_ops = tf.layer_backward_ops(model, flash_attention=flash_attention, **kw)
    layer_fwd = build_layer_forward(fwd_ops, pr, tp_part, sp)
    layer_bwd = build_layer_backward(bwd_ops, pr, tp_part, sp)
    if recompute == "full":
        layer_re = tuple(Part(f"re_{p.name}", p.kind, p.dur, p.flops, p.op, p.nbytes) for p in layer_fwd)
    elif recompute == "selective":
        # Korthikanti et al. 2022: recompute only the core attention (QK^T, softmax, AV).
        core = {"attn", "attn_scores", "softmax", "attn_dropout", "attn_context"}
        layer_re = tuple(
            Part(f"re_{op.name}", "compute", pr.time(op), op.flops)
            for op in fwd_ops
            if op.name in core
        )
    else:
        layer_re = ()

    def simple(ops: Sequence[Op]) -> Program:
        return tuple(pr.part(op) for op in ops)

    embed_fwd = simple(tf.embedding_forward_ops(model, **kw))
    embed_bwd = simple(tf.embedding_backward_ops(model, **kw))
    head_fwd = simple(tf.head_forward_ops(model, **kw))
    head_bwd = simple(tf.head_backward_ops(model, **kw))
    if tp_part is not None:
        # The embedding output is summed across the vocab-parallel TP ranks (all-reduce, or
        # reduce-scatter into the sequence-parallel region); its backward needs no collective.
        embed_fwd = embed_fwd + (tp_part("reduce_scatter" if sp else "all_reduce"),)
        if sp:
            # The head's input is gathered from the sequence-parallel region, and the input
            # gradient reduce-scattered back (Korthikanti et al. 2022, Fig. 5 at the boundary).
            head_fwd = (tp_part("all_gather"),) + head_fwd
            head_bwd = head_bwd + (tp_part("reduce_scatter"),)
        else:
            head_bwd = head_bwd + (tp_part("all_reduce"),)
    return StagePrograms(layer_fwd, layer_bwd, layer_re, embed_fwd, embed_bwd, head_fwd, head_bwd)


def program_time(
    prog: Program, slowdown: float = 1.0, interference: float = 0.0
) -> tuple[float, float, float]:
    """(total, compute, exposed tp) seconds of a program run back to back on one GPU.

    A compute part that runs beside an overlapping collective is slowed by ``interference``
    (the measured cost of sharing the GPU with an NCCL kernel)."""
    total = comp = tpc = 0.0
    pending = 0.0  # an overlapping collective waiting for the next compute part
    for p in prog:
        if p.kind == "tp":
            if p.overlap_next:
                pending = max(pending, p.dur)
            else:
                total += p.dur
                tpc += p.dur
        else:
            d = p.dur * slowdown
            if pending:
                d *= 1.0 + interference
                exposed = max(0.0, pending - d)
                total += d + exposed
                tpc += exposed
                pending = 0.0
            else:
                total += d
            comp += d
    if pending:
        total += pending
        tpc += pending
    return total, comp, tpc
