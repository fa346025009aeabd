"""``simulator compare WORKLOAD.yaml --topology A --topology B [--variant 'label:k=v,...']``.

Runs one workload on several configurations and shows them side by side: step time, MFU,
tokens/s, every breakdown component, memory, time/cost to train (when ``training.tokens`` is
set) and the change against the first column. Configurations are, in order:

1. one per ``--topology`` (label: the topology's ``name``); with none given, the workload's own
   topology;
2. one per ``--variant 'label:key=value,key=value'`` on the first of those topologies (e.g.
   ``--variant 'H200:topology.gpu=H200-SXM-141GB'``). Values are YAML; commas inside
   brackets or quotes do not split (``'uneven:parallelism.stage_layers=[19,21,21,19]'``).

``--set`` applies to every configuration (a variant's own keys win). Writes
``results/<name>/compare.csv`` (one row per configuration, the sweep table's columns plus the
change of step time and tokens/s against the first) and ``compare.png`` (one stacked bar of
the step's breakdown per configuration).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from simulator.config.checks import resolve
from simulator.config.load import LoadedWorkload, load_workload, parse_override
from simulator.cost import with_training_cost
from simulator.errors import ConfigError, SimulatorError
from simulator.report import html, io, plots, table
from simulator.sweep import RESULT_COLUMNS, process_pool, summary_row


def register(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="run a workload on several topologies / variants and compare them side by side",
    )
    p.add_argument("workload", help="workload YAML (workloads/*.yaml)")
    p.add_argument(
        "--topology",
        action="append",
        default=[],
        metavar="FILE",
        help="a topology to compare (repeatable); default: the workload's own",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="'LABEL:KEY=VALUE,...'",
        help="a variant on the first topology, by dotted overrides (repeatable)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an input key in every configuration (repeatable)",
    )
    p.add_argument("--out", help="output folder (default results/<workload name>)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="configurations simulated in parallel (default: one per core)",
    )
    p.add_argument("--no-files", action="store_true", help="write no result files")
    p.set_defaults(func=main)


@dataclass(frozen=True)
class Config:
    """One column of a comparison."""

    label: str
    topology: str | None  # file, or None for the workload's own
    overrides: dict[str, Any]
    own: tuple[str, ...] = ()  # the keys the variant itself sets (not ``--set``)

    def named(self, e: SimulatorError) -> SimulatorError:
        """``e`` naming this variant (and ``--variant``, not ``--set``, for its own keys)."""
        if not self.label:
            return e
        if isinstance(e, ConfigError):
            file, field = e.file, e.field
            if file == "--set" and field in self.own:
                file = "--variant"
            elif self._sets_topology_field(file, field):
                # e.g. a GPU name the variant gave, found while simulating: the topology
                # file's ``gpu`` is the variant's ``topology.gpu``
                file, field = "--variant", f"topology.{field}"
            return ConfigError(
                f"variant {self.label!r}: {ConfigError(e.detail, file=file, field=field)}"
            )
        return type(e)(f"variant {self.label!r}: {e}")

    def _sets_topology_field(self, file: str | None, field: str | None) -> bool:
        """Whether a topology's ``field`` (in an error from ``file``) holds a value this
        variant set: its own ``topology.<key>`` is that field or contains it."""
        if not field or file in (None, "--set", "--variant", "--topology"):
            return False
        key = f"topology.{field}"
        return any(key == k or key.startswith(k + ".") for k in self.own)


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets, braces and quotes."""
    parts, depth, quote, cur = [], 0, "", []
    for ch in text:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_variant(text: str) -> tuple[str, dict[str, Any]]:
    """``'label:k=v,k=v'`` -> (label, {k: v}); without ``label:`` the label is the text."""
    label, body = "", text
    colon, eq = text.find(":"), text.find("=")
    if colon != -1 and (eq == -1 or colon < eq):
        label, body = text[:colon].strip(), text[colon + 1 :]
    items = split_top_level(body)
    if not items:
        raise ConfigError(
            f"no key=value in {text!r} (expected 'label:key=value,...')", file="--variant"
        )
    label = label or body.strip()
    try:
        overrides = dict(parse_override(item) for item in items)
    except ConfigError as e:
        detail = f"variant {label!r}: {e.detail}"
        raise ConfigError(detail, file="--variant", field=e.field) from None
    return label, overrides


def configurations(
    topologies: Sequence[str], variants: Sequence[str], overrides: Sequence[str]
) -> list[Config]:
    """The columns of a comparison, in order (see the module docstring)."""
    common = dict(parse_override(o) for o in overrides)
    configs: list[Config] = [Config("", t, common) for t in topologies] or [
        Config("", None, common)
    ]
    first = configs[0].topology
    for v in variants:
        label, ov = parse_variant(v)
        configs.append(Config(label, first, {**common, **ov}, tuple(ov)))
    return configs


def _label_topologies(configs: list[Config], loaded: list[LoadedWorkload]) -> list[str]:
    labels = []
    for c, lw in zip(configs, loaded, strict=True):
        labels.append(c.label or lw.topology.name)
    # Two topologies with the same name: tell them apart by file.
    for i, lbl in enumerate(labels):
        if labels.count(lbl) > 1 and not configs[i].label:
            labels[i] = f"{lbl} ({Path(loaded[i].topology_path).stem})"
    seen: dict[str, int] = {}
    for i, lbl in enumerate(labels):
        if lbl in seen:
            labels[i] = f"{lbl} #{i + 1}"
        seen[lbl] = i
    return labels


