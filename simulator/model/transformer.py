"""Model math of a decoder-only transformer: parameters, kernel-level ops, model FLOPs.

Pure functions, no SimPy. Everything here is per *one tensor-parallel rank* unless a name says
otherwise, following Megatron-LM's tensor parallelism (Shoeybi et al. 2019, arXiv:1909.08053):
QKV and fc1 are column-parallel (output features split over ``tp``), out_proj and fc2 are
row-parallel (input features split), the embedding and LM head are vocab-parallel. With
sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198) the norms, dropouts and
residual adds run on ``seq/tp`` tokens per rank.

Architecture conventions (the config has no separate switches for them):

* **GPT family** (``activation: gelu``): learned absolute position embeddings (``seq_len x h``
  parameters), biases on every linear layer, dropout (p > 0) after attention softmax and on
  both residual branches and the embedding, as in GPT-2/3 and Megatron's GPT recipes.
* **Llama family** (``activation: swiglu``): rotary position embeddings (no parameters), no
  biases, no dropout (Touvron et al. 2023).

Norm parameters follow ``model.norm_kind``: LayerNorm has gain and bias (2h), RMSNorm a gain (h).

FLOP conventions: a GEMM ``[m,k] @ [k,n]`` costs ``2mkn``. Attention ``softmax(QK^T)V`` costs
``4 b s^2 h`` non-causal (two batched GEMMs of ``2 b s^2 h``); a causal flash kernel executes
half of it, and its backward 2.5x the forward (the convention of the calibration data,
``data/calibration/README.md``, and of FlashAttention-2, Dao 2023). Memory-bound ops carry
``flops = 0``: their time is their HBM bytes over bandwidth, and model FLOPs (MFU) count only
matrix products (Narayanan et al. 2021, arXiv:2104.04473, Appendix), with causal attention
(Megatron-LM's current counting; :func:`model_flops_per_step`).
"""

from __future__ import annotations

from functools import lru_cache

from simulator.config.schema import ModelConfig
from simulator.errors import ConfigError
from simulator.model import eager, mla, moe
from simulator.model.ops import (
    DTYPE_BYTES,
    FP32,
    MASK,
    Arch,
    Local,
    Op,
    accumulate_op,
    arch,
    cast_op,
    dtype_bytes,
    flash_attention_op,
    gemm_grads,
    gemm_op,
    local_dims,
    mem_op,
)

__all__ = [
    "DTYPE_BYTES",
    "FP32",
    "MASK",
    "Arch",
    "Local",
    "Op",
    "arch",
    "dtype_bytes",
    "local_dims",
]


# --------------------------------------------------------------------------------------------
# One transformer layer
#
# HBM traffic of the memory-bound ops, in tensors of the named width (T = tokens the op sees):
#   norm        fwd: read x, write y                                   2 T*h
#               bwd: read x, dy, write dx (gain/bias grads are small partial sums)  3 T*h
#   residual    fwd: fused bias-dropout-add: read branch, read skip, write out (+ mask)  3 T*h
#               bwd: dropout backward (read dy, mask, write dx; absent without dropout) and
#                    the add that joins the skip and branch gradients (read 2, write 1)
#   gelu        fwd 2 T*ffn, bwd 3 T*ffn (read x, dy; write dx)
#   swiglu      fwd 3 T*ffn (read gate, up; write out), bwd 5 T*ffn (read gate, up, dy;
#               write dgate, dup)
#   rope        read and write q and k, forward and backward alike
# so backward moves 1.5-2x the forward bytes.


def _attention_forward(L: Local, d: int, dropout: bool, flash: bool) -> list[Op]:
    if flash:
        return [flash_attention_op(L, d)]
    hq, hd, b, s = L.heads, L.head_dim, L.b, L.s
    # Unfused core attention of Megatron-LM before flash attention (Korthikanti et al. 2022,
    # Fig. 4): batched QK^T over the full s x s (the causal mask is applied in the softmax),
    # fused scale-mask-softmax, dropout, batched PV.
    sq = b * hq * s * s
    ops = [
        gemm_op("attn_scores", "attn", s, hd, s, d, batch=b * hq),
        mem_op("softmax", "attn", 2 * sq * d),
    ]
    if dropout:
        ops.append(mem_op("attn_dropout", "attn", sq * (2 * d + MASK)))
    ops.append(gemm_op("attn_context", "attn", s, s, hd, d, batch=b * hq))
    return ops


def _attention_backward(fwd: list[Op], L: Local, d: int, dropout: bool) -> list[Op]:
    if len(fwd) == 1:  # flash
        return [flash_attention_op(L, d, backward=True)]
    sq = L.b * L.heads * L.s * L.s
    by = {op.name: op for op in fwd}
    ops = gemm_grads(by["attn_context"], d)
    if dropout:
        ops.append(mem_op("attn_dropout", "attn", sq * (2 * d + MASK), bwd=True))
    ops.append(mem_op("softmax", "attn", 3 * sq * d, bwd=True))  # read y, dy; write dx
    return ops + gemm_grads(by["attn_scores"], d)


