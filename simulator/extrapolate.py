"""A step of many micro-batches from shorter simulations: the pipeline's steady state.

With identical micro-batches a pipeline schedule (GPipe, 1F1B, interleaved 1F1B) settles into
a periodic steady state: after its warm-up, every further *cycle* of micro-batches (one for
GPipe and 1F1B, ``pp`` for the interleaved schedule, whose micro-batch count must be a multiple
of ``pp``) adds the same time to the step, and the same time to each part of the breakdown,
while the warm-up and the tail after the last backward (cool-down, gradient reduction, optimizer,
parameter gathers) stay as they are. Every quantity that grows with the step is then extended
linearly from the two longest simulated steps ``m2 < m3`` one cycle apart:
``q(m) = q(m3) + (m - m3) / cycle * (q(m3) - q(m2))``. Memory follows the same rule: GPipe
holds all ``m`` micro-batches' activations (linear in ``m``), 1F1B at most ``pp - stage`` (flat
once ``m >= pp``).

What shows that the two steps are in the steady state (the shortest has at least twice the
pipeline depth in micro-batches):

* 1F1B and interleaved 1F1B (two steps, ``m1 = 2 pp`` rounded to a cycle, and one cycle more):
  each stage's order of the longer step is the shorter one's with one cycle of steady-state
  (forward, backward) pairs inserted. :func:`one_cycle_inserted` checks that the simulation
  did exactly that: on every process and stream, the longer step's records are the shorter
  one's up to some point, then the inserted ones, then the rest of the shorter one's delayed
  by the step's increment -- same kinds, layers, bytes and FLOPs, times within 1e-9 of the
  step; the memory timeline the same. The engine being deterministic, a state that one cycle
  leaves as it found it (only later) repeats with every further cycle, so the step of ``m`` is
  exact, not fitted.
* GPipe (three steps ``m1 < m2 < m3`` one cycle apart): its stages run all forwards then all
  backwards, so a longer step inserts in two places; the increments ``m1 -> m2`` and
  ``m2 -> m3`` of the step, every breakdown part, memory and FLOPs must agree
  (:func:`periodic`).

Where the check fails (a fault whose effect changes over time, a tail that has not settled),
the caller simulates every micro-batch. The events table, trace and memory timeline of an
extrapolated run are those of the longest simulated step; ``run --all-microbatches`` simulates
every one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from simulator.report.links import LinkLoads

#: Relative agreement the increments m1 -> m2 and m2 -> m3 need before the step is extrapolated.
PERIODIC_REL = 1e-6
#: Below this share of a quantity's own size, a difference is floating-point noise (a part
#: that does not grow with the micro-batches: the tail's reduction, the optimizer); also the
#: share of the step within which :func:`one_cycle_inserted` takes two record times as equal.
NOISE_REL = 1e-9
#: Event-table columns that must agree between a record and its counterpart one cycle on
#: (times aside; a name carries the micro-batch index, which does not; the parts a row lists
#: follow from its program, which these and its times pin down).
SAME_EVENT = ("kind", "layer", "bytes", "flops", "coalesced")
#: Summary figures that grow linearly with the micro-batches in the steady state.
LINEAR_KEYS = ("step_time_s", "hardware_flops_per_step")


def points(microbatches: int, pp: int, virtual_stages: int, schedule: str) -> tuple | None:
    """The micro-batch counts to simulate for a step of ``microbatches``: ``(m1, m2)`` for
    1F1B and the interleaved schedule, ``(m1, m2, m3)`` for GPipe (module docstring); or None
    where simulating every micro-batch costs about as much: fewer than ``6 (m1 + cycle)``
    (each simulation also pays a fixed cost -- building the step, its tail, its tables --
    which outweighs the micro-batches of a short pipeline: Llama-3-8B on 64 GPUs, pp 1, 16
    micro-batches, simulates in 0.2 s, from 2 and 3 micro-batches in 0.4 s)."""
    # (DualPipe: a micro-batch of each direction, two pairs on every rank)
    cycle = {"interleaved": pp, "dualpipe": 2}.get(schedule, 1)  # (DualPipeV: 1)
    m1 = cycle * math.ceil(2 * pp / cycle)
    m1 = max(m1, cycle)
    ms = tuple(m1 + k * cycle for k in range(3 if schedule == "gpipe" else 2))
    if microbatches < 6 * (m1 + cycle) or (microbatches - ms[-1]) % cycle:
        return None
    return ms


def series(summaries: Sequence[Mapping]) -> dict[str, list[float]]:
    """The figures to extrapolate, by dotted name, one value per simulated step."""
    out: dict[str, list[float]] = {k: [float(s[k]) for s in summaries] for k in LINEAR_KEYS}
    for group in ("breakdown_s", "memory_gib"):
        for k in summaries[-1][group]:
            out[f"{group}.{k}"] = [float(s[group][k]) for s in summaries]
    if "moe" in summaries[-1] and "uniform_step_time_s" in summaries[-1]["moe"]:
        for k in ("uniform_step_time_s", "imbalance_cost_s"):
            out[f"moe.{k}"] = [float(s["moe"][k]) for s in summaries]
    return out


def periodic(values: Sequence[float]) -> bool:
    """Whether ``q(m1), q(m2), q(m3)`` grow by the same increment (within PERIODIC_REL of the
    increment, or NOISE_REL of the value)."""
    a, b, c = values
    d1, d2 = b - a, c - b
    tol = PERIODIC_REL * max(abs(d1), abs(d2)) + NOISE_REL * max(abs(a), abs(b), abs(c))
    return abs(d1 - d2) <= tol


def extend(values: Sequence[float], ms: Sequence[int], m: int) -> float:
    """``q(m)`` from the last two points of a periodic series (see the module docstring)."""
    m2, m3 = ms[-2:]
    b, c = values[-2:]
    return c + (m - m3) / (m3 - m2) * (c - b)


def one_cycle_inserted(short: Mapping, long: Mapping, keys: Sequence[str],
                       times: Sequence[str], same: Sequence[str], shift: float,
                       tol: float) -> bool:  # fmt: skip
    """Whether table ``long`` is table ``short`` with rows inserted at one place in each group
    of ``keys`` (a process and stream): the group's rows, in the tables' order, are the
    short group's first rows, then any number of new ones, then the short group's remaining
    rows with every column of ``times`` later by ``shift``; columns ``same`` equal throughout,
    times within ``tol``. A table is anything whose ``[column]`` gives its values in order (a
    DataFrame, :class:`~simulator.report.events.EventRows`' columns)."""
    n_s = len(np.asarray(short[times[0]]))

    def codes(cols: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each row's values of ``cols`` as one integer, alike in both tables."""
        out = np.zeros(n_s + len(np.asarray(long[times[0]])), dtype=np.int64)
        for c in cols:
            both = np.concatenate([np.asarray(short[c]), np.asarray(long[c])])
            f, uniq = pd.factorize(both)
            out = pd.factorize(out * (len(uniq) + 1) + f)[0]  # (kept below the row count)
        return out[:n_s], out[n_s:]

    def groups(code: np.ndarray) -> dict[int, np.ndarray]:
        order = np.argsort(code, kind="stable")  # each group's rows stay in table order
        cuts = np.flatnonzero(np.diff(code[order])) + 1
        return {int(code[g[0]]): g for g in np.split(order, cuts) if len(g)}

    k_s, k_l = codes(keys)
    gs, gl = groups(k_s), groups(k_l)
    if gs.keys() != gl.keys():
        return False
    a_s, a_l = codes(same)
    t_s = np.column_stack([np.asarray(short[c], dtype=float) for c in times])
    t_l = np.column_stack([np.asarray(long[c], dtype=float) for c in times])
    for key, i_s in gs.items():
        i_l = gl[key]
        n, extra = len(i_s), len(i_l) - len(i_s)
        if extra < 0:
            return False
        head = i_l[:n]
        match = (a_l[head] == a_s[i_s]) & (np.abs(t_l[head] - t_s[i_s]) <= tol).all(1)
        cut = n if match.all() else int(np.argmin(match))  # rows before: as in the short step
        tail_l, tail_s = i_l[cut + extra:], i_s[cut:]
        if not ((a_l[tail_l] == a_s[tail_s]).all()
                and (np.abs(t_l[tail_l] - t_s[tail_s] - shift) <= tol).all()):  # fmt: skip
            return False
    return True


def steady(short, long) -> bool:
    """Whether the simulated step ``long`` (a :class:`~simulator.run.SimResult`) is ``short``
    with one steady-state cycle inserted (:func:`one_cycle_inserted` on its event rows and
    memory timeline), and ends with the same critical process."""
    s, lg = short.summary, long.summary
    if s["critical_process"] != lg["critical_process"]:
        return False
    shift, tol = lg["step_time_s"] - s["step_time_s"], NOISE_REL * lg["step_time_s"]
    cols = ("gpu", "stream", "start_s", "end_s", *SAME_EVENT)  # (a process's GPU names it)
    ev_s, ev_l = ({c: r.rows.column(c) for c in cols} for r in (short, long))
    return one_cycle_inserted(
        ev_s, ev_l, ("gpu", "stream"), ("start_s", "end_s"), SAME_EVENT, shift, tol
    ) and one_cycle_inserted(
        short.memory, long.memory, ("proc",), ("t_s",), ("delta_bytes", "what"), shift, tol
    )


def extend_links(loads: Sequence[LinkLoads], ms: Sequence[int], m: int,
                 step: float) -> LinkLoads:  # fmt: skip
    """The link loads of the ``m``-micro-batch step: bytes and busy time of every link
    extrapolated from the last two steps' (as :func:`extend`), utilisation over ``step``."""
    m2, m3 = ms[-2:]
    return loads[-1].extended(loads[-2], (m - m3) / (m3 - m2), step)


def settle_pipeline_parts(bd: dict[str, float], step: float) -> None:
    """Re-apply the breakdown's rule to extrapolated parts (:func:`~simulator.report.summary.
    breakdown`): the pipeline's waiting time (bubble + imbalance) and the stage imbalance both
    grow linearly, but the imbalance is charged at most the waiting time, so past the
    micro-batch count where it reaches it the bubble is 0 and the imbalance all of it. Then
    make the parts add up exactly to ``step`` (the rest, float rounding, to compute)."""
    if "pp_imbalance" in bd and "pp_bubble" in bd:
        waiting = bd["pp_bubble"] + bd["pp_imbalance"]
        bd["pp_imbalance"] = min(waiting, max(0.0, bd["pp_imbalance"]))
        bd["pp_bubble"] = waiting - bd["pp_imbalance"]
    bd["compute"] += step - sum(bd.values())
