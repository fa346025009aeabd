"""Kernel-level ops of a transformer written with plain PyTorch modules and run eagerly under
``torch.autocast`` (``training.kernels: eager``).

:mod:`simulator.model.transformer` describes Megatron-LM / Transformer Engine kernels, where a
norm, RoPE or SwiGLU is one fused kernel over compute-dtype tensors. An eager model launches
one kernel per PyTorch operator instead, and autocast runs some operators in fp32 (PyTorch AMP
docs, "CUDA Ops that can autocast to float32": pow, rsqrt, layer_norm, softmax, log_softmax,
nll_loss ...) while matmuls and attention run in the compute dtype. The Llama family here is
the model of ``benchmarks/device/measure.py`` (RMSNorm as ``x.float()``, ``pow``, ``mean``,
``+ eps``, ``rsqrt``, two multiplies; RoPE as ``x*cos + cat([-x2, x1])*sin``; SwiGLU as
``silu(g) * u`` over a chunked ``gate_up`` projection; GQA attention through
``scaled_dot_product_attention``). The GPT family is a nanoGPT-style block (``nn.LayerNorm``,
fused qkv split into heads, SDPA with dropout, GELU, dropout on both residual branches,
learned positions, biases in the GEMM epilogue). Both op lists were checked against an aten
trace of those modules (PyTorch 2.11, forward and backward, second micro-batch).

Dtypes, in bytes per element: ``d`` the compute dtype; ``FP32`` autocast's fp32 ops and the
gradients of fp32 tensors; ``R`` the residual stream, which is the *parameter* dtype: the
embedding returns its weight's dtype and ``x + branch`` promotes to it (fp32 with AMP master
weights, bf16 when FSDP hands bf16 parameters to the module); ``P`` the parameter dtype.

Counting rules: an elementwise kernel reads each input once and writes its output once; a
broadcast operand (norm gain, rotary table, per-row statistic) is read once at its own size;
a reduction reads its input and writes the reduced tensor; cat and split backward copy every
element; views (view, transpose, chunk, split, narrow) launch nothing. Backward follows the
autograd formulas of PyTorch's ``tools/autograd/derivatives.yaml``: ``mul`` backward is one
multiply per input that needs a gradient, ``pow(x, 2)`` backward is ``grad * (2 * x.pow(1))``
(``pow(1)`` is a copy), ``mean`` backward expands and divides, ``cat`` backward is slices,
``chunk``/``split`` backward is a ``cat``, a cast's backward is the opposite cast, and a
tensor used ``k`` times gets ``k - 1`` gradient sums (autograd's input buffer).

Mixed precision with fp32 master weights (``P == FP32``): autocast casts every GEMM weight
(and bias) to ``d`` in every micro-batch's forward, and autograd casts each weight gradient
back to fp32 and adds it into ``.grad`` (steady state: read ``.grad`` and the new gradient,
write the sum; the first micro-batch after ``zero_grad(set_to_none=True)`` only stores it).
"""

from __future__ import annotations

from functools import lru_cache

from simulator.config.schema import ModelConfig
from simulator.model import mla
from simulator.model.ops import (
    FP32,
    MASK,
    Local,
    Op,
    accumulate_op,
    arch,
    cast_op,
    flash_attention_op,
    gemm_grads,
    gemm_op,
    local_dims,
    mem_op,
)

I64 = 8  # token ids, labels
BOOL = 1
#: Shared memory a block of PyTorch's softmax kernels may use by default (CUDA's 48 KiB static
#: limit, ``sharedMemPerBlock``). ``host_softmax`` in aten/src/ATen/native/cuda/SoftMax.cu keeps
#: a row there (``cunn_SoftMaxForwardSmem``: read once, write once) only while the row fits;
#: a wider row (an fp32 vocabulary of more than 12,288 logits: every LLM's) runs the multi-pass
#: ``cunn_SoftMaxForward`` / ``cunn_SoftMaxBackward`` (see :func:`log_softmax_passes`).
SOFTMAX_SMEM_BYTES = 48 * 1024