def _qk_norms(T: int, q_w: int, kv_w: int, d: int, bwd: bool) -> list[Op]:
    """``model.qk_layernorm``: Megatron-Core's ``q_layernorm`` and ``k_layernorm`` (Transformer
    Engine's norm over each head's ``head_dim``, ``get_gpt_layer_with_transformer_engine_spec
    (qk_layernorm=True)``), one kernel per tensor each way, over the ``T`` tokens' query
    (``q_w`` wide) and key (``kv_w``) heads of this TP rank; bytes as the other norms
    (forward read and write, backward read input and gradient, write gradient; the
    backward in reverse order)."""
    n = 3 if bwd else 2
    ops = [mem_op("q_norm", "attn", n * T * q_w * d, bwd),
           mem_op("k_norm", "attn", n * T * kv_w * d, bwd)]  # fmt: skip
    return ops[::-1] if bwd else ops


@lru_cache(maxsize=1024)
def _layer_forward(
    model: ModelConfig, b: int, tp: int, sp: bool, d: int, flash: bool
) -> tuple[Op, ...]:
    L = local_dims(model, b, tp, sp)
    A = arch(model)
    h, T, NT = model.hidden, L.tokens, L.norm_tokens
    q_w, kv_w = L.heads * L.head_dim, L.kv_heads * L.head_dim
    res = NT * h * (3 * d + (MASK if A.dropout else 0))
    act = (3 if model.activation == "swiglu" else 2) * T * L.ffn * d
    ops = [mem_op("norm1", "attn", 2 * NT * h * d), gemm_op("qkv", "attn", T, h, q_w + 2 * kv_w, d)]
    if model.qk_layernorm:
        ops += _qk_norms(T, q_w, kv_w, d, False)
    if A.rotary:
        ops.append(mem_op("rope", "attn", 2 * T * (q_w + kv_w) * d))
    ops += _attention_forward(L, d, A.dropout, flash)
    ops += [
        gemm_op("out_proj", "attn", T, q_w, h, d),
        mem_op("residual1", "attn", res),
        mem_op("norm2", "mlp", 2 * NT * h * d),
        gemm_op("fc1", "mlp", T, h, L.fc1_out, d),
        mem_op("act", "mlp", act),
        gemm_op("fc2", "mlp", T, L.ffn, h, d),
        mem_op("residual2", "mlp", res),
    ]
    return tuple(ops)


@lru_cache(maxsize=1024)
def _layer_backward(
    model: ModelConfig, b: int, tp: int, sp: bool, d: int, flash: bool
) -> tuple[Op, ...]:
    L = local_dims(model, b, tp, sp)
    A = arch(model)
    h, T, NT = model.hidden, L.tokens, L.norm_tokens
    fwd = _layer_forward(model, b, tp, sp, d, flash)
    by = {op.name: op for op in fwd}
    res = NT * h * ((2 * d + MASK if A.dropout else 0) + 3 * d)
    act = (5 if model.activation == "swiglu" else 3) * T * L.ffn * d
    norm = 3 * NT * h * d
    attn_fwd = _attention_forward(L, d, A.dropout, flash)
    ops = [
        mem_op("residual2", "mlp", res, True),
        *gemm_grads(by["fc2"], d),
        mem_op("act", "mlp", act, True),
    ]
    ops += [
        *gemm_grads(by["fc1"], d),
        mem_op("norm2", "mlp", norm, True),
        mem_op("residual1", "attn", res, True),
    ]
    ops += gemm_grads(by["out_proj"], d)
    ops += _attention_backward(attn_fwd, L, d, A.dropout)
    if A.rotary:
        ops.append(mem_op("rope", "attn", by["rope"].bytes, True))
    if model.qk_layernorm:
        ops += _qk_norms(T, L.heads * L.head_dim, L.kv_heads * L.head_dim, d, True)
    ops += [*gemm_grads(by["qkv"], d), mem_op("norm1", "attn", norm, True)]
    return tuple(ops)


#: ``training.kernels``: Megatron-LM-style fused kernels, or plain eager PyTorch modules
#: (:mod:`simulator.model.eager`).
KERNELS = ("fused", "eager")
#: GEMMs that multiply by a weight (their weights are cast under AMP).
WEIGHT_GEMMS = ("qkv", "out_proj", "fc1", "fc2", "lm_head")


def _modes(kernels: str, param_dtype: str) -> int:
    """Validate the two switches; return the parameter dtype's bytes."""
    if kernels not in KERNELS:
        raise ConfigError(
            f"kernels={kernels!r} (accepted: {', '.join(KERNELS)})", field="training.kernels"
        )
    return dtype_bytes(param_dtype, "training.param_dtype")


def _master_weights(ops: tuple[Op, ...], d: int, biases: bool) -> list[Op]:
    """Fused kernels with fp32 master weights under autocast: before each weight GEMM the
    fp32 -> ``d`` cast of its weight (and bias), after each weight-gradient GEMM the cast of
    the gradient to fp32 and its addition into ``.grad`` (:func:`ops.accumulate_op`)."""
    out: list[Op] = []
    for op in ops:
        base = op.name[: -len("_wgrad")] if op.name.endswith("_wgrad") else op.name
        weight = op.kind == "gemm" and base in WEIGHT_GEMMS
        n = (op.n if biases and base != "lm_head" else 0) + (
            op.m * op.n if op.backward else op.k * op.n
        )
        if weight and not op.backward:
            out.append(cast_op(op.name + "_wcast", op.block, n, FP32, d))
        out.append(op)
        if weight and op.backward and op.name.endswith("_wgrad"):
            out.append(cast_op(base + "_gcast", op.block, n, d, FP32, True))
            out.append(accumulate_op(base + "_gacc", op.block, n))
    return out


