"""``simulator validate [SUITE.yaml ...]``: predicted vs measured, with errors, MAPE and bias,
and how each suite was used (fit set, development set or held out)."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from simulator.errors import ConfigError
from simulator.validate import SuiteResult, prepare_suite, run_prepared
from simulator.validate_markdown import markdown

REPO = Path(__file__).resolve().parents[2]


def _is_suite(path: Path) -> bool:
    """A YAML file in a validation/ subfolder is a suite (not a case's workload) when it says
    how it was used: a top-level ``role:`` key."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    return any(line.startswith("role:") for line in head.splitlines())


def default_suites() -> list[Path]:
    """Every suite shipped in validation/ (the repository's, else the current directory's)."""
    for base in (REPO / "validation", Path("validation")):
        if base.is_dir():
            nested = [p for p in base.glob("*/*.yaml") if p.name == "suite.yaml" or _is_suite(p)]
            return sorted({*base.glob("*.yaml"), *nested})
    return []


def register(sub) -> None:
    p = sub.add_parser("validate", help="run validation suites: predicted vs measured")
    p.add_argument("suites", nargs="*", help="suite YAML files (default: validation/*.yaml, "
                                             "validation/*/suite.yaml and every other "
                                             "validation/*/*.yaml with a top-level role)")
    p.add_argument("--quiet", action="store_true", help="only the per-suite verdicts")
    p.add_argument("--markdown", action="store_true",
                   help="print only the README's fidelity tables (Markdown: fit, development "
                        "and pre-registered held-out suites, MAPE beside bias) on stdout")
    p.set_defaults(func=main)


def _fmt(metric: str, v: float) -> str:
    if metric.endswith("per_s"):  # a rate (tokens_per_s), not a time
        return f"{v:,.0f}/s"
    if metric.endswith("_s"):
        return f"{v * 1e6:,.1f} µs" if v < 1e-2 else f"{v:,.3f} s"
    return f"{v:,.4g}"


def render(res: SuiteResult, console: Console, quiet: bool) -> None:
    if not quiet:
        t = Table(title=f"validation suite: {res.name}", title_justify="left")
        t.add_column("case")
        t.add_column("predicted", justify="right")
        t.add_column("measured", justify="right")
        t.add_column("error", justify="right")
        for c in res.cases:
            colour = "green" if abs(c.error) <= 0.10 else "yellow" if abs(c.error) <= 0.2 else "red"
            t.add_row(c.name, _fmt(c.metric, c.predicted), _fmt(c.metric, c.measured),
                      f"[{colour}]{c.error:+.1%}[/{colour}]")
        console.print(t)
    role = res.role.replace("_", " ") + " set"
    if res.held_out_until:
        role += f", held out until tag {res.held_out_until}"
    console.print(f"  {res.name} ({role}): {len(res.cases)} cases, MAPE {res.mape:.1%}, "
                  f"bias {res.bias:+.1%}")
    if res.at_freeze is not None:
        m, b, n = res.at_freeze
        tag = f"at tag {res.frozen_tag}" if res.frozen_tag else "when the model was frozen"
        rerun = ("a development result" if res.held_out_until else
                 "the current model's prediction")
        console.print(f"    held-out result (predicted once {tag}, before measuring): {n} "
                      f"cases, MAPE {m:.1%}, bias {b:+.1%}; the figures above re-run the "
                      f"current model, {rerun}")
    for band, m, b, n in res.bands:
        console.print(f"    {band}: {n} cases, MAPE {m:.1%}, bias {b:+.1%}")
    for what, value, limit in res.checks:
        ok = value <= limit
        mark = "[green]PASS[/green]" if ok else "[red]FAIL[/red]"
        console.print(f"  {mark} {res.name}: {what} = {value:.1%} (limit {limit:.0%})")


def summary_table(results: list[SuiteResult]) -> Table:
    """One row per suite: how it was used, cases, MAPE, bias (mean signed error), verdict."""
    t = Table(title="validation summary (bias = mean of predicted / measured - 1: below 0, a "
                    "time predicted too short, a size too small or a rate too low)",
              title_justify="left")
    for col, just in (("suite", "left"), ("used as", "left"), ("cases", "right"),
                      ("MAPE", "right"), ("bias", "right"), ("verdict", "left")):
        t.add_column(col, justify=just)
    for r in results:
        used = r.role.replace("_", " ")
        if r.at_freeze is not None:
            when = f"held out until {r.held_out_until}" if r.held_out_until else \
                f"predicted at {r.frozen_tag or 'the freeze'}"
            used += f" ({when}: MAPE {r.at_freeze[0]:.1%}, bias {r.at_freeze[1]:+.1%})"
        t.add_row(r.name, used, str(len(r.cases)), f"{r.mape:.1%}",
                  f"{r.bias:+.1%}", "[green]pass[/green]" if r.passed else "[red]FAIL[/red]")
    return t


def main(args) -> int:
    suites = [Path(s) for s in args.suites] or default_suites()
    if not suites:
        raise ConfigError("no suites given and no validation/ folder found", file="validate")
    console = Console(width=max(100, Console().width), highlight=False)
    failed, results = [], []
    prepared = [prepare_suite(path) for path in suites]  # bad suites fail before any output
    if args.markdown:  # stdout is the Markdown alone; verdicts go to stderr
        console = Console(file=sys.stderr, width=100, highlight=False)
    for path, prep in zip(suites, prepared, strict=True):
        with Progress(TextColumn(f"validating {path.name}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=Console(file=sys.stderr), transient=True) as bar:
            task = bar.add_task("", total=prep.size)
            res = run_prepared(prep, progress=lambda task=task: bar.advance(task))
        render(res, console, args.quiet or args.markdown)
        results.append(res)
        if not res.passed:
            failed.append(res.name)
    if args.markdown:
        sys.stdout.write(markdown(results, root=REPO))
    else:
        console.print(summary_table(results))
    if failed:
        console.print(f"[red]{len(failed)} suite(s) outside tolerance: {', '.join(failed)}[/red]")
        return 1
    console.print(f"[green]all {len(suites)} suite(s) within tolerance[/green]")
    return 0
