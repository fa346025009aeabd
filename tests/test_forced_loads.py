"""The skewed loads a forced-routing held-out workload states (``validation/batch.py``
``forced_loads``, since the seventeenth batch) against the measured-moe workloads' loads, written
by hand from ``steps.py``'s rule when that suite was made, and against the rule worked by hand
for top-3 (first choice from SKEW_P = [0.30, 0.20, 1/12 x 6], choice j = first + j mod 8)."""

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "validation"))
import batch  # noqa: E402


def test_top2_loads_equal_the_measured_moe_workloads():
    w = yaml.safe_load((ROOT / "validation/measured-moe/moe_ep2_skewed.yaml").read_text())
    assert batch.forced_loads(8, 2) == pytest.approx(w["training"]["moe_expert_load"], abs=2e-6)


def test_top3_loads_by_hand():
    o = 1 / 12
    want = [(0.30 + o + o) / 3, (0.20 + 0.30 + o) / 3, (o + 0.20 + 0.30) / 3, (o + o + 0.20) / 3,
            o, o, o, o]
    got = batch.forced_loads(8, 3)
    assert got == pytest.approx(want, abs=2e-6)
    assert sum(got) == pytest.approx(1.0, abs=1e-9)


def test_forced_workloads_state_the_rule():
    """Every forced-routing workload of a batch: the case's layout and, when skewed, the rule's
    loads; uniform ones carry none."""
    cases = batch.forced_cases(17)
    assert len(cases) == 4
    for name, c in cases.items():
        for kind in ("uniform", "skewed"):
            w = yaml.safe_load((ROOT / f"validation/heldout17/{name}_{kind}.yaml").read_text())
            p, t, m = w["parallelism"], w["training"], c["model"]
            assert (p["dp"], p["ep"]) == (c["world"], c["ep"])
            assert t["global_batch"] == c["mb"] * c["n_mb"] * c["world"]
            assert w["model"]["moe"]["top_k"] == m["top_k"]
            loads = t.get("moe_expert_load")
            assert (loads == batch.forced_loads(m["experts"], m["top_k"])) if kind == "skewed" \
                else loads is None
