"""Shared figure style for the report plots (matplotlib, Agg backend, deterministic).

Sizes are in pixels at :data:`DPI`; text colours on coloured blocks follow WCAG relative
luminance; PNGs are written through :func:`simulator.report.io.write_png_atomic` (atomic, no
software version or date in the file, so identical input gives identical bytes).
"""

from __future__ import annotations

import functools
import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from simulator.engine.records import COMM_DIMS  # noqa: E402
from simulator.report.io import png_bytes, write_png_atomic  # noqa: E402

DPI = 100

#: Legend / label text of each event kind and breakdown key.
KIND_LABELS = {
    "fwd": "forward",
    "bwd": "backward",
    "recompute": "recompute",
    "optimizer": "optimizer",
    **{f"{d}_comm": f"{short} comm" for d, (short, _, _) in COMM_DIMS.items() if d != "pp"},
    "pp_comm": "PP send/recv",
    "zero_gather": "ZeRO gather",
    "compute": "compute",
    "pp_bubble": "pipeline bubble",
    "pp_imbalance": "stage imbalance",
    "host": "host launch",
    "other": "other",
}
KIND_ORDER = (
    "fwd",
    "bwd",
    "recompute",
    "optimizer",
    *(f"{d}_comm" for d in COMM_DIMS),
    "zero_gather",
)
COMM_STREAMS = tuple(COMM_DIMS)
STREAM_LABELS = {d: short for d, (short, _, _) in COMM_DIMS.items()}
#: Line colours of a sweep's second key (Okabe-Ito order, then viridis when there are more).
LINE_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000")
IDLE_FACE = "#F4F4F4"
IDLE_HATCH_COLOUR = "#BBBBBB"

STYLE = {
    "font.size": 10,
    "font.family": "DejaVu Sans",
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "hatch.linewidth": 0.6,
}


def time_unit(t_end: float) -> tuple[float, str]:
    """Scale and unit of a time axis ending at ``t_end`` seconds: s when long, else ms or µs."""
    if t_end >= 2.0:
        return 1.0, "s"
    if t_end >= 2e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def text_colour(face) -> str:
    """Black or white, whichever reads better on ``face`` (WCAG 2 relative luminance)."""
    r, g, b = (c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(face))
    return "black" if 0.2126 * r + 0.7152 * g + 0.0722 * b > 0.35 else "white"


def styled(func):
    """Run a plot function under :data:`STYLE` (rcParams restored afterwards)."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        with plt.rc_context(STYLE):
            return func(*args, **kwargs)

    return wrapper


def new_figure(width_px: int, height_px: int):
    """A figure of ``width_px`` x ``height_px`` pixels at :data:`DPI`."""
    return plt.figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI)


def png_bytes_closed(fig) -> bytes:
    """``fig`` rendered to PNG bytes (at its own dpi, no metadata), then closed: pyplot keeps
    every open figure, so a report built per point of a sweep would otherwise hold them all."""
    try:
        return png_bytes(fig)
    finally:
        plt.close(fig)


def save_png(fig, path: str | os.PathLike) -> None:
    """Write ``fig`` to ``path`` (atomic, deterministic) and close it."""
    try:
        write_png_atomic(path, fig, dpi=DPI)
    finally:
        plt.close(fig)