def unfused_grad_accumulation(ops: list[Op], d: int, acc: int, share: float) -> list[Op]:
    """``ops`` (a backward) with, after each weight-gradient GEMM, the addition of the fresh
    ``d``-byte gradient into the step's accumulated gradient of ``acc`` bytes an element:
    ``d + 2 acc`` bytes per weight element (read both, write the sum), times ``share``.

    Megatron-LM fuses this addition into the wgrad GEMM (``--gradient-accumulation-fusion``,
    NVIDIA/Megatron-LM commit 83b1e42f, 2022-02-13), but only with fp32 accumulation: with
    fp16 gradients its arguments.py turns the fusion off, and code before that commit (the
    SC21 runs, NGC 20.12) had none. Unfused, LocalDDP's contiguous fp32 ``main_grad`` takes
    ``main_grad.add_(grad)`` every micro-batch (``share`` 1), while 16-bit gradients
    accumulate in ``.grad`` by autograd, whose first micro-batch keeps the gradient without
    an addition (``share`` (m - 1) / m; megatron/model/distributed.py at 6985e589)."""
    out: list[Op] = []
    for op in ops:
        out.append(op)
        # weight GEMMs are the unbatched ones (unfused attention's batched products have none)
        if op.kind == "gemm" and op.name.endswith("_wgrad") and not op.batch and share > 0:
            n = op.m * op.n  # dW = X^T dY: [k, n] of the forward GEMM (ops.gemm_grads)
            out.append(mem_op(op.name[: -len("_wgrad")] + "_gacc", op.block,
                              n * (d + 2 * acc) * share, bwd=True))  # fmt: skip
    return out


def layer_forward_ops(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    dtype_bytes: int = 2,
    flash_attention: bool = True,
    kernels: str = "fused",
    param_dtype: str = "bf16",
) -> list[Op]:
    """Kernels of one transformer layer's forward on one TP rank, in execution order.

    ``norm1, qkv, [rope], attn, out_proj, residual1, norm2, fc1, act, fc2, residual2`` (pre-norm
    block). ``flash_attention=False`` replaces ``attn`` by Megatron's unfused core attention
    (``attn_scores, softmax, [attn_dropout], attn_context``). The TP collectives are placed
    between these kernels by :mod:`simulator.model.comm`.

    ``kernels="eager"`` returns the kernels of plain eager PyTorch modules under autocast
    instead (:mod:`simulator.model.eager`); the GEMMs and the attention kernel, and so the
    FLOPs, are the same. ``param_dtype="fp32"`` (AMP master weights) adds, every micro-batch,
    the fp32 -> compute-dtype cast of each GEMM weight before its GEMM (with bf16 parameters,
    fused kernels accumulate into Megatron's fp32 ``main_grad`` inside the wgrad GEMM).
    """
    P = _modes(kernels, param_dtype)
    args = (model, micro_batch, tp, sequence_parallel, dtype_bytes, flash_attention)
    if kernels == "eager":
        return list(eager.layer_forward(*args, P))
    ops = _layer_forward(*args)
    return _master_weights(ops, dtype_bytes, arch(model).biases) if P == FP32 else list(ops)


def layer_backward_ops(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    dtype_bytes: int = 2,
    flash_attention: bool = True,
    kernels: str = "fused",
    param_dtype: str = "bf16",
) -> list[Op]:
    """Kernels of one layer's backward on one TP rank, in execution order (the forward
    reversed; each GEMM becomes ``_dgrad`` then ``_wgrad``). ``kernels`` as in
    :func:`layer_forward_ops`; ``param_dtype="fp32"`` adds after each weight-gradient GEMM the
    cast of the gradient to fp32 and its addition into ``.grad``."""
    P = _modes(kernels, param_dtype)
    args = (model, micro_batch, tp, sequence_parallel, dtype_bytes, flash_attention)
    if kernels == "eager":
        return list(eager.layer_backward(*args, P))
    ops = _layer_backward(*args)
    return _master_weights(ops, dtype_bytes, arch(model).biases) if P == FP32 else list(ops)


# --------------------------------------------------------------------------------------------
# Embedding, LM head, loss, optimizer


def embedding_forward_ops(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    dtype_bytes: int = 2,
    kernels: str = "fused",
    param_dtype: str = "bf16",
) -> list[Op]:
    """Vocab-parallel lookup (each rank reads the rows of its vocabulary shard, about 1/tp of
    the tokens, and writes a full ``[b*s, h]`` partial sum that the TP all-reduce or, with SP,
    reduce-scatter completes), then the position-embedding add and dropout (GPT family).
    ``kernels="eager"``: :func:`eager.embedding_forward` (output in the parameter dtype)."""
    P = _modes(kernels, param_dtype)
    if kernels == "eager":
        return eager.embedding_forward(model, micro_batch, tp, sequence_parallel, P)
    L, A = local_dims(model, micro_batch, tp, sequence_parallel), arch(model)
    h, d = model.hidden, dtype_bytes
    ops = [mem_op("embed", "embed", L.tokens * h * d * (1 + 1 / tp))]
    if A.learned_positions:
        ops.append(mem_op("pos_embed", "embed", 3 * L.norm_tokens * h * d))
    if A.dropout:
        ops.append(mem_op("embed_dropout", "embed", L.norm_tokens * h * (2 * d + MASK)))
    return ops


