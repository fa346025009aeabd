"""Self-contained HTML reports: one file per run, compare and sweep that opens offline.

Everything is inside the page: the figures are PNGs as ``data:`` URIs, the style is one
``<style>`` block, and there is no script. Every number the page shows is an element with
``data-key`` (the dotted summary key, or the column of a table), ``data-value`` (the exact
value, as JSON writes it) and ``data-scale`` (the factor from the value to the number shown),
so a reader can check the page against ``summary.json`` (``tests/test_html_report.py`` does,
in a headless browser).

A run's page: the headline, the breakdown of the step (a bar and a table), the pipeline
timeline, memory over time of the fullest GPUs, the busiest links with their bursts (peak
utilisation and the share of the step spent above half load, from the flow network's load
history), cost and energy, the inputs (workload and topology as loaded, each topology field
marked as set in the file or a default) and the GPU's figures with the source of each.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from matplotlib.lines import Line2D
from matplotlib.ticker import EngFormatter

from simulator.engine.records import BREAKDOWN_KEYS, KIND_COLOURS
from simulator.report import io, sweep_view
from simulator.report.figure import (
    KIND_LABELS,
    LINE_COLOURS,
    new_figure,
    png_bytes_closed,
    styled,
    time_unit,
)
from simulator.report.table import layout_text

GiB = 1024**3

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:0 auto;max-width:1180px;
padding:1.2em 2em 3em;color:#222;line-height:1.4}
h1{font-size:1.6em;margin-bottom:.1em}h2{font-size:1.2em;margin-top:1.8em;
border-bottom:1px solid #ddd;padding-bottom:.2em}
.sub{color:#555;margin-top:0}
.cards{display:flex;flex-wrap:wrap;gap:.8em;margin:1em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.5em .9em;min-width:8.5em}
.card .v{font-size:1.35em;font-weight:600}.card .k{color:#555;font-size:.85em}
table{border-collapse:collapse;margin:.5em 0;font-size:.92em}
th,td{padding:.25em .7em;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
th{background:#f6f6f6;white-space:nowrap}td.n{text-align:right;font-variant-numeric:tabular-nums}
.bar{display:flex;height:26px;border-radius:4px;overflow:hidden;margin:.6em 0;
border:1px solid #ccc}
.bar span{display:block;height:100%}
.sw{display:inline-block;width:.9em;height:.9em;border-radius:2px;margin-right:.4em;
vertical-align:-.1em}
img{max-width:100%;height:auto;border:1px solid #eee}
.warn{background:#fff4e5;border-left:4px solid #E69F00;padding:.4em .8em;margin:.4em 0}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.85em}
details{margin:.5em 0}summary{cursor:pointer;font-weight:600}
.muted{color:#777}.wide{overflow-x:auto}
"""


# --------------------------------------------------------------------------------------------
# Small builders


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def num(key: str, value: Any, text: str, scale: float = 1.0, tag: str = "span", cls: str = "") -> str:
    """An element showing ``text`` for the number ``value`` of ``key`` (see module docstring)."""
    attrs = f' data-key="{esc(key)}" data-value="{esc(json.dumps(value))}" data-scale="{scale:g}"'
    cl = f' class="{cls}"' if cls else ""
    return f"<{tag}{cl}{attrs}>{esc(text)}</{tag}>"


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def fmt_s(t: float) -> tuple[str, float]:
    """Seconds as text in a readable unit, and the scale from seconds to that unit."""
    if t == 0:
        return "0", 1.0
    for scale, unit in ((1.0, "s"), (1e3, "ms"), (1e6, "µs")):
        if abs(t) * scale >= 1.0 or unit == "µs":
            return f"{t * scale:.3f} {unit}", scale
    return f"{t:.3g} s", 1.0


def fmt_si(x: float, unit: str = "") -> tuple[str, float]:
    """``1.23 M`` style text and the scale of the number shown."""
    for scale, prefix in ((1e-12, "T"), (1e-9, "G"), (1e-6, "M"), (1e-3, "k")):
        if abs(x) * scale >= 1.0:
            return f"{x * scale:.3f} {prefix}{unit}".rstrip(), scale
    return f"{x:.3f} {unit}".rstrip(), 1.0