def _simulate(loaded: LoadedWorkload) -> dict:
    from simulator.run import simulate

    return with_training_cost(simulate(loaded).summary, loaded)


@dataclass
class Comparison:
    name: str
    labels: list[str]
    configs: list[Config]
    loaded: list[LoadedWorkload]
    summaries: list[dict]

    def frame(self) -> pd.DataFrame:
        """One row per configuration: label, inputs, the sweep columns, change vs the first."""
        rows = []
        for label, c, lw, s in zip(
            self.labels, self.configs, self.loaded, self.summaries, strict=True
        ):
            row = {
                "label": label,
                "topology_file": str(lw.topology_path),
                "overrides": json.dumps(c.overrides, sort_keys=True),
                **summary_row(s),
            }
            rows.append(row)
        df = pd.DataFrame(rows, columns=["label", "topology_file", "overrides", *RESULT_COLUMNS])
        for col in ("step_time_s", "tokens_per_s"):
            base = df[col].iloc[0]
            df[f"{col}_change"] = df[col].astype(float) / float(base) - 1 if base else float("nan")
        return df


def run_compare(
    workload: str | Path,
    topologies: Sequence[str] = (),
    variants: Sequence[str] = (),
    overrides: Sequence[str] = (),
    *,
    workers: int | None = None,
    on_start: Callable[[int], None] | None = None,
    on_done: Callable[[], None] | None = None,
    on_loaded: Callable[[str], None] | None = None,
) -> Comparison:
    """Load and simulate every configuration; raises ConfigError on invalid input.
    ``on_start(n)`` and ``on_done()`` (after each simulation) report progress;
    ``on_loaded(name)`` is called with the workload's name once every configuration is
    valid, before any is simulated (the output folder's check)."""
    configs = configurations(topologies, variants, overrides)
    loaded = []
    for c in configs:
        try:
            loaded.append(load_workload(workload, c.overrides, topology=c.topology))
        except ConfigError as e:
            raise c.named(e) from None
    for c, lw in zip(configs, loaded, strict=True):
        try:  # a layout that does not fit the cluster fails here, naming its variant
            resolve(lw.workload, lw.topology, file=str(lw.workload_path),
                    topo_file=str(lw.topology_path))
        except ConfigError as e:
            raise c.named(e) from None
    if on_loaded:
        on_loaded(loaded[0].workload.name)
    if on_start:
        on_start(len(loaded))
    n = workers or min(len(loaded), os.cpu_count() or 1)
    summaries: list[dict] = [{}] * len(loaded)
    if n > 1 and len(loaded) > 1:
        with process_pool(min(n, len(loaded))) as pool:
            futures = {pool.submit(_simulate, lw): i for i, lw in enumerate(loaded)}
            for f in as_completed(futures):
                try:  # an input error found while simulating names its variant too
                    summaries[futures[f]] = f.result()
                except SimulatorError as e:
                    raise configs[futures[f]].named(e) from None
                if on_done:
                    on_done()
    else:
        for i, lw in enumerate(loaded):
            try:
                summaries[i] = _simulate(lw)
            except SimulatorError as e:
                raise configs[i].named(e) from None
            if on_done:
                on_done()
    labels = _label_topologies(configs, loaded)
    return Comparison(loaded[0].workload.name, labels, configs, loaded, summaries)


def write_outputs(cmp: Comparison, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = out / "compare.csv", out / "compare.png"
    io.write_atomic(csv_path, cmp.frame().to_csv(index=False, lineterminator="\n"))
    title = f"{cmp.name}: one training step on {len(cmp.labels)} configurations"
    plots.plot_compare(cmp.summaries, cmp.labels, png_path, title=title)
    html_path = html.write_html(
        out / "compare.html",
        html.compare_report(cmp.name, cmp.labels, cmp.summaries, png_path.read_bytes()),
    )
    return [csv_path, png_path, html_path]


def main(args) -> int:
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"must be >= 1, got {args.workers}", file="--workers")
    progress = Progress(
        TextColumn("[bold]compare"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(stderr=True), transient=True,
        disable=args.json or not sys.stderr.isatty(),  # a pipe gets no bar (nor its newline)
    )  # fmt: skip
    with progress:
        task = progress.add_task("compare", total=None)
        cmp = run_compare(
            args.workload, args.topology, args.variant, args.overrides, workers=args.workers,
            on_start=lambda n: progress.update(task, total=n),
            on_done=lambda: progress.advance(task),
            on_loaded=None if args.no_files else (
                lambda name: io.check_out_dir(io.output_dir(args.out, name), replace=False)),
        )  # fmt: skip
    out = io.output_dir(args.out, cmp.name)
    written = [] if args.no_files else write_outputs(cmp, out)
    if args.json:
        doc = {
            "name": cmp.name,
            "configurations": [
                {
                    "label": label,
                    "topology_file": str(lw.topology_path),
                    "overrides": c.overrides,
                    "summary": s,
                }
                for label, c, lw, s in zip(
                    cmp.labels, cmp.configs, cmp.loaded, cmp.summaries, strict=True
                )
            ],
        }
        sys.stdout.write(io.dumps_json(doc, indent=None))
        return 0
    table.print_renderable(table.compare_table(cmp.summaries, cmp.labels))
    for label, s in zip(cmp.labels, cmp.summaries, strict=True):
        for w in s.get("warnings") or []:
            print(f"warning: {label}: {w}")
    if written:
        print(f"wrote {out}/: " + ", ".join(p.name for p in written))
    return 0