def embedding_backward_ops(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    dtype_bytes: int = 2,
    kernels: str = "fused",
    param_dtype: str = "bf16",
    main_grad_bytes: int = 0,
    tied_head: bool = False,
) -> list[Op]:
    """Dropout backward, position-embedding gradient (read dY, write the summed rows), and
    the word-embedding gradient as Megatron-Core's ``VocabParallelEmbedding`` produces it
    (:func:`embedding_weight_grad_ops`: a dense ``[V/tp, h]`` gradient, then its addition
    into ``main_grad`` of ``main_grad_bytes`` an element; ``tied_head``: the LM head on the
    same rank shares the weight). ``kernels="eager"``: :func:`eager.embedding_backward`."""
    P = _modes(kernels, param_dtype)
    if kernels == "eager":
        return eager.embedding_backward(model, micro_batch, tp, sequence_parallel, P)
    L, A = local_dims(model, micro_batch, tp, sequence_parallel), arch(model)
    h, d = model.hidden, dtype_bytes
    ops = []
    if A.dropout:
        ops.append(mem_op("embed_dropout", "embed", L.norm_tokens * h * (2 * d + MASK), True))
    if A.learned_positions:
        ops.append(mem_op("pos_embed", "embed", 2 * L.norm_tokens * h * d, True))
    g = FP32 if P == FP32 else d  # F.embedding of fp32 weights is not autocast: fp32 dY
    return ops + embedding_weight_grad_ops(L.tokens, L.vocab, h, tp, g, P == FP32,
                                           main_grad_bytes, tied_head)


#: ``embedding_dense_backward``'s rows per partial sum (``NROWS_PER_THREAD``, PyTorch
#: aten/src/ATen/native/cuda/EmbeddingBackwardKernel.cu).
EMBED_ROWS_PER_PARTIAL = 10
#: Bytes of a token id (int64) and of a boolean mask element.
ID_BYTES, BOOL_BYTES = 8, 1


def embedding_weight_grad_ops(tokens: int, rows: int, h: int, tp: int, g: int, fp32_grad: bool,
                              main_grad_bytes: int, tied_head: bool) -> list[Op]:
    """The word-embedding weight gradient of one micro-batch on one TP rank (fused kernels).

    Megatron-Core's ``VocabParallelEmbedding`` (tp > 1) maps the ids of other shards to row 0,
    looks up with ``F.embedding`` and zeroes their output rows (``output_parallel[input_mask,
    :] = 0.0``). Backward: that ``index_put_``'s gradient clones dY and writes zeros into the
    ``(1 - 1/tp)`` foreign rows (boolean mask -> int64 indices); then PyTorch's
    ``embedding_dense_backward`` over all ``tokens`` ids (Embedding.cu, sort path for more
    than 3,072 ids): a CUB radix sort of the int64 ids with their positions (8 passes of 8
    bits, reading and writing keys and values), ``at::zeros`` of the dense ``[rows, h]``
    gradient in dY's dtype ``g``, ``compute_grad_weight`` (read every token's dY row, write
    one fp32 partial sum per run of up to 10 equal ids: about ``tokens/tp`` distinct rows
    plus ``(1 - 1/tp) tokens / 10`` partials for row 0), ``sum_and_scatter`` (read the
    partials, write the ``tokens/tp`` rows). The dense gradient then reaches the optimizer's
    buffer in full, whatever the tokens touched: Megatron-Core's DDP hook on the parameter
    runs ``param.main_grad.add_(param.grad)`` (``g + 2 * main_grad_bytes`` bytes an
    element, every micro-batch: the hook sets ``.grad`` to None after it); with fp32
    weights (autocast) autograd adds it into ``.grad`` (12 bytes an element, steady state).
    ``tied_head`` (the LM head shares the weight on this rank, Megatron's ``zero_out_wgrad``
    at PP 1): the head's fused wgrad has gone into ``main_grad`` already and it hands
    autograd a zero-filled ``[rows, h]`` dummy (``torch.zeros``, ``g`` bytes an element),
    which autograd's input buffer adds to the embedding's (``3 g``)."""
    mine = tokens / tp
    partials = mine + (tokens - mine) / EMBED_ROWS_PER_PARTIAL
    ops = []
    if tp > 1:
        foreign = tokens - mine
        ops.append(mem_op("embed_mask", "embed", 2 * tokens * h * g + tokens * BOOL_BYTES
                          + foreign * (h * g + 2 * ID_BYTES), True))
    ops += [
        mem_op("embed_sort", "embed", 8 * 2 * 2 * tokens * ID_BYTES, True),
        mem_op("embed_zero", "embed", rows * h * g, True),
        mem_op("embed_partial", "embed", tokens * h * g + partials * h * FP32, True),
        mem_op("embed_scatter", "embed", partials * h * FP32 + mine * h * g, True),
    ]
    if tied_head:
        ops += [mem_op("head_wgrad_zero", "embed", rows * h * g, True),
                accumulate_op("embed_gsum", "embed", rows * h, g)]
    if fp32_grad:
        ops.append(accumulate_op("embed_gacc", "embed", rows * h))
    elif main_grad_bytes:
        ops.append(mem_op("embed_gacc", "embed", rows * h * (g + 2 * main_grad_bytes), True))
    return ops


