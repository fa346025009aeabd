"""``simulator run WORKLOAD.yaml``: simulate one training step and report it."""

from __future__ import annotations

import json
import shutil
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from simulator.config.load import LoadedWorkload, load_workload
from simulator.engine.sim import CountingEnvironment
from simulator.hardware.catalog import load_gpu
from simulator.report import io, table
from simulator.run import SimResult, check_full_detail, resolve_loaded, simulate


def register(sub) -> None:
    p = sub.add_parser("run", help="simulate one training step of a workload")
    p.add_argument("workload", help="workload YAML (workloads/*.yaml)")
    p.add_argument("--topology", help="topology YAML replacing the workload's cluster.topology")
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override an input key by dotted path (repeatable); topology keys under topology.",
    )
    p.add_argument("--out", help="output folder (default results/<workload name>)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument(
        "--detail", choices=["folded", "full"], default="folded",
        help="folded: one process per distinct behaviour (default); full: every GPU and every "
        "ring step",
    )
    p.add_argument(
        "--all-microbatches", action="store_true",
        help="simulate every micro-batch (by default a step of many micro-batches is "
        "extrapolated from two shorter ones in the pipeline's steady state)",
    )
    p.add_argument("--no-files", action="store_true", help="write no result files")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr (what the run is doing; the bar of --detail full)")
    p.set_defaults(func=main)


def simulate_full_with_progress(loaded: LoadedWorkload) -> SimResult:
    """``--detail full`` with a progress bar on stderr: the folded simulation (seconds) gives
    the step time, and the bar follows the full simulation's clock towards it."""
    check_full_detail(resolve_loaded(loaded), loaded.workload, str(loaded.workload_path))
    expected = simulate(loaded).summary["step_time_s"]
    env = CountingEnvironment()
    progress = Progress(
        TextColumn("[bold]simulating every GPU"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}% of the step · {task.fields[events]:,} events"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    stop = threading.Event()
    with progress:
        task = progress.add_task("full", total=expected, events=0)

        def poll() -> None:
            while not stop.wait(0.25):
                progress.update(task, completed=min(env.now, 0.999 * expected),
                                events=env.n_events)

        watcher = threading.Thread(target=poll, daemon=True)
        watcher.start()
        try:
            return simulate(loaded, detail="full", env=env)
        finally:
            stop.set()
            watcher.join()


#: The files of a run, by role.
OUTPUT_FILES = {
    "summary": "summary.json",
    "events": "events.parquet",
    "links": "links.parquet",
    "trace": "trace.json",
    "timeline": "timeline.png",
    "report": "report.html",
}


def write_outputs(
    result: SimResult,
    out: Path,
    loaded: LoadedWorkload | None = None,
    on_file: Callable[[str], None] | None = None,
) -> list[Path]:
    """Write a run's files as one set: into a hidden folder beside ``out``, which then takes
    the place of ``out`` (:func:`~simulator.report.io.publish_folder`), so a killed or failed
    run never leaves files of two runs together, nor files without their summary.
    ``summary.json`` holds no wall-clock figure (``sim_wall_s`` is on stdout with ``--json``
    and in the table), so the same input gives the same bytes. ``report.html`` (one
    self-contained page) shows the inputs too when ``loaded`` is given; ``on_file(name)`` is
    called before each file is written (the progress display). Returns the final paths."""
    # matplotlib (the timeline, the page's figures) only for a run that writes files
    from simulator.report import html, plots, trace

    note = on_file or (lambda name: None)
    stage = io.stage_folder(out)
    try:
        paths = {k: stage / name for k, name in OUTPUT_FILES.items()}
        note(OUTPUT_FILES["events"])
        io.write_parquet_atomic(paths["events"], result.events)
        note(OUTPUT_FILES["links"])
        io.write_parquet_atomic(paths["links"], result.links)
        note(OUTPUT_FILES["trace"])
        trace.write_trace(
            paths["trace"], result.events, result.memory, result.links,
            result.extras.get("link_series"),
        )
        # the simulated micro-batches' step, where the summary's was extrapolated
        simulated = result.extras.get("simulated_summary", result.summary)
        note(OUTPUT_FILES["timeline"])
        plots.plot_timeline(result.events, simulated, paths["timeline"])
        note(OUTPUT_FILES["report"])
        inputs = None
        if loaded is not None:
            gpu = load_gpu(loaded.topology.gpu, file=str(loaded.topology_path))
            inputs = html.inputs_of(loaded, gpu)
        page = html.run_report(
            result.summary,
            timeline_png=paths["timeline"].read_bytes(),
            memory=result.memory,
            link_series=result.extras.get("link_series"),
            links=result.links,
            inputs=inputs,
        )
        html.write_html(paths["report"], page)
        summary = {k: v for k, v in result.summary.items() if k != "sim_wall_s"}
        io.write_json_atomic(paths["summary"], summary)
        for name in io.SHARED_RESULT_FILES:  # compare's and plan's files stay with the run's
            if (out / name).is_file():
                shutil.copy2(out / name, stage / name)
        io.publish_folder(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return [out / name for name in OUTPUT_FILES.values()]


def _phases(enabled: bool) -> Progress:
    """What a folded run is doing, on stderr while it runs (a large MoE run simulates for
    seconds and writes a 100 MB trace for half a minute); drawn only on a terminal and
    removed when done, so piped output and the table are unchanged."""
    console = Console(stderr=True)
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        # off a terminal rich would still end with an empty line on stderr
        disable=not (enabled and console.is_terminal),
    )


def main(args) -> int:
    loaded = load_workload(args.workload, args.overrides, topology=args.topology)
    out = io.output_dir(args.out, loaded.workload.name)
    if not args.no_files:
        out = io.check_out_dir(
            out, known=frozenset(OUTPUT_FILES.values()) | frozenset(io.SHARED_RESULT_FILES)
        )
    bar = args.detail == "full" and not args.no_progress  # a bar of its own, then files
    result = simulate_full_with_progress(loaded) if bar else None
    with _phases(not args.no_progress) as phases:
        task = phases.add_task("simulating one step")
        if result is None:
            result = simulate(loaded, detail=args.detail, extrapolate=not args.all_microbatches)
        written = [] if args.no_files else write_outputs(
            result, out, loaded,
            on_file=lambda name: phases.update(task, description=f"writing {name}"),
        )
    if args.json:
        sys.stdout.write(json.dumps(result.summary, allow_nan=False) + "\n")
    else:
        table.print_renderable(table.run_table(result.summary))
        if written:
            print(f"wrote {out}/: " + ", ".join(p.name for p in written))
    return 0
