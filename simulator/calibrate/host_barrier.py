"""Refit ``host_barrier_s`` (gpus.yaml defaults): what a host read after a collective of ``n``
ranks costs beyond one process's synchronisation (:func:`simulator.model.sync.host_barrier_s`).

Data: ``data/measured/sync-segments-h100x4/segments.jsonl.gz`` (``benchmarks/device/
sync_segments.py``, 4x H100, 2026-11-27): 1, 2 and 4 ranks (two launches of 4) each issue the
same host-bound stream of 2,048 tiny kernels a step, cut into ``k`` = 4, 16, 64, 256 segments;
each segment ends with an ``all_to_all_single`` of uneven split sizes and one of rows
(``async``), or the same with the sizes read on the host before the row exchange (``sync``,
as eager MoE code does), two rounds of 20 steps each.

Per launch, round and ``k``, from the steps (each rank's ``issue``: a segment's host time
from its start to its count exchange issued; ``wall``: the step until its GPU finished):

* the redraw: ``(sum_j max_r issue_rj - max_r sum_j issue_rj) / k`` in ``sync`` mode. A step
  cut by barriers pays each segment's slowest rank, a continuous one the slowest rank over
  the step (what ``host_jitter`` prices); the difference per barrier.
* the read: ``rest_sync - rest_async``, ``rest = (max_r wall - A) / k`` with ``A`` the sum of
  the segments' maxima (``sync``) or the largest sum (``async``): what a barrier's read adds
  beyond the issue, less the same of one process (``w1``), which ``host_sync_s`` prices.

Their sum is one launch's cost a barrier, mean over rounds and ``k``; ``host_barrier_s`` is the
least-squares fit through the origin of those costs on ``e_n`` (the expected maximum of ``n``
standard normals): the slowest of ``n`` fresh lags, as :mod:`.host_spread` does for the
persistent one.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from functools import lru_cache

import numpy as np

from simulator.calibrate import REPO
from simulator.hardware.catalog import default_kernel_params
from simulator.model.sync import expected_max_normal

DATA = REPO / "data/measured/sync-segments-h100x4/segments.jsonl.gz"


@lru_cache(maxsize=1)
def runs() -> dict[tuple, dict[int, list[dict]]]:
    """{(world, label, round, mode, k): {rank: steps}}."""
    out: dict[tuple, dict[int, list[dict]]] = defaultdict(dict)
    with gzip.open(DATA, "rt") as f:
        for line in f:
            r = json.loads(line)
            out[(r["world"], r["label"], r["round"], r["mode"], r["k"])][r["rank"]] = r["steps"]
    return dict(out)


def _per_segment(world: int, label: str, rnd: int, mode: str, k: int) -> tuple[float, float]:
    """(redraw, rest) a segment, seconds, mean over the steps of one run."""
    by_rank = runs()[(world, label, rnd, mode, k)]
    ranks = sorted(by_rank)
    redraw, rest = [], []
    for i in range(len(by_rank[ranks[0]])):
        issue = np.array([by_rank[r][i]["issue"] for r in ranks]) * 1e-6  # [rank, segment]
        sum_max = float(issue.max(axis=0).sum())
        max_sum = float(issue.sum(axis=1).max())
        wall = max(by_rank[r][i]["wall"] for r in ranks) * 1e-6
        redraw.append((sum_max - max_sum) / k)
        rest.append((wall - (sum_max if mode == "sync" else max_sum)) / k)
    return float(np.mean(redraw)), float(np.mean(rest))


def read_cost(world: int, label: str, rnd: int, k: int) -> float:
    """What the read adds to a segment beyond its issue: ``rest_sync - rest_async``."""
    return _per_segment(world, label, rnd, "sync", k)[1] - _per_segment(world, label, rnd,
                                                                         "async", k)[1]


def launches() -> list[tuple[int, str]]:
    """(world, label) of every launch."""
    return sorted({(w, lab) for (w, lab, *_rest) in runs()})


def _keys(world: int, label: str) -> list[tuple[int, int]]:
    return sorted({(rnd, k) for (w, lab, rnd, mode, k) in runs()
                   if (w, lab) == (world, label) and mode == "sync"})


def one_process_read() -> float:
    """One process's read cost a segment (mean over its rounds and ``k``): what
    ``host_sync_s`` and the drain of the GPU already price."""
    return float(np.mean([read_cost(w, lab, rnd, k) for w, lab in launches() if w == 1
                          for rnd, k in _keys(w, lab)]))


def barrier_costs() -> dict[tuple[int, str], tuple[float, float]]:
    """{(world, label): (redraw, read beyond one process's)} a barrier, seconds, mean over the
    launch's rounds and ``k``; launches of more than one rank."""
    base = one_process_read()
    out = {}
    for w, lab in launches():
        if w < 2:
            continue
        keys = _keys(w, lab)
        redraw = float(np.mean([_per_segment(w, lab, rnd, "sync", k)[0] for rnd, k in keys]))
        read = float(np.mean([read_cost(w, lab, rnd, k) for rnd, k in keys])) - base
        out[(w, lab)] = (redraw, read)
    return out


def fit() -> float:
    """``host_barrier_s``: least squares through the origin of each launch's cost a barrier
    (redraw + read) on ``e_n``."""
    pts = [(expected_max_normal(w), sum(c)) for (w, _), c in barrier_costs().items()]
    e = np.array([p[0] for p in pts])
    y = np.array([p[1] for p in pts])
    return float(e @ y / (e @ e))


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}."""
    if not DATA.exists():
        return {}
    return {"defaults.host_barrier_s": (float(f"{fit():.3g}"),
                                        default_kernel_params()["host_barrier_s"])}
