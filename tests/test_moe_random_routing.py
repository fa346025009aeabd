"""Random routes (``training.moe_routing: random``, Megatron-Core's forced load balancing):
the busiest EP rank's expected excess against closed forms and a seeded simulation of the
routing itself."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.config.schema import ModelConfig
from simulator.model import moe

QWEN3 = ModelConfig(
    layers=94, hidden=4096, ffn_hidden=12288, heads=64, kv_heads=4, kv_channels=128,
    vocab=151936, seq_len=4096, moe=dict(experts=128, top_k=8, ffn_hidden=1536),
)  # fmt: skip


def test_expected_max_of_normals_closed_forms():
    # E[max] of two standard normals is 1/sqrt(pi); of three, 3/(2 sqrt(pi))
    assert moe.expected_max_normal(1) == 0.0
    assert moe.expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-6)
    assert moe.expected_max_normal(3) == pytest.approx(1.5 / math.sqrt(math.pi), rel=1e-6)


def test_two_ranks_by_hand():
    # E = 2, k = 1, ep = 2: each token goes to rank 0 or 1 with probability 1/2. A rank's
    # count is Binomial(T, 1/2), and max = T/2 + |X - T/2|; with the normal approximation
    # E|X - T/2| = sqrt(T/4) sqrt(2/pi), so the excess is sqrt(2/(pi T)).
    T = 10_000
    assert moe.random_busiest_excess(2, 1, 2, T) == pytest.approx(
        math.sqrt(2 / (math.pi * T)), rel=1e-6)


@pytest.mark.parametrize("experts,top_k,ep,tokens", [(16, 2, 4, 512), (8, 2, 8, 2048),
                                                    (64, 6, 8, 1024)])
def test_excess_matches_simulated_routing(experts, top_k, ep, tokens):
    # every token picks top_k distinct experts by i.i.d. random scores, as Megatron-Core's
    # forced load balancing does; the mean over draws of the busiest rank's count
    rng = np.random.default_rng(7)
    per, mean, excess = experts // ep, tokens * top_k / ep, []
    for _ in range(600):
        picks = np.argsort(rng.random((tokens, experts)), axis=1)[:, :top_k]
        excess.append(np.bincount(picks.ravel() // per, minlength=ep).max() / mean - 1)
    sim = float(np.mean(excess))
    sem = float(np.std(excess)) / math.sqrt(len(excess))
    got = moe.random_busiest_excess(experts, top_k, ep, tokens)
    assert abs(got - sim) < 4 * sem + 0.02 * sim


def test_random_routes_load_the_busiest_rank():
    # Qwen3-235B, TP 2 (2,048 tokens a rank), EP 32: 65,536 routed tokens
    loc = moe.moe_local(QWEN3, 1, 2, 1, 32, 1, moe.RANDOM)
    excess = moe.random_busiest_excess(128, 8, 32, 32 * 2048)
    assert loc.imbalance == pytest.approx(1 + excess)
    assert sum(loc.expert_tokens) == pytest.approx(2048 * 8 * (1 + excess))
    assert loc.busiest_share == pytest.approx((1 + excess) / 32)
    # more tokens, relatively less spread (1/sqrt(T)); one rank, none
    loc4 = moe.moe_local(QWEN3, 4, 2, 1, 32, 1, moe.RANDOM)
    assert loc4.imbalance - 1 == pytest.approx(excess / 2)
    assert moe.moe_local(QWEN3, 1, 2, 1, 1, 1, moe.RANDOM).imbalance == 1.0


def test_padded_rows_of_a_varying_count():
    # exact counts pad to whole 128-row tiles
    assert moe.padded_rows(512) == 512 and moe.padded_rows(513) == 640
    # a normal count centred on a tile boundary crosses it half the time: half a tile more
    assert moe.padded_rows(512, 22.0) == pytest.approx(512 + 64, rel=1e-9)
    # a spread much wider than a tile makes the residue uniform: half a tile on average
    assert moe.padded_rows(4000, 400.0) == pytest.approx(4000 + 64, abs=0.5)
    # and agrees with a direct average over sampled counts
    rng = np.random.default_rng(3)
    x = np.maximum(rng.normal(520.0, 22.0, 200_000), 0.0)
    assert moe.padded_rows(520, 22.0) == pytest.approx(np.mean(np.ceil(x / 128) * 128), rel=2e-3)


def test_random_routes_spread_each_expert():
    # each expert's copies: Binomial(T, k/E) over the T routed tokens
    loc = moe.moe_local(QWEN3, 1, 4, 1, 8, 1, moe.RANDOM)
    T = 8 * 1024
    assert loc.expert_spread == pytest.approx(math.sqrt(T * (8 / 128) * (120 / 128)))
    assert moe.moe_local(QWEN3, 1, 4, 1, 8, 1).expert_spread == 0.0
