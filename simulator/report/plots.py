"""Plots of a comparison and of a sweep, and (re-exported) the timeline of one step.

* :func:`plot_timeline` -- one step as a person would sketch it (:mod:`.timeline`).
* :func:`plot_compare` -- one stacked bar of the step-time breakdown per configuration.
* :func:`plot_sweep` -- a metric against the swept keys (line, heat map or small multiples).

All colours come from :data:`simulator.engine.records.KIND_COLOURS` (Okabe-Ito, colour-blind
safe), so the timeline, the compare bars and the tables agree. Files are written atomically
with no version or date metadata (:func:`simulator.report.figure.save_png`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from simulator.engine.records import BREAKDOWN_KEYS, KIND_COLOURS
from simulator.report.figure import (
    DPI,
    KIND_LABELS,
    LINE_COLOURS,
    new_figure,
    save_png,
    styled,
    text_colour,
    time_unit,
)
from simulator.report.table import format_seconds, format_value, lower_is_better, metric_label
from simulator.report.timeline import plot_timeline

__all__ = ["plot_compare", "plot_sweep", "plot_timeline"]


def _metric_scale(metric: str) -> float:
    return 100.0 if metric == "mfu" else 1.0


def compact(v: float) -> str:
    """A tick label with k / M / G instead of an offset or scientific notation."""
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div * 10 or (a >= div and suffix != "k"):
            return f"{v / div:.4g}{suffix}"
    return f"{v:.4g}"


#: Axis formatter of :func:`compact` labels.
COMPACT = FuncFormatter(lambda v, _pos: compact(v))


# --------------------------------------------------------------------------------------------
# Compare


def throughput_change(first: dict, other: dict) -> float:
    """Change of throughput of ``other`` against ``first`` (+1.0 = twice the tokens/s): from
    ``tokens_per_s``, or from step times (the same tokens per step) when it is missing."""
    a, b = first.get("tokens_per_s"), other.get("tokens_per_s")
    if a and b and np.isfinite(a) and np.isfinite(b):
        return float(b) / float(a) - 1
    return float(first["step_time_s"]) / float(other["step_time_s"]) - 1


def _compare_note(rows: Sequence[dict], labels: Sequence[str], totals: Sequence[float],
                  i: int) -> list[tuple[str, dict]]:
    """The annotation right of bar ``i``: (text, text keywords) per line -- step time and MFU,
    the change of tokens/s against the first bar, whether it fits in memory."""
    if totals[i] <= 0:
        return [("no result", {"fontsize": 10, "color": "#C00000"})]
    r = rows[i]
    note = format_seconds(totals[i])
    mfu = r.get("mfu")
    if mfu is not None and np.isfinite(mfu):
        note += f"  ·  MFU {mfu:.1%}"
    lines = [(note, {"fontsize": 10, "weight": "bold"})]
    if i > 0 and totals[0] > 0:
        change = throughput_change(rows[0], r)
        colour = "#00734F" if change > 0.005 else ("#B03A00" if change < -0.005 else "#555555")
        lines.append((f"{change:+.1%} tokens/s vs {_short(labels[0], 20)}",
                      {"fontsize": 8.5, "color": colour}))
    if r.get("fits") is False:
        lines.append(("does not fit in GPU memory",
                      {"fontsize": 8.5, "color": "#C00000", "weight": "bold"}))
    return lines


def _text_px(fig, text: str, **kw) -> float:
    """Width in pixels of ``text`` drawn on ``fig`` with keywords ``kw`` (measured by the
    figure's renderer, then removed)."""
    t = fig.text(0, 0, text, **kw)
    try:
        return float(t.get_window_extent(renderer=fig.canvas.get_renderer()).width)
    finally:
        t.remove()


@styled
def plot_compare(
    rows: Sequence[dict], labels: Sequence[str], path: str | os.PathLike, *, title: str
) -> None:
    """One horizontal stacked bar per configuration, split into the ``breakdown_s`` parts.

    Bars are in the given order, top to bottom; each is annotated with its step time, MFU and
    change against the first configuration, and segments wide enough carry their share of the
    step. A configuration that does not fit in memory is flagged in red.
    """
    if len(rows) != len(labels):
        raise ValueError(f"{len(rows)} summaries but {len(labels)} labels")
    n = len(rows)
    bar_px = 46
    height_px = int(150 + n * (bar_px + 22))
    width_px = 1400
    fig = new_figure(width_px, height_px)
    totals = [
        float(r.get("step_time_s") or sum((r.get("breakdown_s") or {}).values())) for r in rows
    ]
    notes = [_compare_note(rows, labels, totals, i) for i in range(n)]
    # the labels and annotations as drawn, measured, so that none is clipped at either edge
    label_w = max((_text_px(fig, lbl, fontsize=10) for lbl in labels), default=40.0)
    left = min(0.4, max(0.08, (label_w + 24) / width_px))
    right = 0.985
    top = 1 - 80 / height_px
    bottom = 48 / height_px
    ax = fig.add_axes((left, bottom, right - left, top - bottom))
    t_max = max(totals) if totals and max(totals) > 0 else 1.0
    scale, unit = time_unit(t_max)
    axis_px = (right - left) * width_px
    gap_px = 8  # between a bar's end and its annotation
    x_max = t_max * scale
    for r, total, lines in zip(rows, totals, notes, strict=True):
        end = max(total, sum(max(float(v or 0.0), 0.0)
                             for v in (r.get("breakdown_s") or {}).values()))
        note_w = max(_text_px(fig, text, **kw) for text, kw in lines) + gap_px + 6
        room = max(axis_px - note_w, 0.3 * axis_px)  # the bar's end must leave note_w
        x_max = max(x_max, end * scale * axis_px / room)
    px = x_max / axis_px
    present = []
    for i, r in enumerate(rows):
        bd = r.get("breakdown_s") or {}
        x = 0.0
        for key in BREAKDOWN_KEYS:
            v = float(bd.get(key) or 0.0) * scale
            if v <= 0:
                continue
            colour = KIND_COLOURS.get(key, KIND_COLOURS["other"])
            hatch = "////" if key == "pp_bubble" else None
            ax.barh(
                i,
                v,
                left=x,
                height=0.62,
                color=colour,
                edgecolor="white",
                linewidth=0.8,
                hatch=hatch,
                zorder=2,
            )
            if key not in present:
                present.append(key)
            share = v / (totals[i] * scale) if totals[i] > 0 else 0
            text = f"{share:.0%}"
            if v / px >= len(text) * 7 + 6:
                ax.text(
                    x + v / 2,
                    i,
                    text,
                    ha="center",
                    va="center",
                    fontsize=8.5,
                    color=text_colour(colour),
                    zorder=3,
                )
            x += v
        x_note = x + gap_px * px
        lines = notes[i]
        offsets = {1: [0.0], 2: [-0.13, 0.17], 3: [-0.22, 0.06, 0.32]}[len(lines)]
        for (text, kw), dy in zip(lines, offsets, strict=True):
            ax.text(x_note, i + dy, text, va="center", zorder=3, clip_on=False, **kw)
    ax.set_yticks(range(n), labels, fontsize=10)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, x_max)
    ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= t_max * scale * 1.001])
    ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= t_max * scale * 1.001])
    ax.set_xlabel(f"step time ({unit}), split into exposed time on the critical path")
    ax.grid(axis="x", color="#DDDDDD", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", length=0)
    fig.text(0.01, 1 - 10 / height_px, title, fontsize=14, weight="bold", va="top")
    handles = [
        Patch(
            facecolor=KIND_COLOURS[k],
            edgecolor="white",
            hatch="////" if k == "pp_bubble" else None,
            label=KIND_LABELS[k],
        )
        for k in BREAKDOWN_KEYS
        if k in present
    ]
    fig.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(left, top + 6 / height_px),
        ncol=len(handles) or 1,
        frameon=False,
        fontsize=9,
        handlelength=1.6,
        columnspacing=1.2,
    )
    save_png(fig, path)


