"""Terminal tables of a run, a comparison and a sweep (rich).

The functions return rich renderables; :func:`print_renderable` prints one at a readable
width (at least 100 columns) and without colour codes when the output is not a terminal, so
the same text can go into a log file. Colours of the breakdown bars are
:data:`simulator.engine.records.KIND_COLOURS`, the same as the plots'.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from typing import IO, Any

import pandas as pd
from rich import box
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from simulator.engine.records import BREAKDOWN_KEYS, COMM_DIMS, KIND_COLOURS

BAR_WIDTH = 24
MIN_WIDTH = 120

#: Row labels of the breakdown keys.
BREAKDOWN_LABELS = {
    "compute": "compute",
    **{f"{d}_comm": long for d, (_, long, _) in COMM_DIMS.items()},
    "pp_bubble": "pipeline bubble",
    "pp_imbalance": "stage imbalance",
    "host": "host (launch, sync)",
    "optimizer": "optimizer",
    "other": "other",
}
MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations")


# --------------------------------------------------------------------------------------------
# Number formatting (shared with the plots)


def format_seconds(t: float | None) -> str:
    """``0.0123`` -> ``"12.3 ms"``; picks s, ms or µs with 3 significant digits."""
    if t is None or not math.isfinite(t):
        return "n/a"
    a = abs(t)
    if a >= 100:
        return f"{t:,.0f} s"
    if a >= 1:
        return f"{t:.3g} s"
    if a >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    if a == 0:
        return "0 s"
    return f"{t * 1e6:.3g} µs"


def format_count(x: float | None) -> str:
    """``1234567`` -> ``"1.23 M"`` (k, M, G, T), plain below 10,000."""
    if x is None or not math.isfinite(x):
        return "n/a"
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(x) >= div:
            return f"{x / (1e3 if suffix == 'k' else div):.3g} {suffix}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def format_bytes(b: float | None) -> str:
    """Bytes in decimal units (``"1.5 GB"``), as link counters and nccl-tests report them."""
    if b is None or not math.isfinite(b):
        return "n/a"
    for div, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(b) >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b:.0f} B"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def bar(fraction: float, colour: str, width: int = BAR_WIDTH) -> Text:
    """A horizontal bar of ``fraction`` (0..1) of ``width`` cells, in eighths of a cell."""
    fraction = min(max(fraction if _finite(fraction) else 0.0, 0.0), 1.0)
    eighths = int(round(fraction * width * 8))
    full, rest = divmod(eighths, 8)
    text = "█" * full + ("" if rest == 0 else " ▏▎▍▌▋▊▉"[rest])
    return Text(text.ljust(width), style=colour)


def lower_is_better(metric: str) -> bool:
    """Whether smaller values of ``metric`` are better (times, memory, cost, energy)."""
    m = metric.lower()
    if any(k in m for k in ("mfu", "tokens", "tflops", "throughput", "util")):
        return False
    return True


def metric_label(metric: str) -> str:
    """Axis label of a summary metric: ``step_time_s`` -> ``step time (s)``, mfu in %."""
    special = {
        "mfu": "MFU (%)",
        "tokens_per_s": "tokens / s",
        "tflops_per_gpu": "TFLOP/s per GPU",
        "step_time_s": "step time (s)",
        "memory_gib.total": "memory per GPU (GiB)",
    }
    if metric in special:
        return special[metric]
    for suffix, unit in (("_s", "s"), ("_gib", "GiB"), ("_days", "days"), ("_usd", "USD")):
        if metric.lower().endswith(suffix):
            return f"{metric[: -len(suffix)].replace('_', ' ')} ({unit})"
    return metric.replace("_", " ")


def format_value(v: float, metric: str) -> str:
    """A metric value for a label: MFU in %, times via :func:`format_seconds`, k/M suffixes."""
    if not _finite(v):
        return "n/a"
    if metric == "mfu":
        return f"{v * 100:.1f}%"
    if metric.endswith("_s") and metric != "tokens_per_s":
        return format_seconds(v)
    a = abs(v)
    if a >= 1e6:
        return f"{v / 1e6:.3g}M"
    if a >= 1e4:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}"


def layout_text(summary: dict) -> str:
    """One line of the layout: ``TP 8 · PP 4 · DP 32 · ZeRO-1 · 1F1B · 128 micro-batches · ...``.

    Reads ``layout`` keys ``tp cp pp dp ep zero``, the schedule (``pp_schedule`` or
    ``schedule``, with ``virtual_stages``) and the micro-batch count (``microbatches`` or
    ``micro_batches``), then ``n_gpus``, ``gpu`` and ``topology``.
    """
    lay = summary.get("layout") or {}
    bits = []
    for key, label in (("tp", "TP"), ("cp", "CP"), ("pp", "PP"), ("dp", "DP"), ("ep", "EP")):
        if lay.get(key) is not None and (key not in ("cp", "ep") or lay[key] != 1):
            bits.append(f"{label} {lay[key]}")
    if lay.get("zero"):
        bits.append(f"ZeRO-{lay['zero']}")
    sched = lay.get("pp_schedule", lay.get("schedule"))
    if sched and (lay.get("pp") or 1) > 1:
        sched = str(sched)
        text = sched.upper() if sched.lower() in ("1f1b", "gpipe") else sched
        if (lay.get("virtual_stages") or 1) > 1:
            text += f" ({lay['virtual_stages']} virtual stages)"
        bits.append(text)
    mbs = lay.get("microbatches", lay.get("micro_batches"))
    if mbs:
        bits.append(f"{mbs} micro-batches")
    if isinstance(summary.get("n_gpus"), int):
        gpu = f" {summary['gpu']}" if summary.get("gpu") else ""
        bits.append(f"{summary['n_gpus']:,}{gpu} GPUs")
    if summary.get("topology"):
        bits.append(str(summary["topology"]))
    return " · ".join(bits)


# --------------------------------------------------------------------------------------------
# One run


def _headline(summary: dict) -> Table:
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
    for col in ("step time", "tokens / s", "MFU", "TFLOP/s per GPU", "GPUs"):
        t.add_column(col, justify="right")
    mfu = summary.get("mfu")
    t.add_row(
        Text(format_seconds(summary.get("step_time_s")), style="bold"),
        format_count(summary.get("tokens_per_s")),
        Text(f"{mfu:.1%}" if _finite(mfu) else "n/a", style="bold"),
        f"{summary['tflops_per_gpu']:.0f}" if _finite(summary.get("tflops_per_gpu")) else "n/a",
        f"{summary['n_gpus']:,}" if isinstance(summary.get("n_gpus"), int) else "n/a",
    )
    return t


def _breakdown(summary: dict) -> Table:
    bd = summary.get("breakdown_s") or {}
    step = summary.get("step_time_s") or sum(v for v in bd.values() if _finite(v)) or 0.0
    t = Table(
        title="Where the step time goes (exposed, critical path)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    t.add_column("part")
    t.add_column("time", justify="right")
    t.add_column("% of step", justify="right")
    t.add_column("", no_wrap=True)
    keys = [k for k in BREAKDOWN_KEYS if k in bd] + [k for k in bd if k not in BREAKDOWN_KEYS]
    layout = summary.get("layout") or {}
    for key in keys:
        v = bd[key]
        dim = key[: -len("_comm")] if key.endswith("_comm") else None
        if dim and not v and (layout.get(dim) or 1) <= 1:
            continue  # a dimension this layout does not use (the JSON keeps the key, at 0)
        share = v / step if step and _finite(v) else 0.0
        colour = KIND_COLOURS.get(key, KIND_COLOURS["other"])
        t.add_row(
            BREAKDOWN_LABELS.get(key, key),
            format_seconds(v),
            f"{share:.1%}",
            bar(share, colour),
            style="dim" if not share else None,
        )
    t.add_row(Text("step", style="bold"), Text(format_seconds(step), style="bold"), "100%", "")
    return t


def _imbalance_note(summary: dict) -> Text | None:
    """What makes the heaviest pipeline stage heavier, one line under the breakdown (printed
    at the console's width, not wrapped to the table's, which split '46.6 ms' over two lines)."""
    why = summary.get("pp_imbalance_from")
    if not why or not why.get("parts_s"):
        return None
    total = sum(why["parts_s"].values())
    parts = sorted(((k, v) for k, v in why["parts_s"].items() if v >= 0.01 * total),
                   key=lambda kv: -kv[1])  # parts under 1 % of the imbalance are noise
    text = ", ".join(f"{BREAKDOWN_LABELS.get(k, k)} {format_seconds(v)}" for k, v in parts)
    return Text(f"stage imbalance: the heaviest stage ({why['heaviest_stage']}) spends more "
                f"on {text}", style="dim")


#: Row labels of the memory table where the summary key is not plain words.
MEMORY_LABELS = {
    # eager DDP's constructor bucket set, live until the buckets are rebuilt (steps 1-2)
    "allocated_first_steps": "allocated, first steps (DDP rebuild)",
}


def _memory(summary: dict) -> Table | None:
    mem = summary.get("memory_gib")
    if not mem:
        return None
    cap = mem.get("capacity")
    total = mem.get("total")
    fits = summary.get("fits")
    title = "Memory per GPU (worst GPU), GiB"
    t = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False
    )
    t.add_column("what")
    t.add_column("GiB", justify="right")
    t.add_column("% of HBM", justify="right")
    t.add_column("", no_wrap=True)
    colours = {
        "weights": "#0072B2",
        "gradients": "#56B4E9",
        "optimizer": "#009E73",
        "activations": "#CC79A7",
    }
    keys = [k for k in MEMORY_KEYS if k in mem]
    keys += [k for k in mem if k not in (*MEMORY_KEYS, "total", "capacity", "allocated",
                                         "allocated_first_steps")]
    first, alloc = mem.get("allocated_first_steps"), mem.get("allocated")
    if _finite(first) and _finite(alloc) and first - alloc >= 0.05:
        keys.append("allocated_first_steps")  # only where the first steps hold more
    for key in keys:
        v = mem[key]
        share = v / cap if _finite(cap) and cap and _finite(v) else 0.0
        t.add_row(
            MEMORY_LABELS.get(key, key),
            f"{v:.1f}" if _finite(v) else "n/a",
            f"{share:.0%}",
            bar(share, colours.get(key, "#666666")),
        )
    if _finite(total):
        share = total / cap if _finite(cap) and cap else 0.0
        style = "bold red" if fits is False else "bold"
        t.add_row(
            Text("total", style=style),
            Text(f"{total:.1f}", style=style),
            Text(f"{share:.0%}", style=style),
            bar(share, "red" if fits is False else "#444444"),
        )
    if _finite(cap):
        t.add_row("capacity", f"{cap:.1f}", "", "")
    if fits is False:
        over = f" ({total - cap:.1f} GiB over)" if _finite(total) and _finite(cap) else ""
        t.caption = Text(f"DOES NOT FIT in GPU memory{over}", style="bold red")
        t.caption_justify = "left"
    return t


def _links(summary: dict) -> Table | None:
    links = summary.get("busiest_links") or []
    if not links:
        return None
    t = Table(
        title="Busiest links",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    t.add_column("link")
    t.add_column("kind")
    t.add_column("utilisation", justify="right")
    t.add_column("", no_wrap=True)
    t.add_column("bytes", justify="right")
    for link in links:
        u = link.get("utilization")
        colour = (
            "red"
            if _finite(u) and u >= 0.9
            else ("#E69F00" if _finite(u) and u >= 0.6 else "#0072B2")
        )
        t.add_row(
            str(link.get("link", "?")),
            str(link.get("kind", "")),
            f"{u:.0%}" if _finite(u) else "n/a",
            bar(u if _finite(u) else 0.0, colour, 16),
            format_bytes(link.get("bytes")),
        )
    return t


def _tokens(n: float) -> str:
    """``2e12`` -> ``"2T tokens"`` (the training budget the time-to-train rows assume)."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= div:
            return f"{n / div:,.3g}{unit} tokens"
    return f"{n:,.0f} tokens"