# Megatron-LM's vocab-parallel cross-entropy (tensor_parallel/cross_entropy.py) per logit:
# forward: cast to fp32 (read d, write 4), max (read 4), subtract max (read 4, write 4),
# exp (read 4, write 4), sum (read 4), divide in place to the softmax it keeps (read 4, write 4):
# d + 36 bytes. Backward: softmax - one_hot scaled by dloss (read 4, write 4), cast back to the
# logits' dtype (read 4, write d): 12 + d bytes. The max / sum / target-logit all-reduces
# (b*s fp32 each) are too small to model.
CE_FWD_FP32_BYTES, CE_BWD_FP32_BYTES = 36, 12


def head_forward_ops(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    dtype_bytes: int = 2,
    kernels: str = "fused",
    param_dtype: str = "bf16",
    tp_loss: str = "vocab_parallel",
) -> list[Op]:
    """Final norm, the vocab-parallel LM head ``[b*s, h] @ [h, V/tp]`` and the fp32
    cross-entropy over ``V/tp`` logits (memory-bound). ``kernels="eager"``:
    :func:`eager.head_forward` (``tp_loss``: see ``parallelism``); ``param_dtype="fp32"``
    casts the head's weight first."""
    P = _modes(kernels, param_dtype)
    if kernels == "eager":
        return eager.head_forward(model, micro_batch, tp, sequence_parallel, dtype_bytes, P,
                            tp_loss == "gathered")
    L, h, d = local_dims(model, micro_batch, tp, sequence_parallel), model.hidden, dtype_bytes
    ops = (
        mem_op("final_norm", "head", 2 * L.norm_tokens * h * d),
        gemm_op("lm_head", "head", L.tokens, h, L.vocab, d),
        mem_op("cross_entropy", "head", L.tokens * L.vocab * (d + CE_FWD_FP32_BYTES)),
    )
    return _master_weights(ops, d, False) if P == FP32 else list(ops)


def head_backward_ops(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    dtype_bytes: int = 2,
    kernels: str = "fused",
    param_dtype: str = "bf16",
    tp_loss: str = "vocab_parallel",
) -> list[Op]:
    """Cross-entropy backward, LM head dgrad and wgrad, final-norm backward.
    ``kernels="eager"``: :func:`eager.head_backward`; ``param_dtype="fp32"`` adds the head
    gradient's cast and ``.grad`` accumulation."""
    P = _modes(kernels, param_dtype)
    if kernels == "eager":
        return eager.head_backward(model, micro_batch, tp, sequence_parallel, dtype_bytes, P,
                            tp_loss == "gathered")
    L, h, d = local_dims(model, micro_batch, tp, sequence_parallel), model.hidden, dtype_bytes
    lm = gemm_op("lm_head", "head", L.tokens, h, L.vocab, d)
    ops = (
        mem_op("cross_entropy", "head", L.tokens * L.vocab * (d + CE_BWD_FP32_BYTES), True),
        *gemm_grads(lm, d),
        mem_op("final_norm", "head", 3 * L.norm_tokens * h * d, True),
    )
    return _master_weights(ops, d, False) if P == FP32 else list(ops)


def foreach_adam_bytes(g: int, m: int, p: int = FP32) -> int:
    """Bytes per parameter of ``torch.optim.AdamW(foreach=True)``'s step over fp32 parameters
    with ``g``-byte gradients and ``m``-byte moments (PyTorch's ``_multi_tensor_adam``,
    torch/optim/adam.py, decoupled weight decay, float lr, not capturable, not amsgrad): eight
    multi-tensor passes, each reading its inputs and writing its output once:
    ``params *= 1 - lr wd`` (read, write the parameter: 8), ``lerp_(m, g)`` (``2m + g``),
    ``v *= beta2`` (``2m``), ``addcmul_(v, g, g)`` (``2m + g``, the gradient read once),
    ``denom = sqrt(v)`` into a new list (``2m``), ``denom /= sqrt(bias correction)`` (``2m``),
    ``denom += eps`` (``2m``), ``addcdiv_(params, m, denom)`` (``8 + 2m``): ``16 + 2g + 14m``,
    80 for fp32 everywhere. ``p``: the stepped parameters' bytes (``4p`` instead of 16 when
    bf16 parameters without master weights are stepped in place)."""
    return 4 * p + 2 * g + 14 * m


def optimizer_ops(
    n_params_local: float,
    *,
    param_dtype: str,
    grad_dtype: str,
    moments_dtype: str = "fp32",
    impl: str = "fused",
    master_weights: str = "fp32",
    grad_clip: str = "norm",
) -> list[Op]:
    """The optimizer step of the parameters this rank updates, memory-bound.

    ``grad_norm`` (for gradient clipping) reads every gradient once. ``grad_clip="foreach"``
    (:func:`clip_ops`) adds ``grad_clip_mul``, PyTorch's ``_foreach_mul_`` of every gradient
    by the clamped coefficient (read and written once); ``"none"`` drops the norm. ``adam`` (a multi-tensor
    fused Adam) with bf16/fp16 working weights reads grad, fp32 master, m, v and writes
    master, m, v and the working copy: g + 12 + 12 + p bytes per parameter (Rajbhandari et al.
    2020, ZeRO, Section 3.1: 16 bytes of state per parameter); with fp32 weights (AMP) there
    is no master copy: read g, p, m, v, write p, m, v (g + 24). ``moments_dtype="bf16"``
    (DeepSeek-V3) reads and writes m and v at 2 bytes: g + 8 + 8 + p (g + 16 with AMP).
    ``master_weights="none"`` (bf16 parameters stepped in place): read g, p, m, v, write p,
    m, v: g + 2 (p + mv) bytes, as with fp32 weights but at the parameters' width;
    ``"remainder"`` (Apex's kernel with parameter remainders): the fp32 weight is read and
    written as its bf16 half and its 16-bit remainder, g + 2 (4 + mv), no separate copy out.
    ``impl="foreach"``: PyTorch's multi-tensor AdamW (:func:`foreach_adam_bytes`), plus the
    working copy's write with narrower parameters.
    """
    p = dtype_bytes(param_dtype, "training.param_dtype")
    g = dtype_bytes(grad_dtype, "training.grad_reduce_dtype")
    m = dtype_bytes(moments_dtype, "training.optimizer_moments_dtype")
    mv = 2 * m
    if p == FP32:
        g = FP32
    master = master_weights == "fp32" and p != FP32
    if impl == "foreach":
        per = foreach_adam_bytes(g, m) + p if master else foreach_adam_bytes(g, m, p)
    elif impl != "fused":
        raise ConfigError(
            f"optimizer_impl={impl!r} (accepted: fused, foreach)", field="training.optimizer_impl"
        )
    elif master_weights == "remainder" and p != FP32:
        per = g + 2 * (FP32 + mv)
    elif not master:
        per = g + 2 * (p + mv)
    else:
        per = g + 2 * (FP32 + mv) + p
    return [*clip_ops(n_params_local, g, grad_clip),
            mem_op("adam", "optimizer", n_params_local * per)]


