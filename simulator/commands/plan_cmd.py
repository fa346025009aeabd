"""``simulator plan WORKLOAD.yaml --gpus N``: search the parallel layouts for N GPUs."""

from __future__ import annotations

import shlex
import sys

import pandas as pd
from rich import box
from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from simulator.config.load import load_workload
from simulator.config.schema import MAX_GPUS
from simulator.cost import with_training_cost
from simulator.engine.records import BREAKDOWN_KEYS, COMM_DIMS
from simulator.errors import ConfigError
from simulator.plan import HEADROOM_GIB, Planned, PlanResult, plan
from simulator.report import io, table
from simulator.report.table import BREAKDOWN_LABELS, format_count, format_seconds


def register(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="search tp/pp/dp, micro-batch, ZeRO, recompute and schedule for N GPUs",
        description="Enumerate the layouts of a workload on N GPUs, drop those that break "
        "divisibility or do not fit in memory, rank the rest with a fast analytic estimate, "
        "simulate the best in full and print the top K by tokens/s.",
    )
    p.add_argument("workload", help="workload YAML (workloads/*.yaml)")
    p.add_argument("--gpus", type=int, required=True, help="number of GPUs")
    p.add_argument("--top", type=int, default=5, help="layouts to show (default 5)")
    p.add_argument(
        "--simulate",
        type=int,
        default=None,
        metavar="M",
        help="layouts simulated in full after the estimate (default 2 * --top)",
    )
    p.add_argument("--topology", help="topology YAML replacing the workload's cluster.topology")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override an input key by dotted path (repeatable)",
    )
    p.add_argument(
        "--headroom-gib",
        type=float,
        default=HEADROOM_GIB,
        metavar="G",
        help=f"GiB per GPU a layout must leave free to count as fitting (default {HEADROOM_GIB:g})",
    )
    p.add_argument("--workers", type=int, default=None, help="parallel simulations")
    p.add_argument("--out", help="output folder (default results/<workload name>)")
    p.add_argument("--no-files", action="store_true", help="write no result files")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=main)


def _row(p: Planned) -> dict:
    s, c = p.summary, p.candidate
    return {
        "layout": c.label(),
        "reference": p.is_reference,
        **{f"layout.{k}": v for k, v in vars(c).items()},
        "tokens_per_s": s.get("tokens_per_s"),
        "step_time_s": s.get("step_time_s"),
        "mfu": s.get("mfu"),
        "memory_gib.total": (s.get("memory_gib") or {}).get("total"),
        "memory_gib.capacity": (s.get("memory_gib") or {}).get("capacity"),
        "fits": s.get("fits"),
        **{f"breakdown_s.{k}": (s.get("breakdown_s") or {}).get(k) for k in BREAKDOWN_KEYS},
        "estimated_tokens_per_s": p.estimate.tokens_per_s if p.estimate else None,
        "estimated_memory_gib": p.estimate.memory_gib if p.estimate else None,
        "error": s.get("error", ""),
    }


def to_json(result: PlanResult) -> dict:
    def entry(p: Planned) -> dict:
        return {
            "layout": p.candidate.label(),
            "overrides": p.candidate.overrides(),
            "reference": p.is_reference,
            "estimate": None
            if p.estimate is None
            else {
                "tokens_per_s": p.estimate.tokens_per_s,
                "step_time_s": p.estimate.step_time_s,
                "memory_gib": p.estimate.memory_gib,
            },
            "summary": p.summary,
        }

    return {
        "name": result.name,
        "n_gpus": result.n_gpus,
        "top": [entry(p) for p in result.top],
        "reference": entry(result.reference) if result.reference else None,
        "counts": result.counts,
        "wall_s": result.wall_s,
        "timings": result.timings,
    }


def plan_table(result: PlanResult) -> Group:
    """The top layouts: throughput (change against the workload's own layout), step time,
    MFU and memory; then where each one's step goes (exposed time per breakdown part)."""
    ref = result.reference
    ref_ok = ref is not None and "error" not in ref.summary and ref.summary.get("fits")
    ref_tps = ref.summary["tokens_per_s"] if ref_ok else None
    rows: list[tuple[str, Planned]] = [(str(i), p) for i, p in enumerate(result.top, 1)]
    if ref is not None and all(p is not ref for p in result.top):
        rows.append(("yours", ref))

    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("#", justify="right", no_wrap=True, min_width=5)
    # the layout wraps onto more lines where the terminal is narrow, so that the figures
    # beside it are never cut to an ellipsis
    t.add_column("layout", overflow="fold", ratio=1)
    for col in ("tokens / s", "step", "MFU", "memory GiB"):
        t.add_column(col, justify="right", no_wrap=True)
    shown = [
        k
        for k in BREAKDOWN_KEYS
        if any((p.summary.get("breakdown_s") or {}).get(k, 0) > 0 for _, p in rows)
    ]
    b = Table(
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        title="where the step goes (exposed time)",
        title_justify="left",
    )
    b.add_column("#", justify="right", no_wrap=True, min_width=5)
    for k in shown:
        b.add_column(_SHORT.get(k, BREAKDOWN_LABELS[k]), justify="right", no_wrap=True)
    for rank, p in rows:
        s = p.summary
        label = p.candidate.label() + ("  ← yours" if p.is_reference else "")
        if "error" in s:
            t.add_row(rank, label, Text(s["error"], style="red"))
            continue
        tps = Text(format_count(s["tokens_per_s"]))
        if ref_tps and p is not ref:
            change = s["tokens_per_s"] / ref_tps - 1
            tps.append(f" ({change:+.1%})", style="green" if change >= 0 else "red")
        mem = s["memory_gib"]
        mem_text = Text(f"{mem['total']:.1f} / {mem['capacity']:.0f}")
        if not s.get("fits"):
            mem_text.append(" NO FIT", style="bold red")
        t.add_row(rank, label, tps, format_seconds(s["step_time_s"]), f"{s['mfu']:.1%}", mem_text)
        b.add_row(rank, *[format_seconds(s["breakdown_s"].get(k, 0.0)) for k in shown])
    c = result.counts
    head = Text(
        f"{result.name} on {result.n_gpus:,} GPUs: {c['enumerated']:,} layouts, "
        f"{c['invalid']:,} break divisibility, {c['does_not_fit']:,} do not fit in memory "
        f"with {result.headroom_gib:g} GiB to spare, "
        f"{c['estimated']:,} estimated, {c['simulated']} simulated in full "
        f"({result.wall_s:.1f} s)",
        style="bold",
    )
    parts: list = [head, t]
    if result.top:
        parts += [Text(""), b]
    else:
        parts.append(Text("no layout fits in GPU memory", style="bold red"))
    return Group(*parts)