def img(png: bytes, alt: str) -> str:
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def kv_table(rows: Sequence[tuple[str, str]], head: tuple[str, str] | None = None) -> str:
    h = f"<tr><th>{esc(head[0])}</th><th>{esc(head[1])}</th></tr>" if head else ""
    return "<table>" + h + "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _get(d: Mapping, dotted: str) -> Any:
    cur: Any = d
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, Mapping) else None
    return cur


# --------------------------------------------------------------------------------------------
# Figures (PNG bytes)


@styled
def memory_png(memory: pd.DataFrame, capacity_gib: float, k: int = 4) -> bytes | None:
    """Allocated memory over the step of the ``k`` processes with the highest peaks."""
    if memory is None or memory.empty:
        return None
    peaks = memory.groupby("proc")["total_bytes"].max().sort_values(ascending=False, kind="stable")
    fig = new_figure(1000, 340)
    ax = fig.add_subplot(1, 1, 1)
    t_end = float(memory["t_s"].max()) or 1.0
    scale, unit = time_unit(t_end)
    for j, proc in enumerate(peaks.index[:k]):
        g = memory[memory["proc"] == proc].sort_values(["t_s", "delta_bytes"], kind="stable")
        ax.step(g["t_s"] * scale, g["total_bytes"] / GiB, where="post",
                color=LINE_COLOURS[j % len(LINE_COLOURS)], label=str(proc))
    if finite(capacity_gib):
        ax.axhline(capacity_gib, color="#D55E00", ls="--", lw=1, label="capacity")
    ax.set_xlabel(f"time in the step ({unit})")
    ax.set_ylabel("allocated (GiB)")
    ax.set_ylim(0, max(capacity_gib if finite(capacity_gib) else 0, peaks.iloc[0] / GiB) * 1.18)
    ax.legend(loc="upper right", fontsize=8, frameon=False, ncol=k + 1)
    ax.set_title("Memory over the step (the fullest simulated processes)", loc="left")
    fig.tight_layout()
    return png_bytes_closed(fig)


def link_bursts(series: pd.DataFrame | None, step: float) -> dict[str, dict[str, float]]:
    """Per link of a load history (link, t_s, utilization; a value holds until the next):
    ``peak`` utilisation and ``above_half_s``, the time spent above 50 % load."""
    out: dict[str, dict[str, float]] = {}
    if series is None or series.empty:
        return out
    for link, g in series.groupby("link", sort=False):
        t = g["t_s"].to_numpy(float)
        u = g["utilization"].to_numpy(float)
        ends = np.append(t[1:], max(step, t[-1]))
        out[str(link)] = {
            "peak": float(u.max()),
            "above_half_s": float(np.sum(np.clip(ends - t, 0, None)[u > 0.5])),
        }
    return out


@styled
def links_png(series: pd.DataFrame | None, step: float, k: int = 4) -> bytes | None:
    """Utilisation over the step of the ``k`` links that carried the most flow traffic."""
    if series is None or series.empty:
        return None
    links = list(dict.fromkeys(series["link"]))[:k]
    scale, unit = time_unit(step)
    fig = new_figure(1000, 60 + 90 * len(links))
    for j, link in enumerate(links):
        ax = fig.add_subplot(len(links), 1, j + 1)
        g = series[series["link"] == link]
        t = np.append(g["t_s"].to_numpy(float), step) * scale
        u = np.append(g["utilization"].to_numpy(float), g["utilization"].iloc[-1]) * 100
        ax.fill_between(t, u, step="post", color=LINE_COLOURS[j % len(LINE_COLOURS)], alpha=0.8)
        ax.set_ylim(0, 105)
        ax.set_xlim(0, step * scale)
        ax.set_ylabel("%", rotation=0, labelpad=8)
        ax.text(0.005, 0.92, link, transform=ax.transAxes, va="top", fontsize=8)
        if j < len(links) - 1:
            ax.set_xticklabels([])
    ax.set_xlabel(f"time in the step ({unit})")
    fig.suptitle("Load of the busiest links over the step (bursts, not averages)", x=0.01,
                 ha="left", fontsize=12)
    fig.tight_layout()
    return png_bytes_closed(fig)