def clip_ops(n_params_local: float, g: int, grad_clip: str = "norm") -> list[Op]:
    """Global-norm gradient clipping over this rank's ``n_params_local`` gradients of ``g``
    bytes. ``"norm"``: the norm only, one read of every gradient (Megatron-Core's
    ``multi_tensor_l2norm`` over the main grads; its ``multi_tensor_scale`` runs only when the
    clip coefficient is below 1, not priced). ``"foreach"``:
    ``torch.nn.utils.clip_grad_norm_`` as PyTorch 2.11 runs it (torch/nn/utils/clip_grad.py,
    foreach path): ``_get_total_norm`` reads every gradient once (``_foreach_norm`` per
    device and dtype, then ``stack`` and ``vector_norm`` of the per-tensor norms, a few
    scalars), ``_clip_grads_with_norm_`` multiplies every gradient in place by
    ``clamp(max_norm / (norm + 1e-6), max=1)`` whatever its value (``_foreach_mul_``: read and
    write): ``3g`` bytes a parameter in two ops; no host synchronisation. ``"none"``: nothing.
    The scalar kernels between the two and a distributed clip's scalar all-reduce (FSDP2's
    ``full_tensor()``, a pipeline's hand-written clip) are not priced."""
    if grad_clip == "none":
        return []
    if grad_clip not in ("norm", "foreach"):
        raise ConfigError(f"grad_clip={grad_clip!r} (accepted: norm, foreach, none)",
                          field="training.grad_clip")
    ops = [mem_op("grad_norm", "optimizer", n_params_local * g)]
    if grad_clip == "foreach":
        ops.append(mem_op("grad_clip_mul", "optimizer", 2 * n_params_local * g))
    return ops


# --------------------------------------------------------------------------------------------
# Communication volumes


def tp_comm_bytes(model: ModelConfig, *, micro_batch: int, dtype_bytes: int = 2) -> float:
    """The ``[b, s, h]`` tensor a TP all-reduce sums (or an SP reduce-scatter / all-gather
    splits), in bytes, full size as nccl-tests counts it. Megatron does two per layer in the
    forward and two in the backward (Shoeybi et al. 2019, Fig. 4)."""
    return float(micro_batch * model.seq_len * model.hidden * dtype_bytes)


def pp_stream_bytes(kernels: str, param_dtype: str) -> int:
    """Bytes per element of the tensor a pipeline stage sends: the residual stream, which eager
    code keeps in the parameter dtype (fp32 under autocast over fp32 weights: the embedding's
    output and every residual addition are fp32) and fused (Megatron) code in 16 bits."""
    return DTYPE_BYTES[param_dtype] if kernels == "eager" else 2


def pp_activation_bytes(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    dtype_bytes: int = 2,
    scatter_gather: bool = False,
) -> float:
    """Bytes one TP rank sends to the next pipeline stage per micro-batch (and the same
    gradient back). With SP the hidden state is already split ``s/tp``; without it each rank
    sends the full ``b*s*h`` unless Megatron's scatter/gather optimisation (Narayanan et al.
    2021, Section 4.1) splits it ``1/tp`` and the receiver all-gathers over NVLink.
    ``dtype_bytes``: the residual stream's (:func:`pp_stream_bytes`)."""
    full = micro_batch * model.seq_len * model.hidden * dtype_bytes
    return float(full / tp if (sequence_parallel or scatter_gather) else full)


# --------------------------------------------------------------------------------------------
# Parameters


def _norm_params(model: ModelConfig) -> int:
    return (2 if model.norm_kind == "layernorm" else 1) * model.hidden


def attention_params(model: ModelConfig) -> int:
    """Weight matrices of a layer's attention: Q, K, V, O (GQA: K and V have
    ``kv_heads * head_dim`` outputs), or MLA's low-rank projections and latent norms."""
    if model.attention_kind == "mla":
        return mla.mla_params(model)
    h, hd = model.hidden, model.head_dim
    q, kv = model.heads * hd, model.n_kv_heads * hd
    return h * (q + 2 * kv) + q * h


