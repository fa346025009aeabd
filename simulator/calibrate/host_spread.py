"""Refit ``host_jitter`` (gpus.yaml defaults): the spread of per-process host speed that a
host-bound step of ``n`` ranks pays by waiting for its slowest host
(:func:`simulator.model.sync.host_group_factor`).

Data, both from 4x H100 boxes, every step started after a synchronize and a barrier (as the
training scripts time a step), each rank's host time to issue it:

* ``data/measured/host-spread-h100x4/<launch>/host_spread-rank*.jsonl``
  (``benchmarks/device/host_spread.py``, ``call_host_spread.sh``): ``n`` ranks each issuing
  the same host-bound eager stream (16 blocks of LayerNorm, two Linears and GELU, forward,
  backward and AdamW, about 25 kernels a block on [8, 64, 256]: the GPU idles), 12-15 ms a
  step. The launches a user gets by default (``DEFAULT_LAUNCHES``: no CPU binding, torchrun's
  ``OMP_NUM_THREADS=1``), the ``solo`` phases (no collective inside the step, so each rank's
  time is its own host's).
* ``data/measured/dtensor-spread-h100x4/dtensor_spread_<launch>.jsonl``
  (``benchmarks/device/dtensor_spread.py``): two launches of 4 ranks and two of 2, each rank
  issuing ``steps_alt.py``'s DTensor TP + SP step (16 layers, tiny width and the h11_tp4sp_P
  shape: 0.25-0.34 s) and, in the same processes, a one-GPU eager GPT-2 step without DTensor
  (0.09-0.14 s), ten of each.

Statistic: for each launch and every group of ranks in it (every pair and, with 4 ranks,
the four), ``max / mean - 1`` over the group of each step's issue time, averaged over the
steps (``WINDOW`` = 1: one step, the unit the model applies the factor to). The scale ``s``
is the least-squares fit through the origin of those penalties on ``e_n`` (the expected
maximum of ``n`` standard normals), as :mod:`.sync` does for GPUs.

Until 2026-11-27 13:00 the fit summed 16 consecutive steps of ``host_spread.py`` per window
(0.2 s of host time) and gave 0.0911: a process's lag is partly drawn afresh at each barrier
(it sleeps there and is woken on whichever core), so the sum over 16 separate steps spreads
less (8.8 % at 4) than any one continuous step does, whatever its length (12 ms: 12.3 %;
0.1-0.34 s: 14.4 %), and a training step is one continuous issue.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache

import numpy as np

from simulator.calibrate import REPO, jsonl
from simulator.calibrate.sync import fit_scale, group_penalties
from simulator.hardware.catalog import default_kernel_params

DATA = REPO / "data/measured/host-spread-h100x4"
DTENSOR = REPO / "data/measured/dtensor-spread-h100x4"
#: launches of the default setting (no --pin, torchrun's OMP_NUM_THREADS=1) with 2 or 4 ranks
DEFAULT_LAUNCHES = ("n2", "n4a", "n4b", "n4c")
#: steps per window: one step between two barriers (a training step is one continuous issue)
WINDOW = 1


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


def dtensor_issue_times() -> list[np.ndarray]:
    """[rank, run] issue times of every launch and step kind (``dt``, ``plain``) and width of
    ``dtensor_spread.py``."""
    out = []
    for path in sorted(DTENSOR.glob("dtensor_spread_*.jsonl")):
        by: dict[tuple, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
        for r in jsonl(path):
            if "rank" in r:
                by[(r["width"], r["step"])][r["rank"]][r["run"]] = r["issue_s"]
        for key in sorted(by):
            ranks = by[key]
            out.append(np.array([[ranks[q][i] for i in sorted(ranks[q])] for q in sorted(ranks)]))
    return out


def penalties(window: int = WINDOW, launches=DEFAULT_LAUNCHES,
              dtensor: bool = True) -> list[tuple[int, float]]:
    """(group size, mean over windows of max / mean - 1) for every pair and the group of 4
    of each launch (:func:`simulator.calibrate.sync.group_penalties`): ``host_spread.py``'s
    steps in windows of ``window``, then (``dtensor``) ``dtensor_spread.py``'s steps one by
    one."""
    pts = [p for launch in launches
           for p in group_penalties(windows(issue_times(launch), window))]
    if dtensor:
        pts += [p for t in dtensor_issue_times() for p in group_penalties(t)]
    return pts


@lru_cache(maxsize=4)
def fit(window: int = WINDOW) -> float:
    """The scale ``s``: least squares through the origin of the penalties on ``e_n``, as for
    the GPUs (:func:`simulator.calibrate.sync.fit_scale`)."""
    return fit_scale(penalties(window))


def refit() -> dict[str, tuple[float, float]]:
    return {"defaults.host_jitter": (round(fit(), 4), default_kernel_params()["host_jitter"])}