def _training_cost(summary: dict) -> Table | None:
    rows = []
    if _finite(summary.get("cost_per_Mtoken_usd")):
        basis = summary.get("cost_basis") or {}
        rows.append(("cost per million tokens", f"${summary['cost_per_Mtoken_usd']:,.3f}"))
        rows.append(("energy per million tokens", f"{summary['energy_per_Mtoken_kWh']:,.3f} kWh"))
        if basis:
            rows.append(("per GPU", f"{basis['power_per_gpu_W']:,.0f} W, "
                         f"${basis['usd_per_gpu_hour']:,.2f}/h ({basis['price_basis']})"))
    if _finite(summary.get("time_to_train_days")):
        tokens = (summary.get("training") or {}).get("tokens")
        label = f"time to train {_tokens(tokens)}" if _finite(tokens) else "time to train"
        rows.append((label, f"{summary['time_to_train_days']:,.1f} days"))
    if _finite(summary.get("gpu_hours")):
        rows.append(("GPU-hours", f"{summary['gpu_hours']:,.0f}"))
    if _finite(summary.get("energy_MWh")):
        rows.append(("energy", f"{summary['energy_MWh']:,.1f} MWh"))
    if _finite(summary.get("cost_usd")):
        rows.append(("cost", f"${summary['cost_usd']:,.0f}"))
    rel = summary.get("reliability") or {}
    if _finite(rel.get("goodput")):
        rows.append(("goodput with failures", f"{rel['goodput']:.1%}"))
        if _finite(rel.get("effective_time_to_train_days")):
            rows.append(("time to train with failures",
                         f"{rel['effective_time_to_train_days']:,.1f} days"))
        if _finite(rel.get("expected_failures")):
            rows.append(("expected failures", f"{rel['expected_failures']:,.0f}"))
        if _finite(rel.get("job_mtbf_hours")):
            rows.append(("job MTBF", f"{rel['job_mtbf_hours']:.2f} h"))
        if _finite(rel.get("checkpoint_interval_min")):
            rows.append(("checkpoint every", f"{rel['checkpoint_interval_min']:.1f} min"))
    if not rows:
        return None
    t = Table(
        title="Cost and energy",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        show_header=False,
    )
    t.add_column("what")
    t.add_column("value", justify="right")
    for r in rows:
        t.add_row(*r)
    return t