def _is_moe(model: ModelConfig, moe_layer: bool | None) -> bool:
    return model.moe is not None if moe_layer is None else bool(moe_layer and model.moe)


@lru_cache(maxsize=256)
def layer_params(model: ModelConfig, moe_layer: bool | None = None) -> int:
    """Parameters of one transformer layer: the attention (:func:`attention_params`), the MLP
    (SwiGLU three ``h x ffn`` matrices, GELU two; for an MoE layer every expert and the router,
    :func:`moe.moe_mlp_params`), two norms, and for the GPT family the biases. For GPT
    (ffn = 4h) this is ``12h^2 + 13h`` (Narayanan et al. 2021, Section 5.1). ``moe_layer``:
    which kind of layer of an MoE model (default: an MoE layer when the model has experts)."""
    h, hd = model.hidden, model.head_dim
    q, kv = model.heads * hd, model.n_kv_heads * hd
    n = attention_params(model)
    if _is_moe(model, moe_layer):
        n += moe.moe_mlp_params(model)
    else:
        n += (3 if model.activation == "swiglu" else 2) * h * model.ffn
    n += 2 * _norm_params(model)
    if arch(model).biases:
        fc1_out = 2 * model.ffn if model.activation == "swiglu" else model.ffn
        n += (q + 2 * kv) + h + fc1_out + h
    return n


def active_layer_params(model: ModelConfig, moe_layer: bool | None = None) -> int:
    """Parameters one token uses in a layer: :func:`layer_params` with only ``top_k`` routed
    experts (plus the shared ones and the router) in an MoE layer."""
    n = layer_params(model, moe_layer)
    if _is_moe(model, moe_layer):
        n -= moe.moe_mlp_params(model) - moe.moe_mlp_active_params(model)
    return n


def embedding_params(model: ModelConfig) -> int:
    """Word embedding ``V x h`` plus learned positions ``s x h`` (GPT family)."""
    pos = model.seq_len * model.hidden if arch(model).learned_positions else 0
    return model.vocab * model.hidden + pos


def head_params(model: ModelConfig) -> int:
    """LM head ``h x V`` (no bias); 0 when tied to the embedding."""
    return 0 if model.tied_embeddings else model.vocab * model.hidden


def final_norm_params(model: ModelConfig) -> int:
    """The norm before the LM head."""
    return _norm_params(model)


def _sum_layers(model: ModelConfig, per_layer) -> int:
    """``per_layer(moe_layer)`` summed over the model's dense and MoE layers (in the pattern
    ``moe.dense_layers`` and ``moe.layer_freq`` give)."""
    if model.moe is None:
        return model.layers * per_layer(False)
    n_moe = model.moe_layers
    return (model.layers - n_moe) * per_layer(False) + n_moe * per_layer(True)


def _sum_layer_kinds(model: ModelConfig, per_layer) -> int:
    """``per_layer(moe_layer, local)`` summed over the model's layers (MoE or dense, local or
    full attention)."""
    counts: dict[tuple[bool, bool], int] = {}
    for kind in model.layer_kinds:
        counts[kind] = counts.get(kind, 0) + 1
    return sum(n * per_layer(*kind) for kind, n in counts.items())


def total_params(model: ModelConfig) -> int:
    """All parameters (unpadded vocabulary, the convention of published counts). DeepSeek-V3:
    671 B without its multi-token-prediction module; Mixtral 8x7B: 46.7 B."""
    return (
        _sum_layers(model, lambda x: layer_params(model, x))
        + embedding_params(model)
        + head_params(model)
        + final_norm_params(model)
    )


def active_params(model: ModelConfig) -> int:
    """Parameters one token uses (equal to :func:`total_params` for a dense model).
    DeepSeek-V3: 37 B; Mixtral 8x7B: 12.9 B; Qwen3-235B-A22B: 22 B."""
    return (
        _sum_layers(model, lambda x: active_layer_params(model, x))
        + embedding_params(model)
        + head_params(model)
        + final_norm_params(model)
    )


def stage_params(model: ModelConfig, n_layers: int, *, first: bool, last: bool) -> int:
    """Parameters one pipeline stage holds, all TP ranks together: its layers, the embedding
    on the first stage, the final norm and head on the last. With tied embeddings and more
    than one stage the last stage keeps its own copy of the word embedding for the head,
    kept in sync by an all-reduce of its gradient (Megatron-LM; Narayanan et al. 2021)."""
    n = n_layers * layer_params(model)
    if first:
        n += embedding_params(model)
    if last:
        n += head_params(model) + final_norm_params(model)
        if model.tied_embeddings and not first:
            n += model.vocab * model.hidden
    return n


# --------------------------------------------------------------------------------------------
# Model and hardware FLOPs


def _layer_matmul_flops_per_token(model: ModelConfig, moe_layer: bool | None = None) -> int:
    """Forward FLOPs of a layer's weight GEMMs per token: 2 x the weight-matrix entries it
    multiplies by (an MoE layer: ``top_k`` routed experts, the shared ones and the router)."""
    if model.attention_kind == "mla":
        att = sum(a * b for _, a, b in mla.mla_matrices(model))
    else:
        h, hd = model.hidden, model.head_dim
        q, kv = model.heads * hd, model.n_kv_heads * hd
        att = h * (q + 2 * kv) + q * h
    if _is_moe(model, moe_layer):
        mlp = moe.moe_mlp_active_params(model)
    else:
        mlp = (3 if model.activation == "swiglu" else 2) * model.hidden * model.ffn
    return 2 * (att + mlp)


