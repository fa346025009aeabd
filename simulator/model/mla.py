"""Multi-head latent attention (MLA) of DeepSeek-V2/V3: parameters, FLOPs, per-rank kernels.

MLA (DeepSeek-V2, arXiv:2405.04434, Section 2.1; DeepSeek-V3, arXiv:2412.19437, Section 2.1.1)
replaces the Q, K, V projections of a layer by low-rank ones. With ``H`` heads, hidden ``h``,
query rank ``r_q``, KV rank ``r_kv``, per-head dims ``d_n`` (no position), ``d_r`` (rotary) and
``d_v`` (value):

* queries: ``c_q = W_DQ x`` (``h x r_q``), RMSNorm, ``q = W_UQ c_q`` (``r_q x H(d_n + d_r)``);
  without a query rank (``q_lora_rank: null``) one ``h x H(d_n + d_r)`` projection;
* keys and values: ``[c_kv, k_r] = W_DKV x`` (``h x (r_kv + d_r)``, the rotary key ``k_r`` is
  one head shared by all heads), RMSNorm on ``c_kv``, ``[k_n, v] = W_UKV c_kv``
  (``r_kv x H(d_n + d_v)``);
* attention over query/key heads of ``d_n + d_r`` and value heads of ``d_v``, then
  ``W_O`` (``H d_v x h``).

Tensor parallelism as Megatron-Core's ``MLASelfAttention``: the two down-projections and their
norms are duplicated on every TP rank (they are small), the up-projections are column-parallel
(heads split over ``tp``) and ``W_O`` is row-parallel, so the TP collectives sit where they sit
for MHA (around the layer's input and after ``out_proj``).

Training does not use the inference-time absorption of ``W_UK`` into ``W_UQ``: the kernels
below are those of the training forward (the DeepSeek-V3 report's FLOP counts likewise).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.config.schema import ModelConfig
from simulator.model.ops import Op, flash_attention_op, gemm_grads, gemm_op, local_dims, mem_op


def _dims(model: ModelConfig) -> tuple[int, int | None, int, int, int, int]:
    c = model.mla
    return model.heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, (
        c.v_head_dim
    )


def mla_matrices(model: ModelConfig) -> list[tuple[str, int, int]]:
    """The weight matrices of one MLA block, ``(name, in, out)``, in execution order."""
    H, rq, rkv, dn, dr, dv = _dims(model)
    h = model.hidden
    qk = H * (dn + dr)
    mats = [("q_down", h, rq), ("q_up", rq, qk)] if rq else [("q_proj", h, qk)]
    mats += [("kv_down", h, rkv + dr), ("kv_up", rkv, H * (dn + dv)), ("out_proj", H * dv, h)]
    return mats


def mla_params(model: ModelConfig) -> int:
    """Parameters of one MLA block: its matrices plus the RMSNorm gains of the query and KV
    latents (not the layer's input norm). DeepSeek-V3 (h 7168, 128 heads, r_q 1536, r_kv 512,
    d_n 128, d_r 64, d_v 128): 187,107,328."""
    _, rq, rkv, *_ = _dims(model)
    return sum(a * b for _, a, b in mla_matrices(model)) + (rq or 0) + rkv


def mla_attention_flops_per_token(model: ModelConfig) -> int:
    """Forward QK^T and PV FLOPs per token, non-causal: ``2 s H (d_n + d_r) + 2 s H d_v``."""
    H, _, _, dn, dr, dv = _dims(model)
    return 2 * model.seq_len * H * (dn + dr + dv)


def mla_attention_head_dim(model: ModelConfig) -> int:
    """The head width a flash kernel of equal FLOPs sees: QK^T runs on ``d_n + d_r`` and PV on
    ``d_v``, so ``(d_n + d_r + d_v) / 2`` (192 and 128 give 160 for DeepSeek-V3)."""
    _, _, _, dn, dr, dv = _dims(model)
    return (dn + dr + dv) // 2


def _local_gemms(model: ModelConfig, tokens: int, tp: int, d: int) -> list[Op]:
    out = []
    for name, k, n in mla_matrices(model):
        if name in ("q_up", "q_proj", "kv_up"):
            n = -(-n // tp)  # column-parallel: heads split over tp
        elif name == "out_proj":
            k = -(-k // tp)  # row-parallel
        out.append(gemm_op(name, "attn", tokens, k, n, d))
    return out


def mla_forward_ops(model: ModelConfig, micro_batch: int, tp: int, sp: bool, d: int) -> list[Op]:
    """Kernels of an MLA block's forward on one TP rank (fused kernels), the layer's input norm
    and residual add included: ``norm1, q_down, q_norm, q_up, kv_down, kv_norm, kv_up, rope,
    attn, out_proj, residual1`` (``q_proj`` in place of the first three without a query rank).
    The rotary part is applied to ``H/tp`` query heads and the one shared key head; the
    attention kernel is a causal flash kernel of :func:`mla_attention_head_dim`."""
    L = local_dims(model, micro_batch, tp, sp)
    H, rq, rkv, dn, dr, dv = _dims(model)
    h, T, NT = model.hidden, L.tokens, L.norm_tokens
    g = {op.name: op for op in _local_gemms(model, T, tp, d)}
    ops = [mem_op("norm1", "attn", 2 * NT * h * d)]
    if rq:
        ops += [g["q_down"], mem_op("q_norm", "attn", 2 * T * rq * d), g["q_up"]]
    else:
        ops.append(g["q_proj"])
    ops += [g["kv_down"], mem_op("kv_norm", "attn", 2 * T * rkv * d), g["kv_up"]]
    ops.append(mem_op("rope", "attn", 2 * T * (L.heads * dr + dr) * d))
    hd = mla_attention_head_dim(model)
    ops.append(flash_attention_op(_with_head_dim(L, hd), d))
    ops += [g["out_proj"], mem_op("residual1", "attn", 3 * NT * h * d)]
    return ops


def mla_backward_ops(model: ModelConfig, micro_batch: int, tp: int, sp: bool, d: int) -> list[Op]:
    """The forward reversed: each GEMM's dgrad and wgrad, the attention backward, the norms'
    backward (read x, dy; write dx) and the rotary backward."""
    L = local_dims(model, micro_batch, tp, sp)
    NT, h = L.norm_tokens, model.hidden
    out: list[Op] = []
    for op in reversed(mla_forward_ops(model, micro_batch, tp, sp, d)):
        if op.kind == "gemm":
            out += gemm_grads(op, d)
        elif op.kind == "attention":
            hd = mla_attention_head_dim(model)
            out.append(flash_attention_op(_with_head_dim(L, hd), d, backward=True))
        elif op.name == "residual1":
            out.append(mem_op("residual1", "attn", 3 * NT * h * d, True))
        elif op.name == "rope":
            out.append(mem_op("rope", "attn", op.bytes, True))
        else:  # norms: read x and dy, write dx
            out.append(mem_op(op.name, "attn", op.bytes * 1.5, True))
    return out


def mla_activation_bytes(
    model: ModelConfig,
    micro_batch: int,
    tp: int,
    sp: bool,
    d: int,
    *,
    recompute: frozenset[str] = frozenset(),
    gemm_in: int | None = None,
    attn_out: float | None = None,
) -> float:
    """What an MLA block keeps for its backward on one TP rank: the input of every GEMM
    (norm output, the two latents and their norm outputs, Q, K, V and the attention output),
    the norm input, and the flash kernel's fp32 log-sum-exp.

    ``recompute`` (Megatron-Core's recompute modules): ``layernorm`` drops the norm outputs
    (recomputed from their inputs), ``mla_up_proj`` drops Q, K and V (the up-projections and
    RoPE re-run from the latents; DeepSeek-V3, arXiv:2412.19437, Section 3.2.3). ``gemm_in``:
    bytes per element of a cached GEMM input where the precision recipe keeps the quantised
    copy (FP8: 1; default ``d``). ``attn_out``: bytes per element of the attention output,
    the input of ``out_proj`` that the attention's backward reads too (default ``gemm_in``;
    DeepSeek-V3 keeps it in a 12-bit E5M6 format with 1x128 tiles, Section 3.3.3)."""
    L = local_dims(model, micro_batch, tp, sp)
    H, rq, rkv, dn, dr, dv = _dims(model)
    T, NT, h, Hl = L.tokens, L.norm_tokens, model.hidden, L.heads
    g = d if gemm_in is None else gemm_in
    n = NT * h * d  # norm1 input (sequence-parallel shard)
    n += T * (rq or 0) * d + T * (rkv + dr) * d  # latents (norm inputs; rope input)
    if "layernorm" not in recompute:
        n += T * h * g  # gathered norm output: input of the down-projections
        n += T * (rq or 0) * g + T * rkv * g  # latent norm outputs: inputs of the up-projections
    if "mla_up_proj" not in recompute:
        n += (T * Hl * (dn + dr) * 2 + T * Hl * dv) * d  # Q, K (after rope), V
    n += T * Hl * dv * (g if attn_out is None else attn_out)  # attention output
    return float(n + 4 * micro_batch * Hl * model.seq_len)


def _with_head_dim(L, hd: int):
    """The per-rank shapes with every head ``hd`` wide (K and V heads: one per query head)."""
    return replace(L, head_dim=hd, kv_heads=L.heads)
