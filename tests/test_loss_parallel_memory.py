"""The working set of PyTorch's ``loss_parallel`` (``parallelism.tp_impl: dtensor``, eager):
its ``_log_softmax`` and fused nll/log-softmax backward handlers
(``torch/distributed/tensor/parallel/loss.py``), worked by hand in bytes."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.model import memory
from simulator.run import simulate
from tests.conftest import ROOT

TP2 = ROOT / "validation/heldout7/h7_tp2_X.yaml"  # DTensor TP 2, no SP, 4 x 2048 tokens
T, V, TP = 4 * 2048, 50304, 2


def _transient(impl: str, tp: int = TP, d: int = 2) -> float:
    w = load_workload(TP2).workload
    return memory.head_transient_bytes(w.model, micro_batch=4, tp=tp, sequence_parallel=False,
                                       dtype_bytes=d, kernels="eager", tp_impl=impl)


def test_backward_holds_three_fp32_shards_beside_the_kept_log_softmax():
    """``x = T V/tp`` local logits. Forward (bf16 logits): the logits (2x), their fp32 copy (4x),
    ``shifted`` (4x), ``exp`` (4x) before the kept result: 14x. Backward: ``zeros_like`` (4x),
    ``exp`` of the kept log-softmax (4x), the sum (4x), then the product in place of ``exp``:
    12x beside the kept 4x, the larger. Megatron-style eager vocab-parallel code: 6x."""
    x = T * V // TP
    assert _transient("dtensor") == pytest.approx(12 * x)
    assert _transient("megatron") == pytest.approx(6 * x)
    # fp32 compute: no cast; forward logits + shifted + exp = 12x, the backward's 12x
    assert _transient("dtensor", d=4) == pytest.approx(12 * x)
    # one rank: the ordinary cross-entropy, whatever the TP code
    assert _transient("dtensor", tp=1) == _transient("megatron", tp=1) == pytest.approx(8 * T * V)


def test_step_peak_grows_by_the_difference():
    """The one-micro-batch step peaks in the loss's backward, so its allocated memory under
    DTensor is the Megatron-style code's plus ``(12 - 6) T V/tp`` bytes (no SP: nothing else
    differs in memory)."""
    a = simulate(load_workload(TP2, ["parallelism.tp_impl=megatron"])).summary["memory_gib"]
    b = simulate(load_workload(TP2)).summary["memory_gib"]
    assert (b["allocated"] - a["allocated"]) * 2**30 == pytest.approx(6 * T * V / TP)