def _title(summary: dict) -> Text:
    text = Text(str(summary.get("name", "run")), style="bold")
    layout = layout_text(summary)
    if layout:
        text.append("  " + layout, style="dim")
    return text


def run_table(summary: dict) -> RenderableType:
    """Everything a person wants from one run, as a stack of small tables.

    Headline (step time, tokens/s, MFU, TFLOP/s per GPU), breakdown with seconds, % of step
    and a bar, memory per GPU against capacity (red "DOES NOT FIT" when ``fits`` is false),
    busiest links, time and cost to train when the summary has them, the simulator's own wall
    time and event count, and warnings.
    """
    parts: list[RenderableType] = [
        _title(summary),
        _headline(summary),
        Text(""),
        _breakdown(summary),
    ]
    note = _imbalance_note(summary)
    if note is not None:
        parts.append(note)
    for extra in (_memory(summary), _links(summary), _training_cost(summary)):
        if extra is not None:
            parts += [Text(""), extra]
    parts.append(Text(""))
    foot = []
    if _finite(summary.get("sim_wall_s")):
        foot.append(f"simulated in {format_seconds(summary['sim_wall_s'])}")
    if isinstance(summary.get("events"), int):
        foot.append(f"{summary['events']:,} events")
    ex = summary.get("extrapolated")
    if isinstance(ex, dict):  # the step extended from shorter ones (simulator/extrapolate.py)
        sims = ", ".join(f"{m:,}" for m in ex["simulated_microbatches"])
        foot.append(f"{ex['microbatches']:,} micro-batches extrapolated from steps of {sims} "
                    "(--all-microbatches: simulate every one)")
    if foot:
        parts.append(Text(" · ".join(foot), style="dim"))
    for w in summary.get("warnings") or []:
        parts.append(Text(f"warning: {w}", style="yellow"))
    return Group(*parts)


