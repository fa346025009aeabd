"""Communication as ops: the collectives of each parallel dimension, placed in a rank's op list.

The model emits its communication next to its kernels as ``Op(kind="comm")`` -- the
collective, the parallel dimension whose groups run it, its full size as nccl-tests counts it,
and whether it runs beside the next kernel (``overlap``) -- so the engine prices and runs what
it is given and never infers a collective from a kernel's name. :func:`layer_ops`,
:func:`embedding_ops` and :func:`head_ops` are the op lists of one rank with every dimension's
communication in place.

**Tensor parallelism** follows Megatron-LM (Shoeybi et al. 2019, arXiv:1909.08053; with
sequence parallelism Korthikanti et al. 2022, arXiv:2205.05198, Section 4.2): forward, an
all-reduce after each row-parallel GEMM (out_proj, fc2), or with SP a reduce-scatter there and
an all-gather before each column-parallel GEMM (qkv, fc1). Backward mirrors them: with SP the
output gradient of a row-parallel GEMM is all-gathered first; the input-gradient all-reduce
(SP: reduce-scatter) of a column-parallel GEMM overlaps its weight-gradient GEMM, and with SP
the re-gather of the sharded input overlaps the data-gradient GEMM.

**Context parallelism** splits every sequence over ``cp`` ranks; all kernels but attention
run on the rank's ``s/cp`` tokens (:func:`cp_local`), and attention is
:mod:`simulator.model.context`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from simulator.config.schema import ModelConfig
from simulator.model import context
from simulator.model import transformer as tf
from simulator.model.ops import DTYPE_BYTES, Op

#: Megatron-LM's column-parallel (output features split) and row-parallel GEMMs of a layer.
COLUMN_PARALLEL = ("qkv", "fc1")
ROW_PARALLEL = ("out_proj", "fc2")


def comm_op(name: str, collective: str, dim: str, nbytes: float, overlap: bool = False) -> Op:
    """A collective over the groups of ``dim``; ``overlap``: it runs beside the next kernel."""
    return Op(name, "comm", dim, bytes=float(nbytes), dim=dim, collective=collective,
              overlap=overlap)  # fmt: skip


def _gemm_base(op: Op) -> str:
    return op.name.rsplit("_", 1)[0] if op.backward else op.name


def _is(op: Op, names: tuple[str, ...]) -> bool:
    return op.kind == "gemm" and _gemm_base(op) in names


@dataclass(frozen=True)
class LowPrecisionGather:
    """How Transformer Engine runs a sequence-parallel all-gather of a GEMM operand under a
    low-precision recipe (``Linear`` / ``LayerNormLinear`` ``with_input_all_gather``, the
    output gradient's ``grad_output_preprocess``, ``gather_along_first_dim(...,
    quantizer=...)``, TE 2.x): each rank quantises its own ``1/tp`` share and the quantised
    copies are gathered. ``fwd``: bytes per element of the forward input's gather (row-wise
    copy) and of its backward re-gather (MXFP8: the column-wise copy; per-tensor FP8: the
    row-wise copy again, transposed after the gather where the GPU needs it); ``grad``: of the
    output gradient's gather (MXFP8 both copies, as its quantizer wants both usages; per-tensor
    FP8 the row-wise copy); ``tp``: the group size; ``amax``: current scaling all-reduces each
    gathered tensor's amax over the TP group first (``with_amax_reduction``, TE's
    ``_customize_quantizers_float8_current_scaling`` for SP column / row parallel)."""

    fwd: float
    grad: float
    tp: int
    amax: bool = False


def _amax(lp: LowPrecisionGather | None) -> list[Op]:
    return [comm_op("tp_amax_all_reduce", "all_reduce", "tp", 4.0)] if lp and lp.amax else []


def tp_forward(ops: Sequence[Op], nbytes: float, sp: bool, gather_bytes: float | None = None,
               lowp: LowPrecisionGather | None = None) -> list[Op]:  # fmt: skip
    """A layer's forward kernels with Megatron's TP collectives (module docstring).
    ``gather_bytes``: the SP all-gather of a column-parallel input when it is not in the
    compute dtype (DTensor's ``PrepareModuleInput`` gathers the norm's fp32 output).
    ``lowp``: the column-parallel inputs are quantised before their gather and gathered in
    the low-precision format (:class:`LowPrecisionGather`)."""
    out: list[Op] = []
    for op in ops:
        if sp and _is(op, COLUMN_PARALLEL):
            g = nbytes if gather_bytes is None else gather_bytes
            if lowp is not None:
                g = nbytes * lowp.fwd / 2.0
                op = replace(op, gathered=lowp.tp)
                out += _amax(lowp)
            out.append(comm_op("tp_all_gather", "all_gather", "tp", g))
        out.append(op)
        if _is(op, ROW_PARALLEL):
            c = "reduce_scatter" if sp else "all_reduce"
            out.append(comm_op(f"tp_{c}", c, "tp", nbytes))
    return out


def tp_backward(ops: Sequence[Op], nbytes: float, sp: bool, grad_in_bytes: float | None = None,
                overlap: bool = True, regather: bool = True,
                lowp: LowPrecisionGather | None = None) -> list[Op]:  # fmt: skip
    """A layer's backward kernels with Megatron's TP collectives (module docstring).
    ``grad_in_bytes``: the all-reduce of a column-parallel input's gradient without SP when
    that input is not in the compute dtype (eager code: the norm's output, in the residual
    stream's dtype). ``overlap=False`` (eager code): the collective on a column-parallel
    input's gradient runs after the layer's weight gradient, not beside it: autograd's
    ``MmBackward`` node computes both gradients before the input gradient reaches the TP
    boundary's function, whose collective the stream then waits for. ``regather=False``
    (DTensor): with SP the all-gathered input of a column-parallel GEMM was kept for the
    backward (autograd saved it), so it is not gathered again, and ``grad_in_bytes`` is also
    the size of its gradient's reduce-scatter. ``lowp``: the row-parallel output gradients
    are quantised before their gather and the gathers move the low-precision copies
    (:class:`LowPrecisionGather`)."""
    out: list[Op] = []
    pending: list[Op] = []  # eager: the input gradient's collective, after the weight gradient
    seen_row: set[str] = set()
    for op in ops:
        base = _gemm_base(op)
        if sp and _is(op, ROW_PARALLEL) and base not in seen_row:
            g = nbytes
            if lowp is not None:
                g = nbytes * lowp.grad / 2.0
                out += _amax(lowp)
            out.append(comm_op("tp_all_gather", "all_gather", "tp", g))
            seen_row.add(base)
        if sp and lowp is not None and _is(op, ROW_PARALLEL) and op.name.endswith("_dgrad"):
            op = replace(op, gathered=lowp.tp)
        if _is(op, COLUMN_PARALLEL) and op.name.endswith("_dgrad"):
            if sp and regather:
                g = nbytes if lowp is None else nbytes * lowp.fwd / 2.0
                out.append(comm_op("tp_all_gather", "all_gather", "tp", g, overlap=True))
            out.append(op)
            c = "reduce_scatter" if sp else "all_reduce"
            g = nbytes if (sp and regather) or grad_in_bytes is None else grad_in_bytes
            if overlap:
                out.append(comm_op(f"tp_{c}", c, "tp", g, overlap=True))
            else:
                pending.append(comm_op(f"tp_{c}", c, "tp", g))
            continue
        if pending and not (_is(op, COLUMN_PARALLEL) and op.name.endswith("_wgrad")):
            out += pending
            pending.clear()
        out.append(op)
    return out + pending


@lru_cache(maxsize=256)
def cp_local(model: ModelConfig, cp: int) -> ModelConfig:
    """The model as one context-parallel rank sees it outside attention: ``seq_len / cp``
    tokens per sequence (Megatron-LM splits the sequence, not the weights)."""
    if cp == 1:
        return model
    return model.model_copy(update={"seq_len": model.seq_len // cp})


def residual_comm_bytes(model: ModelConfig, micro_batch: int, kernels: str, param_dtype: str
                        ) -> float:  # fmt: skip
    """A ``[b, s, h]`` tensor of the residual stream's dtype in bytes: in eager code the
    stream, the embedding's output and the norms' outputs are in the parameter dtype (fp32
    with AMP master weights; :mod:`simulator.model.eager`), so TP collectives on them (the
    embedding's all-reduce, the gradient of a column-parallel input) carry those bytes; fused
    (Megatron) code casts to the compute dtype in its norms."""
    r = DTYPE_BYTES[param_dtype] if kernels == "eager" else 2
    return tf.tp_comm_bytes(model, micro_batch=micro_batch, dtype_bytes=r)


def layer_ops(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    backward: bool,
    cp: int = 1,
    cp_comm: str = "p2p",
    flash_attention: bool = True,
    kernels: str = "fused",
    param_dtype: str = "bf16",
    tp_input_dtype: str = "residual",
    tp_impl: str = "megatron",
    lowp_gather: LowPrecisionGather | None = None,
) -> list[Op]:
    """One layer's forward (or backward) on one rank: kernels and the TP and CP collectives
    (``tp_input_dtype``, ``tp_impl``: see ``parallelism``; ``lowp_gather``: Transformer
    Engine's sequence-parallel gathers under a low-precision recipe,
    :class:`LowPrecisionGather`)."""
    local = cp_local(model, cp)
    kw = dict(
        micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel,
        flash_attention=flash_attention, kernels=kernels, param_dtype=param_dtype,
    )  # fmt: skip
    fn = tf.layer_backward_ops if backward else tf.layer_forward_ops
    ops = fn(local, **kw)
    if tp > 1:
        nbytes = tf.tp_comm_bytes(local, micro_batch=micro_batch)
        res = (residual_comm_bytes(local, micro_batch, kernels, param_dtype)
               if tp_input_dtype == "residual" else None)
        dt = tp_impl == "dtensor"
        lp = lowp_gather if sequence_parallel and kernels == "fused" else None
        if backward:
            ops = tp_backward(ops, nbytes, sequence_parallel, res,
                              overlap=kernels != "eager", regather=not dt, lowp=lp)
        else:
            ops = tp_forward(ops, nbytes, sequence_parallel, res if dt else None, lowp=lp)
    if cp > 1:
        cp_ops = context.attention_ops(model, micro_batch, tp, cp, cp_comm, backward)
        i = next(k for k, op in enumerate(ops) if op.kind == "attention")
        ops = [*ops[:i], *cp_ops, *ops[i + 1 :]]
    return list(ops)


def embedding_ops(
    model: ModelConfig, *, micro_batch: int, tp: int, sequence_parallel: bool,
    backward: bool, cp: int = 1, kernels: str = "fused", param_dtype: str = "bf16",
    main_grad_bytes: int = 0, tied_head: bool = False,
) -> list[Op]:  # fmt: skip
    """The embedding on one rank. Its output is summed across the vocab-parallel TP ranks
    (all-reduce, or reduce-scatter into the sequence-parallel region). In backward the
    all-reduce's gradient is the identity, but the reduce-scatter's is an all-gather of the
    sequence-parallel gradient before the lookup's backward (Megatron-Core's
    ``_ReduceScatterToSequenceParallelRegion.backward``; DTensor's ``RowwiseParallel`` with
    ``Shard(1)`` output, whose backward redistributes the gradient to ``Replicate``)
    (``main_grad_bytes``, ``tied_head``: see
    :func:`simulator.model.transformer.embedding_weight_grad_ops`)."""
    local = cp_local(model, cp)
    kw = dict(micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel,
              kernels=kernels, param_dtype=param_dtype)  # fmt: skip
    if backward:
        ops = tf.embedding_backward_ops(local, main_grad_bytes=main_grad_bytes,
                                        tied_head=tied_head, **kw)
        if tp > 1 and sequence_parallel:
            nbytes = residual_comm_bytes(local, micro_batch, kernels, param_dtype)
            ops = [comm_op("tp_all_gather", "all_gather", "tp", nbytes), *ops]
        return ops
    ops = tf.embedding_forward_ops(local, **kw)
    if tp > 1:
        c = "reduce_scatter" if sequence_parallel else "all_reduce"
        nbytes = residual_comm_bytes(local, micro_batch, kernels, param_dtype)
        ops = [*ops, comm_op(f"tp_{c}", c, "tp", nbytes)]
    return ops


def head_ops(
    model: ModelConfig, *, micro_batch: int, tp: int, sequence_parallel: bool,
    backward: bool, cp: int = 1, kernels: str = "fused", param_dtype: str = "bf16",
    tp_input_dtype: str = "residual", tp_impl: str = "megatron", tp_loss: str = "vocab_parallel",
) -> list[Op]:  # fmt: skip
    """Final norm, LM head and loss on one rank. With SP the head's input is gathered from
    the sequence-parallel region and its input gradient reduce-scattered back (Korthikanti et
    al. 2022, Fig. 5 at the boundary); without SP the input gradient is all-reduced. DTensor
    (``tp_impl``) gathers the final norm's output (``ColwiseParallel(input_layouts=Shard(1))``
    on the LM head), in the residual stream's dtype as its gradient's reduce-scatter.
    ``tp_loss: gathered`` all-gathers the LM head's vocabulary-split logits (the whole
    ``[b*s, V]`` tensor in the compute dtype) before the loss's copies."""
    local = cp_local(model, cp)
    kw = dict(micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel,
              kernels=kernels, param_dtype=param_dtype, tp_loss=tp_loss)  # fmt: skip
    ops = (tf.head_backward_ops if backward else tf.head_forward_ops)(local, **kw)
    if tp == 1:
        return ops
    if tp_loss == "gathered" and not backward:
        i = next(k for k, op in enumerate(ops) if op.name == "logits_gather_copy")
        logits = ops[i].bytes / 2  # the copy reads and writes the gathered logits once
        ops = [*ops[:i], comm_op("tp_all_gather", "all_gather", "tp", logits), *ops[i:]]
    nbytes = tf.tp_comm_bytes(local, micro_batch=micro_batch)
    if sequence_parallel and tp_impl == "dtensor" and tp_input_dtype == "residual":
        nbytes = residual_comm_bytes(local, micro_batch, kernels, param_dtype)
    if not backward:
        return [comm_op("tp_all_gather", "all_gather", "tp", nbytes), *ops] if sequence_parallel else ops
    if sequence_parallel:
        return [*ops, comm_op("tp_reduce_scatter", "reduce_scatter", "tp", nbytes)]
    # the gradient of the final norm's output, in the residual stream's dtype unless cast
    if tp_input_dtype == "residual":
        nbytes = residual_comm_bytes(local, micro_batch, kernels, param_dtype)
    return [*ops, comm_op("tp_all_reduce", "all_reduce", "tp", nbytes)]
