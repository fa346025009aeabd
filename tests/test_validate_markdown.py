"""validate --markdown: the README's fidelity tables made from the suites themselves."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.commands.validate_cmd import default_suites
from simulator.config.suite import WorkloadSuite, load_suite
from simulator.errors import ConfigError
from simulator.validate import CaseResult, SuiteResult, frozen_result, run_suite
from simulator.validate_markdown import DEV_HEAD, FIT_HEAD, HELD_HEAD, markdown

ROOT = Path(__file__).resolve().parents[1]
TOPO = ROOT / "topologies" / "h100x4-nvswitch.yaml"
MiB = 2**20


def _tables(md: str) -> dict[str, list[list[str]]]:
    """{group heading: rows (cells)} of validate --markdown's output."""
    out: dict[str, list[list[str]]] = {}
    head = None
    for line in md.splitlines():
        if line.startswith("**"):
            head = line
            out[head] = []
        elif line.startswith("| ") and head is not None and not line.startswith("| suite |"):
            out[head].append([c.strip() for c in line.strip("|").split(" | ")])
    return out


def _collective_s(nbytes: int) -> float:
    """The `collective` command's time for one all-reduce over all 4 GPUs of the box."""
    r = subprocess.run([sys.executable, "-m", "simulator", "collective", "all_reduce",
                        "--bytes", str(nbytes), "--topology", str(TOPO), "--json"],
                       cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["time_s"]


def _tiny_suites(tmp_path: Path) -> tuple[Path, Path, list[float]]:
    """A fit suite and a once-held-out suite of two measured all-reduces each (group of 4,
    device timing), the latter with a predictions file written 'at its freeze'."""
    measured = [2.0e-4, 6.0e-3]  # 64 MiB, 1 GiB
    sizes = [64 * MiB, 1024 * MiB]
    (tmp_path / "m.jsonl").write_text("".join(
        json.dumps({"op": "all_reduce", "group": 4, "bytes": b, "time_s": t}) + "\n"
        for b, t in zip(sizes, measured, strict=True)))
    rows = [{"op": "all_reduce", "group": 4, "bytes": sizes[0], "predicted_s": 2.2e-4},
            {"op": "all_reduce", "group": 4, "bytes": sizes[1], "predicted_s": 4.8e-3}]
    (tmp_path / "pred.yaml").write_text(yaml.safe_dump({"rows": rows}))
    base = {"kind": "collectives", "data": "m.jsonl", "topology": str(TOPO),
            "ops": ["all_reduce"], "bands": [{"name": "all", "tolerance_mape": 10.0}],
            "role_note": "x"}
    fit = tmp_path / "fit.yaml"
    fit.write_text(yaml.safe_dump({**base, "name": "tiny-fit", "role": "fit",
                                   "summary": "two all-reduces", "note": "fitted here"}))
    held = tmp_path / "held.yaml"
    held.write_text(yaml.safe_dump({**base, "name": "tiny-held", "role": "development",
                                    "held_out_until": "tag-7", "predictions": "pred.yaml",
                                    "summary": "the same, pre-registered"}))
    return fit, held, measured


def test_markdown_figures_match_an_independent_calculation(tmp_path):
    fit, held, measured = _tiny_suites(tmp_path)
    r = subprocess.run([sys.executable, "-m", "simulator", "validate", "--markdown", str(fit),
                        str(held)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # stdout is the Markdown alone: headings, tables and blank lines
    assert all(not line or line.startswith(("**", "|")) for line in r.stdout.splitlines())
    tables = _tables(r.stdout)
    assert set(tables) == {FIT_HEAD, HELD_HEAD}  # no development set given
    # today's figures, from the `collective` command and the measured times by hand
    errs = [_collective_s(b) / t - 1 for b, t in zip((64 * MiB, 1024 * MiB), measured,
                                                        strict=True)]
    today_m = f"{(abs(errs[0]) + abs(errs[1])) / 2 * 100:.1f} %"
    today_b = f"{(errs[0] + errs[1]) / 2 * 100:+.1f} %"
    ((row,),) = [tables[FIT_HEAD]]
    assert row[0] == f"[`{fit.resolve().as_posix()}`]({fit.resolve().as_posix()})"
    assert row[1:6] == ["two all-reduces", "fit", "2", today_m, today_b]
    assert row[6] == "fitted here"  # no section in docs/FIDELITY_HISTORY.md: no link
    # the held-out result: the predictions file, +10 % and -20 %: MAPE 15 %, bias -5 %
    ((row,),) = [tables[HELD_HEAD]]
    assert row[1:10] == ["the same, pre-registered", "`tag-7`", "2", "**15.0 %**",
                         "**-5.0 %**", "development", today_m, today_b, ""]


def _result(name: str, role: str, errors: list[float], **kw) -> SuiteResult:
    cases = [CaseResult(name, f"c{i}", "step_time_s", 1.0 + e, 1.0)
             for i, e in enumerate(errors)]
    return SuiteResult(name, cases, [], role=role, **kw)


def test_each_suite_lands_in_the_table_of_its_use():
    results = [
        _result("f", "fit", [0.1, -0.3], summary="F"),
        _result("d", "development", [0.02], summary="D", note="a | b"),
        _result("h", "held_out", [0.05, 0.07], frozen_tag="tag-10", at_freeze=(0.2, -0.1, 2)),
        _result("h2", "development", [0.0], held_out_until="tag-2", frozen_tag="tag-2",
                at_freeze=(0.3, 0.3, 1)),
    ]
    tables = _tables(markdown(results, ROOT))
    assert [r[1] for r in tables[FIT_HEAD]] == ["F"]
    assert tables[FIT_HEAD][0][4:6] == ["20.0 %", "-10.0 %"]  # |0.1|, |-0.3|; 0.1 - 0.3
    (dev,) = tables[DEV_HEAD]
    assert dev[1:6] == ["D", "development", "1", "2.0 %", "+2.0 %"]
    assert dev[6].startswith("a \\| b")  # a pipe in a note does not split the row
    # held-out batches in their tags' order (tag-2 before tag-10), frozen beside today
    held = tables[HELD_HEAD]
    assert [r[2] for r in held] == ["`tag-2`", "`tag-10`"]
    assert held[0][4:9] == ["**30.0 %**", "**+30.0 %**", "development", "0.0 %", "+0.0 %"]
    assert held[1][4:9] == ["**20.0 %**", "**-10.0 %**", "held out", "6.0 %", "+6.0 %"]


def _shipped_results() -> list[SuiteResult]:
    """Each shipped suite as a result without running it (no cases): its role, tag, words
    and, for a workload suite, its frozen result."""
    out = []
    for p in default_suites():
        s = load_suite(p)
        at = frozen_result(s) if isinstance(s, WorkloadSuite) else None
        out.append(SuiteResult(s.name, [], [], role=s.role, held_out_until=s.held_out_until,
                               at_freeze=at, frozen_tag=s.frozen_tag, path=p,
                               summary=s.summary, note=s.note))
    return out


def test_every_shipped_suite_appears_once_with_its_role_and_words():
    results = _shipped_results()
    tables = _tables(markdown(results, ROOT))
    rows = [(head, row) for head, rs in tables.items() for row in rs]
    assert len(rows) == len(results)
    for r in results:
        rel = Path(r.path).relative_to(ROOT).as_posix()
        (head, row), = [(h, row) for h, row in rows if f"]({rel})" in row[0]]
        assert r.summary and r.summary == row[1], rel
        assert f"(docs/FIDELITY_HISTORY.md#{r.name})" in row[-1], rel  # its history section
        if r.frozen_tag or r.role == "held_out":
            assert head == HELD_HEAD and r.frozen_tag and row[2] == f"`{r.frozen_tag}`", rel
            assert row[6] == ("held out" if r.role == "held_out" else "development"), rel
        else:
            assert head == (FIT_HEAD if r.role == "fit" else DEV_HEAD), rel
            assert row[2] == r.role, rel


def test_the_readme_table_lists_every_shipped_suite_in_its_group():
    """The README's block (pasted from validate --markdown) names each suite once, in the
    table of its use; its figures are today's, so only the structure is checked here."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- validate --markdown: begin -->\n(.*?)<!-- validate --markdown: "
                      r"end -->", text, re.S)
    assert block, "README has no generated fidelity block"
    tables = _tables(block.group(1))
    for r in _shipped_results():
        rel = Path(r.path).relative_to(ROOT).as_posix()
        where = [h for h, rs in tables.items() for row in rs if f"]({rel})" in row[0]]
        want = HELD_HEAD if (r.frozen_tag or r.role == "held_out") else \
            FIT_HEAD if r.role == "fit" else DEV_HEAD
        assert where == [want], rel


def test_predicted_at_needs_a_held_out_role(tmp_path):
    fit, _, _ = _tiny_suites(tmp_path)
    data = yaml.safe_load(fit.read_text())
    fit.write_text(yaml.safe_dump({**data, "predicted_at": "tag-1"}))
    with pytest.raises(ConfigError, match="predicted_at"):
        run_suite(fit)
