"""The HTML reports in a real headless browser: they load offline without console errors, and
every number they show equals the run's own record (``summary.json``, ``compare --json``,
``sweep.parquet``).

Needs the ``playwright`` package and a Chromium at ``/usr/bin/chromium`` (``.ci/run`` installs
both: Debian's chromium and ``pip install playwright``); without them the tests are skipped,
unless ``SIMULATOR_REQUIRE_BROWSER=1`` (CI sets it) turns the skip into a failure.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from simulator.cli import main as cli_main
from tests.conftest import SMALL_MODEL, small_topology, write_case

CHROMIUM = Path(os.environ.get("SIMULATOR_CHROMIUM", "/usr/bin/chromium"))
REQUIRED = os.environ.get("SIMULATOR_REQUIRE_BROWSER") == "1"


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed"
    if not CHROMIUM.exists():
        return f"no Chromium at {CHROMIUM}"
    return None


@pytest.fixture(scope="module")
def browser():
    why = _missing()
    if why:
        if REQUIRED:
            pytest.fail(f"SIMULATOR_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--headless"]
        )
        yield b
        b.close()


def open_page(browser, path: Path) -> tuple[list[dict], list[str]]:
    """Load ``path`` offline; return its numbers (data-key, data-value, data-scale, text)
    and the console errors and page errors it raised."""
    ctx = browser.new_context(offline=True)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
    page.goto(path.resolve().as_uri(), wait_until="load")
    numbers = page.eval_on_selector_all(
        "[data-key]",
        "els => els.map(e => ({key: e.dataset.key, value: e.dataset.value, "
        "scale: e.dataset.scale, text: e.textContent}))",
    )
    broken = page.eval_on_selector_all(
        "img", "els => els.filter(e => !(e.complete && e.naturalWidth > 0)).length"
    )
    if broken:
        errors.append(f"{broken} image(s) did not load")
    ctx.close()
    return numbers, errors


def lookup(doc, dotted: str):
    cur = doc
    for part in dotted.split("."):
        if isinstance(cur, list):
            cur = cur[int(part)]
        elif isinstance(cur, dict):
            if part not in cur:
                # keys that hold dots themselves ("breakdown_s.compute" in a sweep row)
                rest = dotted.split(".")
                i = rest.index(part)
                joined = ".".join(rest[i:])
                for k in sorted(cur, key=len, reverse=True):
                    if joined == k or joined.startswith(k + "."):
                        tail = joined[len(k) + 1 :]
                        return lookup(cur[k], tail) if tail else cur[k]
                raise KeyError(dotted)
            cur = cur[part]
        else:
            raise KeyError(dotted)
    return cur


def check_numbers(numbers: list[dict], record) -> int:
    """Every shown number equals the record's: the exact value in data-value, and the text
    is that value in the shown unit, rounded to the digits shown."""
    assert numbers, "the page shows no numbers"
    for n in numbers:
        value = json.loads(n["value"])
        expected = lookup(record, n["key"])
        if isinstance(expected, float):
            assert value == pytest.approx(expected, rel=1e-12), n
        else:
            assert value == expected, n
        m = re.search(r"[-+]?\d[\d,]*(?:\.(\d+))?", n["text"])
        assert m, n
        shown = float(m.group(0).replace(",", ""))
        digits = len(m.group(1) or "")
        assert math.isclose(
            shown, float(value) * float(n["scale"]), abs_tol=0.51 * 10**-digits
        ), n
    return len(numbers)


def small_case(tmp_path: Path) -> Path:
    """16 GPUs on two nodes: TP 4, PP 2, DP 2 (pipeline, DP flows across nodes, NVLink)."""
    work = {
        "name": "html",
        "model": {**SMALL_MODEL, "layers": 4},
        "training": {"global_batch": 16, "micro_batch": 1, "tokens": 1.0e9},
        "parallelism": {"tp": 4, "pp": 2, "dp": 2, "zero": 1},
    }
    topo = small_topology(2, 8, cost={"pue": 1.25, "node_overhead_W": 3000.0})
    return write_case(tmp_path, work, topo)


def test_run_report_in_a_browser(browser, tmp_path):
    out = tmp_path / "out"
    assert cli_main(["run", str(small_case(tmp_path)), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    numbers, errors = open_page(browser, out / "report.html")
    assert errors == []
    check_numbers(numbers, summary)
    keys = {n["key"] for n in numbers}
    # The headline, every part of the breakdown, memory and cost are all on the page.
    assert {"step_time_s", "tokens_per_s", "mfu", "cost_per_Mtoken_usd",
            "energy_per_Mtoken_kWh", "memory_gib.total"} <= keys  # fmt: skip
    assert {f"breakdown_s.{k}" for k in summary["breakdown_s"]} <= keys
    text = (out / "report.html").read_text()
    assert "http://" not in text and "https://" not in text.replace("https://ui.perfetto", "")


def test_compare_and_sweep_reports_in_a_browser(browser, tmp_path, capsys):
    work = small_case(tmp_path)
    out = tmp_path / "cmp"
    args = ["compare", str(work), "--variant", "slow-nic:topology.nic_bandwidth_Gbps=100",
            "--out", str(out)]  # fmt: skip
    assert cli_main([*args, "--json", "--no-files"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert cli_main(args) == 0
    numbers, errors = open_page(browser, out / "compare.html")
    assert errors == []
    check_numbers(numbers, doc)

    sweep = {"name": "s", "base": work.name,
             "grid": {"topology.nic_bandwidth_Gbps": [100, 400]}}  # fmt: skip
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    sout = tmp_path / "sweep"
    assert cli_main(["sweep", str(tmp_path / "sweep.yaml"), "--workers", "1", "--out",
                     str(sout), "--no-progress"]) == 0  # fmt: skip
    rows = pq.read_table(sout / "sweep.parquet").to_pylist()
    numbers, errors = open_page(browser, sout / "sweep.html")
    assert errors == []
    check_numbers(numbers, {"points": {str(r["point_index"]): r for r in rows}})