# --------------------------------------------------------------------------------------------
# Sweep


def _failed_mask(df: pd.DataFrame, metric: str) -> pd.Series:
    bad = ~np.isfinite(pd.to_numeric(df[metric], errors="coerce").astype(float))
    if "status" in df.columns:
        bad = bad | (df["status"].astype(str) != "ok")
    return bad


def _reason(row: pd.Series) -> str:
    for col in ("reason", "error", "message", "warning"):
        if col in row.index and isinstance(row[col], str) and row[col]:
            return row[col]
    status = row.get("status")
    return str(status) if isinstance(status, str) and status != "ok" else "failed"


def _short(text: str, n: int = 28) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _axis_values(values: Sequence) -> tuple[list, bool]:
    """Sorted distinct values of a key and whether they are numeric."""
    uniq = list(dict.fromkeys(values))
    try:
        nums = [float(v) for v in uniq]
    except (TypeError, ValueError):
        return uniq, False
    order = np.argsort(nums, kind="stable")
    return [uniq[i] for i in order], True


def _key_label(key: str) -> str:
    return key.split(".")[-1].replace("_", " ") if "." in key else key.replace("_", " ")


def _line_panel(ax, df, x_key, hue_key, metric, bad, y_fail, *, legend=True):
    """Metric against ``x_key`` (one line per value of ``hue_key``) with failures marked.

    Failed points are drawn as red crosses at height ``y_fail`` (under the data) with their
    reason; with a single line the values are written above the points and the best is ringed.
    """
    xs, numeric = _axis_values(df[x_key].tolist())
    pos = {v: (float(v) if numeric else i) for i, v in enumerate(xs)}
    geometric = numeric and min(pos.values()) > 0 and max(pos.values()) / min(pos.values()) >= 4
    hues = _axis_values(df[hue_key].tolist())[0] if hue_key else [None]
    sc = _metric_scale(metric)
    for j, h in enumerate(hues):
        sub = df if h is None else df[df[hue_key] == h]
        sub_bad = bad.loc[sub.index]
        if len(hues) <= len(LINE_COLOURS):
            colour = LINE_COLOURS[j]
        else:
            colour = plt.get_cmap("viridis")(0.05 + 0.85 * j / max(1, len(hues) - 1))
        ok = sub[~sub_bad.to_numpy()]
        ok = ok.assign(_x=[pos[v] for v in ok[x_key]]).sort_values("_x", kind="stable")
        y = pd.to_numeric(ok[metric]).astype(float).to_numpy() * sc
        label = None if h is None else str(h)
        # Points of a categorical key have no order between them: markers, not a line.
        ax.plot(ok["_x"], y, marker="o", color=colour, label=label, linewidth=1.8, markersize=5,
                linestyle="-" if numeric else "none")
        if len(hues) == 1 and len(ok):
            for xv, yv in zip(ok["_x"], y, strict=True):
                ax.annotate(
                    format_value(yv / sc, metric),
                    (xv, yv),
                    textcoords="offset points",
                    xytext=(0, 9),
                    ha="center",
                    fontsize=8.5,
                    color=colour,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
                )
            k = int(np.argmin(y) if lower_is_better(metric) else np.argmax(y))
            ax.plot(
                ok["_x"].iloc[k],
                y[k],
                marker="o",
                markersize=15,
                markerfacecolor="none",
                markeredgecolor="black",
                markeredgewidth=1.5,
            )
            ax.annotate(
                "best",
                (ok["_x"].iloc[k], y[k]),
                textcoords="offset points",
                xytext=(0, -20),
                ha="center",
                fontsize=8.5,
                weight="bold",
            )
        for n_at, idx in enumerate(sub.index[sub_bad.to_numpy()]):
            r = df.loc[idx]
            xv = pos[r[x_key]]
            ax.plot(xv, y_fail, marker="x", color="#C00000", markersize=9, mew=2)
            text = _short(_reason(r), 32)
            if h is not None:
                text = f"{_key_label(hue_key)} {h}: {text}"
            # Keep the reason inside the panel: left-aligned at the first x, right at the last.
            ha = "left" if r[x_key] == xs[0] else ("right" if r[x_key] == xs[-1] else "center")
            # Reasons at the same x are stacked (one line per hue), never drawn over each other.
            ax.annotate(
                text,
                (xv, y_fail),
                textcoords="offset points",
                xytext=(0, -14 - 11 * (j if h is not None else n_at % 3)),
                ha=ha,
                fontsize=8,
                color="#C00000",
            )
    if geometric:
        ax.set_xscale("log", base=2)
        ax.minorticks_off()
    ax.set_xticks([pos[v] for v in xs], [str(v) for v in xs])
    _no_overlap(ax, [str(v) for v in xs])
    if not numeric:
        ax.set_xlim(-0.5, len(xs) - 0.5)
    if metric != "mfu":
        ax.yaxis.set_major_formatter(COMPACT)
    ax.set_xlabel(x_key)
    ax.set_ylabel(metric_label(metric))
    ax.grid(color="#E5E5E5", linewidth=0.6)
    ax.spines[["top", "right"]].set_visible(False)
    if legend and hue_key and len(hues) > 1:
        ax.legend(fontsize=8.5, frameon=False, title=_key_label(hue_key), title_fontsize=8.5)


