"""Primitives of the model math: dtypes, the per-rank shapes of a layer, and the kernel-level
``Op`` with its constructors.

Shared by :mod:`simulator.model.transformer` (Megatron-LM-style fused kernels) and
:mod:`simulator.model.eager` (plain eager PyTorch modules); both re-export nothing new here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simulator.config.schema import ModelConfig
from simulator.errors import ConfigError

#: Bytes per element of the dtypes the config names (``memory.BYTES`` re-exports it).
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
FP32 = 4
#: A dropout mask stores one byte per element (Korthikanti et al. 2022, Section 4.1).
MASK = 1


#: ``Op.kind`` of a point where the host waits for the GPU (``.tolist()``, ``.item()``): no
#: kernel, but the kernels after it are launched by a host that starts behind the GPU.
HOST_SYNC = "host_sync"


@dataclass(frozen=True)
class Op:
    """One kernel, or one communication op, on one rank.

    ``kind`` is ``gemm`` (``[m,k] @ [k,n]``; ``batch > 0`` means a batched GEMM of ``batch``
    such products), ``attention`` (a fused flash-attention kernel; ``batch, heads, kv_heads,
    seq, head_dim`` per rank; ``kv_seq`` keys when they differ from the ``seq`` queries, e.g.
    a context-parallel block; ``causal`` masks the upper triangle, aligned bottom-right),
    ``memory`` (elementwise / normalisation / reduction, bound by HBM bandwidth) or ``comm``
    (a ``collective`` over the groups of parallel dimension ``dim``, ``bytes`` its full size as
    nccl-tests counts it; ``overlap`` lets it run beside the next kernel instead of before it:
    :mod:`simulator.model.comm`). ``flops`` is authoritative for every kind; ``bytes`` counts
    HBM bytes read plus written (for GEMMs the operands once: ``(mk + kn + mn) * dtype``).
    Backward GEMMs are named ``<fwd>_dgrad`` (gradient of the left operand, the activation)
    and ``<fwd>_wgrad`` (gradient of the right operand, the weight). ``acc_bytes`` (GEMMs):
    bytes per element of a buffer the GEMM adds its output into, read and written in place
    (a wgrad fused with gradient accumulation into an fp32 ``main_grad``: 4); 0 writes a
    fresh output in the compute dtype. ``serial`` (GEMMs): > 1, the op is that many GEMMs of
    ``m / serial`` rows each, run one after another (a grouped GEMM's per-expert kernels).
    """

    name: str
    kind: str
    block: str
    m: int = 0
    k: int = 0
    n: int = 0
    batch: int = 0
    heads: int = 0
    kv_heads: int = 0
    seq: int = 0
    head_dim: int = 0
    flops: float = 0.0
    bytes: float = 0.0
    backward: bool = False
    kv_seq: int = 0  # attention: keys per sequence (0: = seq)
    causal: bool = True  # attention
    window: int = 0  # attention: > 0, a causal sliding window of that many keys per query
    dim: str = ""  # comm: the parallel dimension whose groups run it
    collective: str = ""  # comm: all_reduce | all_gather | reduce_scatter | send_recv
    overlap: bool = False  # comm: runs beside the next kernel
    acc_bytes: int = 0  # gemm: accumulates into a buffer of this many bytes an element
    serial: int = 0  # gemm: > 1, that many GEMMs of m / serial rows one after another
    #: gemm: > 1, the left operand reached the GEMM through a sequence-parallel all-gather
    #: over that many TP ranks, quantised on each rank's share before it (Transformer Engine)
    gathered: int = 0


@dataclass(frozen=True)
class Arch:
    """The family conventions of a model (see the module docstring)."""

    biases: bool
    learned_positions: bool
    dropout: bool
    rotary: bool


def arch(model: ModelConfig) -> Arch:
    """GPT conventions for GELU models, Llama conventions for SwiGLU models; ``model.dropout``
    overrides the family's dropout."""
    gpt = model.activation == "gelu"
    drop = gpt if model.dropout is None else model.dropout
    return Arch(biases=gpt, learned_positions=gpt, dropout=drop, rotary=not gpt)


def dtype_bytes(name: str, field: str = "training.precision") -> int:
    """Bytes per element of a dtype name; raises ConfigError on an unknown one."""
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ConfigError(
            f"unknown dtype {name!r} (accepted: {', '.join(DTYPE_BYTES)})", field=field
        ) from None


# --------------------------------------------------------------------------------------------
# Per-rank dimensions


@dataclass(frozen=True)
class Local:
    """Dimensions of one layer on one TP rank for one micro-batch."""

    b: int  # sequences in the micro-batch
    s: int  # tokens per sequence
    tokens: int  # b*s: rows of every GEMM (SP gathers the sequence before them)
    norm_tokens: int  # tokens the norms / dropout / residuals see: b*s/tp with SP, else b*s
    heads: int  # query heads on this rank
    kv_heads: int  # key/value heads on this rank (replicated when tp > kv_heads)
    head_dim: int
    ffn: int  # MLP inner width on this rank
    fc1_out: int  # 2*ffn for SwiGLU (gate and up), ffn for GELU
    vocab: int  # vocabulary rows on this rank, ceil(V/tp)
    #: > 0: every layer of the model attends within this many tokens (``model.layer_variant``
    #: of a local layer), sliding or in chunks (``chunked``); 0: full causal attention
    window: int = 0
    chunked: bool = False


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@lru_cache(maxsize=1024)
def local_dims(model: ModelConfig, micro_batch: int, tp: int, sequence_parallel: bool) -> Local:
    """Per-rank shapes. Heads must divide by ``tp``; KV heads are split, or replicated when
    ``tp`` is a multiple of them (Megatron-LM's GQA rule); ffn and vocab are split with
    ceiling division (Megatron pads them)."""
    if tp < 1 or micro_batch < 1:
        raise ConfigError(
            f"tp={tp} and micro_batch={micro_batch} must be >= 1", field="parallelism.tp"
        )
    if model.heads % tp:
        raise ConfigError(
            f"heads={model.heads} is not divisible by tp={tp}", field="parallelism.tp"
        )
    kv = model.n_kv_heads
    if kv % tp == 0:
        kv_local = kv // tp
    elif tp % kv == 0:
        kv_local = 1
    else:
        raise ConfigError(
            f"kv_heads={kv} and tp={tp}: one must divide the other", field="parallelism.tp"
        )
    b, s, ffn = micro_batch, model.seq_len, _cdiv(model.ffn, tp)
    nt = b * _cdiv(s, tp) if sequence_parallel else b * s
    fc1_out = 2 * ffn if model.activation == "swiglu" else ffn
    vocab = _cdiv(model.vocab, tp)
    # a window only where every layer uses it (a model of mixed layers is priced per kind of
    # layer, each from ModelConfig.layer_variant)
    window = model.attention_window or 0 if model.attention_window_pattern is None else 0
    return Local(b, s, b * s, nt, model.heads // tp, kv_local, model.head_dim, ffn, fc1_out, vocab,
                 window, window > 0 and model.attention_window_kind == "chunked")


# --------------------------------------------------------------------------------------------
# Op constructors


def gemm_op(name: str, block: str, m: int, k: int, n: int, d: int, batch: int = 0, bwd=False) -> Op:
    nb = max(batch, 1)
    return Op(
        name, "gemm", block, m=m, k=k, n=n, batch=batch,
        flops=2.0 * nb * m * k * n, bytes=float(nb * (m * k + k * n + m * n) * d), backward=bwd,
    )  # fmt: skip


def mem_op(name: str, block: str, nbytes: float, bwd: bool = False) -> Op:
    return Op(name, "memory", block, bytes=float(nbytes), backward=bwd)


def gemm_grads(op: Op, d: int) -> list[Op]:
    """dgrad then wgrad of a forward GEMM Y[m,n] = X[m,k] W[k,n]:
    dX = dY[m,n] @ W^T[n,k] and dW = X^T[k,m] @ dY[m,n], each 2mkn FLOPs (so a layer's
    backward GEMMs cost twice its forward ones; Narayanan et al. 2021, Appendix)."""
    return [
        gemm_op(op.name + "_dgrad", op.block, op.m, op.n, op.k, d, op.batch, bwd=True),
        gemm_op(op.name + "_wgrad", op.block, op.k, op.m, op.n, d, op.batch, bwd=True),
    ]


def flash_attention_op(L: Local, d: int, backward: bool = False) -> Op:
    """The fused causal flash-attention kernel of one micro-batch on one TP rank.

    Forward: QK^T and PV over the lower triangle, ``2*b*hq*s^2*hd`` FLOPs; reads Q, K, V and
    writes O once (Dao et al. 2022, arXiv:2205.14135). Backward: 2.5x the forward FLOPs (5
    GEMMs of the forward's 2, with QK^T recomputed); reads Q, K, V, O, dO and writes dQ, dK, dV
    (FlashAttention-2, Dao 2023).

    A local layer (``L.window``): chunks of ``c`` tokens are ``s/c`` independent causal
    sequences of ``c`` (Llama 4's chunked attention: the kernel sees batch ``b s/c``), so
    ``2 b hq s c hd`` FLOPs; a sliding window of ``w`` keys computes ``s w - w^2/2`` query-key
    pairs instead of ``s^2/2`` (:func:`simulator.model.transformer.window_pairs2`), ``2 b hq
    (2 s w - w^2) hd``, and the kernel skips the key tiles outside the window
    (FlashAttention-2's ``window_size``; cuDNN's sliding window). Q, K, V and O move once
    either way: the bytes are those of full attention.
    """
    hq, hkv, hd, b, s = L.heads, L.kv_heads, L.head_dim, L.b, L.s
    win = 0
    if L.window and L.chunked:
        b, s = b * (L.s // L.window), L.window
        flops = 2.0 * b * hq * s * s * hd
    elif L.window:
        win = L.window
        flops = 2.0 * b * hq * (2 * s * win - win * win) * hd
    else:
        flops = 2.0 * b * hq * s * s * hd
    if backward:
        return Op(
            "attn", "attention", "attn", batch=b, heads=hq, kv_heads=hkv, seq=s, head_dim=hd,
            flops=2.5 * flops, bytes=float(b * s * hd * (4 * hq + 4 * hkv) * d), backward=True,
            window=win,
        )  # fmt: skip
    return Op(
        "attn", "attention", "attn", batch=b, heads=hq, kv_heads=hkv, seq=s, head_dim=hd,
        flops=flops, bytes=float(b * s * hd * (2 * hq + 2 * hkv) * d), window=win,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# Mixed precision with fp32 master weights (torch.autocast; Micikevicius et al. 2018,
# arXiv:1710.03740): every micro-batch casts each weight a GEMM uses to the compute dtype, and
# autograd casts each weight gradient back to fp32 and adds it into ``.grad``.


def cast_op(name: str, block: str, elements: float, src: int, dst: int, bwd: bool = False) -> Op:
    """A dtype conversion (``Tensor.to``, autocast's casts, their backward): read ``src``
    bytes and write ``dst`` bytes per element."""
    return mem_op(name, block, elements * (src + dst), bwd)


def accumulate_op(name: str, block: str, elements: float, dtype: int = FP32, bwd=True) -> Op:
    """A gradient sum ``a + b`` (autograd's input buffer, or ``.grad += g`` in AccumulateGrad
    once ``.grad`` exists): read both, write one, ``3 * dtype`` bytes per element."""
    return mem_op(name, block, 3 * elements * dtype, bwd)