# --------------------------------------------------------------------------------------------
# Compare


def _get(summary: dict, dotted: str) -> Any:
    cur: Any = summary
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


#: (label, dotted key, formatter) rows of the compare table.
COMPARE_ROWS: tuple[tuple[str, str, Any], ...] = (
    ("step time", "step_time_s", format_seconds),
    ("tokens / s", "tokens_per_s", format_count),
    ("MFU", "mfu", lambda v: f"{v:.1%}"),
    ("TFLOP/s per GPU", "tflops_per_gpu", lambda v: f"{v:.0f}"),
    *((f"  {BREAKDOWN_LABELS[k]}", f"breakdown_s.{k}", format_seconds) for k in BREAKDOWN_KEYS),
    ("memory per GPU (GiB)", "memory_gib.total", lambda v: f"{v:.1f}"),
    ("GPU memory (GiB)", "memory_gib.capacity", lambda v: f"{v:.0f}"),
    ("GPUs", "n_gpus", lambda v: f"{v:,}"),
    ("USD per million tokens", "cost_per_Mtoken_usd", lambda v: f"${v:,.3f}"),
    ("kWh per million tokens", "energy_per_Mtoken_kWh", lambda v: f"{v:,.3f}"),
    ("time to train (days)", "time_to_train_days", lambda v: f"{v:,.1f}"),
    ("cost (USD)", "cost_usd", lambda v: f"${v:,.0f}"),
)


