"""Refit a learned router's token correlation (``training.moe_route_correlation``) from the row
counts of eager MoE steps, and count the expert GEMM calls of new row count they made.

Data: ``data/measured/diagnosis9-h100x4/`` (4x H100, 2026-11-27): for four MoE cases of two
measuring scripts (``steps_alt.py`` h8_moe_ep2_Q / ep4_Q: GPT-2 blocks, GELU experts, softmax
over all experts then top-2; ``steps_third.py`` h8t_moe_ep2_B / ep4_B: Llama blocks, SwiGLU
experts, top-2 then softmax over the two), ``expert_rows-CASE-rN.json`` holds every MoE layer
call's rows per local expert on rank N (``layers[l][call][expert]``: the ``M`` of that expert's
GEMMs, in call order: 3 warm-up steps, 6 timed steps, one profiled step), and ``steps.jsonl``
each case's model, micro-batch, micro-batches and GPUs (EP = GPUs).

* :func:`correlation_of`: per rank, the method-of-moments correlation of all its counts
  (:func:`simulator.model.shape_cache.correlation`, ``n`` = the tokens of all EP ranks in a
  micro-batch), the mean over the ranks.
* :func:`measured_new`: per rank and step, the calls whose ``M`` no earlier call of the rank
  had (one kind of GEMM; every kind of a layer sees the same counts), counted from the rows.
* :func:`rank_correlation_of`: the same per EP rank (a rank's copies in a call), for
  ``training.moe_rank_correlation`` (``moe_routing: learned``: the busiest rank of a call,
  :mod:`simulator.model.route_skew`; :func:`measured_busiest` against
  :func:`predicted_busiest`).
* ``refit``: the default is the mean correlation of the stable router's cases
  (``steps_third.py``); ``steps_alt.py``'s router collapses (counts piled at 0 and at every
  token), its own value is what its workloads set (:data:`COLLAPSING`).

* :func:`fit_init`: a router at initialization (its first step, before any optimizer step):
  the mean over ``data/measured/expert-rows-h100x4/``'s ``steps_alt.py`` cases whose router
  learns (top-k > 1) of the first step's correlations, expert and rank; what a router that
  receives no gradient keeps (:data:`INIT_ROUTER`, :data:`INIT_RANKS`).
* :func:`fit_widening`: the stable router widens as it trains (its correlation rises through
  the logged steps, :func:`step_correlations`): ``(rho_s - rho_1) (tokens / seq_len)
  (global batch)`` (the growth of a sequence's correlation, times the sequences of an
  optimizer step) against ``(h (s - 1))^2`` (``h`` the hidden size:
  :func:`simulator.model.moe.route_widening`), least squares through the origin over every
  logged ``steps_third.py`` case, each rank's rows from the first step (:data:`DIAG`,
  :data:`ROWS`, :data:`ROWS2`): ``schema.ROUTE_WIDENING_PER_HIDDEN2``; the first step's
  correlation, mean over the same cases, is ``schema.ROUTE_CORRELATION_DEFAULT``.
No validation suite is read here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.calibrate import REPO, jsonl
from simulator.config.schema import (
    RANK_CORRELATION_DEFAULT,
    ROUTE_CORRELATION_DEFAULT,
    ROUTE_WIDENING_PER_HIDDEN2,
)
from simulator.model import route_skew
from simulator.model.shape_cache import Stream, correlation, new_share

DIAG = REPO / "data" / "measured" / "diagnosis9-h100x4"
#: more logged cases, every step from the first (helper emoe9, 4x H100)
ROWS = REPO / "data" / "measured" / "expert-rows-h100x4"
#: the second logging (the EP 4 twins of the stable router's AD and AH, AD at EP 2, AF):
#: development cases only (its ``eval/`` holds the seventeenth batch's, not read here)
ROWS2 = REPO / "data" / "measured" / "expert-rows2-h100x4"
#: the script whose router the default describes (a stable learning router)
STABLE = "steps_third.py"
#: the script whose router collapses, and the correlation its workloads set
COLLAPSING = "steps_alt.py"


@dataclass(frozen=True)
class Case:
    """One logged MoE case: ``rows[rank][layer][call][expert]``, the tokens ``n`` of a call
    (micro-batch x sequence x EP ranks) and each token's mean probability ``p`` of sending an
    expert a copy (top-k / experts)."""

    name: str
    script: str
    rows: np.ndarray
    n: int
    p: float
    micro_batches: int
    warmup: int
    top_k: int = 0
    hidden: int = 0
    seq: int = 0

    def calls(self) -> int:
        """Expert GEMM calls of one kind per step on a rank: layers x micro-batches x local
        experts."""
        _, layers, _, local = self.rows.shape
        return layers * self.micro_batches * local


def cases(where: Path = DIAG) -> list[Case]:
    """The logged cases of ``where``, by name ([] before the measurement exists)."""
    if not where.exists():
        return []
    out = []
    for rec in jsonl(where / "steps.jsonl"):
        files = sorted(where.glob(f"expert_rows-{rec['case']}-r*.json"))
        if rec.get("scheme") != "moe" or not files:
            continue
        logs = [json.loads(Path(f).read_text()) for f in files]
        m = rec["model"]
        out.append(Case(rec["case"], rec["script"], np.array([g["layers"] for g in logs]),
                        rec["micro_batch"] * m["seq"] * rec["gpus"], m["top_k"] / m["experts"],
                        rec["micro_batches"], logs[0]["warmup"], m["top_k"], m["hidden"], m["seq"]))
    return sorted(out, key=lambda c: c.name)


def correlation_of(case: Case) -> float:
    """The mean over the ranks of the correlation of each rank's counts."""
    return float(np.mean([correlation(r.ravel(), case.n) for r in case.rows]))


