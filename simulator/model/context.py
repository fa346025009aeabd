"""Context parallelism: attention over a sequence split across ``cp`` ranks.

**Load-balanced causal split** (Megatron-LM / Transformer Engine): a sequence of ``s`` tokens
is cut into ``2*cp`` chunks of ``c = s/(2cp)``; rank ``i`` holds chunks ``i`` and
``2cp-1-i``, so under the causal mask every rank does the same work, ``1/cp`` of the whole
(:func:`causal_units`): its early chunk sees few keys and its late chunk many.

**p2p (ring attention)**: the K/V block of every rank travels around the CP ring, one hop per
step, while the rank computes attention of its queries against the block it holds (Liu et al.
2023, arXiv:2310.01889; Transformer Engine's ``AttnFuncWithCPAndKVP2P``). Step 0 is the
local block, causal over ``2c`` queries and keys. At step ``j > 0`` the block comes from rank
``r = (i - j) mod cp``: if ``r < i`` both local query chunks see the source's early chunk
(``2c`` queries x ``c`` keys), if ``r > i`` only the late query chunk sees both source chunks
(``c`` x ``2c``), in both cases without a mask. The send of the next block runs beside the
current block's kernel. Backward starts from the block the forward ended with (its
successor's, ``p2p_comm_buffers[-1]`` saved for the backward) and passes the blocks the other
way round the ring, so the rank's own (diagonal) block comes last: ``cp-1`` K/V hops (steps
``0 .. cp-2``) and ``cp-1`` hops of the accumulated dK/dV one step behind them (steps
``1 .. cp-1``; the middle steps send both in one buffer), each beside that step's kernel, and
the last dK/dV hop, beside the diagonal block, delivers every block's gradient to its owner
(Transformer Engine's ``AttnFuncWithCP.backward``, v1.4, and
``AttnFuncWithCPAndKVP2P.backward`` in ``attention/dot_product_attention/context_parallel.py``
today): no hop is left exposed after the last kernel. After every step but the first the
partial results are folded into the running ones (:func:`merge_bytes`). Selective
recomputation of the core attention runs the forward ring again, its ``cp-1`` K/V hops each
beside its block's kernel, before the backward's own ring
(:data:`simulator.engine.program.SELECTIVE_COMM`).

**all_gather** (Llama 3, Dubey et al. 2024, arXiv:2407.21783, Section 3.3.2): K and V are
all-gathered over the CP group before attention (small with GQA), each local query chunk
attends to its causal prefix, and backward gathers K and V again (Transformer Engine's
``AttnFuncWithCPAndKVAllGather`` saves the rank's own K and V, not the gathered ones, and its
backward calls ``gather_along_first_dim`` on them, since TE 1.10) and reduce-scatters dK/dV;
no collective is overlapped. Selective recomputation of the core attention runs the forward's
gather a third time.

Rank ``i`` runs ``i`` blocks of the ``2c x c`` shape and ``cp-1-i`` of the ``c x 2c`` one;
both have the same FLOPs and the same keys summed over row tiles, so every step is priced with
the first (it has the more row tiles, so it is the slower by the per-tile overhead).

**Local attention windows** (``model.attention_window``) as Transformer Engine runs them
(``attention/dot_product_attention/context_parallel.py``, since the all-gather variant, TE
1.10, 2024): a sliding window runs with ``cp_comm_type`` ``all_gather`` or ``a2a`` only
(``attn_forward_func_with_cp`` asserts "Context parallelism does not support sliding window
attention with cp_comm_type='p2p'"), and TE has no chunked mask at all. With ``all_gather``
K and V are still gathered whole (and dK/dV reduce-scattered whole), but each local query
chunk ``q`` attends only to the keys its window reaches,
``get_kv_seq_info_after_all_gather``: keys ``[max(0, (q+1)c - c - (w-1)), (q+1)c)``, at most
``c + w - 1`` of them, with the window bottom-right aligned, so the kernel computes the
window's pairs (:func:`chunk_pairs`) and skips the tiles outside it. The split stays the
load-balanced one, which a window unbalances: the first chunk's queries see fewer than ``w``
keys, so rank 0 does the least; the busiest rank (:func:`window_rank`) is priced, since
every rank waits for it at the next collective. ``p2p`` with a sliding window and a chunked
window under any CP are refused (:func:`simulator.config.checks.cp_window_refusal`).

**a2a** (Ulysses; Jacobs et al. 2023, arXiv:2309.14509; Transformer Engine's
``AttnFuncWithCPAndQKVOA2A``): before attention one ``all_to_all_single`` each for Q, K and V
over the CP group turns the rank's ``s/cp`` tokens of all its heads into the whole sequence of
``heads/cp`` of them (a buffer of ``b s/cp h hd`` elements per rank, ``(cp-1)/cp`` of it on
the wire); the rank's two load-balanced chunks arrive in rank order and are put back in
sequence order (``reorder_seq_chunks_for_a2a_before_attn``), so the kernel is the non-CP
causal kernel, any sliding window included, on the full sequence with ``heads/cp`` query and
``kv_heads/cp`` key/value heads: every rank does exactly ``1/cp`` of the work, window or not.
One all-to-all brings the output back (chunks reordered first). Backward: one all-to-all of
dO, the kernel's backward, one each of dQ, dK, dV. The all-to-alls run on the CP stream
while the next tensor's layout copy runs, not beside the attention kernel: none is
overlapped. Each tensor is copied twice on each side in Megatron's ``sbhd`` layout (heads
moved to the front before, chunks index-selected after; the output's chunks index-selected
before, heads moved back after) (:func:`a2a_copy_bytes`). TE saves the post-all-to-all Q, K,
V and O for the backward, the same bytes as the pre-all-to-all ones, so the saved activations
do not change; selective recomputation of the core attention runs the kernel, the copies and
the four forward all-to-alls again (:data:`simulator.engine.program.SELECTIVE_COMM`). The
query and key/value heads per TP rank must divide by ``cp``
(:func:`simulator.config.checks.cp_a2a_refusal`); a chunked window is refused as under the
other modes.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.config.checks import cp_a2a_refusal, cp_window_refusal
from simulator.config.schema import ModelConfig
from simulator.errors import ConfigError
from simulator.model.ops import FP32, Op, flash_attention_op, local_dims, mem_op

CP_COMM = ("p2p", "all_gather", "a2a")
#: FlashAttention-2's backward FLOPs relative to its forward (see ``ops.flash_attention_op``).
BWD_FLOPS = 2.5


def chunks_of(rank: int, cp: int) -> tuple[int, int]:
    """The two sequence chunks (of ``2*cp``) that CP rank ``rank`` holds."""
    return rank, 2 * cp - 1 - rank


def causal_units(rank: int, cp: int) -> float:
    """Causal attention work of ``rank`` in units of one full ``c x c`` chunk block (a
    diagonal block counts 1/2): ``2cp`` for every rank, ``1/cp`` of the sequence's total
    ``(2cp)^2 / 2``."""
    units = 0.0
    for q in chunks_of(rank, cp):
        units += q + 0.5  # q full blocks before it, half of its diagonal
    return units


def window_prefix_pairs(x: float, w: int | None) -> float:
    """Query-key pairs of the first ``x`` queries of a sequence under a causal mask (``w``
    None: ``x^2/2``) or a causal sliding window of ``w`` keys (``x^2/2`` up to ``x = w``, then
    ``w`` a query: ``x w - w^2/2``; :func:`simulator.model.transformer.window_pairs2`'s
    convention, so that the chunks of a sequence add up to its ``s w - w^2/2``)."""
    if w is None or x <= w:
        return x * x / 2
    return x * w - w * w / 2


def chunk_pairs(chunk: int, c: int, w: int | None) -> float:
    """Query-key pairs of sequence chunk ``chunk`` (``c`` queries) under the causal mask or
    window ``w``: ``(2 chunk + 1) c^2 / 2`` causal; ``c w`` once its queries are all ``w`` or
    more tokens in."""
    return window_prefix_pairs((chunk + 1) * c, w) - window_prefix_pairs(chunk * c, w)


def rank_pairs(rank: int, cp: int, c: int, w: int | None) -> float:
    """Query-key pairs of CP rank ``rank``'s two chunks."""
    return sum(chunk_pairs(q, c, w) for q in chunks_of(rank, cp))


