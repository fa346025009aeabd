"""Refit ``host_jitter`` (gpus.yaml defaults): the spread of per-process host speed that a
host-bound step of ``n`` ranks pays by waiting for its slowest host
(:func:`simulator.model.sync.host_group_factor`).

Data: ``data/measured/host-spread-h100x4/<launch>/host_spread-rank*.jsonl``
(``benchmarks/device/host_spread.py`` on 4x H100, ``call_host_spread.sh``): ``n`` ranks each
issuing the same host-bound eager stream (16 blocks of LayerNorm, two Linears and GELU,
forward, backward and AdamW, about 25 kernels a block on [8, 64, 256]: the GPU idles),
every step started after a synchronize and a barrier. The fit uses the launches a user gets
by default (``DEFAULT_LAUNCHES``: no CPU binding, torchrun's ``OMP_NUM_THREADS=1``), the
``solo`` phases (no collective inside the step, so each rank's time is its own host's).

Statistic: for each launch and every group of ranks in it (every pair and, with 4 ranks,
the four), each rank's time to issue the same ``WINDOW`` consecutive steps (aligned by the
barrier that starts each), ``max / mean - 1`` over the group, averaged over the windows of
both rounds. The scale ``s`` is the least-squares fit through the origin of those penalties
on ``e_n`` (the expected maximum of ``n`` standard normals), as :mod:`.sync` does for GPUs.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

import numpy as np

from simulator.calibrate import REPO, jsonl
from simulator.calibrate.sync import fit_scale, group_penalties
from simulator.hardware.catalog import default_kernel_params

DATA = REPO / "data/measured/host-spread-h100x4"
#: launches of the default setting (no --pin, torchrun's OMP_NUM_THREADS=1) with 2 or 4 ranks
DEFAULT_LAUNCHES = ("n2", "n4a", "n4b", "n4c")
#: steps per window: about 0.2 s of host time on the H100 box (12-15 ms a step), the middle of
#: the host-bound training steps measured (0.1-0.4 s from one barrier to the next)
WINDOW = 16


def rows(launch: str) -> list[dict]:
    """Every rank's rows of one launch."""
    return [r for p in sorted((DATA / launch).glob("host_spread-rank*.jsonl")) for r in jsonl(p)]


def issue_times(launch: str, mode: str = "solo", key: str = "issue_s") -> np.ndarray:
    """[rank, step]: each rank's per-step times of ``mode``, rounds one after another."""
    by_rank: dict[int, list[float]] = defaultdict(list)
    for r in sorted(rows(launch), key=lambda r: (r["rank"], r["round"])):
        if r["mode"] == mode:
            by_rank[r["rank"]].extend(r[key])
    n = min(len(v) for v in by_rank.values())
    return np.array([by_rank[k][:n] for k in sorted(by_rank)])


def windows(t: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """[rank, window]: sums over consecutive windows of ``window`` steps."""
    w = t.shape[1] // window
    return t[:, : w * window].reshape(t.shape[0], w, window).sum(axis=2)


def penalties(window: int = WINDOW, launches=DEFAULT_LAUNCHES) -> list[tuple[int, float]]:
    """(group size, mean over windows of max / mean - 1) for every pair and the group of 4
    of each launch (:func:`simulator.calibrate.sync.group_penalties`)."""
    return [p for launch in launches
            for p in group_penalties(windows(issue_times(launch), window))]


@lru_cache(maxsize=4)
def fit(window: int = WINDOW) -> float:
    """The scale ``s``: least squares through the origin of the penalties on ``e_n``, as for
    the GPUs (:func:`simulator.calibrate.sync.fit_scale`)."""
    return fit_scale(penalties(window))


def refit() -> dict[str, tuple[float, float]]:
    return {"defaults.host_jitter": (round(fit(), 4), default_kernel_params()["host_jitter"])}