def log_softmax_passes(row_elements: int, backward: bool, itemsize: int = FP32) -> int:
    """Passes over the logits (each reads or writes every element once) of PyTorch's CUDA
    ``log_softmax`` and its backward over rows of ``row_elements``. A row that fits
    :data:`SOFTMAX_SMEM_BYTES`: forward read and write (2), backward read the gradient and the
    output, write the input's gradient (3). A wider row, from global memory each time:
    forward the row's max, the sum of exponentials, then read again and write (4); backward
    the gradient's sum, then read the gradient and the output and write (4). Measured on one
    H100 (data/measured/acgemm-h100x1: fp32 rows of 32,000 and 65,536 at 2,048 tokens): the
    forward 319 / 713 us and the backward 368 / 738 us, 4 passes at 2.9-3.3 TB/s."""
    if row_elements * itemsize <= SOFTMAX_SMEM_BYTES:
        return 3 if backward else 2
    return 4


def _tiny(name: str, block: str, count: int, nbytes: float, bwd: bool = False) -> list[Op]:
    """``count`` small kernels over per-token vectors (index arithmetic, masks, scalars)."""
    return [mem_op(f"{name}{i + 1}", block, nbytes, bwd) for i in range(count)]


# --------------------------------------------------------------------------------------------
# Building blocks


def _linear_fwd(g: Op, bias: bool, P: int, d: int) -> list[Op]:
    """``nn.Linear`` under autocast: weight (and bias) cast to ``d`` when stored in fp32, then
    the GEMM (the bias is added in its epilogue, cuBLASLt ``addmm``)."""
    ops = []
    if P == FP32:
        ops.append(cast_op(g.name + "_wcast", g.block, g.k * g.n, FP32, d))
        if bias:
            ops.append(cast_op(g.name + "_bcast", g.block, g.n, FP32, d))
    return ops + [g]


def _linear_bwd(g: Op, bias: bool, P: int, d: int) -> list[Op]:
    """dgrad and wgrad GEMMs, the bias gradient (a sum of dY over tokens), and with fp32
    master weights the cast of each gradient to fp32 and its addition into ``.grad``."""
    ops = gemm_grads(g, d)
    if bias:
        ops.append(mem_op(g.name + "_bgrad", g.block, (g.m + 1) * g.n * d, True))
    if P == FP32:
        ops.append(cast_op(g.name + "_gcast", g.block, g.k * g.n, d, FP32, True))
        ops.append(accumulate_op(g.name + "_gacc", g.block, g.k * g.n))
        if bias:
            ops.append(cast_op(g.name + "_bgcast", g.block, g.n, d, FP32, True))
            ops.append(accumulate_op(g.name + "_bgacc", g.block, g.n))
    return ops


def _norm_fwd(p: str, block: str, kind: str, n: int, h: int, R: int, d: int, P: int) -> list[Op]:
    """A pre-norm over ``n`` tokens of width ``h``: fp32 math on an ``R``-typed input, output
    cast to ``d`` for the next GEMM (``.to(cdtype)`` in measure.py, autocast's input cast of
    ``nn.Linear`` in the GPT block)."""
    x = n * h
    ops = [] if R == FP32 else [cast_op(f"{p}_upcast", block, x, R, FP32)]
    if kind == "rmsnorm":  # y = xf * rsqrt(mean(xf^2) + eps) * weight
        ops += [
            mem_op(f"{p}_pow", block, 2 * x * FP32),
            mem_op(f"{p}_mean", block, (x + n) * FP32),
            mem_op(f"{p}_eps", block, 2 * n * FP32),
            mem_op(f"{p}_rsqrt", block, 2 * n * FP32),
            mem_op(f"{p}_scale", block, (2 * x + n) * FP32),
            mem_op(f"{p}_gain", block, 2 * x * FP32 + h * P),
        ]
    else:  # native_layer_norm: one kernel, read x, write y and the row mean / rstd
        if P != FP32:  # autocast casts gain and bias to fp32
            ops += [cast_op(f"{p}_wupcast{i}", block, h, P, FP32) for i in (1, 2)]
        ops.append(mem_op(f"{p}_ln", block, 2 * x * FP32 + 2 * n * FP32 + 2 * h * FP32))
    return ops + [cast_op(f"{p}_cast", block, x, FP32, d)]