@styled
def tradeoff_png(df: pd.DataFrame, y: str, keys: Sequence[str]) -> bytes | None:
    """Cost or energy per million tokens against step time, one point per sweep point:
    the colour says the first swept key's value, the marker the second's (a legend names
    them; points are categorical, so they are not joined)."""
    ok = df[df[y].notna() & df["step_time_s"].notna()]
    if ok.empty:
        return None
    fig = new_figure(900, 520)
    ax = fig.add_axes((0.09, 0.11, 0.6, 0.8))
    markers = ("o", "s", "^", "D", "v", "P", "X", "*")
    first = list(dict.fromkeys(ok[keys[0]].astype(str))) if keys else ["all"]
    second = list(dict.fromkeys(ok[keys[1]].astype(str))) if len(keys) > 1 else [""]
    a_col = ok[keys[0]].astype(str) if keys else pd.Series("all", index=ok.index)
    b_col = ok[keys[1]].astype(str) if len(keys) > 1 else pd.Series("", index=ok.index)
    size = 70 if len(ok) <= 500 else 12  # thousands of points: small markers
    for (a, b), g in ok.groupby([a_col, b_col], sort=False):  # one call per colour x marker
        ax.scatter(g["step_time_s"], g[y], s=size, zorder=3, edgecolor="white",
                   linewidth=0.8 if size > 20 else 0.2,
                   color=LINE_COLOURS[first.index(a) % len(LINE_COLOURS)],
                   marker=markers[second.index(b) % len(markers)])
    handles = [Line2D([], [], ls="none", marker="o", color=LINE_COLOURS[i % len(LINE_COLOURS)],
                      label=f"{_short_key(keys[0]) if keys else ''} = {v}")
               for i, v in enumerate(first)]
    handles += [Line2D([], [], ls="none", marker=markers[i % len(markers)], color="#555",
                       label=f"{_short_key(keys[1])} = {v}")
                for i, v in enumerate(second) if len(keys) > 1]
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.71, 0.91), frameon=False,
               fontsize=9)
    ax.xaxis.set_major_formatter(EngFormatter(unit="s"))
    ax.set_xlabel("step time")
    ax.set_ylabel("USD per million tokens" if y.startswith("cost") else "kWh per million tokens")
    fig.suptitle(("Cost" if y.startswith("cost") else "Energy")
                 + " per million tokens against step time (lower left is better)",
                 x=0.01, ha="left", fontsize=12)
    ax.grid(alpha=0.3)
    return png_bytes_closed(fig)


def _short_key(key: str) -> str:
    return key.split(".")[-1]


# --------------------------------------------------------------------------------------------
# Inputs and where each figure came from

GPU_FIELDS = (
    "peak_tflops", "hbm_GiB", "hbm_TBps", "hbm_efficiency", "nvlink_GBps", "power_W",
    "price_per_gpu_hour", "kernel_launch_s", "sm_count", "runtime_reserved_GiB",
)  # fmt: skip


def inputs_of(loaded: Any, gpu: Any) -> dict[str, Any]:
    """What the inputs section shows: the workload and topology as loaded (defaults filled
    in), which topology fields the file (or ``--set``) gave, and the GPU's figures with the
    source of each (the catalog's ``sources``, or the topology file for an inline override).

    ``loaded`` is a :class:`~simulator.config.load.LoadedWorkload`, ``gpu`` its resolved
    :class:`~simulator.hardware.catalog.GPUSpec`."""
    topo = loaded.topology
    inline = set(topo.gpu) - {"base"} if isinstance(topo.gpu, Mapping) else set()
    figures = []
    for f in GPU_FIELDS:
        value = getattr(gpu, f, None)
        if value is None:
            continue
        if isinstance(value, Mapping):
            value = dict(value)
        if f in inline:
            src = f"{loaded.topology_path}: gpu.{f}"
        else:
            src = (gpu.sources or {}).get(f) or "hardware catalog (simulator/hardware/data/gpus.yaml)"
        figures.append((f, value, src))
    return {
        "workload_file": str(loaded.workload_path),
        "topology_file": str(loaded.topology_path),
        "workload": loaded.workload.model_dump(mode="json"),
        "topology": topo.model_dump(mode="json"),
        "topology_set": sorted(topo.model_fields_set),
        "gpu": figures,
    }


