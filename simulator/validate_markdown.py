"""The README's fidelity tables, made from the suites themselves (``validate --markdown``).

Three tables, one per way a suite was used (its ``role``, ``held_out_until`` and
``predicted_at``): **fit sets**, **development sets** and **pre-registered held-out batches**.
A row is the suite's file (a link), its ``summary`` (a few words), how it is used, its cases,
MAPE and bias (mean signed error) side by side, and its ``note`` with a link to its section
of ``docs/FIDELITY_HISTORY.md`` where it has one. A held-out batch shows its held-out result
as it came out -- the predictions recorded at its freeze tag scored on the measurements --
beside today's re-run of the current model. Nothing here is typed by hand, so the table cannot drift from the
suites: figures are computed by :mod:`simulator.validate`, words come from the suite files.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from simulator.validate import SuiteResult

#: where each suite's full history is kept, relative to the repository root
HISTORY = "docs/FIDELITY_HISTORY.md"

FIT_HEAD = ("**Fit sets**: constants were fitted on them; their error measures the fit, "
            "not a prediction.")
DEV_HEAD = ("**Development sets**: nothing fitted, but looked at while the model was chosen; "
            "not a test of prediction.")
HELD_HEAD = ("**Pre-registered held-out batches**: the model frozen at a tag, every case "
             "predicted once there and committed before the measurement. *Held out* is that "
             "prediction scored as it came out; *today* re-runs the current model, a "
             "development result once the suite has been looked at (*used as now*).")


def is_held_out_batch(r: SuiteResult) -> bool:
    """A pre-registered suite: predicted once at a freeze tag (held out or looked at since)."""
    return bool(r.frozen_tag) or r.role == "held_out" or r.at_freeze is not None


def pct(x: float) -> str:
    """0.123 -> '12.3 %' (the README's style)."""
    return f"{x * 100:.1f} %"


def signed_pct(x: float) -> str:
    """Bias: -0.05 -> '-5.0 %', 0.05 -> '+5.0 %'."""
    return f"{x * 100:+.1f} %"


def anchor(name: str) -> str:
    """The GitHub anchor of a ``## name`` heading (lower case; spaces to '-'; other
    punctuation but '-' and '_' dropped)."""
    return re.sub(r"[^a-z0-9 _-]", "", name.lower()).replace(" ", "-")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _suite_link(r: SuiteResult, root: Path) -> str:
    if r.path is None:
        return f"`{r.name}`"
    path = Path(r.path).resolve()
    try:
        rel = path.relative_to(root.resolve()).as_posix()
    except ValueError:
        rel = path.as_posix()
    shown = rel.removeprefix("validation/")
    return f"[`{shown}`]({rel})"


def history_sections(root: Path) -> set[str]:
    """The suite names with a ``## name`` section in ``docs/FIDELITY_HISTORY.md``."""
    path = root / HISTORY
    if not path.is_file():
        return set()
    return {line[3:].strip() for line in path.read_text(encoding="utf-8").splitlines()
            if line.startswith("## ")}


def _note(r: SuiteResult, history: set[str]) -> str:
    words = _cell(r.note)
    if r.name not in history:  # a new suite: no history yet
        return words
    link = f"[history]({HISTORY}#{anchor(r.name)})"
    return f"{words} ({link})" if words else link


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    right = {"cases", "MAPE", "bias", "held-out MAPE", "held-out bias", "today MAPE",
             "today bias"}
    out = ["| " + " | ".join(header) + " |",
           "|" + "|".join("---:" if h in right else "---" for h in header) + "|"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def _plain_rows(results: list[SuiteResult], root: Path) -> list[list[str]]:
    history = history_sections(root)
    return [[_suite_link(r, root), _cell(r.summary) or r.name, r.role.replace("_", " "),
             str(len(r.cases)), pct(r.mape), signed_pct(r.bias), _note(r, history)]
            for r in results]


def _tag_key(r: SuiteResult) -> tuple:
    """Held-out batches in the order of their tags (heldout-predictions-2 before -10); within
    a tag, steps before collectives, and each memory suite right after its steps' suite."""
    parts = re.split(r"(\d+)", r.frozen_tag)
    tag = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in parts)
    path = Path(r.path).as_posix() if r.path is not None else r.name
    path = path.removesuffix(".yaml")
    steps = path.replace("-memory/", "/").replace("memory", "suite")
    return tag, bool(r.bands), steps, path != steps


def _held_rows(results: list[SuiteResult], root: Path) -> list[list[str]]:
    history = history_sections(root)
    rows = []
    for r in sorted(results, key=_tag_key):
        if r.at_freeze is not None:
            m, b, n = r.at_freeze
            held_m, held_b = pct(m), signed_pct(b)
            cases = str(n) if n == len(r.cases) else f"{n} ({len(r.cases)} today)"
        else:  # held out, no prediction recorded: today's run is its held-out result
            held_m, held_b, cases = "not recorded", "", str(len(r.cases))
        used = "held out" if r.role == "held_out" else "development"
        tag = f"`{r.frozen_tag}`" if r.frozen_tag else ""
        rows.append([_suite_link(r, root), _cell(r.summary) or r.name, tag, cases,
                     f"**{held_m}**", f"**{held_b}**" if held_b else "", used,
                     pct(r.mape), signed_pct(r.bias), _note(r, history)])
    return rows


def markdown(results: list[SuiteResult], root: Path) -> str:
    """The three tables (fit, development, pre-registered held-out) as Markdown, every suite
    of ``results`` in exactly one; paths are linked relative to ``root``."""
    held = [r for r in results if is_held_out_batch(r)]
    fit = [r for r in results if r.role == "fit" and not is_held_out_batch(r)]
    dev = [r for r in results if r.role != "fit" and not is_held_out_batch(r)]
    plain = ["suite", "what it is", "used as", "cases", "MAPE", "bias", "note"]
    lines: list[str] = []
    for head, group in ((FIT_HEAD, fit), (DEV_HEAD, dev)):
        if group:
            lines += [head, "", *_table(plain, _plain_rows(group, root)), ""]
    if held:
        header = ["suite", "what it is", "predicted at", "cases", "held-out MAPE",
                  "held-out bias", "used as now", "today MAPE", "today bias",
                  "note (of the held-out result)"]
        lines += [HELD_HEAD, "", *_table(header, _held_rows(held, root)), ""]
    return "\n".join(lines).rstrip("\n") + "\n"
