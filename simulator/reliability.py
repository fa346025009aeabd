"""Failures over a whole training run: goodput, effective time to train, best checkpoint interval.

A synchronous data-parallel job stops as a whole when any one of its ``n`` GPUs fails, so with
independent exponentially distributed failures of per-GPU mean ``MTBF_gpu`` the job fails at
rate ``n / MTBF_gpu``: the job's mean time between failures is ``M = MTBF_gpu / n``.

The job alternates work segments of ``tau`` seconds with blocking checkpoint writes of
``delta`` seconds. A failure loses the work done since the last completed checkpoint and costs
a restart of ``R`` seconds (detect, reschedule, re-initialise, reload the checkpoint); failures
may also strike during a restart or a checkpoint write. For this model Daly (2006)
gives the expected wall time of a job that needs ``T_s`` seconds of useful work::

    T_w = M * exp(R / M) * (exp((tau + delta) / M) - 1) * T_s / tau

so the fraction of wall time spent on useful steps (the *goodput*) is ``T_s / T_w`` and the
expected number of failures over the run is ``T_w / M``.

The checkpoint interval that maximises goodput is, to first order, Young's
``tau = sqrt(2 * delta * M)`` (Young 1974); Daly's higher-order estimate (Daly 2006)

    tau = sqrt(2 delta M) * (1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9) - delta   (delta < 2M)
    tau = M                                                                         (otherwise)

is within a fraction of a percent of the exact optimum for ``delta << M`` and is the default.
Checkpoints happen at step boundaries, so the interval used is rounded to a whole number of
steps (at least one).

References:
    J. W. Young, "A first order approximation to the optimum checkpoint interval",
    Communications of the ACM 17(9):530-531, 1974.
    J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
    Future Generation Computer Systems 22(3):303-312, 2006.
"""

from __future__ import annotations

import math
from typing import Any

from simulator.config.schema import Reliability, TrainingConfig
from simulator.errors import ConfigError

#: Largest (restart + step + checkpoint) / job MTBF accepted (goodput ~ e^-40 there).
MAX_COST_OVER_MTBF = 40.0

SECONDS_PER_DAY = 86400.0


def job_mtbf_s(gpu_mtbf_hours: float, n_gpus: int) -> float:
    """Mean time between failures of a job that stops when any of its ``n_gpus`` fails (s)."""
    if gpu_mtbf_hours <= 0 or n_gpus < 1:
        raise ValueError("gpu_mtbf_hours must be > 0 and n_gpus >= 1")
    return gpu_mtbf_hours * 3600.0 / n_gpus


def young_interval_s(write_s: float, mtbf_s: float) -> float:
    """Young (1974): first-order optimum compute time between checkpoints, ``sqrt(2 delta M)``."""
    return math.sqrt(2.0 * write_s * mtbf_s)


def daly_interval_s(write_s: float, mtbf_s: float) -> float:
    """Daly (2006): higher-order optimum compute time between checkpoints (s).

    With a free checkpoint (``write_s == 0``) there is no optimum: checkpoint every step; this
    returns 0 and the caller rounds up to one step.
    """
    if write_s <= 0:
        return 0.0
    if write_s >= 2.0 * mtbf_s:
        return mtbf_s
    x = write_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * write_s * mtbf_s) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - write_s


def goodput(interval_s: float, write_s: float, restart_s: float, mtbf_s: float) -> float:
    """Fraction of wall time spent on useful work (Daly 2006): ``T_s / T_w``.

    Args:
        interval_s: compute time between two checkpoints (tau), > 0.
        write_s: time one checkpoint blocks training (delta).
        restart_s: time from a failure to training again (R).
        mtbf_s: the job's mean time between failures (M).
    """
    if interval_s <= 0:
        raise ValueError("interval_s must be > 0")
    m = mtbf_s
    # expm1 keeps precision when (tau + delta) << M.
    wall_per_work = (
        m * math.exp(restart_s / m) * math.expm1((interval_s + write_s) / m) / interval_s
    )
    return 1.0 / wall_per_work


