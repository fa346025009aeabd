"""How unevenly a learned router loads the EP ranks within one call (micro-batch, layer).

A learned router does not send each rank its mean share of a call's token copies: its shares
move from call to call (a collapsing router piles a call's tokens on one or two experts). The
model is the Dirichlet-multinomial: a call's rank shares ``S`` are Dirichlet with parameters
``alpha * p_r`` (``p_r``: rank ``r``'s mean share) and its ``N`` copies multinomial over them,
so a rank's count is beta-binomial with variance ``N p (1 - p) (1 + (N - 1) rho)``,
``rho = 1 / (alpha + 1)`` the correlation of two copies' ranks (``training.
moe_rank_correlation``). Every rank waits for the busiest at the layer's exchanges, so a
call costs the rank holding ``E[max_r count_r]``.

The count shares themselves are, to the same variance, Dirichlet with the effective
concentration ``a = N / (1 + (N - 1) rho) - 1`` (at ``rho = 0`` the multinomial's own
spread, ``p (1 - p) / N``). For Dirichlet shares ``S_r = G_r / sum G`` with independent
``G_r ~ Gamma(a p_r)``, ``sum G`` is independent of ``S`` (Lukacs), so ``E[max_r S_r] =
E[max_r G_r] / a`` and ``E[max_r G_r] = int_0^inf (1 - prod_r F_r(x)) dx``: one quadrature
of the gamma CDFs (:func:`expected_max_share`). The average of ``calls`` independent calls
(what a stage keeps in memory over its layers) has ``1 / calls`` of the variance: the same
form with ``calls (a + 1) - 1``.

Checked against closed forms (tests): the uniform Dirichlet (``a p_r = 1``) has ``E[max] =
(1/n) sum_{i<=n} 1/i``; two ranks at ``a p = 1/2`` (arcsine law) ``1/2 + 1/pi``; large ``a``
the normal limit.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

#: above this shape a gamma variable is priced by its normal limit (the skew ``2/sqrt(a)``
#: moves its expected maximum by under 1e-3 of its standard deviation's share there)
NORMAL_SHAPE = 400.0
#: terms of the series and of the continued fraction of the incomplete gamma function
_TERMS = 600


def concentration(copies: float, rho: float, calls: int = 1) -> float:
    """The Dirichlet concentration whose shares spread like a beta-binomial count of
    ``copies`` copies correlated by ``rho`` (:mod:`module docstring <simulator.model.
    route_skew>`), averaged over ``calls`` independent calls."""
    a = copies / (1.0 + (copies - 1.0) * rho) - 1.0
    return max(1e-9, calls * (a + 1.0) - 1.0)


def _gamma_cdf(a: float, x: np.ndarray) -> np.ndarray:
    """The regularised lower incomplete gamma function ``P(a, x)``: its series below
    ``a + 1``, the continued fraction of ``Q`` above (Abramowitz & Stegun 6.5.29 and 6.5.31,
    evaluated by the modified Lentz method)."""
    out = np.zeros_like(x)
    lead = lambda v: np.exp(a * np.log(v) - v - math.lgamma(a))  # noqa: E731
    lo = (x > 0) & (x < a + 1.0)
    if lo.any():
        v = x[lo]
        term = np.full_like(v, 1.0 / a)
        total = term.copy()
        for n in range(1, _TERMS):
            term = term * v / (a + n)
            total += term
            if np.all(term < total * 1e-15):
                break
        out[lo] = total * lead(v)
    hi = x >= a + 1.0
    if hi.any():
        v = x[hi]
        tiny = 1e-300
        b = v + 1.0 - a
        c = np.full_like(v, 1.0 / tiny)
        d = 1.0 / b
        h = d.copy()
        for n in range(1, _TERMS):
            an = -n * (n - a)
            b = b + 2.0
            d = an * d + b
            d = np.where(np.abs(d) < tiny, tiny, d)
            c = b + an / c
            c = np.where(np.abs(c) < tiny, tiny, c)
            d = 1.0 / d
            step = d * c
            h = h * step
            if np.all(np.abs(step - 1.0) < 1e-15):
                break
        out[hi] = 1.0 - lead(v) * h
    return np.clip(out, 0.0, 1.0)


def _cdf(shape: float, x: np.ndarray) -> np.ndarray:
    """CDF of ``Gamma(shape, 1)`` at ``x``: exact, or its normal limit above
    :data:`NORMAL_SHAPE`."""
    if shape > NORMAL_SHAPE:
        z = (x - shape) / math.sqrt(2.0 * shape)
        return 0.5 * (1.0 + np.vectorize(math.erf)(z))
    return _gamma_cdf(shape, x)


@lru_cache(maxsize=256)
def expected_max_share(means: tuple[float, ...], a: float) -> float:
    """``E[max_r S_r]`` for Dirichlet shares with means ``means`` (summing to 1) and
    concentration ``a``: ``E[max_r G_r] / a`` over independent ``G_r ~ Gamma(a p_r)``, by
    trapezoid quadrature of ``1 - prod_r F_r(x)`` (:mod:`simulator.model.route_skew`)."""
    shapes = [a * p for p in means if p > 0]
    if len(shapes) < 2:
        return max(means)
    top = max(shapes)
    upper = top + 14.0 * math.sqrt(top) + 40.0
    x = np.linspace(0.0, upper, 40_001)
    prod = np.ones_like(x)
    for s in shapes:
        prod *= _cdf(s, x)
    f = 1.0 - prod
    return float(np.sum((f[1:] + f[:-1]) * 0.5 * np.diff(x)) / a)


def busiest_share(means: tuple[float, ...], copies: float, rho: float, calls: int = 1) -> float:
    """Expected share of a call's ``copies`` held by the busiest of the ranks whose mean
    shares are ``means``, copies correlated by ``rho``; ``calls``: averaged over that many
    independent calls first. Never below the largest mean."""
    if len(means) < 2 or copies <= 0:
        return max(means)
    a = concentration(copies, rho, calls)
    return max(max(means), expected_max_share(tuple(means), a))
