"""``parallelism.tp_embedding: replicated``: eager TP code that keeps a whole ``nn.Embedding``
on every TP rank (``benchmarks/device/steps_third.py``'s ``Llama.embed``, built before the
TP split and never sharded). Sizes worked out by hand from the workload (shape A: vocabulary
32000, hidden 2048, 8 x 2048 tokens, bf16 weights and bf16 AdamW moments, TP 4)."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.errors import ConfigError
from simulator.run import simulate
from tests.conftest import ROOT

TP4 = ROOT / "validation/heldout8/h8t_tp4_A.yaml"  # TP 4, tp_embedding: replicated
V, H, T, TP = 32000, 2048, 8 * 2048, 4
GIB = 2**30


def _summary(embedding: str) -> dict:
    return simulate(load_workload(TP4, [f"parallelism.tp_embedding={embedding}"])).summary


def test_whole_embedding_states_on_every_rank():
    """The rank holds all ``V`` rows instead of ``V/4``: ``V h (1 - 1/4)`` more bf16 weights
    (2 bytes) and two bf16 AdamW moments (4 bytes). The ``.grad`` tensors are made by the
    backward (``zero_grad(set_to_none=True)``), after this one-micro-batch step's peak in the
    loss: none at the peak either way. The lookup saves only the ids (the batch itself), not
    the vocab-parallel lookup's shifted int64 ids and bool mask (``9 T`` bytes)."""
    shard, whole = _summary("vocab_parallel"), _summary("replicated")
    extra = V * H * (1 - 1 / TP)
    ms, mw = shard["memory_gib"], whole["memory_gib"]
    assert (mw["weights"] - ms["weights"]) * GIB == pytest.approx(2 * extra)
    assert (mw["optimizer"] - ms["optimizer"]) * GIB == pytest.approx(4 * extra)
    assert mw["gradients"] == ms["gradients"] == 0.0
    assert (mw["activations"] - ms["activations"]) * GIB == pytest.approx(-9 * T)
    assert (mw["allocated"] - ms["allocated"]) * GIB == pytest.approx(6 * extra - 9 * T)


def test_lookup_without_collective():
    """The replicated lookup's output is whole on every rank: the vocab-parallel embedding's
    all-reduce of ``T h`` bf16 values leaves the step's TP communication."""
    shard, whole = _summary("vocab_parallel"), _summary("replicated")
    assert whole["breakdown_s"]["tp_comm"] < shard["breakdown_s"]["tp_comm"]


def test_replicated_needs_eager_code():
    """Fused (Megatron-LM) code always splits the embedding over the vocabulary: refused."""
    with pytest.raises(ConfigError) as e:
        simulate(load_workload(TP4, ["training.kernels=fused", "parallelism.tp_loss=vocab_parallel"]))
    assert e.value.field == "parallelism.tp_embedding"