def _norm_bwd(
    p: str, block: str, kind: str, n: int, h: int, R: int, d: int, P: int, residual: bool
) -> list[Op]:
    """Backward of :func:`_norm_fwd`, and the sum of the input's gradients: inside the norm
    the fp32 input has two uses for RMSNorm (``pow`` and the scaling multiply) and one for
    LayerNorm, plus the residual branch when the stream itself is fp32; a bf16 stream sums
    the norm's fp32 gradient after casting it back (``x.float()`` backward)."""
    x = n * h
    ops = [cast_op(f"{p}_cast", block, x, d, FP32, True)]
    if kind == "rmsnorm":
        ops += [
            mem_op(f"{p}_gain_dw", block, 3 * x * FP32, True),  # dy * y
            mem_op(f"{p}_gain_dx", block, 2 * x * FP32 + h * P, True),  # dy * weight
            mem_op(f"{p}_gain_sum", block, (x + h) * FP32, True),  # weight grad: sum over rows
            mem_op(f"{p}_scale_dr", block, 3 * x * FP32, True),  # g * xf
            mem_op(f"{p}_scale_dx", block, (2 * x + n) * FP32, True),  # g * r
            mem_op(f"{p}_scale_sum", block, (x + n) * FP32, True),  # grad of r: sum over h
            # rsqrt backward: -0.5 * g * r.pow(3), three kernels on [n, 1]
            mem_op(f"{p}_rsqrt_pow", block, 2 * n * FP32, True),
            mem_op(f"{p}_rsqrt_scale", block, 2 * n * FP32, True),
            mem_op(f"{p}_rsqrt_mul", block, 3 * n * FP32, True),
            mem_op(f"{p}_mean", block, (n + x) * FP32, True),  # expand(g) / h
            mem_op(f"{p}_pow_copy", block, 2 * x * FP32, True),  # xf.pow(1) is a copy
            mem_op(f"{p}_pow_scale", block, 2 * x * FP32, True),  # 2 * ...
            mem_op(f"{p}_pow_mul", block, 3 * x * FP32, True),  # g * ...
        ]
        uses, weights = 2, 1
    else:
        # native_layer_norm_backward: dx (read dy, x, write dx), then gain / bias gradients
        # in a second kernel that reads dy and x again
        ops.append(mem_op(f"{p}_ln", block, 5 * x * FP32 + 2 * n * FP32 + 3 * h * FP32, True))
        if P != FP32:
            ops += [cast_op(f"{p}_wupcast{i}", block, h, FP32, P, True) for i in (1, 2)]
        uses, weights = 1, 2
    if P == FP32:
        ops += [accumulate_op(f"{p}_w{i + 1}_gacc", block, h) for i in range(weights)]
    fp32_uses = uses + (1 if residual and R == FP32 else 0)
    ops += [accumulate_op(f"{p}_acc{i + 1}", block, x) for i in range(fp32_uses - 1)]
    if R != FP32:
        ops.append(cast_op(f"{p}_upcast", block, x, FP32, R, True))
        if residual:
            ops.append(accumulate_op(f"{p}_acc_res", block, x, R))
    return ops


def _rope(L: Local, d: int, bwd: bool) -> list[Op]:
    """``x*cos + cat([-x2, x1])*sin`` on q and k (measure.py ``apply_rope``), after casting
    the fp32 ``[s, hd]`` tables to ``d`` (forward). Per tensor of ``e`` elements: two
    multiplies (``2e`` each plus the table), ``neg`` of one half (``e``), ``cat`` (``2e``),
    ``add`` (``3e``). Backward: the two multiplies by the tables, ``neg`` of one half of
    the gradient (cat backward is slices), the ``cat`` that chunk backward is, and the sum of
    the gradient's two paths."""
    tab = L.s * L.head_dim
    if bwd:
        ops, order = [], (("k", L.kv_heads), ("q", L.heads))
        steps = (("sin", 2, tab), ("neg", 1, 0), ("cos", 2, tab), ("cat", 2, 0), ("add", 3, 0))
    else:
        ops = [cast_op(f"rope_{t}_table", "attn", tab, FP32, d) for t in ("cos", "sin")]
        order = (("q", L.heads), ("k", L.kv_heads))
        steps = (("cos", 2, tab), ("neg", 1, 0), ("cat", 2, 0), ("sin", 2, tab), ("add", 3, 0))
    for t, heads in order:
        e = L.tokens * heads * L.head_dim
        ops += [mem_op(f"rope_{t}_{k}", "attn", (n * e + extra) * d, bwd) for k, n, extra in steps]
    return ops


