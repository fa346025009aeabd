"""``parallelism.tp_loss: gathered``: eager TP code that all-gathers the LM head's
vocabulary-split logits and runs an ordinary cross-entropy over the whole vocabulary on every
rank (``benchmarks/device/steps_third.py``'s ``_GatherLast``). Sizes worked out by hand from
the workload (shape A: 12 layers of 2048, vocabulary 32000, 8 x 2048 tokens, bf16)."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.errors import ConfigError
from simulator.model import comm, memory
from simulator.model.ops import FP32
from simulator.run import simulate
from tests.conftest import ROOT

TP4 = ROOT / "validation/heldout8/h8t_tp4_A.yaml"  # TP 4, tp_loss: gathered
T, V, D = 8 * 2048, 32000, 2  # tokens, vocabulary, bf16 logits


def _head(tp: int, loss: str, backward: bool):
    w = load_workload(TP4, [f"parallelism.tp={tp}", f"parallelism.tp_loss={loss}"])
    return comm.head_ops(w.workload.model, micro_batch=8, tp=tp, sequence_parallel=False,
                         backward=backward, kernels="eager", param_dtype="bf16",
                         tp_input_dtype="compute", tp_loss=loss)


def _by_name(ops) -> dict:
    return {op.name: op for op in ops}


@pytest.mark.parametrize("tp", [2, 4])
def test_forward_gathers_the_logits_then_runs_the_whole_vocabulary_loss(tp):
    """After the LM head (``T x V/tp``), one all-gather of the whole ``T x V`` bf16 logits,
    NCCL's flat output copied into the ``tp`` parts and ``torch.cat`` (each reads and writes
    ``2 T V`` bytes), then the fp32 cast (``T V (2 + 4)``) and the log-softmax (``16 T V``: a
    128,000-byte fp32 row is wider than shared memory, four passes) over the whole vocabulary:
    the same loss whatever ``tp``, none of the vocab-parallel kernels."""
    ops = _head(tp, "gathered", False)
    names = [op.name for op in ops]
    i = names.index("tp_all_gather")
    assert names.index("lm_head") < i < names.index("logits_gather_copy") < names.index(
        "logits_cat") < names.index("ce_upcast")
    got = _by_name(ops)
    assert got["lm_head"].n == V // tp
    assert got["tp_all_gather"].bytes == pytest.approx(T * V * D)
    assert got["logits_cat"].bytes == pytest.approx(2 * T * V * D)
    assert got["ce_upcast"].bytes == pytest.approx(T * V * (D + FP32))
    assert got["ce_log_softmax"].bytes == pytest.approx(4 * T * V * FP32)
    assert "ce_max" not in got and "ce_div" not in got


def test_backward_slices_the_rank_shard_before_the_head_gemms():
    """Backward at TP 4: the log-softmax backward over the whole vocabulary (``16 T V``, four
    passes over rows wider than shared memory),
    the cast back to bf16, then the rank's ``T x V/4`` slice copied out (``2 T V/4 x 2``)
    before the LM head's data and weight gradients over ``V/4``; the head input's gradient is
    all-reduced as without ``gathered``."""
    ops = _head(4, "gathered", True)
    names = [op.name for op in ops]
    got = _by_name(ops)
    assert got["ce_log_softmax"].bytes == pytest.approx(4 * T * V * FP32)
    assert got["logits_slice"].bytes == pytest.approx(2 * T * (V // 4) * D)
    assert names.index("ce_upcast") < names.index("logits_slice") < names.index("lm_head_dgrad")
    assert got["lm_head_dgrad"].k == V // 4
    assert names[-1] == "tp_all_reduce"


def test_vocab_parallel_is_unchanged():
    """The default keeps the vocab-parallel loss over the local shard and no gather."""
    got = _by_name(_head(4, "vocab_parallel", False))
    assert "tp_all_gather" not in got and "logits_cat" not in got
    assert got["ce_upcast"].bytes == pytest.approx(T * (V // 4) * (D + FP32))


def test_memory_keeps_the_whole_vocabulary_log_softmax():
    """Kept for the backward: the fp32 log-softmax of the whole vocabulary (``4 T V``) on
    every rank, against the vocab-parallel softmax of the shard (``4 T V / tp``); the working
    set is the tp = 1 loss's, ``8 T V`` (bf16 logits)."""
    w = load_workload(TP4)
    kw = dict(micro_batch=8, tp=4, sequence_parallel=False, kernels="eager")
    kept = memory.head_activation_tensors(w.workload.model, tp_loss="gathered", **kw)
    assert kept["log_softmax"] == pytest.approx(4 * T * V)
    assert memory.head_transient_bytes(w.workload.model, tp_loss="gathered", **kw) == pytest.approx(
        8 * T * V)
    shard = memory.head_activation_tensors(w.workload.model, **kw)
    assert shard["softmax"] == pytest.approx(4 * T * V / 4)


def test_gathered_step_is_slower_by_at_least_the_gather():
    """On the 4-GPU workload the gathered loss adds the all-gather and the larger loss to the
    step, the same on every rank (nothing overlaps them: the loss needs the logits)."""
    fast = simulate(load_workload(TP4, ["parallelism.tp_loss=vocab_parallel"])).summary
    slow = simulate(load_workload(TP4)).summary
    gather = slow["breakdown_s"]["tp_comm"] - fast["breakdown_s"]["tp_comm"]
    assert gather > 0
    assert slow["step_time_s"] - fast["step_time_s"] > gather


@pytest.mark.parametrize("sets", [["training.kernels=fused"], ["parallelism.tp_impl=dtensor"]])
def test_gathered_needs_eager_megatron_tp(sets):
    """Fused code and DTensor's ``loss_parallel`` never gather the logits: refused."""
    with pytest.raises(ConfigError) as e:
        simulate(load_workload(TP4, sets))
    assert e.value.field == "parallelism.tp_loss"
