"""Refit ``sync_jitter`` (gpus.yaml defaults): the spread of GPUs' sustained speed that a group
synchronising every layer pays (:mod:`simulator.model.sync`).

Data: ``data/measured/sustained-h100x4/sustained-gpu{0..3}.jsonl``
(``benchmarks/device/sustained.py``, 4x H100 at once): an 8192^3 bf16 GEMM back to back for
40 s (phase ``sustained``) and a training-like mix, each GEMM followed by a 128 M-element add,
for 20 s (phase ``mixed``), timed in windows of 40 GEMMs (about 65 ms). The first
``SKIP_WINDOWS`` windows of each phase are left out (the power limiter engaging, 0.7 s). For
every window the four GPUs ran at once, the penalty of a group is ``max / mean - 1`` of its
members' time for the window's 40 GEMMs; it is averaged over the windows for every pair of
GPUs and for the group of four, and the scale ``s`` is the least-squares fit through the origin
of those penalties on ``e_n`` (the expected maximum of ``n`` standard normals), both phases
together.
"""

from __future__ import annotations

import itertools

import numpy as np

from simulator.calibrate import REPO, jsonl
from simulator.hardware.catalog import load_gpu
from simulator.model.sync import expected_max_normal

DATA = [REPO / f"data/measured/sustained-h100x4/sustained-gpu{g}.jsonl" for g in range(4)]
PHASES = ("sustained", "mixed")
SKIP_WINDOWS = 10


def window_times(phase: str) -> np.ndarray:
    """[gpu, window]: each GPU's time for the same 40 GEMMs, windows aligned by their index."""
    per_gpu = [[r["gemm_sum_s"] for r in jsonl(p) if r.get("phase") == phase] for p in DATA]
    n = min(len(w) for w in per_gpu)
    return np.array([w[SKIP_WINDOWS:n] for w in per_gpu])


def group_penalties(t: np.ndarray) -> list[tuple[int, float]]:
    """(group size, mean over windows of max / mean - 1) for every pair and, with 4 members,
    the four, of ``t`` [member, window] (each member's time for the same work per window)."""
    out = []
    for n in (2, 4):
        for grp in itertools.combinations(range(t.shape[0]), n):
            sub = t[list(grp)]
            out.append((n, float(np.mean(sub.max(0) / sub.mean(0) - 1.0))))
    return out


def fit_scale(pts: list[tuple[int, float]]) -> float:
    """The scale ``s``: least squares through the origin of the penalties on ``e_n``."""
    e = np.array([expected_max_normal(n) for n, _ in pts])
    y = np.array([p for _, p in pts])
    return float(np.dot(e, y) / np.dot(e, e))


def penalties() -> list[tuple[int, float]]:
    """:func:`group_penalties` of every phase."""
    return [p for phase in PHASES for p in group_penalties(window_times(phase))]


def fit() -> float:
    """The scale ``s`` of :func:`penalties`."""
    return fit_scale(penalties())


def refit() -> dict[str, tuple[float, float]]:
    shipped = load_gpu("H100-SXM-80GB").sync_jitter
    return {"sync_jitter": (round(fit(), 5), shipped)}