def _math_attention(L: Local, d: int, dropout: bool, bwd: bool) -> list[Op]:
    """Attention written out (``flash_attention: false``; nanoGPT's slow path, HF Llama's
    eager attention): q, k^T, v copied into ``[b*hq, s, hd]`` for the batched GEMMs (k, v
    repeated to the query heads with GQA), scores scaled and masked in ``d``, autocast's
    fp32 softmax (cast up, softmax, dropout, cast down), output transposed back to
    ``[b, s, hq*hd]`` (``.contiguous()``)."""
    b, s, hq, hd = L.b, L.s, L.heads, L.head_dim
    T, qw, kvw, sq = L.tokens, L.heads * L.head_dim, L.kv_heads * L.head_dim, b * hq * s * s
    scores = gemm_op("attn_scores", "attn", s, hd, s, d, batch=b * hq)
    context = gemm_op("attn_context", "attn", s, s, hd, d, batch=b * hq)
    drop = [mem_op("attn_dropout", "attn", sq * (2 * FP32 + MASK), bwd)] if dropout else []
    if not bwd:
        return [
            mem_op("attn_q_copy", "attn", 2 * T * qw * d),
            mem_op("attn_k_copy", "attn", T * (kvw + qw) * d),
            scores,
            mem_op("attn_scale", "attn", 2 * sq * d),
            mem_op("attn_mask", "attn", 2 * sq * d + s * s * BOOL),
            cast_op("attn_upcast", "attn", sq, d, FP32),
            mem_op("softmax", "attn", 2 * sq * FP32),
            *drop,
            cast_op("attn_downcast", "attn", sq, FP32, d),
            mem_op("attn_v_copy", "attn", T * (kvw + qw) * d),
            context,
            mem_op("attn_out_copy", "attn", 2 * T * qw * d),
        ]
    ops = [mem_op("attn_out_copy", "attn", 2 * T * qw * d, True), *gemm_grads(context, d)]
    ops += [cast_op("attn_downcast", "attn", sq, d, FP32, True), *drop]
    ops += [
        mem_op("softmax", "attn", 3 * sq * FP32, True),  # read y, dy; write dx
        cast_op("attn_upcast", "attn", sq, FP32, d, True),
        mem_op("attn_mask", "attn", 2 * sq * d + s * s * BOOL, True),
        mem_op("attn_scale", "attn", 2 * sq * d, True),
        *gemm_grads(scores, d),
        mem_op("attn_q_copy", "attn", 2 * T * qw * d, True),
    ]
    if kvw != qw:  # the repeated K heads are summed back (v below likewise)
        ops.append(mem_op("attn_k_copy", "attn", T * (qw + kvw) * d, True))
    return ops + [mem_op("attn_v_copy", "attn", T * (qw + kvw) * d, True)]


# --------------------------------------------------------------------------------------------
# One layer


def _layer_gemms(model: ModelConfig, L: Local, d: int) -> dict[str, Op]:
    h, qw, kvw = model.hidden, L.heads * L.head_dim, L.kv_heads * L.head_dim
    T = L.tokens
    return {
        "qkv": gemm_op("qkv", "attn", T, h, qw + 2 * kvw, d),
        "out_proj": gemm_op("out_proj", "attn", T, qw, h, d),
        "fc1": gemm_op("fc1", "mlp", T, h, L.fc1_out, d),
        "fc2": gemm_op("fc2", "mlp", T, L.ffn, h, d),
    }


@lru_cache(maxsize=1024)
def layer_forward(
    model: ModelConfig, b: int, tp: int, sp: bool, d: int, flash: bool, P: int
) -> tuple[Op, ...]:
    """Eager forward kernels of one pre-norm layer on one TP rank (see the module docstring)."""
    L, A = local_dims(model, b, tp, sp), arch(model)
    h, T, NT, R, kind = model.hidden, L.tokens, L.norm_tokens, P, model.norm_kind
    g = _layer_gemms(model, L, d)
    drop = (2 * d + MASK) * NT * h
    res = (2 * R + d) * NT * h  # x (R) + branch (d) -> R
    ops = _norm_fwd("norm1", "attn", kind, NT, h, R, d, P) + _linear_fwd(g["qkv"], A.biases, P, d)
    if A.rotary:
        ops += _rope(L, d, bwd=False)
    ops += [flash_attention_op(L, d)] if flash else _math_attention(L, d, A.dropout, bwd=False)
    ops += _linear_fwd(g["out_proj"], A.biases, P, d)
    ops += [mem_op("resid_dropout1", "attn", drop)] if A.dropout else []
    ops += [mem_op("residual1", "attn", res)]
    ops += _norm_fwd("norm2", "mlp", kind, NT, h, R, d, P) + _linear_fwd(g["fc1"], A.biases, P, d)
    if model.activation == "swiglu":  # silu(gate) * up
        ops += [
            mem_op("act_silu", "mlp", 2 * T * L.ffn * d),
            mem_op("act_mul", "mlp", 3 * T * L.ffn * d),
        ]
    else:
        ops.append(mem_op("act_gelu", "mlp", 2 * T * L.ffn * d))
    ops += _linear_fwd(g["fc2"], A.biases, P, d)
    ops += [mem_op("resid_dropout2", "mlp", drop)] if A.dropout else []
    return tuple(ops + [mem_op("residual2", "mlp", res)])


