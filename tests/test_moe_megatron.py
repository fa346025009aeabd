"""Megatron-Core's MoE mechanics in fused programs: the one host synchronisation per MoE layer
forward where its dispatchers wait for the token counts, DeepEP's fused permutation,
Transformer Engine's grouped GEMM four experts at a time, and what the synchronisation costs a
step (closed forms; dense fused programs untouched)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from simulator.cli import main
from simulator.config.schema import ModelConfig
from simulator.model import moe
from simulator.model.moe_layer import layer_ops
from simulator.model.ops import HOST_SYNC
from tests.conftest import small_topology, write_case

MODEL = ModelConfig(
    layers=2, hidden=1024, ffn_hidden=4096, heads=16, kv_heads=8, vocab=32000, seq_len=2048,
    activation="swiglu",
    moe={"experts": 64, "top_k": 4, "ffn_hidden": 512, "shared_experts": 1},
)  # fmt: skip


def _ops(backward=False, kernels="fused", **kw):
    args = dict(micro_batch=1, tp=2, sequence_parallel=True, backward=backward, moe_layer=True,
                kernels=kernels, ep=4, etp=1)  # fmt: skip
    args.update(kw)
    return layer_ops(MODEL, **args)


def _names(ops):
    return [op.name for op in ops]


def test_alltoall_forward_syncs_once_after_its_permutation():
    names = _names(_ops())
    syncs = [op for op in _ops() if op.kind == HOST_SYNC]
    assert len(syncs) == 1
    i = names.index("moe_counts_sync")
    # Megatron-Core's alltoall dispatcher: counts and their all-gather, the copies to the host,
    # the permutation, then the wait for the copies (before_ep_alltoall) and the all-to-all
    assert names.index("moe_counts") < names.index("a2a_dtoh_tokens") < names.index("permute")
    assert names[i - 1] == "permute" and names[i + 1] == "moe_dispatch"
    assert not any(op.kind == HOST_SYNC for op in _ops(backward=True))


def test_deepep_fused_has_no_token_permutation_around_its_exchange():
    names = _names(_ops(dispatcher="deepep"))
    assert "permute" not in names and "unpermute" not in names
    i = names.index("moe_counts_sync")
    assert names[i - 1] == "moe_counts" and names[i + 1] == "moe_dispatch"
    # the received tokens are still sorted by expert and back, even with one local expert
    one = _names(layer_ops(MODEL.model_copy(update={"moe": MODEL.moe.model_copy(
        update={"experts": 4})}), micro_batch=1, tp=2, sequence_parallel=True, backward=False,
        moe_layer=True, ep=4, dispatcher="deepep"))  # fmt: skip
    assert "sort_chunks" in one and "unsort_chunks" in one
    # eager code keeps its permutation before the counts
    eager = _names(_ops(kernels="eager"))
    assert eager.index("permute") < eager.index("moe_counts") < eager.index("moe_counts_sync")


def test_other_dispatchers_sync_where_megatron_reads_the_counts():
    gather = _names(_ops(dispatcher="allgather"))
    assert gather[gather.index("moe_counts_sync") - 1] == "moe_gather"
    alone = _names(_ops(ep=1))
    assert alone[alone.index("moe_counts_sync") + 1] == "expert_fc1"


def test_shared_expert_output_is_added_once_forward_only():
    assert _names(_ops()).count("shared_add") == 1
    assert "shared_add" not in _names(_ops(backward=True))


@pytest.mark.parametrize("experts,ep,rounds", [(64, 4, 4), (16, 4, 1), (64, 16, 1), (64, 8, 2)])
def test_grouped_gemm_runs_four_experts_at_a_time(experts, ep, rounds):
    model = MODEL.model_copy(update={"moe": MODEL.moe.model_copy(update={"experts": experts})})
    loc = moe.moe_local(model, 1, 2, 1, ep, 1)
    local = experts // ep
    per_expert = 1024 * 4 * ep / experts  # s/tp tokens x top_k x EP ranks, over the experts
    assert loc.expert_tokens == pytest.approx((per_expert,) * local)
    ops = moe.moe_forward_ops(model, loc, tp=2, ep=ep, etp=1, d=2)
    fc1 = [op for op in ops if op.name == "expert_fc1"]
    assert len(fc1) == rounds
    tile = -(-round(per_expert) // 128) * 128
    assert [op.m for op in fc1] == [tile * min(4, local - 4 * r) for r in range(rounds)]
    # FLOPs of the real tokens: 2 x copies x h x 2 ffn (SwiGLU's two projections)
    assert sum(op.flops for op in fc1) == pytest.approx(2 * per_expert * local * 1024 * 1024)


# ---- the engine: what the synchronisation costs


def _step(tmp_path, capsys, model: dict, gpu: dict, **par) -> float:
    work = {
        "name": "sync",
        "model": model,
        "training": {"global_batch": 8, "micro_batch": 1, "precision": "bf16"},
        "parallelism": {"tp": 1, "pp": 1, "zero": 1, **par},
    }
    p = write_case(tmp_path, work, small_topology(1, 8, gpu=gpu))
    assert main(["run", str(p), "--json", "--no-files"]) == 0
    return json.loads(capsys.readouterr().out)["step_time_s"]


MOE = {"layers": 3, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 8,
       "vocab": 32000, "seq_len": 2048, "activation": "swiglu",
       "moe": {"experts": 8, "top_k": 2, "ffn_hidden": 1024}}  # fmt: skip


def test_each_moe_forward_waits_for_its_counts(tmp_path, capsys):
    """The host is ahead (no host time per fused kernel), so each MoE layer forward idles the
    GPU exactly ``host_sync_s`` after the count exchange: 3 layers x 1 micro-batch per replica
    (global batch 8 over dp 8) x the difference (no barrier cost, ``host_barrier_s`` 0: that is
    tests/test_host_barrier.py's)."""
    ahead = {"host_fused_op_s": 0.0, "host_fused_collective_s": 0.0, "host_barrier_s": 0.0}
    base = {"base": "H100-SXM-80GB", "host_jitter": 0.0, "host_sync_s": 0.0, **ahead}
    slow = {"base": "H100-SXM-80GB", "host_jitter": 0.0, "host_sync_s": 1e-3, **ahead}
    a = _step(tmp_path, capsys, MOE, base, dp=8, ep=4)
    b = _step(tmp_path, capsys, MOE, slow, dp=8, ep=4)
    assert b - a == pytest.approx(3 * 1 * 1e-3, rel=1e-6)


def test_dense_fused_programs_have_no_host_clock(tmp_path, capsys):
    dense = {k: v for k, v in MOE.items() if k != "moe"}
    base = {"base": "H100-SXM-80GB", "host_jitter": 0.0, "host_sync_s": 0.0}
    slow = {"base": "H100-SXM-80GB", "host_jitter": 0.0, "host_sync_s": 1e-3,
            "host_fused_op_s": 1e-3}
    assert _step(tmp_path, capsys, dense, slow, dp=8) == _step(tmp_path, capsys, dense, base, dp=8)


TOY = {"layers": 2, "hidden": 256, "ffn_hidden": 1024, "heads": 2, "kv_heads": 2, "vocab": 1024,
       "seq_len": 512, "activation": "swiglu", "moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512}}


@pytest.mark.parametrize("sync_s", [0.0, 5e-3])
def test_host_bound_fused_moe_layer_takes_its_parts_times_the_rates(tmp_path, capsys, sync_s):
    """At hidden 256 with a host time of 1 ms per fused kernel, 0.5 ms per plain aten call on
    integer tensors (the alltoall dispatcher's count kernels and copies: ``host_multihot_s``
    spread over the 27 kernels of its measured call after its 5 synchronisations) and 2 ms
    per collective call the GPU work (microseconds) hides behind the host: each MoE layer's
    forward lasts its kernels x 1 ms + its plain calls x 0.5 ms + its collectives x 2 ms + the
    count synchronisation, its backward the same without the synchronisation and the plain
    calls (op counts from the layer's own op list)."""
    rates = {"base": "H100-SXM-80GB", "host_jitter": 0.0, "host_sync_s": sync_s,
             "host_fused_op_s": 1e-3, "host_multihot_s": 27 * 0.5e-3 + 5 * sync_s,
             "host_fused_collective_s": 2e-3}  # fmt: skip
    work = {"name": "toy", "model": TOY,
            "training": {"global_batch": 2, "micro_batch": 1, "precision": "bf16"},
            "parallelism": {"tp": 1, "pp": 1, "zero": 1, "dp": 2, "ep": 2}}  # fmt: skip
    p = write_case(tmp_path, work, small_topology(1, 2, gpu=rates))
    assert main(["run", str(p), "--out", str(tmp_path / "out"), "--json"]) == 0
    capsys.readouterr()
    ev = pd.read_parquet(tmp_path / "out/events.parquet")
    ev = ev[(ev.gpu == 0) & ev.name.str.match(r"L\d (fwd|bwd)$")]
    model = ModelConfig(**TOY)
    for bwd in (False, True):
        ops = layer_ops(model, micro_batch=1, tp=1, sequence_parallel=False, backward=bwd,
                        moe_layer=True, ep=2, etp=1)  # fmt: skip
        comm = sum(op.kind == "comm" for op in ops)
        syncs = sum(op.kind == HOST_SYNC for op in ops)
        plain = sum(op.name.startswith(moe.PLAIN_ATEN_PREFIXES) for op in ops)
        kernels = len(ops) - comm - syncs - plain
        # forward: 6 count kernels, 4 copies, the un-sort's sizes; TE's 2 row-map kernels;
        # the counts' all-gather and the probabilities' all-to-all beside the tokens'
        assert (kernels, plain, comm, syncs) == ((22, 0, 3, 0) if bwd else (19, 11, 4, 1))
        want = kernels * 1e-3 + plain * 0.5e-3 + comm * 2e-3 + syncs * sync_s
        rows = ev[ev.name.str.endswith("bwd" if bwd else "fwd")]
        assert len(rows) == 2
        for d in rows.end_s - rows.start_s:
            assert d == pytest.approx(want, rel=2e-3)  # + the last kernel's GPU time


def test_shipped_fused_host_rates_leave_dense_fused_steps_unchanged(tmp_path, capsys):
    """The calibrated fused host rates apply to MoE models only: a dense fused model's step
    with the shipped gpus.yaml equals its step with every host rate at zero."""
    dense = {k: v for k, v in MOE.items() if k != "moe"}
    zero = {"base": "H100-SXM-80GB", "host_jitter": 0.0, "host_sync_s": 0.0,
            "host_fused_op_s": 0.0,
            "host_fused_collective_s": 0.0}  # fmt: skip
    shipped = {"base": "H100-SXM-80GB"}
    assert _step(tmp_path, capsys, dense, shipped, dp=8) == _step(tmp_path, capsys, dense, zero, dp=8)


# ---- combined 1F1B: which stream runs what


def _part(name, dur, comm=False):
    from simulator.engine.program import Part

    return Part(name, "comm" if comm else "compute", dur, dim="ep" if comm else "")


def test_alltoall_counts_run_with_the_pre_dispatch_compute():
    """Megatron-Core's combined 1F1B runs the alltoall dispatcher's count exchange in the
    pre-dispatch computation node (compute stream) with the router and the permutation;
    DeepEP's count exchange is part of its dispatch (communication stream)."""
    from simulator.engine.combined import chain_items
    from simulator.engine.program import Part

    sync = Part("moe_counts_sync", HOST_SYNC, 0.0)
    a2a = (_part("router", 1e-3), _part("moe_counts", 5e-5, True), sync,
           _part("permute", 1e-4), _part("moe_dispatch", 2e-3, True), _part("expert", 3e-3))  # fmt: skip
    items = chain_items([("l", 0, a2a)], 1.0, 0.0)
    assert [(it.comm, round(it.dur, 9)) for it in items] == [
        (False, 1.15e-3), (True, 2e-3), (False, 3e-3)]  # fmt: skip
    deepep = (_part("router", 1e-3), _part("moe_counts", 5e-5, True), sync,
              _part("moe_dispatch", 2e-3, True), _part("expert", 3e-3))  # fmt: skip
    items = chain_items([("l", 0, deepep)], 1.0, 0.0)
    assert [(it.comm, round(it.dur, 9)) for it in items] == [
        (False, 1e-3), (True, 5e-5), (True, 2e-3), (False, 3e-3)]  # fmt: skip


def test_deepep_kernels_take_their_sms_from_compute():
    # 20 of an H100's 132 SMs: the rest run 132 / 112 as long, above NCCL's measured 14.4 %
    assert moe.beside_ep_slowdown(0.144, "deepep", 132) == pytest.approx(20 / 112)
    assert moe.beside_ep_slowdown(0.25, "deepep", 132) == 0.25
    assert moe.beside_ep_slowdown(0.144, "alltoall", 132) == 0.144
