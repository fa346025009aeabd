"""A learned router's busiest EP rank per call (``training.moe_routing: learned``,
``simulator/model/route_skew.py``): the Dirichlet expected maximum against closed forms and a
seeded simulation of Dirichlet-multinomial calls; the MoE block and the engine take it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.calibrate import routes
from simulator.config.schema import ModelConfig, TrainingConfig
from simulator.model import moe, moe_sizes, route_skew

REPO = Path(__file__).resolve().parents[1]
SMALL = ModelConfig(
    layers=8, hidden=1024, ffn_hidden=2048, heads=8, kv_heads=8, vocab=32768, seq_len=1024,
    activation="gelu", norm="layernorm", moe=dict(experts=16, top_k=2, ffn_hidden=2048),
)  # fmt: skip


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_uniform_dirichlet_harmonic(n):
    # Dirichlet(1, ..., 1) is uniform on the simplex: E[max] = (1/n) sum_{i<=n} 1/i
    want = sum(1.0 / i for i in range(1, n + 1)) / n
    assert route_skew.expected_max_share((1.0 / n,) * n, float(n)) == pytest.approx(want, rel=1e-6)


def test_two_ranks_arcsine():
    # Beta(1/2, 1/2) (the arcsine law): E[max(S, 1 - S)] = 1/2 + E|S - 1/2| = 1/2 + 1/pi
    assert route_skew.expected_max_share((0.5, 0.5), 1.0) == pytest.approx(
        0.5 + 1 / math.pi, rel=1e-5
    )


def test_large_concentration_normal_limit():
    # a -> inf: S_r ~ normal, deviations from the mean of sd sqrt(p (1-p) / (a + 1)), jointly
    # the deviations of ep normals from their mean: E[max] - p = sd sqrt(ep/(ep-1)) e_ep
    ep, a = 4, 1e6
    sd = math.sqrt(0.25 * 0.75 / (a + 1))
    want = 0.25 + sd * math.sqrt(ep / (ep - 1)) * moe.expected_max_normal(ep)
    got = route_skew.expected_max_share((0.25,) * 4, a)
    assert (got - 0.25) == pytest.approx(want - 0.25, rel=2e-3)


def test_zero_correlation_is_the_multinomial():
    # rho = 0: the concentration matches the multinomial's spread, p (1 - p) / N
    assert route_skew.concentration(10_000, 0.0) == pytest.approx(9_999)
    # averaging m independent calls divides the variance by m: (a + 1) -> m (a + 1)
    a1 = route_skew.concentration(10_000, 0.01)
    assert route_skew.concentration(10_000, 0.01, calls=6) + 1 == pytest.approx(6 * (a1 + 1))


@pytest.mark.parametrize(
    "means,rho,copies",
    [
        ((0.25,) * 4, 0.21, 65536),
        ((0.5, 0.5), 0.21, 32768),
        ((0.4, 0.3, 0.2, 0.1), 0.02, 4096),
        ((0.25,) * 4, 1e-3, 16384),
    ],
)
def test_matches_simulated_calls(means, rho, copies):
    # a call: shares Dirichlet(alpha p) with rho = 1/(alpha + 1), copies multinomial over them
    rng = np.random.default_rng(7)
    alpha = 1.0 / rho - 1.0
    shares = rng.dirichlet(np.array(means) * alpha, size=40_000)
    counts = np.array([rng.multinomial(copies, s) for s in shares])
    sim = (counts.max(axis=1) / copies).mean()
    got = route_skew.busiest_share(means, copies, rho)
    assert got == pytest.approx(sim, rel=0.01)


def test_busiest_never_below_largest_mean():
    assert route_skew.busiest_share((0.7, 0.3), 1e9, 0.0) >= 0.7
    assert route_skew.busiest_share((1.0,), 100, 0.5) == 1.0


def test_moe_local_learned_busiest_rank():
    # the busiest EP rank computes E[max share] of the EP group's copies; the others the rest
    t = TrainingConfig(
        global_batch=32, micro_batch=8, moe_routing="learned", moe_rank_correlation=0.21
    )
    spec = moe.load_spec(t)
    loc = moe.moe_local(SMALL, 8, 1, 1, 4, 1, spec)
    copies = 4 * 8 * 1024 * 2
    share = route_skew.busiest_share((0.25,) * 4, copies, 0.21)
    assert sum(loc.expert_tokens) == pytest.approx(share * copies, rel=1e-9)
    assert loc.imbalance == pytest.approx(4 * share, rel=1e-9)
    assert loc.busiest_share == pytest.approx(share, rel=1e-9)
    # the stable router's default: within a few per cent of even
    even = moe.moe_local(
        SMALL,
        8,
        1,
        1,
        4,
        1,
        moe.load_spec(TrainingConfig(global_batch=32, micro_batch=8, moe_routing="learned")),
    )
    assert 1.0 < even.imbalance < 1.05
    # memory averages the layers' calls: less than one call's maximum, more than even
    held = moe.moe_local(SMALL, 8, 1, 1, 4, 1, moe.load_spec(t, calls=8))
    assert 1.0 < held.imbalance < loc.imbalance


def test_learned_keeps_mean_loads():
    # with moe_expert_load the busiest rank is the one of the largest mean, its experts in
    # their mean proportions
    load = tuple([0.2, 0.1] + [0.7 / 14] * 14)
    spec = moe.Learned(load, 0.05)
    loc = moe.moe_local(SMALL, 8, 1, 1, 8, 1, spec)
    assert loc.expert_tokens[0] / loc.expert_tokens[1] == pytest.approx(2.0)
    assert loc.imbalance > 8 * 0.3


def test_busiest_rank_of_logged_calls():
    # the logged rows of data/measured/diagnosis9-h100x4: each case's busiest rank per call
    # (mean over its calls) against the model at its script's fitted rank correlation
    cases = routes.cases()
    if not cases:
        pytest.skip("no logged rows")
    fitted = routes.fit_rank()
    for case in cases:
        got = routes.predicted_busiest(case, fitted[case.script])
        assert got == pytest.approx(routes.measured_busiest(case), rel=0.10), case.name


# ---------------------------------------------------------------------------------------------
# Eager MoE memory: what steps.py's MoE layer keeps (silu's output, autocast's expert casts)

M_SHAPE = ModelConfig(
    layers=4, hidden=2048, ffn_hidden=4096, heads=16, kv_heads=8, vocab=32000, seq_len=4096,
    moe=dict(experts=8, top_k=2, ffn_hidden=4096),
)  # fmt: skip
SKEW = (0.191667, 0.25, 0.141667, 0.083333, 0.083333, 0.083333, 0.083333, 0.083334)


def _layer_bytes(load, param_dtype="fp32", ep=4):
    t = TrainingConfig(
        global_batch=16,
        micro_batch=1,
        kernels="eager",
        param_dtype=param_dtype,
        moe_expert_load=load,
    )
    return moe_sizes.layer_activation_bytes(M_SHAPE, t, 0, tp=1, sp=False, ep=ep, etp=1)


def test_eager_swiglu_keeps_h_plus_4f_per_copy():
    # each copy the busiest rank computes keeps its fc1 input (h), w1 and w3 outputs (2f),
    # silu's output (f) and w2's input (f); data/measured/moe-h100x4: the skewed EP 4 step
    # kept 0.88 GiB more than the uniform one over 4 layers (11.16 vs 10.28 GiB)
    t_copies = 4 * 4096 * 2
    extra = (0.25 + 0.191667 - 0.25) * t_copies  # the busiest rank's (experts 0, 1) excess
    per_copy = (_layer_bytes(SKEW) - _layer_bytes(None)) / extra
    assert per_copy == pytest.approx((2048 + 4 * 4096) * 2, rel=1e-6)
    assert 4 * (_layer_bytes(SKEW) - _layer_bytes(None)) / 2**30 == pytest.approx(0.88, rel=0.05)


def test_autocast_casts_every_local_expert():
    # fp32 parameters under autocast: an MoE layer keeps its router's and its local experts'
    # bf16 weight copies, not a dense MLP's; bf16 parameters keep none
    casts = _layer_bytes(None) - _layer_bytes(None, param_dtype="bf16")
    attn = (2048 * (2048 + 2 * 1024) + 2048 * 2048) * 2  # q, k, v (8 of 16 KV heads), o
    assert casts == pytest.approx(attn + (2048 * 8 + 2 * 3 * 2048 * 4096) * 2, rel=1e-9)
    ep2 = _layer_bytes(None, ep=2) - _layer_bytes(None, param_dtype="bf16", ep=2)
    assert ep2 - casts == pytest.approx(2 * 3 * 2048 * 4096 * 2, rel=1e-9)


def test_a_router_without_gradient_keeps_its_initial_routes():
    """steps_alt.py's top-1 cases (h15_moe_ep2_AJ, ep4_AJ; logged every step from the first in
    data/measured/expert-rows-h100x4, not used by the fit): the script renormalises the top-k
    weights, identically 1 for one expert, so the router gets no gradient and never collapses.
    Their expert correlation is a router's at initialization (routes.INIT_ROUTER, the first step
    of the learning routers' logs) within a quarter, far from the collapsing router's; their
    rank correlation far below the collapsing one's. Every such workload sets the initial ones."""
    top1 = [c for c in routes.cases(routes.ROWS) if c.top_k == 1]
    assert {c.name for c in top1} == {"h15_moe_ep2_AJ", "h15_moe_ep4_AJ"}
    for case in top1:
        assert routes.correlation_of(case) == pytest.approx(routes.INIT_ROUTER, rel=0.25)
        assert routes.correlation_of(case) < 0.2 * routes.COLLAPSED_ROUTER
        assert routes.rank_correlation_of(case) < 0.6 * routes.COLLAPSED_RANKS
    for batch in range(6, 16):
        for path in (REPO / f"validation/heldout{batch}").glob(f"h{batch}_moe_*.yaml"):
            w = yaml.safe_load(path.read_text())
            if w["model"]["moe"]["top_k"] != 1:
                continue
            t = w["training"]
            assert (t["moe_route_correlation"], t["moe_rank_correlation"]) == (
                routes.INIT_ROUTER, routes.INIT_RANKS), path