def new_flags(case: Case) -> np.ndarray:
    """``[rank][layer][call][expert]``: whether that expert GEMM's row count was new to the
    rank, in the order the rank ran them (call by call, layer by layer, expert by expert); a
    call of no rows never is (it launches no GEMM)."""
    ranks, layers, calls, local = case.rows.shape
    out = np.zeros(case.rows.shape, dtype=bool)
    for r in range(ranks):
        seen: set[int] = set()
        for c in range(calls):
            for layer in range(layers):
                for e in range(local):
                    m = int(case.rows[r, layer, c, e])
                    out[r, layer, c, e] = m > 0 and m not in seen
                    seen.add(m)
    return out


def measured_new(case: Case) -> np.ndarray:
    """``[rank][step]``: calls of one GEMM kind whose row count no earlier call of the rank
    had, counted from the logged rows."""
    new = new_flags(case).sum(axis=(1, 3))  # [rank][call]
    return new.reshape(new.shape[0], -1, case.micro_batches).sum(axis=2)


def measured_slowest(case: Case, first: int, last: int) -> tuple[float, float]:
    """How much more the slowest EP rank meets than the mean one, in steps ``first..last``:
    (each layer's forward: the most new local experts over the ranks, summed over the layer
    calls, over the mean; each micro-batch's backward: the same over all its expert calls)."""
    mb = case.micro_batches
    new = new_flags(case)[:, :, (first - 1) * mb:last * mb, :]
    layer = new.sum(axis=3)  # [rank][layer][call]
    micro = new.sum(axis=(1, 3))  # [rank][call]
    return (float(layer.max(axis=0).sum() / layer.mean(axis=0).sum()),
            float(micro.max(axis=0).sum() / micro.mean(axis=0).sum()))


def measured_share(case: Case, first: int, last: int) -> float:
    """Share of the calls of steps ``first..last`` (1-based) that were new, mean over ranks."""
    new = measured_new(case)[:, first - 1:last]
    return float(new.sum() / (new.size * case.calls()))


def predicted_share(case: Case, rho: float, first: int, last: int) -> float:
    """The model's share new (:func:`simulator.model.shape_cache.new_share`) for the case's
    calls, its mean load and correlation ``rho``."""
    return new_share([Stream(case.n, case.p, rho, case.calls())], first, last)


def fit() -> dict[str, float]:
    """{script: mean correlation of its cases}."""
    by: dict[str, list[float]] = {}
    for c in cases():
        by.setdefault(c.script, []).append(correlation_of(c))
    return {s: float(np.mean(v)) for s, v in by.items()}


def shipped_round(x: float) -> float:
    """Two significant figures, as shipped."""
    return float(f"{x:.2g}")


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}: the default (stable router) and the collapsing
    router's value the steps_alt.py workloads set."""
    f = fit()
    if not f:
        return {}
    g = fit_rank()
    init = fit_init()
    rho1, widen = fit_widening()
    return {"schema.ROUTE_CORRELATION_DEFAULT": (shipped_round(rho1), ROUTE_CORRELATION_DEFAULT),
            "schema.ROUTE_WIDENING_PER_HIDDEN2": (shipped_round(widen),
                                                  ROUTE_WIDENING_PER_HIDDEN2),
            f"{COLLAPSING} workloads' moe_route_correlation": (shipped_round(f[COLLAPSING]),
                                                                COLLAPSED_ROUTER),
            "schema.RANK_CORRELATION_DEFAULT": (shipped_round(g[STABLE]),
                                                RANK_CORRELATION_DEFAULT),
            f"{COLLAPSING} workloads' moe_rank_correlation": (shipped_round(g[COLLAPSING]),
                                                               COLLAPSED_RANKS),
            "INIT_ROUTER": (shipped_round(init[0]), INIT_ROUTER),
            "INIT_RANKS": (shipped_round(init[1]), INIT_RANKS)}