def _inputs_section(inputs: Mapping[str, Any] | None) -> str:
    if not inputs:
        return ""
    topo = inputs["topology"]
    given = set(inputs["topology_set"])
    rows = []
    for k, v in topo.items():
        where = "the file" if k in given else '<span class="muted">default</span>'
        rows.append(f"<tr><th>{esc(k)}</th><td>{esc(json.dumps(v))}</td><td>{where}</td></tr>")
    topo_html = "<table><tr><th>topology key</th><th>value</th><th>from</th></tr>" + "".join(rows) + "</table>"
    gpu_rows = "".join(
        f"<tr><th>{esc(f)}</th><td>{esc(json.dumps(v))}</td><td>{esc(src)}</td></tr>"
        for f, v, src in inputs["gpu"]
    )
    gpu_html = "<table><tr><th>GPU figure</th><th>value</th><th>source</th></tr>" + gpu_rows + "</table>"
    work = yaml.safe_dump(inputs["workload"], sort_keys=False)
    return (
        "<h2>Inputs</h2>"
        f"<p>Workload <code>{esc(inputs['workload_file'])}</code>, topology "
        f"<code>{esc(inputs['topology_file'])}</code>.</p>"
        "<h3>Where each hardware figure came from</h3>" + gpu_html + topo_html
        + f"<details><summary>Workload as loaded (defaults filled in)</summary><pre>{esc(work)}</pre></details>"
    )


# --------------------------------------------------------------------------------------------
# Run


def _cards(summary: Mapping[str, Any]) -> str:
    cards = []

    def card(label: str, key: str, text: str, scale: float = 1.0) -> None:
        cards.append(f'<div class="card"><div class="v">{num(key, _get(summary, key), text, scale)}'
                     f'</div><div class="k">{esc(label)}</div></div>')

    step = summary.get("step_time_s")
    if finite(step):
        text, scale = fmt_s(step)
        card("step time", "step_time_s", text, scale)
    if finite(summary.get("tokens_per_s")):
        text, scale = fmt_si(summary["tokens_per_s"])
        card("tokens / s", "tokens_per_s", text, scale)
    if finite(summary.get("mfu")):
        card("MFU", "mfu", f"{summary['mfu'] * 100:.2f} %", 100)
    if finite(summary.get("tflops_per_gpu")):
        card("TFLOP/s per GPU", "tflops_per_gpu", f"{summary['tflops_per_gpu']:.1f}")
    mem = summary.get("memory_gib") or {}
    if finite(mem.get("total")):
        card(f"GiB per GPU of {mem.get('capacity', 0):.1f}", "memory_gib.total", f"{mem['total']:.2f}")
    for key, label, unit in (
        ("cost_per_Mtoken_usd", "USD per million tokens", "$"),
        ("energy_per_Mtoken_kWh", "kWh per million tokens", ""),
    ):
        if finite(summary.get(key)):
            v = summary[key]
            card(label, key, f"{unit}{v:.4f}" if v < 10 else f"{unit}{v:.2f}")
    return '<div class="cards">' + "".join(cards) + "</div>"