def compare_table(summaries: Sequence[dict], labels: Sequence[str]) -> RenderableType:
    """Configurations side by side; each value after the first column shows its change
    against the first (green when better, red when worse)."""
    if len(summaries) != len(labels):
        raise ValueError(f"{len(summaries)} summaries but {len(labels)} labels")
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    t.add_column("")
    for i, label in enumerate(labels):
        # Headers wrap between words, never inside one.
        head = label if i else f"{label}\n(baseline)"
        t.add_column(head, justify="right", min_width=max(len(w) for w in head.split()))
    for name, key, fmt in COMPARE_ROWS:
        values = [_get(s, key) for s in summaries]
        if not any(_finite(v) for v in values):
            continue
        base = values[0]
        cells: list[Text | str] = []
        for i, v in enumerate(values):
            if not _finite(v):
                cells.append("n/a")
                continue
            cell = Text(fmt(v))
            if i and _finite(base) and base != 0 and key not in ("n_gpus", "memory_gib.capacity"):
                change = v / base - 1
                if abs(change) >= 0.0005:
                    better = (change < 0) == lower_is_better(key)
                    cell.append(f" ({change:+.1%})", style="green" if better else "red")
            cells.append(cell)
        t.add_row(name, *cells)
    fits = [s.get("fits") for s in summaries]
    if any(f is not None for f in fits):
        t.add_row(
            "fits in memory",
            *[
                Text("yes", style="green")
                if f
                else Text("NO", style="bold red")
                if f is False
                else "n/a"
                for f in fits
            ],
        )
    return t


# --------------------------------------------------------------------------------------------
# Sweep


def sweep_table(df: pd.DataFrame, keys: Sequence[str], metric: str) -> RenderableType:
    """One row per sweep point: the swept keys, ``metric`` (the best marked) and the status.

    Other headline metrics present in ``df`` (step time, MFU, tokens/s, fits) are shown too;
    failed points show their ``reason`` / ``error``.
    """
    keys = list(keys)
    df = df.reset_index(drop=True)
    values = pd.to_numeric(df[metric], errors="coerce") if metric in df else pd.Series(dtype=float)
    ok = values.notna()
    if "status" in df.columns:
        ok &= df["status"].astype(str) == "ok"
    best = None
    if ok.any():
        best = values[ok].idxmin() if lower_is_better(metric) else values[ok].idxmax()
    extra = [c for c in ("step_time_s", "mfu", "tokens_per_s", "fits") if c in df and c != metric]
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    # Headers never break inside a word: a key's last part when that is unambiguous, and
    # every header column at least as wide as its header (the status column takes the rest).
    short = [k.split(".")[-1] for k in keys]
    heads = short if len(set(short)) == len(short) else keys
    for h in heads:
        t.add_column(h, justify="right", min_width=len(h))
    head = metric + (" ↓" if lower_is_better(metric) else " ↑")
    t.add_column(head, justify="right", min_width=len(head))
    for c in extra:
        t.add_column(c, justify="right", min_width=len(c))
    t.add_column("status")
    fmts = {
        "step_time_s": format_seconds,
        "mfu": lambda v: f"{v:.1%}",
        "tokens_per_s": format_count,
    }
    for i, row in df.iterrows():
        cells: list[Any] = [str(row[k]) for k in keys]
        v = values.get(i)
        fmt = fmts.get(metric, lambda x: f"{x:.4g}")
        style = "bold green" if i == best else ""
        cells.append(
            Text(fmt(v) + (" ★ best" if i == best else ""), style=style)
            if ok[i]
            else Text("—", style="red")
        )
        for c in extra:
            x = row[c]
            if c == "fits":
                if x is None or x is pd.NA or (isinstance(x, float) and x != x):
                    cells.append("—")
                else:
                    cells.append(Text("yes", style="green") if bool(x) else Text("NO", style="red"))
            else:
                cells.append(fmts[c](float(x)) if _finite(float(x)) else "n/a")
        if ok[i]:
            cells.append(Text("ok", style="green"))
        else:
            reason = ""
            for col in ("reason", "error", "message"):
                if col in row and isinstance(row[col], str) and row[col]:
                    reason = row[col]
                    break
            status = str(row.get("status", "failed"))
            cells.append(Text(f"{status}: {reason}" if reason else status, style="red"))
        t.add_row(*cells)
    return t


# --------------------------------------------------------------------------------------------
# Printing


def print_renderable(r: RenderableType, *, file: IO[str] | None = None) -> None:
    """Print a renderable at least :data:`MIN_WIDTH` columns wide.

    Rich writes colour only to a terminal, so output piped to a file or another program is
    plain text.
    """
    console = Console(file=file, highlight=False, soft_wrap=False)
    if console.width < MIN_WIDTH:
        width = max(MIN_WIDTH, shutil.get_terminal_size((MIN_WIDTH, 24)).columns)
        console = Console(file=file, highlight=False, soft_wrap=False, width=width)
    console.print(r)
