"""How many of a process's GEMM calls have a shape it has not launched before (issue 10/12).

cuBLAS keeps the algorithms its heuristics chose per problem description (sizes, transposes,
types, layouts; ``CUBLASLT_HEURISTICS_CACHE_CAPACITY``, 8,192 entries by default). A call
whose description is in the cache launches at once; a new one first runs the heuristic query
on the host (123-481 us a GEMM on an H100 host, ``data/measured/gemm-shape-host-h100x2``).

In eager MoE code the experts run one after another, each a few GEMMs whose row count ``M`` is
the expert's token count in that micro-batch; every other size of a GEMM kind is fixed
(forward ``[M,k]x[k,n]``, data gradient ``[M,n]x[n,k]``, weight gradient ``[n,M]x[M,k]``), so
whether a call is new depends only on whether its ``M`` came up before in that kind. All
layers of the same widths share the kind (one cache per process).

**The count of a call.** ``n`` tokens (every EP source's) may each send an expert one copy
(top-k picks distinct experts). Tokens routed independently with probability ``p`` give a
binomial count. A router that is learning moves an expert's probability from call to call
(layer to layer, micro-batch to micro-batch, step to step); taking that probability as
Beta-distributed gives the beta-binomial, whose one more parameter is the correlation ``rho``
between two tokens' choices in a call (variance ``n p (1-p) (1 + (n-1) rho)``; ``rho`` 0:
binomial, 1: all tokens of a call route alike; ``alpha = p (1/rho - 1)``, ``beta = (1-p) (1/rho
- 1)``). It is also the marginal of a Dirichlet over the experts' shares, so small ``rho``
describes a stable router and large ``rho`` a collapsing one (counts piled at 0 and at ``n``).

**Closed form.** Draws come from *streams* (independent counts of one distribution ``p_s``, e.g.
the experts of equal load); after ``n_s`` draws of each, a value ``m`` has been seen with
probability ``1 - prod_s (1 - p_s(m))^n_s``, so the expected number of distinct values is

    D = sum_m [1 - prod_s (1 - p_s(m))^n_s]

over ``m >= 1``, and the expected number of new calls among the draws of steps ``first..last``
is ``D(last) - D(first - 1)`` (each step adds ``c_s`` draws per stream); equivalently a call
is new with probability ``sum_{m >= 1} p(m) (1 - p(m))^n`` after ``n`` draws of one
distribution. A call of no rows is never new: an expert that received no tokens launches no
GEMM (PyTorch's ``mm`` / ``addmm`` return an empty product, or fill a weight gradient of
``K = 0`` with zeros, without calling cuBLAS), whether the code calls it on its empty input
(``steps_alt.py``, ``steps_third.py``) or skips it.
Limits: counts spread over far more values than calls give every call new (the upper bound);
one fixed count gives one new call, then none.

**A router that widens as it trains** (``Stream.widen``): the correlation of step ``s`` is
``rho + widen (s - 1)^2`` (``rho`` the first step's), and ``D`` takes each step's draws from
that step's distribution, ``prod_s (1 - p_{s}(m))^c``
(:func:`simulator.model.moe.route_widening` sets ``widen``).

Pure functions, numpy only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Stream:
    """Row counts drawn ``calls`` times a step, independently: beta-binomial over ``n`` tokens
    with mean probability ``p`` and token correlation ``rho`` (module docstring)."""

    n: int
    p: float
    rho: float
    calls: int
    #: growth of ``rho`` with the step: ``rho + widen (s - 1)^2`` at step ``s`` (module
    #: docstring); 0: the same distribution every step
    widen: float = 0.0


def step_rho(rho: float, widen: float, step: int) -> float:
    """The correlation of step ``step`` (1-based) of a router of first-step correlation ``rho``
    that widens by ``widen``: ``rho + widen (step - 1)^2``, at most 1."""
    return min(1.0, rho + widen * (step - 1) ** 2)


def step_weights(s: Stream, steps: float) -> list[tuple[float, float]]:
    """``[(rho, draws)]``: the correlation of each of the first ``steps`` steps and the
    stream's draws in it (one entry of ``steps x calls`` draws when the stream does not
    widen; a fractional last step counts its share of the draws)."""
    if s.widen <= 0.0:
        return [(s.rho, s.calls * steps)]
    whole = int(np.floor(steps))
    out = [(step_rho(s.rho, s.widen, k), float(s.calls)) for k in range(1, whole + 1)]
    if steps > whole:
        out.append((step_rho(s.rho, s.widen, whole + 1), s.calls * (steps - whole)))
    return out


def _log_rising(a: float, n: int) -> np.ndarray:
    """``log Gamma(x + a) - log Gamma(a)`` for x = 0..n (sums of ``log(j + a)``)."""
    return np.concatenate(([0.0], np.cumsum(np.log(np.arange(n) + a))))


def count_pmf(n: int, p: float, rho: float) -> np.ndarray:
    """P(M = m) for m = 0..n: beta-binomial of ``n`` trials, mean ``p``, correlation ``rho``
    (0: binomial)."""
    if p <= 0.0 or p >= 1.0:
        out = np.zeros(n + 1)
        out[0 if p <= 0.0 else n] = 1.0
        return out
    m = np.arange(n + 1)
    lf = _log_rising(1.0, n)  # log m!
    log_choose = lf[n] - lf[m] - lf[n - m]
    if rho <= 0.0:
        log_p = log_choose + m * np.log(p) + (n - m) * np.log1p(-p)
    else:
        s = 1.0 / min(rho, 1.0 - 1e-9) - 1.0
        a, b = p * s, (1.0 - p) * s
        ga, gb = _log_rising(a, n), _log_rising(b, n)
        log_p = log_choose + ga[m] + gb[n - m] - _log_rising(a + b, n)[n]
    pmf = np.exp(log_p - log_p.max())
    return pmf / pmf.sum()


def expected_distinct(streams: Sequence[Stream], steps: float) -> float:
    """Expected number of distinct non-zero counts among ``steps`` steps' draws of every
    stream (a zero-row call launches no GEMM: never new)."""
    if steps <= 0 or not streams:
        return 0.0
    size = max(s.n for s in streams) + 1
    log_miss = np.zeros(size)
    with np.errstate(divide="ignore"):
        for s in streams:
            for rho, draws in step_weights(s, steps):
                pmf = count_pmf(s.n, s.p, rho)
                log_miss[: s.n + 1] += draws * np.log1p(-np.minimum(pmf, 1.0))
    return float(np.sum(-np.expm1(log_miss[1:])))


def new_share(streams: Sequence[Stream], first: int, last: int) -> float:
    """Expected share of the calls of steps ``first..last`` (1-based, of a fresh process) whose
    row count is not zero and no earlier call had: ``(D(last) - D(first - 1)) / calls`` (the
    calls of no rows stay in the denominator: the share is charged per expert GEMM call)."""
    calls = (last - first + 1) * sum(s.calls for s in streams)
    if calls <= 0:
        return 0.0
    new = expected_distinct(streams, last) - expected_distinct(streams, first - 1)
    return min(1.0, max(0.0, new / calls))


def correlation(counts: np.ndarray, n: int) -> float:
    """The token correlation ``rho`` of counts of ``n`` trials (method of moments: their
    variance over the binomial's, less one, over ``n - 1``); 0 when no more spread than
    binomial."""
    c = np.asarray(counts, dtype=float)
    p = c.mean() / n
    if n <= 1 or p <= 0.0 or p >= 1.0:
        return 0.0
    return max(0.0, (c.var() / (n * p * (1.0 - p)) - 1.0) / (n - 1))


def slowest_share(share: float, draws: int, ranks: int) -> float:
    """The share of ``draws`` calls new at the slowest of ``ranks`` ranks that wait for one
    another: each rank's new calls binomial (``draws``, ``share``), independent across ranks,
    the expected largest ``E[max] = sum_x (1 - F(x)^ranks)`` over ``draws`` (``share`` itself for
    one rank). An eager MoE layer's forward waits for every EP rank at its count exchange, so
    each layer pays its slowest rank's new expert GEMMs (``draws``: the local experts); the
    backward only at the next forward (``draws``: all the micro-batch's expert calls)."""
    if ranks <= 1 or draws <= 0 or share <= 0.0 or share >= 1.0:
        return share
    cdf = np.minimum(np.cumsum(count_pmf(draws, share, 0.0)), 1.0)
    return float(np.sum(1.0 - cdf[:-1] ** ranks)) / draws