def _breakdown_section(summary: Mapping[str, Any]) -> str:
    bd = summary.get("breakdown_s") or {}
    step = summary.get("step_time_s") or 0.0
    keys = [k for k in BREAKDOWN_KEYS if k in bd] + [k for k in bd if k not in BREAKDOWN_KEYS]
    spans, rows = [], []
    for k in keys:
        v = bd[k]
        share = v / step if step else 0.0
        colour = KIND_COLOURS.get(k, "#999")
        label = KIND_LABELS.get(k, k)
        if share > 0:
            spans.append(f'<span title="{esc(label)} {share:.1%}" style="width:{share * 100:.3f}%;'
                         f'background:{colour}"></span>')
        text, scale = fmt_s(v)
        rows.append(
            f'<tr><th><span class="sw" style="background:{colour}"></span>{esc(label)}</th>'
            + num(f"breakdown_s.{k}", v, text, scale, tag="td", cls="n")
            + f'<td class="n">{share:.1%}</td></tr>'
        )
    return (
        "<h2>Where the step time goes</h2><p class=\"sub\">Exposed time on the critical path "
        f"({esc(summary.get('critical_process', ''))}); the parts add up to the step.</p>"
        f'<div class="bar">{"".join(spans)}</div>'
        "<table><tr><th>part</th><th>time</th><th>share</th></tr>" + "".join(rows) + "</table>"
    )


def _memory_rows(summary: Mapping[str, Any]) -> str:
    mem = summary.get("memory_gib") or {}
    rows = []
    for k in ("weights", "gradients", "optimizer", "activations", "reserved", "total", "capacity"):
        if finite(mem.get(k)):
            rows.append((k, num(f"memory_gib.{k}", mem[k], f"{mem[k]:.2f} GiB")))
    return kv_table(rows, ("memory (peak, worst GPU)", "GiB"))


def _links_section(
    summary: Mapping[str, Any], series: pd.DataFrame | None, links: pd.DataFrame | None
) -> str:
    busiest = summary.get("busiest_links") or []
    if not busiest:
        return ""
    step = summary.get("step_time_s") or 0.0
    bursts = link_bursts(series, step)
    rows = []

    def row(name: str, kind: str, avg: str, nbytes: float) -> str:
        b = bursts.get(name)
        peak = f"{b['peak']:.0%}" if b else '<span class="muted">—</span>'
        above = fmt_s(b["above_half_s"])[0] if b else '<span class="muted">—</span>'
        return (
            f"<tr><td>{esc(name)}</td><td>{esc(kind)}</td>{avg}"
            f'<td class="n">{peak}</td><td class="n">{above}</td>'
            f'<td class="n">{fmt_si(float(nbytes), "B")[0]}</td></tr>'
        )

    for i, link in enumerate(busiest):
        u = link.get("utilization")
        avg = num(f"busiest_links.{i}.utilization", u, f"{u * 100:.1f} %", 100, tag="td", cls="n")
        rows.append(row(str(link.get("link")), str(link.get("kind", "")), avg, link.get("bytes", 0.0)))
    shown = {str(link.get("link")) for link in busiest}
    if links is not None and not links.empty:
        by_name = links.set_index("link")
        for name in bursts:
            if name in shown or name not in by_name.index:
                continue
            r = by_name.loc[name]
            avg = f'<td class="n">{float(r["utilization"]) * 100:.1f} %</td>'
            rows.append(row(name, str(r["kind"]), avg, float(r["bytes"])))
    png = links_png(series, step)
    return (
        "<h2>Busiest links</h2><p class=\"sub\">The links busiest on average over the step, then "
        "the links that carried the most data-parallel / ZeRO traffic with their bursts: peak "
        "load and time above half load, from the flow network's load history (TP and pipeline "
        "traffic is priced without one, so it shows in the average only).</p>"
        "<table><tr><th>link</th><th>kind</th><th>average</th><th>peak</th>"
        "<th>time above 50 %</th><th>bytes</th></tr>" + "".join(rows) + "</table>"
        + (img(png, "link load over the step") if png else "")
    )