def window_rank(cp: int, c: int, w: int | None) -> int:
    """The CP rank with the most query-key pairs (the lowest such): 0 under the causal mask
    (every rank alike), another one under a window (rank 0's first chunk sees fewer)."""
    return max(range(cp), key=lambda r: (rank_pairs(r, cp, c, w), -r))


def window_keys(chunk: int, c: int, w: int) -> int:
    """Keys the kernel of query chunk ``chunk`` reads after the all-gather under a sliding
    window of ``w`` keys (TE's ``window_size = (w-1, 0)``): its own ``c`` and the ``w - 1``
    before them, as far as the sequence goes back."""
    return min((chunk + 1) * c, c + w - 1)


def kv_block_bytes(model: ModelConfig, micro_batch: int, tp: int, cp: int, d: int = 2) -> float:
    """Bytes of one rank's K and V for its ``s/cp`` tokens and ``kv_heads/tp`` heads."""
    L = local_dims(model, micro_batch, tp, False)
    return float(2 * micro_batch * (model.seq_len // cp) * L.kv_heads * L.head_dim * d)


def ring_bytes(model: ModelConfig, micro_batch: int, tp: int, cp: int, d: int = 2):
    """(forward, backward) bytes one rank sends to its ring neighbour per layer and
    micro-batch with ``cp_comm: p2p``: ``(cp-1)`` K/V blocks forward; backward the same
    blocks again and ``cp-1`` hops of dK/dV (module docstring)."""
    kv = kv_block_bytes(model, micro_batch, tp, cp, d)
    return (cp - 1) * kv, 2 * (cp - 1) * kv


def a2a_bytes(model: ModelConfig, micro_batch: int, tp: int, cp: int, d: int = 2):
    """(query-sized, key/value-sized) buffer of one ``cp_comm: a2a`` all-to-all per rank:
    ``b s/cp`` tokens of the TP rank's query (Q, O, dO, dQ) or key/value (K, V, dK, dV) heads;
    each rank keeps ``1/cp`` of it and sends ``1/cp`` to each of the ``cp - 1`` others."""
    L = local_dims(model, micro_batch, tp, False)
    tokens = micro_batch * (model.seq_len // cp)
    return float(tokens * L.heads * L.head_dim * d), float(tokens * L.kv_heads * L.head_dim * d)


def a2a_copy_bytes(model: ModelConfig, micro_batch: int, tp: int, cp: int, backward: bool,
                   d: int = 2) -> float:
    """HBM bytes of the layout copies around one pass's all-to-alls (module docstring): two
    copies (read and write) of each of Q, K, V and O forward, of dO, dQ, dK, dV backward."""
    q, kv = a2a_bytes(model, micro_batch, tp, cp, d)
    return 2 * 2 * (2 * q + 2 * kv)


def _a2a_ops(model: ModelConfig, b: int, tp: int, cp: int, backward: bool, d: int) -> list[Op]:
    refusal = cp_a2a_refusal(model, tp, cp)
    if refusal is not None:
        raise ConfigError(refusal[1], field=refusal[0])
    L = local_dims(model, b, tp, False)
    L = replace(L, heads=L.heads // cp, kv_heads=L.kv_heads // cp,
                window=model.attention_window or 0, chunked=False)
    kern = flash_attention_op(L, d, backward)
    q, kv = a2a_bytes(model, b, tp, cp, d)
    copies = mem_op("cp_a2a_copy", "attn", a2a_copy_bytes(model, b, tp, cp, backward, d), backward)
    a2a = "all_to_all"
    if backward:
        return [_comm("cp_a2a_do", a2a, q, False), kern, _comm("cp_a2a_dq", a2a, q, False),
                _comm("cp_a2a_dk", a2a, kv, False), _comm("cp_a2a_dv", a2a, kv, False), copies]
    return [_comm("cp_a2a_q", a2a, q, False), _comm("cp_a2a_k", a2a, kv, False),
            _comm("cp_a2a_v", a2a, kv, False), kern, _comm("cp_a2a_o", a2a, q, False), copies]


def _attn(model, b, tp, q: int, kv: int, causal: bool, backward: bool, d: int, name: str,
          pairs: float | None = None, window: int = 0) -> Op:
    L = local_dims(model, b, tp, False)
    hq, hkv, hd = L.heads, L.kv_heads, L.head_dim
    if pairs is None:
        # query-key pairs computed: a causal block sees its prefix and half its diagonal square
        pairs = q * (kv - q) + q * q / 2 if causal else q * kv
    flops = 4.0 * b * hq * pairs * hd
    nbytes = float(b * hd * (2 * hq * q + 2 * hkv * kv) * d)
    if backward:
        flops, nbytes = BWD_FLOPS * flops, 2 * nbytes
    return Op(name, "attention", "attn", batch=b, heads=hq, kv_heads=hkv, seq=q, head_dim=hd,
              kv_seq=kv, causal=causal, flops=flops, bytes=nbytes, backward=backward,
              window=window)  # fmt: skip


def merge_bytes(model: ModelConfig, b: int, tp: int, q: int, kv: int, backward: bool, d: int = 2):
    """HBM bytes of folding one ring step's partial results into the running ones.

    Forward: the block's output is rescaled by its log-sum-exp and added to the running output
    (read both, write one, ``3 d`` bytes per element of ``q x heads x head_dim``) and the
    log-sum-exp updated (``3 x 4`` bytes per query and head); Transformer Engine's
    ``flash_attn_fwd_out_correction``. Backward: the block's dQ added to the running dQ, and
    its dK/dV to the running dK/dV (``3 d`` bytes per element each)."""
    L = local_dims(model, b, tp, False)
    if backward:
        return float(3 * d * b * L.head_dim * (q * L.heads + 2 * kv * L.kv_heads))
    return float(3 * d * b * q * L.heads * L.head_dim + 3 * FP32 * b * q * L.heads)


def _comm(name: str, collective: str, nbytes: float, overlap: bool) -> Op:
    return Op(name, "comm", "cp", bytes=float(nbytes), dim="cp", collective=collective,
              overlap=overlap)  # fmt: skip


def attention_ops(
    model: ModelConfig, b: int, tp: int, cp: int, mode: str, backward: bool, d: int = 2
) -> list[Op]:
    """The attention of one CP rank (module docstring), in place of the single flash kernel:
    blockwise kernels and the CP communication, for the full model's ``seq_len``. A sliding
    window (``model.attention_window``) runs with ``all_gather`` (the busiest rank's chunks
    against the keys their window reaches) and ``a2a`` (the whole sequence's window on
    ``heads/cp`` heads); the rest is refused (
    :func:`~simulator.config.checks.cp_window_refusal`)."""
    refusal = cp_window_refusal(model, cp, mode)
    if refusal is not None:
        raise ConfigError(refusal[1], field=refusal[0])
    if mode == "a2a":
        return _a2a_ops(model, b, tp, cp, backward, d)
    c = model.seq_len // (2 * cp)
    kv = kv_block_bytes(model, b, tp, cp, d)
    w = model.attention_window
    if mode == "all_gather":
        out = [
            _attn(model, b, tp, c, (q + 1) * c, True, backward, d, f"attn_c{q}") if w is None
            else _attn(model, b, tp, c, window_keys(q, c, w), True, backward, d, f"attn_c{q}",
                       pairs=chunk_pairs(q, c, w), window=w)
            for q in chunks_of(0 if w is None else window_rank(cp, c, w), cp)
        ]  # fmt: skip
        gather = _comm("cp_all_gather", "all_gather", cp * kv, False)
        if backward:
            return [gather, *out, _comm("cp_reduce_scatter", "reduce_scatter", cp * kv, False)]
        return [gather, *out]
    diag = _attn(model, b, tp, 2 * c, 2 * c, True, backward, d, "attn_blk0")
    block = _attn(model, b, tp, 2 * c, c, False, backward, d, "attn_blk")
    merge = mem_op("attn_merge", "attn", merge_bytes(model, b, tp, 2 * c, c, backward, d), backward)
    out: list[Op] = []
    for j in range(cp):
        # step j's hop runs beside step j's kernel: K/V for the next step (none at the last),
        # and in backward the dK/dV accumulated so far (none at the first)
        hop = (kv if j < cp - 1 else 0.0) + (kv if backward and j > 0 else 0.0)
        if hop:
            out.append(_comm("cp_send_recv", "send_recv", hop, True))
        # forward: the rank's own causal block first; backward: last (module docstring)
        first = j == (cp - 1 if backward else 0)
        out += [diag] if first else [block, merge]
    return out

