"""How much longer a collective takes while its GPU computes beside it, by GPU, operation,
group size and message size (``fabrics.yaml`` ``nccl.comm_slowdown_beside_compute``).

The catalog holds, per GPU that was measured, per operation and per group size, the extra
fraction ``(t_beside / t_alone) - 1`` at each measured message size (``[[MiB, extra], ...]``);
:func:`extra_fraction` interpolates linearly in log message size between those sizes and holds
the end values beyond them. A group size that was not measured uses the largest measured
group not above it (the smallest measured one below that). A GPU without its own entry uses
the entry named by ``inherit`` (see ``fabrics.yaml`` for which and why).
``python -m simulator.calibrate interference`` refits the table from the measurement files.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping
from typing import Any

MIB = 2**20

#: (op, nbytes, group size) -> extra fraction of the time overlapped with compute
SlowdownFn = Callable[[str, float, int], float]


def table_for(nccl: Mapping[str, Any], gpu_name: str) -> Mapping[str, Any]:
    """The per-operation table of ``gpu_name`` (its own, else the inherited one)."""
    tables = nccl.get("comm_slowdown_beside_compute") or {}
    own = tables.get(gpu_name)
    if own is None:
        own = tables.get(tables.get("inherit", ""), {})
    return {op: v for op, v in own.items() if op != "source"}


def extra_fraction(table: Mapping[str, Any], op: str, nbytes: float, group: int) -> float:
    """Extra fraction of the compute-overlapped time a collective ``op`` of ``nbytes`` over
    ``group`` GPUs takes (0 for an operation the table does not have)."""
    by_group = table.get(op)
    if not by_group or nbytes <= 0:
        return 0.0
    groups = sorted(int(g) for g in by_group)
    below = [g for g in groups if g <= group]
    g = below[-1] if below else groups[0]
    points = sorted((float(s) * MIB, float(e)) for s, e in by_group[g])
    sizes = [s for s, _ in points]
    i = bisect.bisect_left(sizes, nbytes)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (s0, e0), (s1, e1) = points[i - 1], points[i]
    w = math.log(nbytes / s0) / math.log(s1 / s0)
    return e0 + w * (e1 - e0)


def slowdown_fn(nccl: Mapping[str, Any], gpu_name: str) -> SlowdownFn:
    """``f(op, nbytes, group)``: :func:`extra_fraction` over ``gpu_name``'s table."""
    table = table_for(nccl, gpu_name)
    cache: dict[tuple, float] = {}

    def f(op: str, nbytes: float, group: int) -> float:
        key = (op, nbytes, group)
        if key not in cache:
            cache[key] = extra_fraction(table, op, nbytes, group)
        return cache[key]

    return f
