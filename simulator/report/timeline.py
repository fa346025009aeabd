"""The timeline of one simulated step: a row per pipeline stage, drawn as a person sketches it.

Each stage is shown by its representative GPU (the lowest GPU index of the stage): a compute
row coloured by kind with micro-batch numbers in the blocks, thin rows under it for the
communication streams (TP, DP, PP), and the time the GPU does nothing hatched as the bubble.
Where the compute stream stalls while communication runs, a narrow band in the communication's
colour shows what it waits on, so exposed communication is visible on the critical path.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
from matplotlib.collections import LineCollection
from matplotlib.patches import Patch

from simulator.engine.records import BREAKDOWN_KEYS, COMM_DIMS, KIND_COLOURS, parse_parts
from simulator.report.figure import (
    DPI,
    IDLE_FACE,
    IDLE_HATCH_COLOUR,
    KIND_LABELS,
    KIND_ORDER,
    new_figure,
    save_png,
    styled,
    text_colour,
    time_unit,
)
from simulator.report.table import format_seconds, layout_text

TIMELINE_SIZE_PX = (1600, 900)
COMM_STREAMS = (*(d for d in COMM_DIMS if d != "pp"), "gather", "pp")
STREAM_LABELS = {
    **{d: short for d, (short, _, _) in COMM_DIMS.items()},
    "gather": "ZeRO",
    "edp": "expert DP",  # an MoE model's expert gradients (engine EXPERT_STREAMS)
    "egather": "expert ZeRO",
}
#: Kinds that are communication even when recorded on the compute stream.
COMM_KINDS = (*(f"{d}_comm" for d in COMM_DIMS), "zero_gather")


def stream_label(stream: str, rows: pd.DataFrame) -> str:
    """The name of a communication row: the stream's own (``TP``, ``DP``, ``ZeRO``...), or, when
    the engine recorded its collectives over a group of several layout dimensions (the gradient
    reduction and ZeRO gathers over ``cp+dp`` with context parallelism), those dimensions:
    ``CP+DP``, ``ZeRO CP+DP``."""
    base = STREAM_LABELS.get(stream, stream)
    if "dim" not in rows.columns:
        return base
    dims = sorted({d for d in rows["dim"] if isinstance(d, str) and "+" in d})
    if len(dims) != 1:
        return base
    joined = dims[0].upper()
    return joined if stream in COMM_DIMS else f"{base} {joined}"


def comm_rows_from_parts(events: pd.DataFrame) -> pd.DataFrame:
    """Rows of the communication streams (``tp``, ``cp``, ``ep``, ``etp``) for collectives
    that a folded run coalesced into its compute rows, placed at their offsets in the row, so
    that communication shows in the timeline in its own row and colour also where the run
    recorded it inside a layer's row (an MoE layer's all-to-alls: half of a Qwen3 step, drawn
    only in its last backward before). Each collective's dimension is the one the engine
    recorded in ``parts`` (``name@dim``)."""
    comp = events[(events["stream"] == "compute") & (events["parts"] != "")]
    rows = []
    for r in comp.itertuples(index=False):
        t = float(r.start_s)
        for name, dur, dim in parse_parts(r.parts):
            if dim and dur > 0:
                rows.append((r.gpu, r.stage, t, t + dur, dim, f"{dim}_comm"))
            if not name.startswith("~"):  # one beside the next kernel takes no time of its own
                t += dur
    out = pd.DataFrame(rows, columns=["gpu", "stage", "start_s", "end_s", "stream", "kind"])
    return out.assign(microbatch=-1, layer=-1)


def _density_row(
    ax, rows: pd.DataFrame, t_end: float, bins: int, scale: float, yc, h, kind: str = "tp_comm"
) -> None:
    """Fill a communication row bottom-up with the share of each time bin its events cover,
    in the colour of ``kind``."""
    edges = np.linspace(0.0, t_end, bins + 1)
    cover = np.zeros(bins)
    width = edges[1] - edges[0]
    for s0, e0 in zip(rows["start_s"].to_numpy(float), rows["end_s"].to_numpy(float), strict=True):
        i, j = int(s0 // width), min(bins - 1, int(e0 // width))
        for k in range(max(0, i), j + 1):
            cover[k] += max(0.0, min(e0, edges[k + 1]) - max(s0, edges[k]))
    frac = np.clip(cover / width, 0.0, 1.0)
    base = yc + h - 0.02
    ax.fill_between(edges[:-1] * scale, base - frac * (h - 0.04), base, step="post",
                    color=KIND_COLOURS[kind], linewidth=0, zorder=2)


def _representatives(events: pd.DataFrame) -> dict[int, int]:
    """stage -> the lowest GPU index seen on that stage."""
    return {int(s): int(g) for s, g in events.groupby("stage")["gpu"].min().items()}


#: Which communication a stalled compute stream is taken to wait on when several run at once:
#: TP first (it sits on the critical path), then DP / ZeRO, then pipeline transfers -- the
#: order in which :mod:`simulator.report.summary` charges idle compute time.
WAIT_PRIORITY = (*(f"{d}_comm" for d in COMM_DIMS if d not in ("dp", "pp")), "dp_comm",
                 "zero_gather", "pp_comm")  # fmt: skip


def _stall_segments(g: pd.DataFrame, t_end: float, min_w: float) -> dict[str, list]:
    """What one GPU's compute stream is doing when it is not computing.

    Splits ``[0, t_end]`` at every start and end of the GPU's events and classifies each piece
    with no compute op as waiting on a communication kind (the first of
    :data:`WAIT_PRIORITY` running then) or ``"idle"`` (nothing runs on any stream: the
    bubble). Returns ``{state: [(start, width), ...]}`` with pieces narrower than ``min_w``
    dropped.
    """
    starts = g["start_s"].to_numpy(dtype=float)
    ends = g["end_s"].to_numpy(dtype=float)
    bounds = np.unique(np.concatenate([[0.0, t_end], starts, ends]))
    bounds = bounds[(bounds >= 0) & (bounds <= t_end)]
    if len(bounds) < 2:
        return {}
    i0 = np.searchsorted(bounds, starts)
    i1 = np.searchsorted(bounds, ends)

    def coverage(mask: np.ndarray) -> np.ndarray:
        d = np.zeros(len(bounds) + 1)
        np.add.at(d, i0[mask], 1)
        np.add.at(d, i1[mask], -1)
        return np.cumsum(d)[: len(bounds) - 1] > 0

    kinds = g["kind"].to_numpy()
    state = np.full(len(bounds) - 1, "idle", dtype=object)
    state[coverage(g["stream"].to_numpy() == "compute")] = "compute"
    free = state == "idle"
    others = [k for k in sorted(set(kinds)) if k not in WAIT_PRIORITY]
    for kind in [*reversed(others), *reversed(WAIT_PRIORITY)]:
        mask = (kinds == kind) & (g["stream"].to_numpy() != "compute")
        if mask.any():
            state[free & coverage(mask)] = kind
    out: dict[str, list] = {}
    j = 0
    n = len(state)
    while j < n:
        k = j
        while k + 1 < n and state[k + 1] == state[j]:
            k += 1
        if state[j] != "compute" and bounds[k + 1] - bounds[j] >= min_w:
            out.setdefault(state[j], []).append((bounds[j], bounds[k + 1] - bounds[j]))
        j = k + 1
    return out


def _label_groups(rows: pd.DataFrame, join_gap: float) -> list[tuple]:
    """Consecutive compute rows of one (kind, micro-batch) merged into one block.

    Returns ``(kind, mb, start, end, run_start, run_end)`` per block, where the run is the
    widest stretch of the block without a gap longer than ``join_gap``: a label centred there
    sits on colour, not on a TP wait between two layers. Communication rows recorded on the
    compute stream neither start nor end a block, nor does a row of no micro-batch inside a
    block of its kind (a DP bucket's preparation between two layers of the last backward,
    which otherwise cut that backward into unlabelled slivers).
    """
    groups: list[list] = []
    for kind, mb, s, e in zip(
        rows["kind"], rows["microbatch"], rows["start_s"], rows["end_s"], strict=True
    ):
        if kind in COMM_KINDS:
            continue
        if mb < 0 and groups and groups[-1][0] == kind and groups[-1][1] >= 0:
            continue
        s, e = float(s), float(e)
        if groups and groups[-1][0] == kind and groups[-1][1] == mb and mb >= 0:
            g = groups[-1]
            g[3] = max(g[3], e)
            runs = g[4]
            if s - runs[-1][1] <= join_gap:
                runs[-1][1] = max(runs[-1][1], e)
            else:
                runs.append([s, e])
        else:
            groups.append([kind, int(mb), s, e, [[s, e]]])
    out = []
    for kind, mb, s, e, runs in groups:
        rs, re_ = max(runs, key=lambda r: r[1] - r[0])
        out.append((kind, mb, s, e, rs, re_))
    return out


def _breakdown_text(summary: dict) -> str:
    bd = summary.get("breakdown_s") or {}
    step = summary.get("step_time_s") or sum(bd.values()) or 1.0
    parts = [
        f"{KIND_LABELS.get(k, k)} {bd[k] / step:.0%}"
        for k in BREAKDOWN_KEYS
        if bd.get(k) and bd[k] / step >= 0.005
    ]
    return "exposed time: " + " · ".join(parts) if parts else ""


@styled
def plot_timeline(
    events: pd.DataFrame,
    summary: dict,
    path: str | os.PathLike,
    *,
    size_px: tuple[int, int] = TIMELINE_SIZE_PX,
) -> None:
    """Draw one simulated step, one row per pipeline stage, and write it to ``path`` (PNG).

    Each stage is drawn from its representative GPU (the lowest GPU index of the stage): a
    compute row coloured by kind (forward, backward, recompute, optimizer) with micro-batch
    numbers inside the blocks wide enough to hold them, and one thin row per communication
    stream (TP, DP, PP) under it. Time when the GPU runs nothing on any stream is the bubble,
    drawn as light hatched gaps. Ops narrower than a pixel are widened to one pixel so they
    stay visible.
    """
    width_px, height_px = size_px
    ev = events[events["end_s"] >= events["start_s"]]
    reps = _representatives(ev) if not ev.empty else {}
    stages = sorted(reps)
    ev = ev[ev["gpu"].isin(set(reps.values()))]
    if not ev.empty and "parts" in ev.columns:
        ev = pd.concat([ev, comm_rows_from_parts(ev)], ignore_index=True)
    t_end = float(summary.get("step_time_s") or 0.0)
    if not ev.empty:
        t_end = max(t_end, float(ev["end_s"].max()))
    t_end = t_end or 1.0
    scale, unit = time_unit(t_end)
    comm = [s for s in COMM_STREAMS if s in set(ev["stream"])]
    comm += sorted(set(ev["stream"]) - set(COMM_STREAMS) - {"compute"})

    # Vertical layout (data units, y grows downwards): compute row, comm rows, gap.
    n = max(1, len(stages))
    h_comp = 1.0
    h_comm = 0.26 if n <= 8 else 0.22
    gap = 0.45 if n <= 8 else 0.3
    block = h_comp + len(comm) * h_comm + gap

    fig = new_figure(width_px, height_px)
    left, right = 0.085, 0.985
    top = 1.0 - 86.0 / height_px
    bottom = 58.0 / height_px
    ax = fig.add_axes((left, bottom, right - left, top - bottom))
    ax_px = (right - left) * width_px
    x_max = t_end * scale * 1.01
    px = x_max / ax_px  # data units per pixel
    lane_px = (top - bottom) * height_px / (n * block)

    yticks, ylabels, minor_ticks, minor_labels = [], [], [], []
    seps: list[list[tuple[float, float]]] = []
    present = set()
    for i, stage in enumerate(stages):
        gpu = reps[stage]
        y0 = i * block
        g = ev[ev["gpu"] == gpu]
        # Bubble: nothing runs on any stream; waits: compute stalled while comm runs.
        comp = g[g["stream"] == "compute"].sort_values(["start_s", "end_s"], kind="stable")
        stalls = _stall_segments(g, t_end, min_w=px / scale)
        for state, segs in sorted(stalls.items()):
            segs = [(x * scale, w * scale) for x, w in segs]
            if state == "idle":
                ax.broken_barh(
                    segs,
                    (y0, h_comp),
                    facecolors=IDLE_FACE,
                    edgecolors=IDLE_HATCH_COLOUR,
                    hatch="////",
                    linewidth=0,
                    zorder=1,
                )
            else:
                ax.broken_barh(
                    segs,
                    (y0 + 0.3 * h_comp, 0.4 * h_comp),
                    facecolors=KIND_COLOURS.get(state, KIND_COLOURS["other"]),
                    linewidth=0,
                    zorder=1,
                )
                present.add("wait")
            present.add(state)
        for kind, kg in comp.groupby("kind", sort=True):
            s = kg["start_s"].to_numpy(dtype=float) * scale
            w = np.maximum((kg["end_s"].to_numpy(dtype=float) * scale) - s, px)
            colour = KIND_COLOURS.get(kind, KIND_COLOURS["other"])
            ax.broken_barh(
                list(zip(s, w, strict=True)), (y0, h_comp), facecolors=colour, linewidth=0, zorder=2
            )
            present.add(kind)
        fs_max = min(8.0, lane_px * h_comp * 0.55 * 72 / DPI)
        for kind, mb, s, _e, rs, re_ in _label_groups(comp, join_gap=2 * px / scale):
            if s > 0:
                seps.append([(s * scale, y0), (s * scale, y0 + h_comp)])
            if mb < 0:
                continue
            text = str(mb)
            # DejaVu Sans digits are 0.636 em wide; shrink the font to fit, down to 5.5 pt.
            room_px = (re_ - rs) * scale / px - 3
            fs = min(fs_max, room_px / (len(text) * 0.636 * DPI / 72))
            if fs >= 5.5:
                colour = KIND_COLOURS.get(kind, KIND_COLOURS["other"])
                ax.text(
                    (rs + re_) / 2 * scale,
                    y0 + h_comp / 2,
                    text,
                    ha="center",
                    va="center_baseline",
                    fontsize=round(fs * 2) / 2,
                    color=text_colour(colour),
                    zorder=4,
                )
        yticks.append(y0 + h_comp / 2)
        ylabels.append(f"stage {stage}\nGPU {gpu}" if n <= 16 else f"stage {stage}")
        for j, stream in enumerate(comm):
            yc = y0 + h_comp + j * h_comm
            ax.broken_barh(
                [(0, t_end * scale)], (yc + 0.02, h_comm - 0.04), facecolors="#FAFAFA", zorder=0
            )
            sg = g[g["stream"] == stream]
            label = stream_label(stream, sg)
            if stream in ("tp", "cp", "ep", "etp") and len(sg) > ax_px / 4:
                # Many collectives narrower than a pixel: draw the share of each 2-pixel column
                # they occupy (a solid row would claim the whole time).
                _density_row(ax, sg, t_end, int(ax_px / 2), scale, yc, h_comm, f"{stream}_comm")
                present.add(f"{stream}_comm")
                sg = sg.iloc[:0]
            for kind, kg in sg.groupby("kind", sort=True):
                s = kg["start_s"].to_numpy(dtype=float) * scale
                w = np.maximum(kg["end_s"].to_numpy(dtype=float) * scale - s, px)
                colour = KIND_COLOURS.get(kind, KIND_COLOURS["other"])
                ax.broken_barh(
                    list(zip(s, w, strict=True)),
                    (yc + 0.02, h_comm - 0.04),
                    facecolors=colour,
                    linewidth=0,
                    zorder=2,
                )
                present.add(kind)
            if n <= 8:
                minor_ticks.append(yc + h_comm / 2)
                minor_labels.append(label)
    if seps:
        ax.add_collection(LineCollection(seps, colors="white", linewidths=0.7, zorder=3))

    ax.set_xlim(0, x_max)
    ax.set_ylim(n * block - gap + 0.05, -0.05)
    ax.set_yticks(yticks, ylabels, fontsize=9 if n <= 8 else max(6, 9 - n // 8))
    if minor_ticks:
        ax.set_yticks(minor_ticks, minor_labels, minor=True, fontsize=6.5, color="#555555")
        ax.tick_params(axis="y", which="minor", length=0, pad=2)
    ax.tick_params(axis="y", which="major", length=0)
    ax.spines["left"].set_visible(False)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6, zorder=-1)
    ax.set_axisbelow(True)
    ax.axvline(t_end * scale, color="#333333", linewidth=0.8, linestyle="--", zorder=5)

    name = summary.get("name", "step")
    mfu = summary.get("mfu")
    title = f"{name}: one training step takes {format_seconds(t_end)}"
    if mfu is not None and np.isfinite(mfu):
        title += f", MFU {mfu:.1%}"
    fig.text(0.01, 1 - 10 / height_px, title, fontsize=14, weight="bold", va="top")
    sub = " | ".join(t for t in (layout_text(summary), _breakdown_text(summary)) if t)
    if sub:
        t = fig.text(0.01, 1 - 34 / height_px, sub, fontsize=9.5, va="top", color="#333333")
        # a long layout and breakdown (an MoE run) shrinks to the figure's width, not cut off
        # (measured again at each size: hinted glyphs do not scale in proportion)
        renderer, fs = fig.canvas.get_renderer(), 9.5
        while fs > 6.0 and t.get_window_extent(renderer=renderer).x1 > width_px - 8:
            fs -= 0.5
            t.set_fontsize(fs)

    handles = [
        Patch(facecolor=KIND_COLOURS[k], label=KIND_LABELS[k]) for k in KIND_ORDER if k in present
    ]
    if "idle" in present:
        handles.append(
            Patch(
                facecolor=IDLE_FACE,
                edgecolor=IDLE_HATCH_COLOUR,
                hatch="////",
                label="idle (bubble)",
            )
        )
    notes = []
    if "wait" in present:
        notes.append("narrow band in a compute row = compute waiting on that communication")
    if comm and n > 8:
        notes.append(
            "thin rows under each stage: " + ", ".join(STREAM_LABELS.get(s, s) for s in comm)
        )
    extra = "\n".join(notes)
    if handles:
        fig.legend(
            handles=handles,
            loc="lower left",
            bbox_to_anchor=(left, top + 4 / height_px),
            ncol=len(handles),
            frameon=False,
            fontsize=9,
            handlelength=1.6,
            columnspacing=1.2,
        )
    if extra:
        fig.text(
            right, top + 6 / height_px, extra, fontsize=8, ha="right", va="bottom", color="#555555"
        )
    save_png(fig, path)
