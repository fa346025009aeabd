"""The Perfetto / Chrome trace of a simulated step (a view of the events table).

Format: the Chrome "Trace Event Format" JSON object (``{"traceEvents": [...]}``), which
ui.perfetto.dev and chrome://tracing open directly. Reference: Google, "Trace Event Format",
https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU (phases
``X`` complete, ``C`` counter, ``M`` metadata; ``ts``/``dur`` in microseconds).

Layout of the trace:

* one process per simulated GPU, named ``"GPU 17 (stage 3)"`` and sorted by GPU index (pid =
  GPU index + 1, see :data:`PID_OFFSET`);
* one thread (track) per stream of that GPU: compute, tp, dp, pp (then any other, by name);
  ops that overlap on one stream go to extra "(overlap N)" tracks under it, since viewers
  would otherwise draw one as nested inside the other;
* one ``X`` slice per event row, with ``args`` bytes, flops, layer, microbatch, coalesced and
  parts, and a communication row's ``dim`` (the layout dimension(s) of its group, as the
  engine recorded it). A coalesced row (``coalesced > 1``) gets its sub-ops as child slices
  nested inside it (a collective's with its ``dim``),
  laid back to back from ``start_s`` with the durations in ``parts``, so the trace shows what
  one row stands for (see :func:`_children` for parts that do not add up to the row);
* per GPU, counter tracks of memory in GiB from the memory table (total and by category);
* optionally a "Network" process with one utilisation counter track per link (``link_series``:
  columns ``link``, ``t_s``, ``utilization``), or, with only the links table, the step-average
  utilisation of the busiest links; either way a link's counter is named by the link and has
  one series, ``utilization`` (:data:`UTILIZATION`).

Units: times in microseconds (the format's), memory in GiB (2^30 bytes, as ``memory_gib`` in
the summary; the counters' names say so), utilisation as a fraction 0..1.

Times are converted to integer nanoseconds before anything is laid out, so nested slices never
poke out of their parent by a rounding error, and written as microseconds with 3 decimals.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd

from simulator.engine.records import parse_parts
from simulator.report.io import write_json_atomic

GIB = float(1 << 30)

#: Track order and names of the known streams; others follow, sorted by name.
STREAM_ORDER = ("compute", "tp", "dp", "gather", "edp", "egather", "pp")
STREAM_TITLES = {
    "compute": "compute",
    "tp": "TP comm",
    "dp": "DP comm",
    "gather": "ZeRO gather",
    "edp": "expert DP comm",
    "egather": "expert ZeRO gather",
    "pp": "PP send/recv",
}

#: Trace pid of GPU g is g + PID_OFFSET: Perfetto treats pid 0 as the Linux idle task
#: ("swapper") and asks synthetic traces to start at 1 (google/perfetto issues #394, #560).
PID_OFFSET = 1

#: Thread ids of a stream's overflow lanes: tid + LANE_TID_STRIDE * lane.
LANE_TID_STRIDE = 1000

#: Memory categories of the memory table, in counter order.
MEMORY_KINDS = ("weights", "gradients", "optimizer", "activations", "zero_params")

#: The one series of a link's counter (busy fraction, 0..1). A counter is named by its link
#: alone: viewers name a counter track "<name> <series>" ("node0-nic0-leaf0 utilization"),
#: the same whether the utilisation is over time or a step average (the process says which).
UTILIZATION = "utilization"

#: How many links get a counter track when only the links table is given.
DEFAULT_TOP_LINKS = 8


def gpu_pid(gpu: int) -> int:
    """Trace process id of a GPU (see :data:`PID_OFFSET`)."""
    return int(gpu) + PID_OFFSET


def _ns(seconds: float) -> int:
    return int(round(float(seconds) * 1e9))


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def assign_lanes(starts, ends) -> list[int]:
    """Lane of each op of one stream (given in start order) so that no two ops of a lane overlap.

    A stream runs its ops one after another, but the engine may record ops that overlap on one
    stream (several collectives in flight, a send and a receive at once). Trace viewers nest
    slices of one track by containment, so an overlap would draw one op as part of another;
    instead each op goes to the first lane that is free at its start (greedy interval
    partitioning, which uses the fewest lanes for ops sorted by start).
    """
    lane_end: list[int] = []
    out: list[int] = []
    for s, e in zip(starts, ends, strict=True):
        s_ns, e_ns = _ns(s), max(_ns(s), _ns(e))
        for i, end in enumerate(lane_end):
            if end <= s_ns:
                lane_end[i] = e_ns
                out.append(i)
                break
        else:
            lane_end.append(e_ns)
            out.append(len(lane_end) - 1)
    return out


def _stream_tids(streams: list[str]) -> dict[str, int]:
    known = [s for s in STREAM_ORDER if s in streams]
    other = sorted(s for s in set(streams) if s not in STREAM_ORDER)
    return {s: i + 1 for i, s in enumerate(known + other)}


def _num(value: Any) -> Any:
    """Plain Python number for args (ints stay ints, NaN becomes None)."""
    if value is None:
        return None
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    if isinstance(value, (int, bool)) or (hasattr(value, "dtype") and value.dtype.kind in "iub"):
        return int(value)
    f = float(value)
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


def _meta(kind: str, pid: int, tid: int | None = None, **args: Any) -> dict:
    """A metadata (``M``) event: ``process_name``, ``thread_sort_index``, ..."""
    ev: dict[str, Any] = {"name": kind, "ph": "M", "pid": pid}
    if tid is not None:
        ev["tid"] = tid
    ev["args"] = args
    return ev


def _slices(row: Any, pid: int, tid: int) -> list[dict]:
    """The X event of one row, followed by its sub-op children when it is coalesced."""
    start = _ns(row.start_s)
    end = max(start, _ns(row.end_s))
    parts = parse_parts(row.parts) if int(row.coalesced) > 1 else []
    args = {
        "kind": row.kind,
        "proc": row.proc,
        "bytes": _num(row.bytes),
        "flops": _num(row.flops),
        "layer": _num(row.layer),
        "microbatch": _num(row.microbatch),
        "coalesced": _num(row.coalesced),
    }
    dim = getattr(row, "dim", "")
    if isinstance(dim, str) and dim:
        args["dim"] = dim
    if isinstance(row.parts, str) and row.parts:
        args["parts"] = row.parts
    out = [
        {
            "name": row.name,
            "cat": row.kind,
            "ph": "X",
            "pid": pid,
            "tid": tid,
            "ts": _us(start),
            "dur": _us(end - start),
            "args": args,
        }
    ]
    out.extend(_children(row.name, row.kind, pid, tid, start, end, parts))
    return out


def _children(
    parent: str, kind: str, pid: int, tid: int, start: int, end: int, parts: list
) -> list[dict]:
    """Child slices of a coalesced row: its parts back to back from the row's start (ns).

    The parts' nominal durations need not add up to the row: a straggler's slowdown, a TP
    collective that waited on the network (full detail), or one that overlapped the next kernel
    (Megatron's overlapped input-gradient all-reduce). Within a rounding tolerance the last
    part absorbs the difference; when the parts fall short, a ``(not in parts)`` child covers
    the rest of the row; when they overrun it, all are scaled down to fit and say so in their
    args. Either way the children tile the parent exactly, so every viewer nests them.
    """
    if not parts:
        return []
    total = sum(q.dur_s for q in parts)
    span = end - start
    tol = max(2 * len(parts), int(span * 1e-6))
    gap = span - _ns(total)
    scale = 1.0
    if gap < -tol and total > 0:
        scale = span / (total * 1e9)
    items = [(name, dur, dict(dur_s=dur, dim=dim) if dim else dict(dur_s=dur))
             for name, dur, dim in parts]
    if gap > tol:
        note = "row time not covered by its parts (waiting, or slowed down)"
        items.append(("(not in parts)", gap / 1e9, dict(dur_s=gap / 1e9, note=note)))
    out = []
    cum = 0.0
    t0 = start
    for i, (name, dur, extra) in enumerate(items):
        cum += dur * scale
        t1 = end if i == len(items) - 1 else min(end, start + _ns(cum))
        args = {"part_of": parent, "part": i, **extra}
        if scale != 1.0:
            args["scaled_by"] = round(scale, 9)
        out.append(
            {
                "name": name,
                "cat": kind,
                "ph": "X",
                "pid": pid,
                "tid": tid,
                "ts": _us(t0),
                "dur": _us(t1 - t0),
                "args": args,
            }
        )
        t0 = t1
    return out


def _memory_counters(memory: pd.DataFrame) -> list[dict]:
    """``C`` events per GPU: total memory and memory by category, in GiB."""
    out: list[dict] = []
    if memory is None or memory.empty:
        return out
    mem = memory.reset_index(drop=True)
    mem = mem.assign(_order=range(len(mem))).sort_values(["gpu", "t_s", "_order"], kind="stable")
    for gpu, g in mem.groupby("gpu", sort=True):
        pid = gpu_pid(gpu)
        kinds = [k for k in MEMORY_KINDS if k in set(g["what"])]
        kinds += sorted(set(g["what"]) - set(MEMORY_KINDS))
        level = dict.fromkeys(kinds, 0.0)
        # Only the last change at each instant is a level the GPU actually held.
        last: dict[int, tuple[float, dict[str, float]]] = {}
        for r in g.itertuples(index=False):
            level[r.what] += float(r.delta_bytes)
            last[_ns(r.t_s)] = (float(r.total_bytes), dict(level))
        for t in sorted(last):
            total, by_kind = last[t]
            ts = _us(t)
            out.append(
                {
                    "name": "HBM used (GiB)",
                    "ph": "C",
                    "pid": pid,
                    "ts": ts,
                    "args": {"total": round(total / GIB, 6)},
                }
            )
            out.append(
                {
                    "name": "HBM by kind (GiB)",
                    "ph": "C",
                    "pid": pid,
                    "ts": ts,
                    "args": {k: round(by_kind[k] / GIB, 6) for k in kinds},
                }
            )
    return out


def _link_counters(
    links: pd.DataFrame | None,
    link_series: pd.DataFrame | None,
    pid: int,
    t_end_ns: int,
    top: int,
) -> list[dict]:
    """``C`` events of link utilisation on the network process."""
    out: list[dict] = []
    if link_series is not None and not link_series.empty:
        ls = link_series.reset_index(drop=True)
        ls = ls.assign(_order=range(len(ls))).sort_values(["link", "t_s", "_order"], kind="stable")
        for link, g in ls.groupby("link", sort=True):
            last: dict[int, float] = {}
            for r in g.itertuples(index=False):
                last[_ns(r.t_s)] = float(r.utilization)
            for t in sorted(last):
                out.append(
                    {
                        "name": link,
                        "ph": "C",
                        "pid": pid,
                        "ts": _us(t),
                        "args": {UTILIZATION: round(last[t], 6)},
                    }
                )
    elif links is not None and not links.empty:
        busiest = links.sort_values(["utilization", "link"], ascending=[False, True]).head(top)
        for r in busiest.itertuples(index=False):
            for t, u in ((0, float(r.utilization)), (t_end_ns, 0.0)):
                out.append(
                    {
                        "name": r.link,
                        "ph": "C",
                        "pid": pid,
                        "ts": _us(t),
                        "args": {UTILIZATION: round(u, 6)},
                    }
                )
    return out


def perfetto_trace(
    events: pd.DataFrame,
    memory: pd.DataFrame | None,
    links: pd.DataFrame | None = None,
    *,
    link_series: pd.DataFrame | None = None,
    top_links: int = DEFAULT_TOP_LINKS,
) -> dict:
    """Build the Chrome trace-event JSON object of one simulated step.

    ``events``, ``memory`` and ``links`` have the columns of
    :mod:`simulator.engine.records`; ``link_series`` (columns ``link``, ``t_s``,
    ``utilization``) gives utilisation over time of the links worth showing. Without it, the
    ``top_links`` busiest links of ``links`` get a flat step-average track. The result is
    deterministic for identical input and can be written with :func:`write_trace`.
    """
    ev = events.reset_index(drop=True)
    ev = ev.assign(_order=range(len(ev)))
    trace: list[dict] = []

    gpus: dict[int, int] = {}  # gpu -> stage
    for gpu, g in ev.groupby("gpu", sort=True):
        gpus[int(gpu)] = int(g["stage"].min())
    if memory is not None and not memory.empty:
        for gpu in sorted(set(int(x) for x in memory["gpu"])):
            gpus.setdefault(gpu, -1)

    slices: list[dict] = []
    for gpu, stage in sorted(gpus.items()):
        pid = gpu_pid(gpu)
        label = f"GPU {gpu} (stage {stage})" if stage >= 0 else f"GPU {gpu}"
        trace.append(_meta("process_name", pid, name=label))
        trace.append(_meta("process_sort_index", pid, sort_index=pid))
        g = ev[ev["gpu"] == gpu]
        if g.empty:
            continue
        procs = sorted(set(g["proc"]))
        trace.append(_meta("process_labels", pid, labels=",".join(procs)))
        tids = _stream_tids(list(g["stream"].unique()))
        g = g.sort_values(
            ["start_s", "end_s", "name", "kind", "_order"],
            ascending=[True, False, True, True, True],
            kind="stable",
        )
        for stream, tid in tids.items():
            rows = g[g["stream"] == stream]
            lanes = assign_lanes(rows["start_s"].to_numpy(), rows["end_s"].to_numpy())
            title = STREAM_TITLES.get(stream, stream)
            for lane in range(max(lanes, default=0) + 1):
                lane_tid = tid + LANE_TID_STRIDE * lane
                name = title if lane == 0 else f"{title} (overlap {lane})"
                trace.append(_meta("thread_name", pid, lane_tid, name=name))
                trace.append(_meta("thread_sort_index", pid, lane_tid, sort_index=tid * 100 + lane))
            for row, lane in zip(rows.itertuples(index=False), lanes, strict=True):
                slices.extend(_slices(row, pid, tid + LANE_TID_STRIDE * lane))

    trace.extend(slices)
    trace.extend(_memory_counters(memory))

    t_end = _ns(ev["end_s"].max()) if not ev.empty else 0
    net_pid = gpu_pid(max(gpus) + 1) if gpus else PID_OFFSET
    counters = _link_counters(links, link_series, net_pid, t_end, top_links)
    if counters:
        over = "over time" if link_series is not None and not link_series.empty else "step average"
        trace.append(_meta("process_name", net_pid, name=f"Network (busiest links, {over})"))
        trace.append(_meta("process_sort_index", net_pid, sort_index=net_pid))
        trace.extend(counters)

    other: dict[str, Any] = {"generator": "simulator", "time_unit": "us"}
    if links is not None and not links.empty:
        busiest = links.sort_values(["utilization", "link"], ascending=[False, True]).head(
            top_links
        )
        other["busiest_links"] = [
            {
                "link": str(r.link),
                "kind": str(r.kind),
                "utilization": _num(r.utilization),
                "bytes": _num(r.bytes),
            }
            for r in busiest.itertuples(index=False)
        ]
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": other}


def write_trace(
    path: str | os.PathLike,
    events: pd.DataFrame,
    memory: pd.DataFrame | None,
    links: pd.DataFrame | None = None,
    link_series: pd.DataFrame | None = None,
) -> None:
    """Write :func:`perfetto_trace` to ``path`` as compact JSON, atomically."""
    write_json_atomic(
        path,
        perfetto_trace(events, memory, links, link_series=link_series),
        indent=None,
        convert=False,
    )
