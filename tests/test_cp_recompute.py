"""Selective recomputation of the core attention under context parallelism. Megatron-Core's
``_checkpointed_attention_forward`` wraps Transformer Engine's whole attention, its CP
communication included, in ``tensor_parallel.checkpoint``, whose backward runs the forward
again; so each mode's forward communication is issued again before the layer's backward:
``p2p``'s ``cp - 1`` K/V hops (each beside its block's kernel, as in the forward),
``all_gather``'s gather of K/V (which TE's backward also gathers again on its own) and
``a2a``'s four all-to-alls. Closed forms: the bytes re-sent per layer and micro-batch; cp 1
and recompute none unchanged."""

from __future__ import annotations

import pytest

from simulator.config.schema import ModelConfig
from simulator.engine.program import build_stage_programs, program_time
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.model import context as cx

# Llama-3-8B shapes (32 heads, 8 KV heads, head_dim 128) at 32K tokens.
M = ModelConfig(layers=4, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=128256,
                seq_len=32768, activation="swiglu")  # fmt: skip
CM = ComputeModel(load_gpu("H100-SXM-80GB"))
HOP_S = 1e-4  # every collective's folded cost, seconds (a stand-in: only structure is tested)


def _progs(cp: int, mode: str, recompute: str, tp: int = 2, b: int = 1, cost=HOP_S):
    return build_stage_programs(
        model=M, micro_batch=b, tp=tp, sp=tp > 1, recompute=recompute, dtype="bf16", cm=CM,
        comm_cost=lambda dim, op, nbytes: cost, cp=cp, cp_comm=mode)  # fmt: skip


def _kv(cp: int, tp: int, b: int) -> float:
    """One rank's K and V: b s/cp tokens x (8/tp) KV heads x 128 x 2 tensors x 2 bytes."""
    return 2.0 * b * (32768 // cp) * (8 // tp) * 128 * 2


def _cp_comm(prog):
    return [(p.name, p.op, p.nbytes, p.overlap_next) for p in prog
            if p.kind == "comm" and p.dim == "cp"]  # fmt: skip


@pytest.mark.parametrize("cp,tp,b", [(2, 1, 1), (4, 2, 1), (8, 2, 2), (16, 1, 1)])
def test_ring_hops_sent_again_under_selective_recompute(cp, tp, b):
    """p2p: the re-run forward sends its cp - 1 K/V blocks again, each beside a block's
    kernel (overlap_next, as in the forward): (cp - 1) x kv bytes a layer and micro-batch,
    on top of the backward's own 2 (cp - 1) x kv (K/V again and dK/dV)."""
    p = _progs(cp, "p2p", "selective", tp, b)
    kv = _kv(cp, tp, b)
    assert _cp_comm(p.layer_recompute) == [("re_cp_send_recv", "send_recv", kv, True)] * (cp - 1)
    assert sum(n for _, _, n, _ in _cp_comm(p.layer_bwd)) == 2 * (cp - 1) * kv
    assert cx.ring_bytes(M, b, tp, cp) == ((cp - 1) * kv, 2 * (cp - 1) * kv)


@pytest.mark.parametrize("cp,tp,b", [(2, 1, 1), (4, 2, 1), (8, 2, 2)])
def test_all_gather_gathered_again_under_selective_recompute(cp, tp, b):
    """all_gather: TE's backward gathers K/V again by itself (it saves the rank's own K and V);
    the re-run forward adds one more gather of the whole sequence's K/V, cp x kv bytes."""
    kv = _kv(cp, tp, b)
    p = _progs(cp, "all_gather", "selective", tp, b)
    gather = ("cp_all_gather", "all_gather", cp * kv, False)
    assert _cp_comm(p.layer_fwd) == [gather]
    assert _cp_comm(p.layer_bwd) == [gather, ("cp_reduce_scatter", "reduce_scatter", cp * kv,
                                              False)]  # fmt: skip
    assert _cp_comm(p.layer_recompute) == [("re_cp_all_gather", "all_gather", cp * kv, False)]


@pytest.mark.parametrize("mode", ["p2p", "all_gather", "a2a"])
def test_no_recompute_and_cp1_send_nothing_again(mode):
    """recompute none: no recompute program; cp 1: the re-run has no CP collective, and
    the forward and backward programs are the same whatever cp_comm says."""
    assert _progs(4, mode, "none").layer_recompute == ()
    one = _progs(1, mode, "selective")
    assert _cp_comm(one.layer_recompute) == []
    ring = _progs(1, "p2p", "selective")
    assert (one.layer_fwd, one.layer_bwd, one.layer_recompute) == (
        ring.layer_fwd, ring.layer_bwd, ring.layer_recompute)


@pytest.mark.parametrize("cost", [1e-6, 5e-3])
def test_rerun_ring_is_timed_as_the_forward_ring(cost):
    """The re-run ring overlaps its kernels as the forward ring does: its time equals the
    forward attention's (from the first hop to the last block), whether the hops hide under
    the kernels (cheap) or the kernels under the hops (dear)."""
    cp = 4
    p = _progs(cp, "p2p", "selective", cost=cost)
    names = [q.name for q in p.layer_fwd]
    first = names.index("cp_send_recv")
    last = max(i for i, n in enumerate(names) if n.startswith("attn_"))
    assert program_time(p.layer_recompute)[0] == pytest.approx(
        program_time(p.layer_fwd[first:last + 1])[0], rel=1e-12)
    ring = p.layer_fwd[first:last + 1]
    beside = [ring[i + 1] for i, q in enumerate(ring) if q.kind == "comm"]
    assert [q.name for q in beside] == ["attn_blk0"] + ["attn_blk"] * (cp - 2)
    # each of the cp - 1 hops is exposed by what it outlasts the kernel it runs beside
    exposed = dict(program_time(p.layer_recompute)[2]).get("cp", 0.0)
    assert exposed == pytest.approx(sum(max(0.0, cost - q.dur) for q in beside), abs=1e-15)


def test_full_recompute_keeps_the_ring_beside_its_kernels():
    """Full recomputation re-runs the whole forward; its ring hops overlap as they did."""
    p = _progs(4, "p2p", "full")
    assert [(p.name, p.overlap_next) for p in p.layer_recompute if p.dim == "cp"] == [
        ("re_cp_send_recv", True)] * 3
