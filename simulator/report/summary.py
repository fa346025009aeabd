"""The step summary: step time, throughput, MFU, the exposed-time breakdown and peak memory.

Breakdown (exposed time on the critical path). The process that finishes last defines the step.
Its compute stream is busy with compute, exposed communication of a parallel dimension in its
programs (``tp_comm``, ``cp_comm``: a collective the next kernel waits for), the optimizer, or
the all-gather of a received pipeline tensor sent split over the TP ranks (``pp_comm``);
those are disjoint, so each is a plain sum. Every
instant the compute stream is idle is then charged, in order, to data-parallel / ZeRO
communication in flight on this GPU (``dp_comm``), to an incoming pipeline transfer
(``pp_comm``), or else to the pipeline: stage imbalance first (``pp_imbalance``: how much longer
the busiest stage of the same pipeline computes than this process, m * (T_max - T_crit) for
m micro-batches, time the schedule cannot hide), then the schedule's bubble (``pp_bubble``,
what is left: the bubble of the critical stage; ``other`` when there is no pipeline). The
parts add up to the step time by construction.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import numpy as np
import pandas as pd

from simulator.engine.records import BREAKDOWN_KEYS
from simulator.engine.sim import DP_STREAMS, Proc

GiB = 1024**3


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(a, b) for a, b in out]


def _subtract(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]):
    """Intervals of ``a`` not covered by ``b`` (both sorted, disjoint)."""
    out, j = [], 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _length(iv: Sequence[tuple[float, float]]) -> float:
    return float(sum(e - s for s, e in iv))


def _busy_s(proc: Proc) -> float:
    return float(sum(e - s for s, e, *_ in proc.busy))


def _busy_parts(proc: Proc) -> dict[str, float]:
    """What ``proc``'s compute stream is busy with, per breakdown category (seconds)."""
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    for s, e, comp, comm, kind in proc.busy:
        if kind == "optimizer":
            out["optimizer"] += e - s
        elif kind == "pp_comm":  # a received pipeline tensor gathered over the TP group
            out["pp_comm"] += e - s
        else:
            out["compute"] += comp
            exposed = 0.0
            for dim, secs in comm:
                out["host" if dim == "host" else f"{dim}_comm"] += secs
                exposed += secs
            # Anything else inside a busy interval (rounding) counts as compute.
            out["compute"] += max(0.0, (e - s) - comp - exposed)
    return out


def imbalance_parts(proc: Proc, peers: Collection[Proc], imbalance_s: float) -> dict | None:
    """Why the heaviest stage of ``proc``'s pipeline is busier than ``proc``: the categories
    in which it spends more time (its compute, its exposed EP all-to-all, ...), scaled so that
    they add up to the stage imbalance charged to ``proc`` (``imbalance_s``). ``None`` when
    there is no imbalance."""
    if imbalance_s <= 0 or not peers:
        return None
    heavy = max(peers, key=lambda p: (_busy_s(p), -p.pid))
    mine, theirs = _busy_parts(proc), _busy_parts(heavy)
    more = {k: theirs[k] - mine[k] for k in BREAKDOWN_KEYS if theirs[k] - mine[k] > 0}
    total = sum(more.values())
    if total <= 0:
        return None
    return {
        "heaviest_stage": heavy.stage,
        "heaviest_process": heavy.label,
        "parts_s": {k: v * imbalance_s / total for k, v in more.items()},
    }


def breakdown(
    proc: Proc, step_time: float, has_pipeline: bool, peers: Collection[Proc] = ()
) -> dict[str, float]:
    """Exposed time per category for ``proc`` over ``[0, step_time]``; sums to step_time.

    ``peers``: the processes of ``proc``'s pipeline (its other stages), whose busiest one sets
    the stage imbalance (:func:`imbalance_parts` says what makes it busier)."""
    out = _busy_parts(proc)
    busy = [(s, e) for s, e, *_ in proc.busy]
    idle = _subtract([(0.0, step_time)], _union(busy))
    dp_iv = _union([iv for st in DP_STREAMS for iv in proc.comm_iv.get(st, ())])
    rest = _subtract(idle, dp_iv)
    out["dp_comm"] = _length(idle) - _length(rest)
    pp_iv = _union(proc.comm_iv.get("pp_in", ()))
    rest2 = _subtract(rest, pp_iv)
    out["pp_comm"] = _length(rest) - _length(rest2)
    waiting = _length(rest2)
    if has_pipeline and peers:
        heaviest = max(_busy_s(p) for p in peers)
        out["pp_imbalance"] = min(waiting, max(0.0, heaviest - _busy_s(proc)))
        waiting -= out["pp_imbalance"]
    out["pp_bubble" if has_pipeline else "other"] += waiting
    # Make the parts add up exactly (floating point) to the step time.
    drift = step_time - sum(out.values())
    out["compute"] += drift
    return out


def memory_peak(
    memory: pd.DataFrame, capacity_bytes: float, reserved_bytes: float = 0.0
) -> tuple[dict[str, float], str]:
    """Peak memory of the worst process, split by category at the moment of the peak (GiB);
    ``reserved`` (the runtime's own HBM) is part of the total. ``allocated`` is the total
    without it: the tensors alone, what ``torch.cuda.max_memory_allocated`` reports (no CUDA
    context, communication buffers or allocator cache)."""
    cats = ["weights", "gradients", "optimizer", "activations", "zero_params"]
    best = None
    for proc, grp in memory.groupby("proc", sort=True):
        # Process frees before allocations at the same instant (a layer's backward frees its
        # activations before the next one allocates).
        g = grp.sort_values(["t_s", "delta_bytes"], kind="stable")
        tot = g["delta_bytes"].cumsum().to_numpy()
        i = int(np.argmax(tot))
        peak = float(tot[i])
        if best is None or peak > best[0]:
            upto = g.iloc[: i + 1]
            split = upto.groupby("what")["delta_bytes"].sum().to_dict()
            best = (peak, proc, split)
    if best is None:
        keys = ["weights", "gradients", "optimizer", "activations", "total", "allocated"]
        return dict.fromkeys(keys, 0.0), ""
    peak, proc, split = best
    res = {c: float(split.get(c, 0.0)) / GiB for c in cats}
    res["weights"] += res.pop("zero_params")
    res["reserved"] = reserved_bytes / GiB
    res["total"] = (peak + reserved_bytes) / GiB
    res["allocated"] = peak / GiB
    res["capacity"] = capacity_bytes / GiB
    return res, proc