@lru_cache(maxsize=1024)
def layer_backward(
    model: ModelConfig, b: int, tp: int, sp: bool, d: int, flash: bool, P: int
) -> tuple[Op, ...]:
    """Eager backward kernels of one layer, in autograd's execution order."""
    L, A = local_dims(model, b, tp, sp), arch(model)
    h, T, NT, R, kind = model.hidden, L.tokens, L.norm_tokens, P, model.norm_kind
    g = _layer_gemms(model, L, d)
    qw, kvw = L.heads * L.head_dim, L.kv_heads * L.head_dim

    def branch(i: int, block: str) -> list[Op]:
        # the residual add's gradient, cast to the branch dtype, then the dropout backward
        ops = [cast_op(f"residual{i}_cast", block, NT * h, R, d, True)] if R != d else []
        if A.dropout:
            ops.append(mem_op(f"resid_dropout{i}", block, (2 * d + MASK) * NT * h, True))
        return ops

    ops = branch(2, "mlp") + _linear_bwd(g["fc2"], A.biases, P, d)
    if model.activation == "swiglu":
        ops += [
            mem_op("act_mul_du", "mlp", 3 * T * L.ffn * d, True),  # g * silu(gate)
            mem_op("act_mul_ds", "mlp", 3 * T * L.ffn * d, True),  # g * up
            mem_op("act_silu", "mlp", 3 * T * L.ffn * d, True),  # silu_backward(g, gate)
            mem_op("act_cat", "mlp", 2 * T * L.fc1_out * d, True),  # chunk backward
        ]
    else:
        ops.append(mem_op("act_gelu", "mlp", 3 * T * L.ffn * d, True))
    ops += _linear_bwd(g["fc1"], A.biases, P, d)
    ops += _norm_bwd("norm2", "mlp", kind, NT, h, R, d, P, residual=True)
    ops += branch(1, "attn") + _linear_bwd(g["out_proj"], A.biases, P, d)
    if flash:
        ops.append(flash_attention_op(L, d, backward=True))
    else:
        ops += _math_attention(L, d, A.dropout, bwd=True)
    if A.rotary:
        ops += _rope(L, d, bwd=True)
    ops.append(mem_op("qkv_cat", "attn", 2 * T * (qw + 2 * kvw) * d, True))  # split backward
    ops += _linear_bwd(g["qkv"], A.biases, P, d)
    return tuple(ops + _norm_bwd("norm1", "attn", kind, NT, h, R, d, P, residual=True))


# --------------------------------------------------------------------------------------------
# Embedding


def _embedding_grad(p: str, rows: int, tokens: int, h: int, R: int, P: int) -> list[Op]:
    """``embedding_dense_backward`` (sort-based): sort the ids (a radix sort of 64-bit keys
    with values, 8 passes reading and writing both), zero a dense ``[rows, h]`` gradient, sum
    each token's row into fp32 partials, scatter the sums into the rows; with fp32 master
    weights, add it into ``.grad``."""
    ops = [
        mem_op(f"{p}_sort", "embed", 8 * 2 * 2 * tokens * I64, True),
        mem_op(f"{p}_zero", "embed", rows * h * R, True),
        mem_op(f"{p}_partial", "embed", tokens * h * (R + FP32), True),
        mem_op(f"{p}_scatter", "embed", tokens * h * (FP32 + R), True),
    ]
    if P == FP32:
        ops.append(accumulate_op(f"{p}_gacc", "embed", rows * h))
    return ops