def _attention_flops_per_token(model: ModelConfig) -> int:
    """Forward QK^T and PV FLOPs per token, non-causal: 2*s*(heads*hd) each (MLA:
    :func:`mla.mla_attention_flops_per_token`)."""
    if model.attention_kind == "mla":
        return mla.mla_attention_flops_per_token(model)
    return 4 * model.seq_len * model.heads * model.head_dim


def window_pairs2(seq: int, window: int, kind: str) -> int:
    """Twice the query-key pairs a causal local attention computes over one sequence of
    ``seq`` tokens (an integer): a sliding window of ``w`` keys, ``2 s w - w^2`` (each of the
    ``s`` queries sees ``w`` keys, less the triangle the first ``w`` queries miss, ``w^2/2``,
    to within ``w/2``); chunks of ``c`` tokens, each causal on its own, ``(s/c) c^2 = s c``.
    At ``w = c = s`` both give the causal ``s^2``."""
    if kind == "chunked":
        return seq * window
    return 2 * seq * window - window * window


def layer_forward_flops(
    model: ModelConfig,
    tokens: int,
    *,
    causal: bool = False,
    moe_layer: bool | None = None,
    local: bool = False,
) -> int:
    """Forward matmul FLOPs of one layer over ``tokens`` tokens (all TP ranks together).
    GPT: ``24 t h^2 + 4 t s h`` non-causal (Narayanan et al. 2021, Appendix). ``local``: the
    layer attends within ``model.attention_window`` (:func:`window_pairs2` pairs instead of
    the causal ``s^2/2``; counted twice in the non-causal convention). GPT-OSS's attention
    sinks (one learned logit per head, added to each softmax row) add ``O(s)`` work per
    head against the ``O(s w)`` of the window: not counted."""
    mm = _layer_matmul_flops_per_token(model, moe_layer)
    return tokens * mm + attention_core_flops(model, tokens, causal=causal, local=local)


def attention_core_flops(model: ModelConfig, tokens: int, *, causal: bool, local: bool) -> int:
    """Forward ``QK^T`` and ``PV`` FLOPs of one layer over ``tokens`` tokens (whole
    sequences): ``4 t s h`` non-causal, half that causal; a ``local`` layer
    (:func:`window_pairs2`) ``4 h`` per query-key pair computed."""
    att = _attention_flops_per_token(model)
    w = model.attention_window
    if local and w is not None:
        s = model.seq_len
        per_pair = att // s  # FLOPs of one query-key pair (QK^T and PV)
        pairs2 = window_pairs2(s, w, model.attention_window_kind)
        return (tokens // s) * per_pair * (pairs2 // 2 if causal else pairs2)
    return tokens * (att // 2 if causal else att)


def model_flops_per_step(model: ModelConfig, global_batch: int, *, causal: bool = True) -> float:
    """Model FLOPs of one optimizer step (the numerator of MFU): 3 x the forward matmul FLOPs
    (forward, plus a backward of twice the forward), no recomputation.

    Attention is counted **causal** by default: only the lower triangle of ``QK^T`` is needed
    and multiplied with ``V``, ``2 b s^2 h`` forward -- Megatron-LM's
    ``num_floating_point_operations`` (megatron/training/training.py: "only half of the
    attention matrix is non-zero"). Causal counting never exceeds what a causal kernel
    executes, so MFU <= 1. ``causal=False`` gives the older convention of Narayanan et al. 2021
    (eq. 3 without recomputation, ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))`` for GPT),
    Korthikanti et al. 2022 and PaLM (Chowdhery et al. 2022, App. B, ``6N + 12 L H Q T``), for
    comparing with figures published that way. Llama: the same counting with GQA projections
    and three SwiGLU matrices; an MoE model: the active parameters only (``top_k`` routed and
    the shared experts, the router) and MLA's projections. Computed in exact integers.
    """
    tokens = global_batch * model.seq_len
    layers = _sum_layer_kinds(
        model,
        lambda x, loc: layer_forward_flops(model, tokens, causal=causal, moe_layer=x, local=loc),
    )
    fwd = layers + tokens * 2 * model.hidden * model.vocab
    return float(3 * fwd)


def hardware_flops_per_step(
    model: ModelConfig, global_batch: int, recompute: str, *, causal: bool = False
) -> float:
    """Closed form of model FLOPs plus the recomputed forward, in the published convention
    (``causal=False``): ``full`` recomputes every layer's forward (for GPT:
    ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``, Narayanan et al. 2021, eq. 3); ``selective``
    recomputes the attention core, ``4 B s^2 h`` per layer non-causal (Korthikanti et al.
    2022, Section 5). For comparing with papers; a run's ``hfu`` counts instead the FLOPs its
    kernels execute (the events table)."""
    tokens = global_batch * model.seq_len
    extra = {
        "none": 0,
        "selective": _sum_layer_kinds(
            model, lambda _, loc: attention_core_flops(model, tokens, causal=causal, local=loc)
        ),
        "full": _sum_layer_kinds(
            model,
            lambda x, loc: layer_forward_flops(model, tokens, causal=causal, moe_layer=x,
                                               local=loc),
        ),
    }
    if recompute not in extra:
        raise ConfigError(
            f"recompute={recompute!r} (accepted: none, selective, full)", field="training.recompute"
        )
    return model_flops_per_step(model, global_batch, causal=causal) + float(extra[recompute])