def _cost_section(summary: Mapping[str, Any]) -> str:
    rows = []
    for key, label, fmt in (
        ("cost_per_Mtoken_usd", "cost per million tokens", "${:,.4f}"),
        ("energy_per_Mtoken_kWh", "energy per million tokens", "{:,.4f} kWh"),
        ("time_to_train_days", "time to train", "{:,.2f} days"),
        ("gpu_hours", "GPU-hours", "{:,.0f}"),
        ("energy_MWh", "energy to train", "{:,.2f} MWh"),
        ("cost_usd", "cost to train", "${:,.0f}"),
    ):
        v = _get(summary, key)
        if finite(v):
            rows.append((label, num(key, v, fmt.format(v))))
    if not rows:
        return ""
    b = summary.get("cost_basis") or {}
    note = (
        f"Per GPU: {b['power_per_gpu_W']:,.0f} W (board, {b['node_overhead_W']:,.0f} W of "
        f"node overhead per node shared by its GPUs, PUE {b['pue']:g}); "
        f"${b['usd_per_gpu_hour']:,.3f} per GPU-hour ({b['price_basis']})."
        if b else ""
    )
    return "<h2>Cost and energy</h2>" + kv_table(rows) + (f'<p class="sub">{esc(note)}</p>' if note else "")


def run_report(
    summary: Mapping[str, Any],
    *,
    timeline_png: bytes | None = None,
    memory: pd.DataFrame | None = None,
    link_series: pd.DataFrame | None = None,
    links: pd.DataFrame | None = None,
    inputs: Mapping[str, Any] | None = None,
) -> str:
    """The HTML page of one run (see the module docstring)."""
    warns = "".join(f'<div class="warn">{esc(w)}</div>' for w in summary.get("warnings") or [])
    mem_png = memory_png(memory, (summary.get("memory_gib") or {}).get("capacity"))
    body = (
        f"<h1>{esc(summary.get('name', 'run'))}</h1>"
        f'<p class="sub">{esc(layout_text(dict(summary)))}</p>' + warns + _cards(summary)
        + _breakdown_section(summary)
        + ("<h2>Pipeline timeline</h2>" + img(timeline_png, "pipeline timeline") if timeline_png else "")
        + "<h2>Memory</h2>" + _memory_rows(summary) + (img(mem_png, "memory over time") if mem_png else "")
        + _links_section(summary, link_series, links)
        + _cost_section(summary)
        + _inputs_section(inputs)
        + f'<p class="muted">Simulated {num("n_gpus", summary.get("n_gpus"), str(summary.get("n_gpus")))} GPUs as '
        f"{esc(summary.get('simulated_processes', '?'))} processes, {esc(summary.get('events', '?'))} events.</p>"
    )
    return page(f"{summary.get('name', 'run')}: simulated step", body)


def write_html(path: str | Path, text: str) -> Path:
    """Write a report atomically; returns its path."""
    io.write_atomic(path, text)
    return Path(path)


# --------------------------------------------------------------------------------------------
# Compare and sweep

#: Rows of the compare page: (summary key, label, kind of number).
COMPARE_ROWS = (
    ("step_time_s", "step time", "s"),
    ("tokens_per_s", "tokens / s", "si"),
    ("mfu", "MFU", "%"),
    *((f"breakdown_s.{k}", f"  {KIND_LABELS.get(k, k)}", "s") for k in BREAKDOWN_KEYS),
    ("memory_gib.total", "memory per GPU (GiB)", "f"),
    ("cost_per_Mtoken_usd", "USD per million tokens", "f"),
    ("energy_per_Mtoken_kWh", "kWh per million tokens", "f"),
    ("time_to_train_days", "days to train", "f"),
    ("cost_usd", "cost to train (USD)", "f"),
)


def _cell(key: str, v: Any, kind: str) -> str:
    if not finite(v):
        return '<td class="n muted">—</td>'
    if kind == "s":
        text, scale = fmt_s(v)
    elif kind == "si":
        text, scale = fmt_si(v)
    elif kind == "%":
        text, scale = f"{v * 100:.2f} %", 100.0
    else:
        text = f"{v:,.4f}" if abs(v) < 10 else f"{v:,.2f}" if abs(v) < 1000 else f"{v:,.0f}"
        scale = 1.0
    return num(key, v, text, scale, tag="td", cls="n")


