"""What a sweep shows of its table, bounded whatever its number of points.

A sweep of 67,200 points (``benchmarks/sweep_scale.py``) records every point in
``sweep.parquet``; what is printed and drawn must stay readable and quick:

* :func:`ranked` / :func:`best_rows` -- the points best first by the metric (then the
  infeasible or failed ones), for the terminal table (``sweep --top N``) and the table of
  ``sweep.html`` (at most :data:`HTML_ROWS`);
* :func:`plot_view` -- what ``sweep.png`` draws: the table itself when it is small enough
  to read (at most :data:`MAX_VALUES` values along a key and :data:`MAX_PANELS` panels of
  small multiples), otherwise the median of the metric over the other keys, by the two
  keys that change it most (a heat map), or the best :data:`MAX_LABELLED` points of a
  ``points`` list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.report.table import lower_is_better

#: Rows of the terminal table by default (``sweep --top``).
TOP = 20
#: Rows of the table in ``sweep.html`` at most.
HTML_ROWS = 200
#: Panels of small multiples in ``sweep.png`` at most before the plot aggregates.
MAX_PANELS = 12
#: Values along one key (x axis, heat-map row or column) at most before it aggregates.
MAX_VALUES = 40
#: Points of a ``points`` list (one x position each) drawn at most.
MAX_LABELLED = 40


def _values(df: pd.DataFrame, metric: str) -> pd.Series:
    """The metric of the feasible points (``status`` ok), NaN elsewhere."""
    v = pd.to_numeric(df[metric], errors="coerce").astype(float)
    ok = np.isfinite(v.to_numpy())
    if "status" in df.columns:
        ok &= (df["status"].astype(str) == "ok").to_numpy()
    return v.where(ok)


def ranked(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``df`` best first by ``metric`` (ties in point order), then the points without a
    value (infeasible or failed) in point order."""
    v = _values(df, metric)
    order = v if lower_is_better(metric) else -v
    pos = np.arange(len(df))
    idx = np.lexsort((pos, order.fillna(np.inf).to_numpy(), order.isna().to_numpy()))
    return df.iloc[idx]


def best_rows(df: pd.DataFrame, metric: str, n: int) -> pd.DataFrame:
    """The ``n`` best rows of :func:`ranked` (all of ``df`` when it has at most ``n``, in
    its own order)."""
    return df if len(df) <= n else ranked(df, metric).head(n)


@dataclass(frozen=True)
class PlotView:
    """What ``sweep.png`` draws: ``df`` over ``keys``; ``note`` (or None) says how it was
    reduced from the table."""

    df: pd.DataFrame
    keys: list[str]
    note: str | None = None


def _readable(df: pd.DataFrame, keys: Sequence[str]) -> bool:
    counts = [df[k].nunique() for k in keys]
    if any(c > MAX_VALUES for c in counts[:2]):
        return False
    return len(keys) <= 2 or math.prod(counts[2:]) <= MAX_PANELS


def _effect(df: pd.DataFrame, key: str, values: pd.Series) -> float:
    """How much ``key`` moves the metric: the range of its medians per value of the key."""
    medians = values.groupby(df[key].to_numpy()).median().dropna()
    return float(medians.max() - medians.min()) if len(medians) > 1 else 0.0


def plot_view(df: pd.DataFrame, keys: Sequence[str], metric: str) -> PlotView:
    """The grid itself when readable; otherwise the median of ``metric`` over the other keys
    by the (at most) two keys with the largest :func:`_effect` (among those with at most
    :data:`MAX_VALUES` values), kept in their order. A cell without any feasible point is
    failed, with the most common reason of its points."""
    keys = list(keys)
    if _readable(df, keys):
        return PlotView(df, keys)
    values = _values(df, metric)
    candidates = [k for k in keys if 1 < df[k].nunique() <= MAX_VALUES]
    if not candidates:
        return PlotView(df, keys)  # nothing to aggregate by: draw as is
    by_effect = sorted(candidates, key=lambda k: (-_effect(df, k, values), keys.index(k)))
    kept = [k for k in keys if k in by_effect[:2]]
    others = [k for k in keys if k not in kept]
    work = df[kept].assign(_v=values.to_numpy())
    if "reason" in df.columns:
        work["_r"] = df["reason"].where(values.isna().to_numpy(), None).to_numpy()
    else:
        work["_r"] = None
    rows = []
    for combo, g in work.groupby(kept, sort=False, dropna=False):
        combo = combo if isinstance(combo, tuple) else (combo,)
        row = dict(zip(kept, combo, strict=True))
        med = g["_v"].median()
        row[metric] = med
        row["status"] = "ok" if pd.notna(med) else "failed"
        reasons = g["_r"].dropna()
        row["reason"] = "" if pd.notna(med) else (
            str(reasons.mode().iloc[0]) if len(reasons) else "no feasible point"
        )
        rows.append(row)
    cells = pd.DataFrame(rows)
    per_cell = len(df) // max(1, len(cells))
    n_bad = int(values.isna().sum())
    note = f"median of {per_cell:,} points a cell over " + ", ".join(
        k.split(".")[-1] for k in others
    ) + (f" ({n_bad:,} infeasible or failed left out)" if n_bad else "")
    return PlotView(cells, kept, note)


def labelled_view(df: pd.DataFrame, metric: str) -> PlotView:
    """Points that set different keys, one x position each (``point_label``): all of them,
    or the best :data:`MAX_LABELLED` in point order."""
    if len(df) <= MAX_LABELLED:
        return PlotView(df, ["point_label"])
    best = ranked(df, metric).head(MAX_LABELLED).sort_index()
    note = f"the best {MAX_LABELLED} of {len(df):,} points (every point is in sweep.parquet)"
    return PlotView(best, ["point_label"], note)
