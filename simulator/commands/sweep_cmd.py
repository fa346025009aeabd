"""``simulator sweep SWEEP.yaml``: run a grid / list of variations of a workload in parallel."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from simulator.config.load import load_sweep
from simulator.errors import ConfigError
from simulator.report import html, io, plots, sweep_view, table
from simulator.sweep import OK, SweepOutcome, check_metric, run_sweep


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="run variations of a workload (grid and/or points) in parallel",
        description="Run every point of a sweep file, in parallel, recording each finished "
        "point in results/<name>/sweep.parquet; a rerun reuses the points already there whose "
        "resolved inputs (base workload, topology, hardware data) are unchanged.",
    )
    p.add_argument("sweep", help="sweep YAML (sweeps/*.yaml)")
    p.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local: a process pool on this machine (default); ray: tasks on a Ray cluster",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="parallel simulations (default: the number of CPU cores)",
    )
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster address (e.g. ray://head:10001 or auto); default: a local Ray",
    )
    p.add_argument("--out", help="output folder (default results/<sweep name>)")
    p.add_argument("--fresh", action="store_true", help="ignore points already recorded")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        metavar="N",
        help="run at most N new points, then stop (a rerun continues)",
    )
    p.add_argument(
        "--top",
        type=int,
        default=sweep_view.TOP,
        metavar="N",
        help=f"print the best N points when there are more (default {sweep_view.TOP}; "
        "every point is in sweep.parquet)",
    )
    p.add_argument("--json", action="store_true", help="print the table as JSON records")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=main)


def _progress(enabled: bool) -> Progress:
    console = Console(stderr=True)
    return Progress(
        TextColumn("[bold]sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("[green]{task.fields[ok]} ok[/] · [red]{task.fields[failed]} failed[/]"),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        TextColumn("· left"),
        TimeRemainingColumn(),
        console=console,
        disable=not enabled,
        transient=False,
    )


def main(args) -> int:
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"must be >= 1, got {args.workers}", file="--workers")
    if args.top < 1:
        raise ConfigError(f"must be >= 1, got {args.top}", file="--top")
    if args.limit is not None and args.limit < 0:
        raise ConfigError(f"must be >= 0, got {args.limit}", file="--limit")
    if args.address and args.engine != "ray":
        raise ConfigError(
            f"a Ray cluster address is for --engine ray (got --engine {args.engine})",
            file="--address",
        )
    # Validate the sweep file before anything is drawn, so bad input gets one error line.
    check_metric(load_sweep(args.sweep), str(args.sweep))
    show = not args.no_progress and not args.json
    # The bar is drawn only once the sweep has passed its checks (base, engine, output
    # folder), so that an error is one line with nothing before it.
    progress = _progress(show)
    task = progress.add_task("sweep", total=None, ok=0, failed=0)
    counts = {"ok": 0, "failed": 0}
    started = []

    def on_start(n_todo: int, n_done: int) -> None:  # again when a reused point is stale
        if not started:
            progress.start()
            started.append(True)
        progress.update(task, total=n_todo)

    def on_row(index: int, row: dict) -> None:
        counts["ok" if row.get("status") == OK else "failed"] += 1
        progress.update(task, advance=1, **counts)

    try:
        outcome = run_sweep(
            args.sweep,
            engine=args.engine,
            workers=args.workers,
            address=args.address,
            out=args.out,
            fresh=args.fresh,
            limit=args.limit,
            on_start=on_start,
            on_row=on_row,
        )
    finally:
        if started:  # stopping a bar never drawn would print an empty line
            progress.stop()
    written = write_plots(outcome)
    if args.json:
        records = outcome.table.astype(object).where(outcome.table.notna(), None)
        sys.stdout.write(io.dumps_json(records.to_dict(orient="records"), indent=None))
        return 0
    # 'fits' adds nothing to 'status' (ok means it fits) and is empty for invalid points.
    shown = sweep_view.best_rows(outcome.table, outcome.metric, args.top).drop(columns=["fits"])
    for k in outcome.keys:  # a point that does not set a key shows a dash
        shown[k] = shown[k].astype(object).where(shown[k].notna(), "—")
    table.print_renderable(table.sweep_table(shown, outcome.keys, outcome.metric))
    n_done = len(outcome.table)
    bad = int((outcome.table["status"] != OK).sum()) if n_done else 0
    if len(shown) < n_done:
        print(
            f"the best {len(shown)} of {n_done:,} points by {outcome.metric}, best first; "
            f"{n_done - len(shown):,} more in {outcome.path.name} (--top N shows more)"
        )
    print(
        f"{n_done}/{outcome.n_points} points done ({outcome.n_run} run now, "
        f"{outcome.n_skipped} reused from before"
        + (f", {outcome.n_stale} recomputed as their inputs changed" if outcome.n_stale else "")
        + f", {bad} infeasible or failed) in "
        f"{outcome.wall_s:.1f} s; wrote {outcome.path}"
        + (", " + ", ".join(str(p) for p in written) if written else "")
    )
    return 0


def write_plots(outcome: SweepOutcome) -> list[Path]:
    """``sweep.png``: the metric against the swept keys (a line or a heat map), and
    ``sweep.html``: that figure, the cost/energy trade-off and the points on one page.

    Points that do not all set the same keys (an explicit ``points`` list) are plotted one
    per x position, labelled by the keys they set. A large sweep is drawn reduced
    (:mod:`simulator.report.sweep_view`: medians over the keys that matter least, the best
    labelled points, the best rows of the page's table)."""
    df = outcome.table
    keys = [k for k in outcome.keys if k in df.columns]
    if not keys or df.empty:
        return []
    full = df.dropna(subset=keys)
    if len(full) < len(df):
        view = sweep_view.labelled_view(df, outcome.metric)
        labels = []
        for _, row in view.df.iterrows():
            bits = [f"{k.split('.')[-1]}={row[k]}" for k in keys if not pd.isna(row[k])]
            labels.append(f"#{row['point_index']} " + ", ".join(bits))
        view = sweep_view.PlotView(view.df.assign(point_label=labels), view.keys, view.note)
    else:
        view = sweep_view.plot_view(full, keys, outcome.metric)
    path = outcome.out / "sweep.png"
    plots.plot_sweep(view.df, view.keys, outcome.metric, path, title=outcome.name, note=view.note)
    page = html.sweep_report(outcome.name, df, keys, outcome.metric, [path.read_bytes()])
    html_path = html.write_html(outcome.out / "sweep.html", page)
    outcome.written.extend([path, html_path])
    return [path, html_path]