#: Column headers of the plan's breakdown table: short, so that every part fits on one line
#: (the run table spells them out).
_SHORT = {
    **{f"{d}_comm": f"{short} comm" for d, (short, _, _) in COMM_DIMS.items()},
    "ep_comm": "EP all-to-all",
    "pp_comm": "PP send",
    "pp_bubble": "bubble",
    "pp_imbalance": "imbalance",
}


def no_layout_reason(result: PlanResult, n_gpus: int) -> str:
    """Why no layout was simulated: none divides, or none that divides fits in memory."""
    c = result.counts
    if c.get("does_not_fit"):
        return (
            f"none of the {c['does_not_fit']:,} layouts of {result.name} that divide "
            f"{n_gpus:,} GPU{'s' if n_gpus != 1 else ''} fits in GPU memory with {result.headroom_gib:g} GiB to spare "
            "(give more GPUs, or lower --headroom-gib)"
        )
    why = ""
    if result.refusal is not None:  # what refused most of them, e.g. too many micro-batches
        n, fld, detail = result.refusal
        why = f"; {n:,} of {c.get('invalid', n):,} refused by {fld or 'the input'}: {detail}"
    return (
        f"no parallel layout of {result.name} fits {n_gpus:,} GPUs (tp, cp, pp and dp "
        f"must divide the GPUs, the heads, the layers and the global batch){why}"
    )


def main(args) -> int:
    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"must be >= 1, got {args.workers}", file="--workers")
    if args.simulate is not None and args.simulate < 0:
        raise ConfigError(f"must be >= 0, got {args.simulate}", file="--simulate")
    if not 1 <= args.gpus <= MAX_GPUS:  # before the bar is drawn: one error line
        raise ConfigError(f"must be in 1..{MAX_GPUS:,}, got {args.gpus:,}", file="--gpus")
    loaded = load_workload(args.workload, args.overrides, topology=args.topology)
    if not args.no_files:  # before the search: a folder that cannot take plan.csv fails now
        io.check_out_dir(io.output_dir(args.out, loaded.workload.name), replace=False)
    bar = Progress(
        TextColumn("[bold]plan: {task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), console=Console(stderr=True), transient=True,
        disable=args.json or not sys.stderr.isatty(),  # a pipe gets no bar (nor its newline)
    )  # fmt: skip
    with bar:
        task = bar.add_task("enumerating layouts", total=None)

        def progress(phase: str, done: int, total: int) -> None:
            bar.update(task, description=phase, completed=done, total=total)

        result = plan(
            loaded, args.gpus, top=args.top, n_simulate=args.simulate, workers=args.workers,
            headroom_gib=args.headroom_gib, progress=progress,
        )  # fmt: skip
    if not result.simulated:
        raise ConfigError(no_layout_reason(result, args.gpus), file="--gpus")
    for p in result.simulated:
        if "error" not in p.summary:
            p.summary = with_training_cost(p.summary, loaded)
    out = io.output_dir(args.out, result.name)
    written = []
    if not args.no_files:
        df = pd.DataFrame([_row(p) for p in result.simulated])
        df = df.sort_values(["fits", "tokens_per_s"], ascending=[False, False], kind="stable")
        path = out / "plan.csv"
        io.write_atomic(path, df.to_csv(index=False, lineterminator="\n"))
        written.append(path)
    if args.json:
        sys.stdout.write(io.dumps_json(to_json(result), indent=None))
        return 0
    command = f"python -m simulator run {shlex.quote(str(args.workload))}"
    if args.topology:
        command += f" --topology {shlex.quote(str(args.topology))}"
    command += "".join(f" --set {shlex.quote(o)}" for o in args.overrides)
    gpn = loaded.topology.gpus_per_node
    if result.n_gpus < gpn:
        command += f" --set topology.nodes=1 --set topology.gpus_per_node={result.n_gpus}"
    elif result.n_gpus != loaded.topology.nodes * gpn:
        command += f" --set topology.nodes={result.n_gpus // gpn}"
    table.print_renderable(plan_table(result))
    if result.top:
        # Plain print: one line however wide the terminal, so that it can be pasted.
        print(f"run the best:\n{command} {result.top[0].candidate.set_args()}")
    if written:
        print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