def _no_overlap(ax, labels: Sequence[str]) -> None:
    """Rotate x tick labels that would not fit side by side (about 7 px a character)."""
    width_px = ax.get_position().width * ax.figure.get_figwidth() * ax.figure.dpi
    if labels and sum(len(t) * 7 + 12 for t in labels) > width_px:
        ax.tick_params(axis="x", labelrotation=30)
        for t in ax.get_xticklabels():
            t.set_horizontalalignment("right")


def _fail_height(df: pd.DataFrame, metric: str, bad: pd.Series) -> tuple[float, tuple]:
    """Height for failed-point markers (under the data) and the y limits that show them."""
    sc = _metric_scale(metric)
    good = pd.to_numeric(df.loc[~bad.to_numpy(), metric], errors="coerce").astype(float) * sc
    lo = float(good.min()) if len(good) else 0.0
    hi = float(good.max()) if len(good) else 1.0
    span = (hi - lo) or abs(hi) or 1.0
    y_fail = lo - 0.12 * span
    top = hi + 0.12 * span
    bottom = y_fail - 0.14 * span if bad.any() else lo - 0.08 * span
    return y_fail, (bottom, top)


def _heatmap(ax, df, keys, metric, bad):
    """Heat map of ``metric`` over two keys, values in cells, failures hatched with reason."""
    xs, _ = _axis_values(df[keys[0]].tolist())
    ys, _ = _axis_values(df[keys[1]].tolist())
    sc = _metric_scale(metric)
    grid = np.full((len(ys), len(xs)), np.nan)
    reasons: dict[tuple[int, int], str] = {}
    for idx, r in df.iterrows():
        i, j = ys.index(r[keys[1]]), xs.index(r[keys[0]])
        if bad.loc[idx]:
            reasons[(i, j)] = _reason(r)
        else:
            grid[i, j] = float(r[metric]) * sc
    cmap = plt.get_cmap("viridis_r" if lower_is_better(metric) else "viridis").copy()
    finite = grid[np.isfinite(grid)]
    vmin, vmax = (finite.min(), finite.max()) if finite.size else (0, 1)
    if vmin == vmax:
        vmin, vmax = vmin - 1, vmax + 1
    im = ax.imshow(
        np.ma.masked_invalid(grid),
        cmap=cmap,
        vmin=vmin,
        vmax=vmax,
        aspect="auto",
        origin="lower",
    )
    best = None
    if finite.size:
        flat = np.where(np.isfinite(grid), grid, np.inf if lower_is_better(metric) else -np.inf)
        best = np.unravel_index(
            np.argmin(flat) if lower_is_better(metric) else np.argmax(flat), grid.shape
        )
    fs = 10 if len(xs) * len(ys) <= 30 else 8
    for i in range(len(ys)):
        for j in range(len(xs)):
            if (i, j) in reasons:
                ax.add_patch(
                    plt.Rectangle(
                        (j - 0.5, i - 0.5),
                        1,
                        1,
                        facecolor="#F4F4F4",
                        edgecolor="#C00000",
                        hatch="xx",
                        linewidth=0,
                        alpha=0.9,
                    )
                )
                ax.text(
                    j,
                    i,
                    "✗ " + _short(reasons[(i, j)], 22),
                    ha="center",
                    va="center",
                    fontsize=fs - 1,
                    color="#C00000",
                    weight="bold",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1.5, "alpha": 0.85},
                )
            elif np.isfinite(grid[i, j]):
                value = format_value(grid[i, j] / sc, metric)
                face = cmap((grid[i, j] - vmin) / (vmax - vmin))
                is_best = best is not None and (i, j) == tuple(best)
                ax.text(
                    j,
                    i,
                    value + ("\nbest" if is_best else ""),
                    ha="center",
                    va="center",
                    fontsize=fs,
                    color=text_colour(face),
                    weight="bold" if is_best else None,
                )
                if is_best:
                    ax.add_patch(
                        plt.Rectangle(
                            (j - 0.48, i - 0.48),
                            0.96,
                            0.96,
                            fill=False,
                            edgecolor="black",
                            linewidth=2.0,
                        )
                    )
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    _no_overlap(ax, [str(v) for v in xs])
    ax.set_yticks(range(len(ys)), [str(v) for v in ys])
    ax.set_xlabel(keys[0])
    ax.set_ylabel(keys[1])
    ax.tick_params(length=0)
    for sp in ax.spines.values():
        sp.set_visible(False)
    cbar = ax.figure.colorbar(im, ax=ax, fraction=0.04, pad=0.02)
    if metric != "mfu":
        cbar.ax.yaxis.set_major_formatter(COMPACT)
    cbar.set_label(
        metric_label(metric) + ("  (lower is better)" if lower_is_better(metric) else "")
    )


