"""``simulator run WORKLOAD.yaml``: simulate one training step and report it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from simulator.config.load import load_workload
from simulator.report import io, plots, table, trace
from simulator.run import SimResult, simulate


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
    p.add_argument("--no-files", action="store_true", help="write no result files")
    p.set_defaults(func=main)


def write_outputs(result: SimResult, out: Path) -> list[Path]:
    """Write a run's files atomically; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "summary": out / "summary.json",
        "events": out / "events.parquet",
        "links": out / "links.parquet",
        "trace": out / "trace.json",
        "timeline": out / "timeline.png",
    }
    io.write_parquet_atomic(paths["events"], result.events)
    io.write_parquet_atomic(paths["links"], result.links)
    trace.write_trace(
        paths["trace"], result.events, result.memory, result.links,
        result.extras.get("link_series"),
    )
    plots.plot_timeline(result.events, result.summary, paths["timeline"])
    io.write_json_atomic(paths["summary"], result.summary)
    return list(paths.values())


def main(args) -> int:
    loaded = load_workload(args.workload, args.overrides, topology=args.topology)
    result = simulate(loaded, detail=args.detail)
    out = io.output_dir(args.out, loaded.workload.name)
    written = [] if args.no_files else write_outputs(result, out)
    if args.json:
        sys.stdout.write(json.dumps(result.summary) + "\n")
    else:
        table.print_renderable(table.run_table(result.summary))
        if written:
            print(f"wrote {out}/: " + ", ".join(p.name for p in written))
    return 0
