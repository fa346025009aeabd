"""Megatron-Core's flex dispatcher with DeepEP, without ``--enable-experimental``: its PyTorch
``_indices_to_multihot`` after every dispatch (Megatron-LM ``token_dispatcher.py``). Checked
against the torch calls of that function counted by hand (kernels each launches, the host
synchronisations of boolean indexing and ``repeat_interleave``), and the received-token count
against a seeded simulation of uniform random routes."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.config.schema import ModelConfig, TrainingConfig
from simulator.engine.host import HostRates, multihot_op_s, program_matrix
from simulator.model import moe
from simulator.model.ops import HOST_SYNC

QWEN3 = ModelConfig(
    layers=94, hidden=4096, ffn_hidden=12288, heads=64, kv_heads=4, vocab=151936,
    seq_len=4096, activation="swiglu", kv_channels=128,
    moe={"experts": 128, "top_k": 8, "ffn_hidden": 1536, "shared_experts": 0},
)  # fmt: skip

#: kernels of one ``_indices_to_multihot`` call profiled on H100 (torch 2.11,
#: data/measured/multihot-host-h100x4: every rank's profile counts 27)
KERNELS_AFTER = 27
#: boolean indexing twice (its count), ``repeat_interleave`` without ``output_size`` (its
#: check and its total) and the scalar ``index_put_`` (its value's copy) wait on the host: the
#: profile's 5 device-to-host copies and 5 stream synchronisations
SYNCS_AFTER = 5
#: the probabilities' gradient: the index_put's gather, IndexBackward's zeros and its
#: accumulating index_put (linear index, sort, scatter), in place of the fused kernel's one
KERNELS_BWD = 5 - 1


def _ops(backward: bool, multihot: str, dispatcher: str = "deepep", tp: int = 4):
    loc = moe.moe_local(QWEN3, 1, tp, 1, 8, 1)
    fn = moe.moe_backward_ops if backward else moe.moe_forward_ops
    return fn(QWEN3, loc, tp=tp, ep=8, etp=1, d=2, dispatcher=dispatcher, multihot=multihot)


def test_unfused_multihot_kernels_and_syncs():
    fused, unfused = _ops(False, "fused"), _ops(False, "unfused")
    for ops in (fused, unfused):  # setup_metadata's topk before the count exchange
        names = [op.name for op in ops]
        assert names.index("dispatch_topk") < names.index("moe_counts")
    after = [op for op in unfused[[o.name for o in unfused].index("moe_dispatch") + 1:]
             if op.name != "sort_chunks"][:KERNELS_AFTER + SYNCS_AFTER]
    assert sum(op.kind == HOST_SYNC for op in after) == SYNCS_AFTER
    assert {op.name for op in after if op.kind != HOST_SYNC} == moe.MULTIHOT_KERNELS
    assert len(moe.MULTIHOT_KERNELS) == KERNELS_AFTER
    f_names = [op.name for op in fused]
    assert f_names[f_names.index("moe_dispatch") + 1] == "multihot_fused"
    bwd_f, bwd_u = _ops(True, "fused"), _ops(True, "unfused")
    assert len(bwd_u) - len(bwd_f) == KERNELS_BWD
    assert not any(op.kind == HOST_SYNC for op in bwd_u if not isinstance(op, moe.Comm))
    # the NCCL all-to-all dispatcher has no such step
    assert [o.name for o in _ops(False, "unfused", "alltoall")] == \
        [o.name for o in _ops(False, "fused", "alltoall")]


def test_multihot_setting_follows_the_code():
    t = TrainingConfig(global_batch=8, moe_dispatcher="deepep")
    assert moe.multihot_kernels(t) == "fused"
    old = t.model_copy(update={"moe_multihot_fusion": False})
    assert moe.multihot_kernels(old) == "unfused"
    assert moe.multihot_kernels(old.model_copy(update={"moe_dispatcher": "alltoall"})) == "fused"
    assert moe.multihot_kernels(old.model_copy(update={"kernels": "eager"})) == "fused"


def test_received_tokens_match_random_routes():
    # 1,024 tokens on each of 8 ranks, each picking 8 of 128 experts uniformly: the rows one
    # rank receives are the tokens with at least one expert among its 16
    loc = moe.moe_local(QWEN3, 1, 4, 1, 8, 1)
    n = moe.deepep_received_tokens(loc, 128, 8, 8)
    rng = np.random.default_rng(7)
    picks = np.argsort(rng.random((8 * 1024 * 10, 128)), axis=1)[:, :8]
    hit = ((picks // 16) == 0).any(axis=1).mean()
    assert n == pytest.approx(8 * 1024 * hit, rel=0.01)
    assert n == pytest.approx(8 * 1024 * (1 - math.comb(112, 8) / math.comb(128, 8)))


def test_multihot_host_rate_reproduces_the_measured_call():
    # one call on an idle GPU: the host issues 27 kernels at the spread rate and resumes
    # after 3 synchronisations; the GPU's kernels are microseconds, so the call takes what
    # was measured
    from simulator.calibrate import host
    from simulator.hardware.catalog import load_gpu

    gpu = load_gpu("H100-SXM-80GB")
    rate = multihot_op_s(gpu.host_multihot_s, gpu.host_sync_s, KERNELS_AFTER, SYNCS_AFTER)
    rates = HostRates(op_s=1.0, collective_s=1.0, sync_s=gpu.host_sync_s, multihot_op_s=rate)
    ops = [op for op in _ops(False, "unfused") if op.name in moe.MULTIHOT_KERNELS
           or op.name == "multihot_sync"]
    m = program_matrix(ops, rates, lambda parts: 0.0)
    assert m[3] == pytest.approx(host.fit_multihot(), rel=1e-3)


def test_syncs_expose_the_host_between_them():
    # a host-bound forward: each synchronisation waits for the GPU, so the kernels after
    # it run at the host's pace even where the GPU would be ahead
    ops = [op for op in _ops(False, "unfused") if not isinstance(op, moe.Comm)]
    syncs = sum(op.kind == HOST_SYNC for op in ops)
    rates = HostRates(op_s=10e-6, collective_s=10e-6, sync_s=5e-6)
    m = program_matrix(ops, rates, lambda parts: 0.0)  # GPU time free: the host decides
    kernels = len(ops) - syncs
    assert m[3] == pytest.approx(kernels * 10e-6 + syncs * 5e-6)