def embedding_forward(model: ModelConfig, b: int, tp: int, sp: bool, P: int) -> list[Op]:
    """``nn.Embedding`` (tp = 1) or measure.py's vocab-parallel embedding (index arithmetic,
    lookup, zeroing the rows of other shards); GPT: position lookup, add, dropout. Output in
    the parameter dtype ``R``."""
    L, A = local_dims(model, b, tp, sp), arch(model)
    h, T, NT, s, R = model.hidden, L.tokens, L.norm_tokens, L.s, P
    ops = _tiny("embed_index", "embed", 5, 2 * T * I64) if tp > 1 else []
    ops.append(mem_op("embed", "embed", 2 * T * h * R + T * I64))
    if tp > 1:
        ops.append(mem_op("embed_mask", "embed", 2 * T * h * R + T * BOOL))
    if A.learned_positions:
        ops.append(mem_op("pos_embed", "embed", 2 * s * h * R + s * I64))
        ops.append(mem_op("pos_add", "embed", (2 * NT + s) * h * R))
    if A.dropout:
        ops.append(mem_op("embed_dropout", "embed", NT * h * (2 * R + MASK)))
    return ops


def embedding_backward(model: ModelConfig, b: int, tp: int, sp: bool, P: int) -> list[Op]:
    """Dropout backward, the position gradient (summed over the batch when ``b > 1``), the
    shard mask backward and the word-embedding gradient (:func:`_embedding_grad`)."""
    L, A = local_dims(model, b, tp, sp), arch(model)
    h, T, NT, s, R = model.hidden, L.tokens, L.norm_tokens, L.s, P
    ops = []
    if A.dropout:
        ops.append(mem_op("embed_dropout", "embed", NT * h * (2 * R + MASK), True))
    if A.learned_positions:
        if b > 1:
            ops.append(mem_op("pos_sum", "embed", (T + s) * h * R, True))
        ops += _embedding_grad("pos_embed", s, s, h, R, P)
    if tp > 1:
        ops.append(mem_op("embed_mask", "embed", 2 * T * h * R + T * BOOL, True))
    return ops + _embedding_grad("embed", L.vocab, T, h, R, P)


# --------------------------------------------------------------------------------------------
# Head and loss


def head_forward(model: ModelConfig, b: int, tp: int, sp: bool, d: int, P: int,
                 gathered: bool = False) -> list[Op]:
    """Final norm, LM head, and the loss on fp32 logits (``logits.float()``): with tp = 1
    ``F.cross_entropy`` (log_softmax, one kernel of :func:`log_softmax_passes` passes over
    the logits, then nll_loss on the target logits); with tp > 1 the vocab-parallel cross-entropy of
    Megatron-LM / measure.py (max, subtract, exp, sum, divide; each a kernel over the logits).
    ``gathered`` (tp > 1, ``parallelism.tp_loss``): the vocabulary shards are all-gathered
    (the collective is :func:`simulator.model.comm.head_ops`'s), ``dist.all_gather`` into a
    list copies NCCL's flat output into the ``tp`` parts (ProcessGroupNCCL's allgather) and
    ``torch.cat`` joins them, then the tp = 1 loss runs over the whole vocabulary."""
    L = local_dims(model, b, tp, sp)
    h, T, NT, x = model.hidden, L.tokens, L.norm_tokens, L.tokens * L.vocab
    ops = _norm_fwd("final_norm", "head", model.norm_kind, NT, h, P, d, P)
    ops += _linear_fwd(gemm_op("lm_head", "head", T, h, L.vocab, d), False, P, d)
    if gathered and tp > 1:
        x *= tp  # the whole vocabulary on every rank
        ops.append(mem_op("logits_gather_copy", "head", 2 * x * d))
        ops.append(mem_op("logits_cat", "head", 2 * x * d))
    ops.append(cast_op("ce_upcast", "head", x, d, FP32))
    if tp == 1 or gathered:
        row = L.vocab * (tp if gathered else 1)
        return ops + [
            mem_op("ce_log_softmax", "head", log_softmax_passes(row, False) * x * FP32),
            mem_op("ce_nll", "head", T * (I64 + 2 * FP32)),
        ]
    return ops + [
        mem_op("ce_max", "head", (x + T) * FP32),
        mem_op("ce_sub", "head", (2 * x + T) * FP32),
        *_tiny("ce_target", "head", 6, 2 * T * I64),  # local ids, mask, gather, masked_fill
        mem_op("ce_exp", "head", 2 * x * FP32),
        mem_op("ce_sum", "head", (x + T) * FP32),
        *_tiny("ce_loss", "head", 3, 3 * T * FP32),  # log, subtract, mean
        mem_op("ce_div", "head", (2 * x + T) * FP32),
    ]