def best_interval_s(
    write_s: float, restart_s: float, mtbf_s: float, step_s: float | None = None
) -> float:
    """The interval (multiple of ``step_s`` when given) that maximises :func:`goodput`.

    Goodput is unimodal in tau (it rises as checkpoint overhead ``delta / tau`` falls and then
    drops as lost work ``~tau / 2M`` grows), so a golden-section search on log(tau) finds the
    continuous optimum; with a step time the best of the two neighbouring whole-step intervals
    is returned.
    """
    lo, hi = math.log(1e-3), math.log(max(100.0 * mtbf_s, 1.0))
    phi = (math.sqrt(5.0) - 1.0) / 2.0

    def f(x: float) -> float:
        return -goodput(math.exp(x), write_s, restart_s, mtbf_s)

    a, b = lo, hi
    c, d = b - phi * (b - a), a + phi * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(200):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - phi * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + phi * (b - a)
            fd = f(d)
        if b - a < 1e-10:
            break
    tau = math.exp((a + b) / 2.0)
    if step_s:
        cands = {max(1, math.floor(tau / step_s)), max(1, math.ceil(tau / step_s))}
        tau = max((n * step_s for n in cands), key=lambda t: goodput(t, write_s, restart_s, mtbf_s))
    return tau


def reliability_summary(
    summary: dict[str, Any], faults_reliability: Reliability | None, training: TrainingConfig
) -> dict[str, Any]:
    """Expected goodput and time to train of a run, from one simulated step's summary.

    Args:
        summary: the run's summary (uses ``step_time_s``, ``n_gpus`` and ``tokens_per_s``).
        faults_reliability: the workload's ``faults.reliability`` (None: nothing to report,
            returns an empty dict).
        training: the workload's ``training`` (``tokens`` for the time to train).

    Returns:
        ``goodput`` (0..1), ``effective_time_to_train_days`` (None without
        ``training.tokens``), ``checkpoint_interval_min`` (the interval used: the given one or
        Daly's optimum, rounded to whole steps), ``checkpoint_interval_steps``,
        ``best_checkpoint_interval_min`` and ``best_goodput`` (exact optimum over whole-step
        intervals), ``young_interval_min``, ``job_mtbf_hours``, ``expected_failures`` (over
        the whole run; None without ``training.tokens``), ``failure_free_time_to_train_days``
        and ``lost_fraction``: ``checkpointing``, ``rework_and_restart`` (first-order split of
        ``1 - goodput``).
    """
    rel = faults_reliability
    if rel is None:
        return {}
    step = float(summary["step_time_s"])
    n = int(summary["n_gpus"])
    tps = float(summary["tokens_per_s"])
    m = job_mtbf_s(rel.gpu_mtbf_hours, n)
    delta, r = float(rel.checkpoint_write_s), float(rel.restart_s)
    # Daly's wall time grows as exp((R + tau + delta) / M): once one restart, one step and
    # one checkpoint take many job MTBFs the run never finishes (goodput under e^-40).
    if (r + step + delta) / m > MAX_COST_OVER_MTBF:
        raise ConfigError(
            f"the job of {n:,} GPUs fails every {m:.3g} s on average, far shorter than a "
            f"restart ({r:g} s) plus a step ({step:.3g} s) plus a checkpoint ({delta:g} s): it "
            f"would never finish (accepted: gpu_mtbf_hours above "
            f"{(r + step + delta) * n / MAX_COST_OVER_MTBF / 3600:.3g})",
            field="faults.reliability.gpu_mtbf_hours",
        )

    if rel.checkpoint_interval_min is not None:
        tau_raw = rel.checkpoint_interval_min * 60.0
    else:
        tau_raw = daly_interval_s(delta, m)
    n_steps = max(1, round(tau_raw / step)) if step > 0 else 1
    tau = n_steps * step
    g = goodput(tau, delta, r, m)
    best_tau = best_interval_s(delta, r, m, step)
    g_best = goodput(best_tau, delta, r, m)

    # First-order split of the lost time (Young 1974): checkpoints cost delta / (tau + delta)
    # of the wall time; each failure costs R plus, on average, half an interval of rework.
    ckpt = delta / (tau + delta)
    lost = 1.0 - g

    out: dict[str, Any] = {
        "goodput": g,
        "effective_time_to_train_days": None,
        "failure_free_time_to_train_days": None,
        "checkpoint_interval_min": tau / 60.0,
        "checkpoint_interval_steps": n_steps,
        "best_checkpoint_interval_min": best_tau / 60.0,
        "best_goodput": g_best,
        "young_interval_min": young_interval_s(delta, m) / 60.0,
        "job_mtbf_hours": m / 3600.0,
        "expected_failures": None,
        "checkpoint_write_s": delta,
        "restart_s": r,
        "lost_fraction": {
            "checkpointing": min(ckpt, lost),
            "rework_and_restart": max(lost - ckpt, 0.0),
        },
    }
    if training.tokens is not None and tps > 0:
        useful = training.tokens / tps
        wall = useful / g
        out["failure_free_time_to_train_days"] = useful / SECONDS_PER_DAY
        out["effective_time_to_train_days"] = wall / SECONDS_PER_DAY
        out["expected_failures"] = wall / m
    return out
