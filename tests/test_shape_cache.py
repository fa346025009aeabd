"""The expected share of GEMM calls whose row count is new to the process
(simulator/model/shape_cache.py), against closed forms, Monte Carlo of routing and the row
counts eager MoE steps logged (data/measured/diagnosis9-h100x4)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import yaml

from simulator.calibrate import routes
from simulator.config.load import load_workload
from simulator.config.schema import ROUTE_WIDENING_PER_HIDDEN2
from simulator.model.moe import route_widening
from simulator.model.shape_cache import (
    Stream,
    correlation,
    count_pmf,
    expected_distinct,
    new_share,
    slowest_share,
    step_weights,
)
from tests.conftest import ROOT


def test_the_pmf_is_binomial_and_beta_binomial():
    n, p = 40, 0.3
    b = count_pmf(n, p, 0.0)
    assert b[7] == pytest.approx(math.comb(40, 7) * 0.3**7 * 0.7**33, rel=1e-9)
    rho = 0.1
    bb = count_pmf(n, p, rho)
    m = np.arange(n + 1)
    assert bb.sum() == pytest.approx(1.0)
    assert float(m @ bb) == pytest.approx(n * p, rel=1e-9)
    var = float(((m - n * p) ** 2) @ bb)
    assert var == pytest.approx(n * p * (1 - p) * (1 + (n - 1) * rho), rel=1e-9)
    # a = p (1/rho - 1) = 2.7, b = 6.3: P(0) = B(a, n + b) / B(a, b)
    a, bt = 2.7, 6.3
    p0 = math.exp(math.lgamma(n + bt) + math.lgamma(a + bt) - math.lgamma(n + a + bt)
                  - math.lgamma(bt))
    assert bb[0] == pytest.approx(p0, rel=1e-9)


def test_all_distinct_counts_give_the_upper_bound():
    """Counts spread over far more values than the calls made: every call new."""
    assert new_share([Stream(10**6, 0.5, 0.1, 64)], 4, 9) == pytest.approx(1.0, abs=1e-3)


def test_a_fixed_count_is_new_once():
    """One count every call (every token to the expert): the first call of the process is
    new, none after it."""
    s = [Stream(4096, 1.0, 0.0, 64)]
    assert new_share(s, 1, 1) == pytest.approx(1 / 64)
    assert new_share(s, 1, 3) == pytest.approx(1 / (3 * 64))
    assert new_share(s, 2, 9) == 0.0
    assert expected_distinct([Stream(100, 1.0, 0.0, 8), Stream(200, 1.0, 0.0, 8)], 5) == 2.0


def test_a_call_of_no_rows_is_never_new():
    """One token that reaches the expert with probability 1/2: only the count 1 launches a
    GEMM, so a call is new with probability 1/2 x (1/2)^(earlier calls), D(s) = 1 - 2^-s; a
    stream that never reaches the expert has no new call at all."""
    s = [Stream(1, 0.5, 0.0, 1)]
    assert expected_distinct(s, 3) == pytest.approx(1 - 0.5**3)
    assert new_share(s, 1, 1) == pytest.approx(0.5)
    assert new_share(s, 2, 3) == pytest.approx((0.25 + 0.125) / 2)
    assert new_share([Stream(64, 0.0, 0.0, 8)], 1, 9) == 0.0


def test_the_sum_over_calls_form():
    """A call after n draws of one distribution is new with probability sum_m p(m)(1-p(m))^n:
    summed over the calls of steps 4..9 it is D(9) - D(3)."""
    n, p, rho, calls = 2000, 0.25, 1e-3, 5
    pm = count_pmf(n, p, rho)
    direct = sum(float(pm[1:] @ (1 - pm[1:]) ** k) for k in range(3 * calls, 9 * calls))
    assert new_share([Stream(n, p, rho, calls)], 4, 9) == pytest.approx(direct / (6 * calls))


def test_like_streams_merge():
    a = Stream(500, 0.2, 0.01, 3)
    assert expected_distinct([a, a], 4) == pytest.approx(expected_distinct([Stream(500, 0.2, 0.01, 6)], 4))


def _monte_carlo(rng, T, E, k, local, calls, draw_shares=None, runs=150):
    shares = []
    for _ in range(runs):
        seen, new = set(), 0
        for step in range(1, 10):
            for _ in range(calls):
                if draw_shares is None:  # top-k of E experts, uniformly, per token
                    picks = np.argpartition(rng.random((T, E)), k, axis=1)[:, :k].ravel()
                    counts = np.bincount(picks, minlength=E)
                else:  # top-1 with the call's expert shares drawn from a Dirichlet
                    counts = rng.multinomial(T, draw_shares(rng))
                for m in counts[:local]:
                    if m > 0 and int(m) not in seen:
                        seen.add(int(m))
                        new += step >= 4
        shares.append(new / (6 * calls * local))
    return np.mean(shares), 3 * np.std(shares) / math.sqrt(runs)


def test_multinomial_routing_against_a_monte_carlo():
    """Top-2 of 8 experts per token, 512 tokens a call, 8 calls a step of the 4 experts of one
    rank (counts of one call are correlated: they sum to 1,024), steps 4..9: independent
    binomial streams give the share of new counts random routing gives (seeded Monte Carlo,
    3 standard errors)."""
    T, E, k, local, calls = 512, 8, 2, 4, 8
    model = new_share([Stream(T, k / E, 0.0, local * calls)], 4, 9)
    mc, err = _monte_carlo(np.random.default_rng(7), T, E, k, local, calls)
    assert model == pytest.approx(mc, abs=err)
    assert 0.03 < model < 0.1  # most counts repeat by the fourth step


def test_a_dirichlet_router_against_a_monte_carlo():
    """Each call's expert shares drawn from a symmetric Dirichlet(a) over 8 experts, 512 tokens
    routed top-1 by them: an expert's count is beta-binomial with correlation 1 / (8 a + 1)
    (the Dirichlet's marginal), and the share of new counts is the model's."""
    T, E, local, calls, a = 512, 8, 4, 8, 2.0
    model = new_share([Stream(T, 1 / E, 1 / (E * a + 1), local * calls)], 4, 9)
    mc, err = _monte_carlo(np.random.default_rng(11), T, E, 1, local, calls,
                           lambda rng: rng.dirichlet([a] * E))
    assert model == pytest.approx(mc, abs=err)
    assert model > 2 * new_share([Stream(T, 1 / E, 0.0, local * calls)], 4, 9)


def test_the_correlation_of_beta_binomial_draws():
    """Method of moments recovers the correlation of seeded beta-binomial draws."""
    rng = np.random.default_rng(3)
    n, p, rho = 8192, 0.125, 0.02
    s = 1 / rho - 1
    draws = rng.binomial(n, rng.beta(p * s, (1 - p) * s, 20_000))
    assert correlation(draws, n) == pytest.approx(rho, rel=0.05)
    assert correlation(rng.binomial(n, p, 20_000), n) < 1e-4


CASES = routes.cases()


@pytest.mark.skipif(not CASES, reason="no logged expert rows")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_new_counts_of_logged_steps(case):
    """The logged rows of each MoE case (4x H100, two scripts): the share of expert GEMM calls
    of the timed steps (4..9) whose row count was new, counted from the rows, against the
    model with the mean correlation of its script's router, within 0.05 (0.01-0.05 over)."""
    rho = routes.fit()[case.script]
    assert routes.predicted_share(case, rho, 4, 9) == pytest.approx(
        routes.measured_share(case, 4, 9), abs=0.05)
    # independent tokens alone (rho 0) would predict far fewer
    assert routes.predicted_share(case, 0.0, 4, 9) < 0.8 * routes.measured_share(case, 4, 9)


@pytest.mark.skipif(not CASES, reason="no logged expert rows")
def test_a_stable_router_step_by_step():
    """steps_third.py's stable router: the new counts of each step fall as the model's, every
    step of the ten within 15 % of its calls."""
    for case in (c for c in CASES if c.script == routes.STABLE):
        measured = routes.measured_new(case).mean(axis=0)
        for s, got in enumerate(measured, start=1):
            want = routes.predicted_share(case, routes.fit()[case.script], s, s) * case.calls()
            assert abs(got - want) <= 0.15 * case.calls(), (case.name, s, got, want)


def test_the_steps_alt_workloads_set_its_router():
    """Every steps_alt.py MoE workload timed over measured steps sets the collapsing router's
    correlation (routes.COLLAPSED_ROUTER); the refit check is tests/test_calibration.py's."""
    for path in ("validation/heldout6/h6_moe_ep2_W.yaml", "validation/heldout6/h6_moe_ep4_W.yaml",
                 "validation/heldout7/h7_moe_ep2_Y.yaml", "validation/heldout8/h8_moe_ep2_Q.yaml",
                 "validation/heldout8/h8_moe_ep4_Q.yaml", "validation/heldout9/h9_moe_ep4_S.yaml"):
        with open(path) as f:
            t = yaml.safe_load(f)["training"]
        assert t["moe_route_correlation"] == routes.COLLAPSED_ROUTER, path
        assert t["moe_routing"] == "learned", path
        assert t["moe_rank_correlation"] == routes.COLLAPSED_RANKS, path


def test_the_slowest_rank_by_enumeration():
    """One call per rank: the slowest of R ranks is new unless all are, 1 - (1 - q)^R; two calls
    on each of two ranks: E[max] enumerated over the four counts' binomials."""
    q = 0.3
    assert slowest_share(q, 1, 1) == q
    assert slowest_share(q, 1, 4) == pytest.approx(1 - 0.7**4)
    b = [0.7**2, 2 * 0.3 * 0.7, 0.3**2]
    e_max = sum(b[i] * b[j] * max(i, j) for i in range(3) for j in range(3))
    assert slowest_share(q, 2, 2) == pytest.approx(e_max / 2)
    assert slowest_share(0.0, 8, 4) == 0.0 and slowest_share(1.0, 8, 4) == 1.0


@pytest.mark.skipif(not CASES, reason="no logged expert rows")
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_slowest_rank_of_logged_steps(case):
    """The logged rows: each layer's forward meets the most new counts over the EP ranks, each
    micro-batch's backward the most over all its calls; at the share counted, the binomial
    order statistic gives both within 8 % (the forward 1.22-1.37 times the mean, the backward
    1.07-1.16)."""
    q = routes.measured_share(case, 4, 9)
    ranks, layers, _, local = case.rows.shape
    fwd, bwd = routes.measured_slowest(case, 4, 9)
    assert slowest_share(q, local, ranks) / q == pytest.approx(fwd, rel=0.08)
    assert slowest_share(q, local * layers, ranks) / q == pytest.approx(bwd, rel=0.08)


def test_a_widening_router_is_one_stream_a_step():
    """A stream whose correlation grows as rho + widen (s - 1)^2 draws each step at its own
    correlation: its distinct counts over two steps are those of two fixed streams, one a
    step; a fractional last step counts its share of the draws."""
    s = Stream(64, 0.25, 1e-3, 3, 2e-3)
    assert step_weights(s, 2.5) == [(1e-3, 3.0), (3e-3, 3.0), (pytest.approx(9e-3), 1.5)]
    assert step_weights(Stream(64, 0.25, 1e-3, 3), 2.5) == [(1e-3, 7.5)]
    split = [Stream(64, 0.25, 1e-3, 3), Stream(64, 0.25, 3e-3, 3)]
    assert expected_distinct([s], 2) == pytest.approx(expected_distinct(split, 1), rel=1e-12)
    assert expected_distinct([s], 2) > expected_distinct([Stream(64, 0.25, 1e-3, 3)], 2)


def test_the_widening_by_layout():
    """route_widening's closed form on the AD workloads of steps_third.py: w (seq / tokens)
    h^2 / global_batch; EP 4 (twice the call's tokens and the step's sequences) a quarter of
    EP 2's; a router set to its own correlation does not widen."""
    ep2 = load_workload(ROOT / "validation" / "heldout14" / "h14t_moe_ep2_AD.yaml").workload
    ep4 = load_workload(ROOT / "validation" / "heldout14" / "h14t_moe_ep4_AD.yaml").workload
    want = ROUTE_WIDENING_PER_HIDDEN2 * (1024 / 8192) * 2048 ** 2 / 16
    assert route_widening(ep2.model, ep2.training, 8192) == pytest.approx(want, rel=1e-12)
    assert route_widening(ep4.model, ep4.training, 16384) == pytest.approx(want / 4, rel=1e-12)
    fixed = ep2.training.model_copy(update={"moe_route_correlation": 1.7e-4})
    fixed.model_fields_set.add("moe_route_correlation")
    assert route_widening(ep2.model, fixed, 8192) == 0.0


@pytest.mark.skipif(not routes.stable_cases(), reason="no logged expert rows")
def test_the_growth_scales_with_the_sequences_of_a_call_and_a_step():
    """The logged EP 2 / EP 4 twins of the stable router (B, AD, AH): the raw growth of the
    correlation falls 2.5-5.3x from EP 2 to EP 4, where a per-sequence growth alone
    (1 / the call's sequences) would halve it; scaled by the sequences of the call and of the
    step (route_widening's form) the twins' slopes agree within a factor of two."""
    def slope(c):
        rho = routes.step_correlations(c)
        x = (np.arange(len(rho)) * float(c.hidden)) ** 2
        return float(np.sum((rho - rho[0]) * x) / np.sum(x * x))

    by = {c.name: c for c in routes.stable_cases()}
    for two, four in (("h8t_moe_ep2_B", "h8t_moe_ep4_B"), ("h14t_moe_ep2_AD", "h14t_moe_ep4_AD"),
                      ("h15t_moe_ep2_AH", "h15t_moe_ep4_AH")):
        a, b = by[two], by[four]
        raw = slope(a) / slope(b)
        assert 2.2 < raw < 6.0, (two, raw)
        scale = (b.n / a.n) ** 2 * b.micro_batches / a.micro_batches
        assert 0.5 < raw / scale < 2.0, (two, raw / scale)