def head_backward(model: ModelConfig, b: int, tp: int, sp: bool, d: int, P: int,
                  gathered: bool = False) -> list[Op]:
    """Loss backward on fp32 logits (tp = 1: nll_loss backward zero-fills the gradient and
    scatters the targets, then log_softmax backward reads the gradient and the output; tp > 1:
    subtract one at the targets and scale the kept softmax in place), the cast back to the
    logits' dtype, the LM head's GEMMs and the final norm's backward. ``gathered``: the tp = 1
    loss backward over the whole vocabulary, then the rank's slice of the gradient copied out
    (``g[..., shard].contiguous()``) before the LM head's GEMMs."""
    L = local_dims(model, b, tp, sp)
    h, T, NT, x = model.hidden, L.tokens, L.norm_tokens, L.tokens * L.vocab
    shard = x
    if gathered and tp > 1:
        x *= tp
    if tp == 1 or gathered:
        row = L.vocab * (tp if gathered else 1)
        ops = [
            mem_op("ce_nll_fill", "head", x * FP32, True),
            mem_op("ce_nll_scatter", "head", T * (I64 + FP32), True),
            mem_op("ce_log_softmax", "head", log_softmax_passes(row, True) * x * FP32, True),
        ]
    else:
        ops = _tiny("ce_target", "head", 3, 2 * T * I64, True)  # ~mask, cast, neg
        ops += [
            mem_op("ce_scatter", "head", T * (I64 + 2 * FP32), True),
            mem_op("ce_scale", "head", (2 * x + T) * FP32, True),
        ]
    ops.append(cast_op("ce_upcast", "head", x, FP32, d, True))
    if x != shard:
        ops.append(mem_op("logits_slice", "head", 2 * shard * d, True))
    ops += _linear_bwd(gemm_op("lm_head", "head", T, h, L.vocab, d), False, P, d)
    return ops + _norm_bwd("final_norm", "head", model.norm_kind, NT, h, P, d, P, False)


# --------------------------------------------------------------------------------------------
# Parameter tensors (FSDP2's per-parameter host work, :mod:`simulator.engine.host`)


def _linear_tensors(model: ModelConfig, n: int) -> int:
    """``n`` ``nn.Linear`` modules: a weight each, and a bias each in the GPT family."""
    return n * (2 if arch(model).biases else 1)


def _norm_tensors(model: ModelConfig) -> int:
    """A norm's gain, and its bias for LayerNorm."""
    return 2 if model.norm_kind == "layernorm" else 1


def layer_param_tensors(model: ModelConfig, moe_layer: bool = False, local_experts: int = 0
                        ) -> int:
    """Parameter tensors of one layer of the eager model this module describes: the attention's
    projections as its GEMMs (one fused QKV and the output projection; MLA its down and up
    projections and the latent norms), the MLP's (one fused gate-up for SwiGLU and the down
    projection; an MoE layer the router and, per expert held, its two projections), each
    with a bias in the GPT family, and the two norms: 6 in the Llama family (QKV, output,
    gate-up, down, two RMSNorm gains), 12 in the GPT family (four weights and biases, two
    LayerNorms' gains and biases)."""
    if model.attention_kind == "mla":
        rq = model.mla.q_lora_rank
        attn = _linear_tensors(model, len(mla.mla_matrices(model))) + (2 if rq else 1)
    else:
        attn = _linear_tensors(model, 2)
    if moe_layer and model.moe is not None:
        held = local_experts + model.moe.shared_experts
        mlp = 1 + held * _linear_tensors(model, 2)
    else:
        mlp = _linear_tensors(model, 2)
    return attn + mlp + 2 * _norm_tensors(model)


def embedding_param_tensors(model: ModelConfig) -> int:
    """The word embedding, and the learned positions in the GPT family."""
    return 2 if arch(model).learned_positions else 1


def head_param_tensors(model: ModelConfig) -> int:
    """The final norm and the LM head's weight (none when tied to the embedding)."""
    return _norm_tensors(model) + (0 if model.tied_embeddings else 1)
