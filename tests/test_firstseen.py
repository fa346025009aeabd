"""What a fresh process pays for a learned router's expert-GEMM row counts, against the
measurement (data/measured/firstseen-h100x4, routerdiag-h100x4/call2; benchmarks/firstseen_report.py):
the counting of the events (closed form), the prewarm split, and the per-event costs the step
data give against those the engine ships (micro-benchmarks of their own: gemm-shape-host-h100x2,
gemm-first-launch-h100x4)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import firstseen_report as fr
from simulator.model import kernel_first


def _log(rank: int, rows: list, warmup: int = 1) -> dict:
    """A per-rank file of route_replay.py: rows [layer][call][local expert] of ``learned``."""
    return {"rank": rank, "warmup": warmup, "calls_per_step": len(rows) * 1,
            "variants": {"learned": {"local_rows": rows}}}


def test_events_count_new_counts_and_bands_per_rank_and_coupled():
    # two ranks, one layer, one micro-batch (a call a step), two local experts; 3 steps
    r0 = [[[100, 100], [100, 200], [300, 0]]]
    r1 = [[[100, 5000], [100, 5000], [100, 5000]]]
    e = fr.events([_log(0, r0), _log(1, r1)])
    b = {m: int(kernel_first.band_of(np.array([m]))[0]) for m in (100, 200, 300, 5000)}
    # rank 0: step 1 meets 100 (one count, one band); step 2 meets 200 (new count; new band
    # unless 200 shares 100's); step 3 meets 300 (the zero-row call counts nothing)
    assert e["counts"][:, 0].tolist() == [1, 1, 1]
    assert e["bands"][:, 0].tolist() == [1, float(b[200] != b[100]),
                                         float(b[300] not in {b[100], b[200]})]
    assert e["counts"][:, 1].tolist() == [2, 0, 0]
    # coupled: per call the larger rank's events
    assert e["counts_max"].tolist() == [2, 1, 1]
    assert e["calls"] == 2 and e["steps"] == 3


@pytest.fixture(scope="module")
def runs():
    rs = fr.runs()
    if len(rs) < 8:
        pytest.skip("firstseen measurement not present")
    return rs


def test_prewarming_the_counts_gemm_shapes_removes_the_fresh_process_cost(runs):
    """The replayed counts' expert GEMM shapes run once before step 1 (allocator emptied after)
    leave a step as fast as the same process's warm replay: the whole cold excess is cuBLAS's
    (heuristic queries, first kernel launches), nothing of the allocator's."""
    pw = [r for r in runs if r["prewarm"] == r["prewarm"]]
    assert len(pw) == 8
    cold = sum(r["learned"] - r["replay_b"] for r in pw)
    removed = sum(r["learned"] - r["prewarm"] for r in pw)
    assert cold > 0.4  # s: the eight runs' cold excess is large
    assert 0.85 <= removed / cold <= 1.15


def test_the_steps_give_the_shipped_per_event_costs_with_coupled_events(runs):
    """Least squares over every run (many equations, two unknowns): the learned step's fresh
    part against its new counts and new kernel bands a step, each MoE call paying its slowest
    EP rank's (the engine's coupling), gives the engine's costs: the six heuristic queries of
    an expert at a new count (gpus.yaml, a micro-benchmark of its own) and the two passes'
    first launches of a new band (kernel_first, another)."""
    a, b, res = fr.fit_steps(coupled=True)
    assert a == pytest.approx(fr.shipped_count_s(), rel=0.25)
    band = 2 * kernel_first.FIRST_LAUNCH_S * kernel_first.KERNELS_PER_PASS
    assert b == pytest.approx(band, rel=0.35)
    # what is left is launch-to-launch spread (the same case 22-28 ms apart, two calls)
    assert float(np.sqrt(np.mean(res ** 2))) < 0.025
    # with the ranks' mean events instead, the costs come out higher: the coupling is real
    a_mean, b_mean, _ = fr.fit_steps(coupled=False)
    assert a_mean > a and b_mean > 1.5 * b


def test_a_new_count_costs_the_heuristic_queries_in_the_prewarm(runs):
    """The prewarm's first calls beyond their repeats, per rank: a new count costs what the
    engine charges (gemm-shape-host-h100x2's micro-benchmark); a new band, alone on an idle
    GPU, more than the step pays for it (part of it hides behind queued work there)."""
    a, b, _ = fr.fit_prewarm()
    assert a == pytest.approx(fr.shipped_count_s(), rel=0.15)
    step_band = fr.fit_steps(coupled=True)[1]
    assert b > 1.3 * step_band


def test_the_engine_prices_the_counted_events_as_measured(runs):
    """The simulator given each run's counted events (share new and new bands in place of its
    own expectation) prices the fresh part as measured, within the runs' spread: no factor."""
    k, res = fr.engine_scale()
    assert 0.85 <= k <= 1.2
    assert float(np.sqrt(np.mean(res ** 2))) < 0.03