#: ``training.moe_route_correlation`` of the ``steps_alt.py`` workloads (its router collapses)
COLLAPSED_ROUTER = 0.53
#: ``training.moe_rank_correlation`` of the ``steps_alt.py`` workloads (per EP rank)
COLLAPSED_RANKS = 0.21
#: the correlations (expert, EP rank) of a router at initialization: what ``steps_alt.py``'s
#: top-1 workloads set, whose router receives no gradient (it renormalises the top-k weights,
#: ``w / w.sum(-1)``, identically 1 for one expert), so it never collapses (:func:`fit_init`)
INIT_ROUTER = 0.078
INIT_RANKS = 0.041


def rank_counts(case: Case) -> np.ndarray:
    """``[call][rank]``: the copies each EP rank's experts received in each logged call
    (every layer's calls, in order), summed over its local experts."""
    per = case.rows.sum(axis=3)  # [rank][layer][call]
    return per.reshape(per.shape[0], -1).T


def rank_correlation_of(case: Case) -> float:
    """The correlation of two copies' EP ranks within a call (``training.
    moe_rank_correlation``): the method of moments of every rank's count in every call
    (:func:`simulator.model.shape_cache.correlation`, ``copies`` trials each, mean share
    ``1/ep``), so both the drift from call to call and a rank's lasting excess count."""
    counts = rank_counts(case)
    return correlation(counts.ravel(), int(round(counts.sum(axis=1).mean())))


def measured_busiest(case: Case) -> float:
    """The busiest EP rank's copies over the mean rank's, mean over the logged calls."""
    counts = rank_counts(case)
    return float(np.mean(counts.max(axis=1) / counts.mean(axis=1)))


def predicted_busiest(case: Case, rho: float) -> float:
    """The model's busiest rank over the mean (:func:`simulator.model.route_skew.
    busiest_share` at uniform mean shares) for the case's copies per call and ``rho``."""
    ranks = case.rows.shape[0]
    copies = float(rank_counts(case).sum(axis=1).mean())
    return ranks * route_skew.busiest_share((1.0 / ranks,) * ranks, copies, rho)


def fit_rank() -> dict[str, float]:
    """{script: mean rank correlation of its cases}."""
    by: dict[str, list[float]] = {}
    for c in cases():
        by.setdefault(c.script, []).append(rank_correlation_of(c))
    return {s: float(np.mean(v)) for s, v in by.items()}


def first_step(case: Case) -> Case:
    """``case`` with only the calls of its first step (the router as initialized)."""
    mb = case.micro_batches
    return Case(case.name, case.script, case.rows[:, :, :mb, :], case.n, case.p, mb, 0,
                case.top_k, case.hidden, case.seq)


def fit_init() -> tuple[float, float]:
    """(expert, rank) correlation of a router at initialization: the first step of every
    logged ``steps_alt.py`` case (:data:`DIAG` and :data:`ROWS`, each rank's rows from the
    first step) whose router learns (top-k > 1: a top-1 router of that script gets no
    gradient), mean over the cases; (0, 0) before the data."""
    first = [first_step(c) for c in cases(DIAG) + cases(ROWS)
             if c.script == COLLAPSING and c.top_k > 1]
    if not first:
        return 0.0, 0.0
    return (float(np.mean([correlation_of(c) for c in first])),
            float(np.mean([rank_correlation_of(c) for c in first])))


def step_correlations(case: Case) -> np.ndarray:
    """The correlation of each logged step (its micro-batches' calls, mean over the ranks)."""
    mb = case.micro_batches
    steps = case.rows.shape[2] // mb
    return np.array([correlation_of(Case(case.name, case.script,
                                         case.rows[:, :, k * mb:(k + 1) * mb, :], case.n,
                                         case.p, mb, 0, case.top_k, case.hidden,
                                         case.seq))
                     for k in range(steps)])


def stable_cases() -> list[Case]:
    """Every logged case of the stable router (:data:`STABLE`), each rank's rows from the
    first step."""
    return [c for c in cases(DIAG) + cases(ROWS) + cases(ROWS2) if c.script == STABLE]


def fit_widening() -> tuple[float, float]:
    """(first-step correlation, widening) of the stable router: the mean first-step
    correlation of :func:`stable_cases`, and the median over them of each case's
    least-squares slope through the origin of ``(rho_s - rho_1) (n / seq) (n mb / seq)``
    against ``(h (s - 1))^2`` over its steps (its own ``rho_1``; ``n / seq`` the sequences
    of a call, ``n mb / seq`` those of an optimizer step, the global batch): the median, as
    one case's jumpy steps (AH's, 4-8x the others' slope at EP 2 and EP 4) would set a pooled
    fit; (0, 0) before the data."""
    first, slopes = [], []
    for c in stable_cases():
        rho = step_correlations(c)
        first.append(rho[0])
        x = (np.arange(len(rho)) * float(c.hidden)) ** 2
        y = (rho - rho[0]) * (c.n / c.seq) * (c.n * c.micro_batches / c.seq)
        if float(np.sum(x * x)) > 0.0:
            slopes.append(float(np.sum(y * x)) / float(np.sum(x * x)))
    if not first or not slopes:
        return 0.0, 0.0
    return float(np.mean(first)), float(np.median(slopes))
