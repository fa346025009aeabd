"""What a large sweep prints and draws is bounded (issue 17 item 7): the terminal table shows
the best ``--top`` points and says how many more there are, ``sweep.png`` draws the median over
the keys that matter least, and ``sweep.html`` lists at most its row limit.

The sweep's table is made, not simulated (thousands of points would take hours): ``run_sweep``
is replaced by one returning a grid whose metric is a known function of its keys, so that the
best point, the keys that matter and every cell's median are known independently."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.cli import main
from simulator.commands import sweep_cmd
from simulator.report import sweep_view
from simulator.sweep import OK, RESULT_COLUMNS, SweepOutcome
from tests.test_sweep import write_sweep

# 5 x 6 x 4 x 3 x 7 = 2,520 points; tokens/s depends strongly on a and c, weakly on the rest
GRID = {
    "topology.nic_bandwidth_Gbps": [50, 100, 200, 400, 800],  # a
    "topology.oversubscription": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0],  # b
    "training.grad_bucket_MB": [10, 25, 50, 100],  # c
    "topology.nic_latency_us": [1.0, 2.0, 3.0],  # d
    "seed": list(range(7)),
}
KEYS = list(GRID)


def _metric(a, b, c, d, seed):
    return 1e5 * (1 + 0.5 * np.log2(a / 50)) * (1 + 0.4 * np.log2(c / 10)) - 10 * b - 5 * d + seed


def big_outcome(out: Path) -> SweepOutcome:
    combos = pd.DataFrame(list(itertools.product(*GRID.values())), columns=KEYS)
    n = len(combos)
    table = pd.DataFrame({c: [np.nan if t == "float" else None] * n
                          for c, t in RESULT_COLUMNS.items()})  # fmt: skip
    table["status"] = OK
    table["reason"] = ""
    table["fits"] = True
    for k in KEYS:
        table[k] = combos[k]
    table["point_index"] = np.arange(n)
    table["tokens_per_s"] = _metric(*(combos[k].to_numpy(dtype=float) for k in KEYS))
    table["step_time_s"] = 4e6 / table["tokens_per_s"]
    bad = np.arange(n) % 50 == 7
    table.loc[bad, ["status", "reason", "tokens_per_s"]] = ["does_not_fit", "too big", np.nan]
    out.mkdir(parents=True, exist_ok=True)
    return SweepOutcome(name="big", table=table, keys=KEYS, metric="tokens_per_s",
                        path=out / "sweep.parquet", out=out, n_points=n, n_run=n,
                        n_skipped=0, wall_s=1.0)  # fmt: skip


@pytest.fixture
def big(tmp_path, monkeypatch):
    outcome = big_outcome(tmp_path / "o")
    monkeypatch.setattr(sweep_cmd, "run_sweep", lambda *a, **k: outcome)
    path = write_sweep(tmp_path, grid={"seed": [0, 1]})  # a real file for the CLI's checks
    return path, outcome


def test_a_large_sweep_prints_the_best_points_and_a_count(big, capsys):
    path, outcome = big
    assert main(["sweep", str(path), "--out", str(outcome.out), "--no-progress", "--top", "7"]) == 0
    text = capsys.readouterr().out
    n = len(outcome.table)
    rows = [ln for ln in text.splitlines() if re.search(r"\bok\s*$", ln)]
    assert len(rows) == 7  # the 7 best, not 2,520
    assert len(text.splitlines()) < 7 + 12  # header, rule, the two closing lines
    assert f"the best 7 of {n:,} points by tokens_per_s" in text
    assert f"{n - 7:,} more in sweep.parquet" in text
    # the first row is the best point: a = 800, c = 100, b = 1.0, d = 1.0, seed 6
    assert "★ best" in rows[0]
    assert rows[0].split()[:5] == ["800", "1.0", "100", "1.0", "6"]


def test_a_large_sweep_plots_medians_by_the_keys_that_matter(big):
    _, outcome = big
    ok = outcome.table[outcome.table["status"] == OK]
    view = sweep_view.plot_view(outcome.table, KEYS, "tokens_per_s")
    a, c = "topology.nic_bandwidth_Gbps", "training.grad_bucket_MB"
    assert view.keys == [a, c]  # the two keys that move the metric most, in sweep order
    assert len(view.df) == 5 * 4  # one cell per (a, c)
    n_bad = len(outcome.table) - len(ok)
    assert view.note == (  # 2,520 / 20 cells; the failed points are not in the medians
        "median of 126 points a cell over oversubscription, nic_latency_us, seed "
        f"({n_bad} infeasible or failed left out)"
    )
    cell = view.df[(view.df[a] == 200) & (view.df[c] == 25)].iloc[0]
    by_hand = ok[(ok[a] == 200) & (ok[c] == 25)]["tokens_per_s"].median()
    assert cell["tokens_per_s"] == pytest.approx(by_hand, rel=1e-12)


def test_a_large_sweeps_page_lists_at_most_its_row_limit(big, capsys):
    path, outcome = big
    assert main(["sweep", str(path), "--out", str(outcome.out), "--no-progress"]) == 0
    page = (outcome.out / "sweep.html").read_text()
    listed = set(re.findall(r'data-key="points\.(\d+)\.tokens_per_s"', page))
    assert len(listed) == sweep_view.HTML_ROWS
    assert f"The best {sweep_view.HTML_ROWS} of {len(outcome.table):,} points" in page
    best = outcome.table["tokens_per_s"].idxmax()
    assert str(outcome.table.loc[best, "point_index"]) in listed
    assert (outcome.out / "sweep.png").stat().st_size > 0


def test_ranked_puts_failed_points_last_and_breaks_ties_in_point_order():
    df = pd.DataFrame({"step_time_s": [2.0, np.nan, 1.0, 2.0, 0.5],
                       "status": [OK, "failed", OK, OK, "does_not_fit"]})  # fmt: skip
    assert list(sweep_view.ranked(df, "step_time_s").index) == [2, 0, 3, 1, 4]
    assert list(sweep_view.best_rows(df, "step_time_s", 9).index) == [0, 1, 2, 3, 4]
