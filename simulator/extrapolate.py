"""A step of many micro-batches from three shorter simulations: the pipeline's steady state.

With identical micro-batches a pipeline schedule (GPipe, 1F1B, interleaved 1F1B) settles into
a periodic steady state: after its warm-up, every further *cycle* of micro-batches (one for
GPipe and 1F1B, ``pp`` for the interleaved schedule, whose micro-batch count must be a multiple
of ``pp``) adds the same time to the step, and the same time to each part of the breakdown,
while the warm-up and the tail after the last backward (cool-down, gradient reduction, optimizer,
parameter gathers) stay as they are. So a step of ``m`` micro-batches is simulated at
``m1 < m2 < m3`` (``m2 - m1 = m3 - m2`` = one cycle, ``m1`` at least twice the pipeline depth)
and, where the increments ``m1 -> m2`` and ``m2 -> m3`` agree (:func:`periodic`), every
quantity that grows with the step is extrapolated linearly from ``m3``:
``q(m) = q(m3) + (m - m3) / cycle * (q(m3) - q(m2))``. Memory follows the same rule: GPipe
holds all ``m`` micro-batches' activations (linear in ``m``), 1F1B at most ``pp - stage`` (flat
once ``m >= pp``), which the three points confirm. Where they disagree (a fault whose effect
changes over time, a tail that has not settled), the caller simulates every micro-batch.

The events table, trace and memory timeline of an extrapolated run are those of the ``m3``
simulation; ``run --all-microbatches`` simulates every one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pandas as pd

#: Relative agreement the increments m1 -> m2 and m2 -> m3 need before the step is extrapolated.
PERIODIC_REL = 1e-6
#: Below this share of a quantity's own size, a difference is floating-point noise (a part
#: that does not grow with the micro-batches: the tail's reduction, the optimizer).
NOISE_REL = 1e-9
#: Summary figures that grow linearly with the micro-batches in the steady state.
LINEAR_KEYS = ("step_time_s", "hardware_flops_per_step")


def points(microbatches: int, pp: int, virtual_stages: int, schedule: str) -> tuple | None:
    """``(m1, m2, m3)`` to simulate for a step of ``microbatches``, or None where simulating
    every micro-batch costs about as much: fewer than twice ``m1 + m2 + m3`` (each simulation
    also pays a fixed cost: building the step, its tables)."""
    cycle = pp if schedule == "interleaved" else 1
    m1 = cycle * math.ceil(2 * pp / cycle)
    m1 = max(m1, cycle)
    m2, m3 = m1 + cycle, m1 + 2 * cycle
    if microbatches < 2 * (m1 + m2 + m3) or (microbatches - m3) % cycle:
        return None
    return m1, m2, m3


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
    """``q(m)`` from ``q(m2), q(m3)`` of a periodic series (see the module docstring)."""
    _, m2, m3 = ms
    _, b, c = values
    return c + (m - m3) / (m3 - m2) * (c - b)


def extend_links(tables: Sequence[pd.DataFrame], ms: Sequence[int], m: int,
                 step: float) -> pd.DataFrame:  # fmt: skip
    """The links table of the ``m``-micro-batch step: bytes and busy time of every link
    extrapolated from the ``m2`` and ``m3`` steps' tables, utilisation over ``step``."""
    t2, t3 = tables[1].set_index("link"), tables[2].set_index("link")
    out = t3.copy()
    for col in ("bytes", "busy_s"):
        prev = t2[col].reindex(t3.index).fillna(0.0)
        out[col] = [extend((0.0, b, c), ms, m) for b, c in zip(prev, t3[col], strict=True)]
    out["utilization"] = out["busy_s"] / step if step else 0.0
    out = out.reset_index()[list(tables[2].columns)]
    return out.sort_values(["utilization", "link"], ascending=[False, True]).reset_index(
        drop=True
    )


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