def compare_report(
    name: str, labels: Sequence[str], summaries: Sequence[Mapping[str, Any]], png: bytes | None
) -> str:
    """The HTML page of a comparison: one column per configuration, the change of
    throughput against the first, the breakdown figure. Cells carry ``data-key``
    ``configurations.<i>.summary.<key>`` (as ``compare --json`` names them)."""
    head = "".join(f"<th>{esc(lbl)}</th>" for lbl in labels)
    rows = []
    for key, label, kind in COMPARE_ROWS:
        values = [_get(s, key) for s in summaries]
        if not any(finite(v) for v in values):
            continue
        cells = "".join(
            _cell(f"configurations.{i}.summary.{key}", v, kind) for i, v in enumerate(values)
        )
        rows.append(f"<tr><th>{esc(label)}</th>{cells}</tr>")
    base = summaries[0].get("tokens_per_s") if summaries else None
    change = "".join(
        f'<td class="n">{(s["tokens_per_s"] / base - 1) * 100:+.1f} %</td>'
        if finite(base) and base and finite(s.get("tokens_per_s")) else '<td class="n">—</td>'
        for s in summaries
    )
    rows.append(f"<tr><th>throughput change vs {esc(labels[0])}</th>{change}</tr>")
    warns = "".join(
        f'<div class="warn">{esc(lbl)}: {esc(w)}</div>'
        for lbl, s in zip(labels, summaries, strict=True) for w in s.get("warnings") or []
    )
    body = (
        f"<h1>{esc(name)}: {len(labels)} configurations</h1>" + warns
        + f"<table><tr><th></th>{head}</tr>" + "".join(rows) + "</table>"
        + (img(png, "breakdown per configuration") if png else "")
    )
    return page(f"{name}: comparison", body)


def sweep_report(
    name: str,
    table: pd.DataFrame,
    keys: Sequence[str],
    metric: str,
    pngs: Sequence[bytes],
    max_rows: int = sweep_view.HTML_ROWS,
) -> str:
    """The HTML page of a sweep: every point, or the best ``max_rows`` of a larger sweep
    (status, metric, step time, cost and energy per million tokens), the sweep figures and
    the trade-off of cost (or, without prices, energy) per million tokens against step time
    (every point). Cells carry ``data-key`` ``points.<point_index>.<column>`` (the columns
    of ``sweep.parquet``)."""
    cols = [c for c in dict.fromkeys([metric, "step_time_s", "cost_per_Mtoken_usd",
                                      "energy_per_Mtoken_kWh", "memory_gib.total"])
            if c in table.columns]  # fmt: skip
    head = "".join(f"<th>{esc(k)}</th>" for k in ["#", *keys, "status", *cols, "reason"])
    kinds = {"step_time_s": "s", "tokens_per_s": "si", "mfu": "%"}
    rows = []
    listed = sweep_view.best_rows(table, metric, max_rows)
    for _, row in listed.iterrows():
        i = int(row["point_index"])
        cells = "".join(f"<td>{esc(row[k])}</td>" for k in keys)
        cells += f"<td>{esc(row['status'])}</td>"
        for c in cols:
            v = row[c]
            v = None if pd.isna(v) else float(v)
            cells += _cell(f"points.{i}.{c}", v, kinds.get(c, "f"))
        reason = row.get("reason") or ""
        cells += f'<td class="muted">{esc(reason[:120])}</td>'
        rows.append(f"<tr><td>{i}</td>{cells}</tr>")
    y = "cost_per_Mtoken_usd" if table.get("cost_per_Mtoken_usd") is not None else "energy_per_Mtoken_kWh"
    trade = tradeoff_png(table, y, keys) if y in table.columns else None
    body = (
        f"<h1>{esc(name)}: {len(table)} points</h1>"
        + "".join(img(p, "sweep") for p in pngs)
        + ("<h2>Cost against speed</h2>" + img(trade, "trade-off") if trade else "")
        + ("<h2>Every point</h2>" if len(listed) == len(table) else
           f"<h2>The best {len(listed)} of {len(table):,} points by {esc(metric)}</h2>"
           "<p>Every point is in sweep.parquet.</p>")
        + f'<div class="wide"><table><tr>{head}</tr>' + "".join(rows) + "</table></div>"
    )
    return page(f"{name}: sweep", body)
