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
from functools import lru_cache

from simulator.config.schema import ModelConfig
from simulator.model import context
from simulator.model import transformer as tf
from simulator.model.ops import Op

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


def tp_forward(ops: Sequence[Op], nbytes: float, sp: bool) -> list[Op]:
    """A layer's forward kernels with Megatron's TP collectives (module docstring)."""
    out: list[Op] = []
    for op in ops:
        if sp and _is(op, COLUMN_PARALLEL):
            out.append(comm_op("tp_all_gather", "all_gather", "tp", nbytes))
        out.append(op)
        if _is(op, ROW_PARALLEL):
            c = "reduce_scatter" if sp else "all_reduce"
            out.append(comm_op(f"tp_{c}", c, "tp", nbytes))
    return out


def tp_backward(ops: Sequence[Op], nbytes: float, sp: bool) -> list[Op]:
    """A layer's backward kernels with Megatron's TP collectives (module docstring)."""
    out: list[Op] = []
    seen_row: set[str] = set()
    for op in ops:
        base = _gemm_base(op)
        if sp and _is(op, ROW_PARALLEL) and base not in seen_row:
            out.append(comm_op("tp_all_gather", "all_gather", "tp", nbytes))
            seen_row.add(base)
        if _is(op, COLUMN_PARALLEL) and op.name.endswith("_dgrad"):
            if sp:
                out.append(comm_op("tp_all_gather", "all_gather", "tp", nbytes, overlap=True))
            out.append(op)
            c = "reduce_scatter" if sp else "all_reduce"
            out.append(comm_op(f"tp_{c}", c, "tp", nbytes, overlap=True))
            continue
        out.append(op)
    return out


@lru_cache(maxsize=256)
def cp_local(model: ModelConfig, cp: int) -> ModelConfig:
    """The model as one context-parallel rank sees it outside attention: ``seq_len / cp``
    tokens per sequence (Megatron-LM splits the sequence, not the weights)."""
    if cp == 1:
        return model
    return model.model_copy(update={"seq_len": model.seq_len // cp})


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
) -> list[Op]:
    """One layer's forward (or backward) on one rank: kernels and the TP and CP collectives."""
    local = cp_local(model, cp)
    kw = dict(
        micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel,
        flash_attention=flash_attention, kernels=kernels, param_dtype=param_dtype,
    )  # fmt: skip
    fn = tf.layer_backward_ops if backward else tf.layer_forward_ops
    ops = fn(local, **kw)
    if tp > 1:
        nbytes = tf.tp_comm_bytes(local, micro_batch=micro_batch)
        ops = (tp_backward if backward else tp_forward)(ops, nbytes, sequence_parallel)
    if cp > 1:
        cp_ops = context.attention_ops(model, micro_batch, tp, cp, cp_comm, backward)
        i = next(k for k, op in enumerate(ops) if op.kind == "attention")
        ops = [*ops[:i], *cp_ops, *ops[i + 1 :]]
    return list(ops)


def embedding_ops(
    model: ModelConfig, *, micro_batch: int, tp: int, sequence_parallel: bool,
    backward: bool, cp: int = 1, kernels: str = "fused", param_dtype: str = "bf16",
) -> list[Op]:  # fmt: skip
    """The embedding on one rank. Its output is summed across the vocab-parallel TP ranks
    (all-reduce, or reduce-scatter into the sequence-parallel region); its backward needs no
    collective."""
    local = cp_local(model, cp)
    kw = dict(micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel,
              kernels=kernels, param_dtype=param_dtype)  # fmt: skip
    if backward:
        return tf.embedding_backward_ops(local, **kw)
    ops = tf.embedding_forward_ops(local, **kw)
    if tp > 1:
        c = "reduce_scatter" if sequence_parallel else "all_reduce"
        ops = [*ops, comm_op(f"tp_{c}", c, "tp", tf.tp_comm_bytes(local, micro_batch=micro_batch))]
    return ops


def head_ops(
    model: ModelConfig, *, micro_batch: int, tp: int, sequence_parallel: bool,
    backward: bool, cp: int = 1, kernels: str = "fused", param_dtype: str = "bf16",
) -> list[Op]:  # fmt: skip
    """Final norm, LM head and loss on one rank. With SP the head's input is gathered from
    the sequence-parallel region and its input gradient reduce-scattered back (Korthikanti et
    al. 2022, Fig. 5 at the boundary); without SP the input gradient is all-reduced."""
    local = cp_local(model, cp)
    kw = dict(micro_batch=micro_batch, tp=tp, sequence_parallel=sequence_parallel,
              kernels=kernels, param_dtype=param_dtype)  # fmt: skip
    ops = (tf.head_backward_ops if backward else tf.head_forward_ops)(local, **kw)
    if tp == 1:
        return ops
    nbytes = tf.tp_comm_bytes(local, micro_batch=micro_batch)
    if not backward:
        return [comm_op("tp_all_gather", "all_gather", "tp", nbytes), *ops] if sequence_parallel else ops
    c = "reduce_scatter" if sequence_parallel else "all_reduce"
    return [*ops, comm_op(f"tp_{c}", c, "tp", nbytes)]