@styled
def plot_sweep(
    df: pd.DataFrame,
    keys: Sequence[str],
    metric: str,
    path: str | os.PathLike,
    *,
    title: str,
    note: str | None = None,
) -> None:
    """Plot ``metric`` against the swept ``keys`` and write it to ``path`` (PNG).

    One key: a line plot with values written at the points and the best one ringed; two keys:
    a heat map with the values in the cells and the best cell outlined; more: small multiples
    of line plots (x = first key, one line per value of the second, one panel per combination
    of the rest, shared y axis). Points whose ``status`` is not ``"ok"`` (or whose metric is
    missing) are marked -- a red x under the data or a hatched cell -- with the reason from the
    ``reason`` / ``error`` / ``message`` column. ``note`` replaces the point count in the
    subtitle (say how ``df`` was reduced from the sweep's table:
    :func:`simulator.report.sweep_view.plot_view`).
    """
    keys = list(keys)
    if not keys:
        raise ValueError("plot_sweep needs at least one swept key")
    missing = [c for c in [*keys, metric] if c not in df.columns]
    if missing:
        raise ValueError(f"sweep table has no column(s) {missing}")
    df = df.reset_index(drop=True)
    bad = _failed_mask(df, metric)
    y_fail, ylim = _fail_height(df, metric, bad)
    if len(keys) == 1:
        fig = new_figure(1100, 620)
        ax = fig.add_axes((0.09, 0.12, 0.87, 0.74))
        _line_panel(ax, df, keys[0], None, metric, bad, y_fail)
        ax.set_ylim(*ylim)
    elif len(keys) == 2:
        xs = df[keys[0]].nunique()
        ys = df[keys[1]].nunique()
        fig = new_figure(max(900, min(1600, 200 + 170 * xs)), max(520, min(1000, 200 + 95 * ys)))
        ax = fig.add_axes((0.1, 0.12, 0.8, 0.74))
        _heatmap(ax, df, keys, metric, bad)
    else:
        rest = keys[2:]
        combos = list(dict.fromkeys(tuple(r) for r in df[rest].itertuples(index=False)))
        ncol = min(4, len(combos))
        nrow = math.ceil(len(combos) / ncol)
        height = 330 * nrow + 130
        fig = new_figure(400 * ncol + 120, height)
        axes = fig.subplots(nrow, ncol, squeeze=False, sharey=True)
        for k, combo in enumerate(combos):
            ax = axes[k // ncol][k % ncol]
            sel = np.ones(len(df), dtype=bool)
            for key, v in zip(rest, combo, strict=True):
                sel &= (df[key] == v).to_numpy()
            _line_panel(ax, df[sel], keys[0], keys[1], metric, bad[sel], y_fail, legend=k == 0)
            ax.set_title(
                ", ".join(f"{_key_label(kk)} = {v}" for kk, v in zip(rest, combo, strict=True)),
                fontsize=10.5,
            )
            ax.set_ylim(*ylim)
            if k % ncol:
                ax.set_ylabel("")
        for k in range(len(combos), nrow * ncol):
            axes[k // ncol][k % ncol].set_visible(False)
        fig.subplots_adjust(
            top=1 - 90 / height, bottom=70 / height, left=0.07, right=0.98, hspace=0.5, wspace=0.1
        )
    n_bad = int(bad.sum())
    h_px = fig.get_figheight() * DPI
    fig.text(0.01, 1 - 10 / h_px, title, fontsize=14, weight="bold", va="top")
    sub = f"{metric_label(metric)} over {', '.join(keys)}: {note or f'{len(df)} points'}"
    sub += " (lower is better)" if lower_is_better(metric) else " (higher is better)"
    if n_bad:
        sub += f"; {n_bad} infeasible or failed, marked in red"
    fig.text(0.01, 1 - 36 / h_px, sub, fontsize=9.5, va="top", color="#333333")
    save_png(fig, path)
