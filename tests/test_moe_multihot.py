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
from simulator.engine.host import HostRates, program_matrix
from simulator.model import moe
from simulator.model.ops import HOST_SYNC

QWEN3 = ModelConfig(
    layers=94, hidden=4096, ffn_hidden=12288, heads=64, kv_heads=4, vocab=151936,
    seq_len=4096, activation="swiglu", kv_channels=128,
    moe={"experts": 128, "top_k": 8, "ffn_hidden": 1536, "shared_experts": 0},
)  # fmt: skip

#: kernels of ``_indices_to_multihot`` by torch call: zeros x 2, ``!=``, ``indices[mask]``
#: (nonzero's count, its select, the gather), arange, ``sum``, ``repeat_interleave`` of a
#: tensor (cumsum, fill, index_select), ``index_put_``, ``probs[mask]`` (3), ``index_put_``,
#: ``.bool()``
KERNELS_AFTER = 2 + 1 + 3 + 1 + 1 + 3 + 1 + 3 + 1 + 1
#: boolean indexing twice and ``repeat_interleave`` without ``output_size`` read a count on
#: the host
SYNCS_AFTER = 3
#: the probabilities' gradient: the index_put's gather, IndexBackward's zeros and its
#: accumulating index_put (linear index, sort, scatter); setup_metadata's topk: zeros, scatter
KERNELS_BWD = 1 + 1 + 3 + 2


def _ops(backward: bool, multihot: str, dispatcher: str = "deepep", tp: int = 4):
    loc = moe.moe_local(QWEN3, 1, tp, 1, 8, 1)
    fn = moe.moe_backward_ops if backward else moe.moe_forward_ops
    return fn(QWEN3, loc, tp=tp, ep=8, etp=1, d=2, dispatcher=dispatcher, multihot=multihot)


def test_unfused_multihot_kernels_and_syncs():
    fused, unfused = _ops(False, "fused"), _ops(False, "unfused")
    added = [op for op in unfused if op.name not in {o.name for o in fused}]
    names = [op.name for op in unfused]
    # setup_metadata's topk before the count exchange, the rest right after the dispatch
    assert names.index("dispatch_topk") < names.index("moe_counts")
    after = names[names.index("moe_dispatch") + 1:names.index("sort_chunks")]
    assert len(after) == KERNELS_AFTER + SYNCS_AFTER
    assert sum(op.kind == HOST_SYNC for op in added) == SYNCS_AFTER
    assert len([op for op in added if op.kind != HOST_SYNC]) == KERNELS_AFTER + 1
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


def test_syncs_expose_the_host_between_them():
    # a host-bound forward: each synchronisation waits for the GPU, so the kernels after
    # it run at the host's pace even where the GPU would be ahead
    ops = [op for op in _ops(False, "unfused") if not isinstance(op, moe.Comm)]
    syncs = sum(op.kind == HOST_SYNC for op in ops)
    rates = HostRates(op_s=10e-6, collective_s=10e-6, sync_s=5e-6)
    m = program_matrix(ops, rates, lambda parts: 0.0)  # GPU time free: the host decides
    kernels = len(ops) - syncs
    assert m[3] == pytest.approx(kernels * 10e-6 + syncs * 5e-6)
