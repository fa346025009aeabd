"""validate: how a suite was used, and bias (mean signed error) beside MAPE."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.errors import ConfigError
from simulator.validate import CaseResult, bias, mape, run_suite

ROOT = Path(__file__).resolve().parents[1]


def _case(pred: float, meas: float) -> CaseResult:
    return CaseResult("s", "c", "step_time_s", pred, meas)


def test_bias_is_the_mean_signed_error_and_mape_its_absolute_mean():
    cases = [_case(0.9, 1.0), _case(2.2, 2.0), _case(0.7, 1.0)]  # -10 %, +10 %, -30 %
    assert bias(cases) == pytest.approx(-0.10)
    assert mape(cases) == pytest.approx(0.50 / 3)


def test_every_shipped_suite_says_how_it_was_used():
    suites = [*ROOT.glob("validation/*.yaml"), *ROOT.glob("validation/*/suite.yaml")]
    assert suites
    for p in suites:
        data = yaml.safe_load(p.read_text())
        assert data.get("role") in ("fit", "development", "held_out"), p
        assert str(data.get("role_note", "")).strip(), p


def _collective_suite(tmp_path: Path, **extra) -> Path:
    topo = ROOT / "topologies" / "h200x4-nvswitch.yaml"
    data = ROOT / "data" / "measured" / "h200x4" / "collectives.jsonl"
    suite = {"name": "t", "kind": "collectives", "data": str(data), "topology": str(topo),
             "ops": ["all_gather"], "timing": "events",
             "bands": [{"name": "all", "tolerance_mape": 1.0}], **extra}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(suite))
    return p


def test_a_suite_without_a_role_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="role"):
        run_suite(_collective_suite(tmp_path))
    p = _collective_suite(tmp_path, role="validation")
    r = subprocess.run([sys.executable, "-m", "simulator", "validate", str(p)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and "role" in r.stderr and "held_out" in r.stderr


def test_collective_suite_reports_role_and_band_bias(tmp_path):
    res = run_suite(_collective_suite(tmp_path, role="held_out", role_note="x"))
    assert res.role == "held_out"
    ((name, m, b, n),) = res.bands
    assert n == len(res.cases) == 20  # all_gather, groups of 4 and 2, 4 KiB .. 1 GiB
    assert m == pytest.approx(res.mape) and b == pytest.approx(res.bias)
    assert abs(b) <= m


def test_a_once_held_out_suite_reports_its_one_prediction_apart(tmp_path):
    """held_out_until: the held-out result is computed from the predictions recorded at the
    tag (predicted_at_freeze), not from a re-run; such a suite must say it is development."""
    wl = yaml.safe_load((ROOT / "validation/heldout/ho_ddp4_A.yaml").read_text())
    wl["cluster"]["topology"] = str(ROOT / "validation/heldout" / wl["cluster"]["topology"])
    cases = [{"name": "a", "workload": wl, "measured": {"step_time_s": 1.0},
              "predicted_at_freeze": {"step_time_s": 0.9}},
             {"name": "b", "workload": wl, "measured": {"step_time_s": 2.0},
              "predicted_at_freeze": {"step_time_s": 2.4}}]
    suite = {"name": "t", "role": "development", "role_note": "x", "held_out_until": "tag-1",
             "cases": cases, "tolerance_mape": 10.0}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(suite))
    res = run_suite(p)
    m, b, n = res.at_freeze
    assert (n, m, b) == (2, pytest.approx(0.15), pytest.approx(0.05))  # -10 %, +20 %
    assert res.held_out_until == "tag-1"
    p.write_text(yaml.safe_dump({**suite, "role": "held_out"}))
    with pytest.raises(ConfigError, match="held_out_until"):
        run_suite(p)


def test_a_once_held_out_collective_suite_scores_its_predictions_file(tmp_path):
    """A collectives suite's held-out result is its predictions file (written at the freeze
    tag) scored on the measured rows, whatever the model is now; rows without a prediction are
    left out, and a malformed file is one ConfigError naming the row."""
    data = tmp_path / "m.jsonl"
    data.write_text('{"op": "all_reduce", "group": 4, "bytes": 1048576, "time_s": 1e-4}\n'
                    '{"op": "all_reduce", "group": 4, "bytes": 4194304, "time_s": 2e-4}\n'
                    '{"op": "all_reduce", "group": 2, "bytes": 4194304, "time_s": 2e-4}\n')
    rows = [{"op": "all_reduce", "group": 4, "bytes": 1048576, "predicted_s": 0.8e-4},
            {"op": "all_reduce", "group": 4, "bytes": 4194304, "predicted_s": 2.6e-4}]
    (tmp_path / "pred.yaml").write_text(yaml.safe_dump({"rows": rows}))
    suite = {"name": "t", "kind": "collectives", "role": "development", "role_note": "x",
             "held_out_until": "tag-1", "predictions": "pred.yaml", "data": "m.jsonl",
             "topology": str(ROOT / "topologies/h200x4-nvswitch.yaml"), "ops": ["all_reduce"],
             "bands": [{"name": "all", "tolerance_mape": 10.0}]}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(suite))
    m, b, n = run_suite(p).at_freeze
    assert (n, m, b) == (2, pytest.approx(0.25), pytest.approx(0.05))  # -20 %, +30 %
    rows[1]["predicted_s"] = -1.0
    (tmp_path / "pred.yaml").write_text(yaml.safe_dump({"rows": rows}))
    with pytest.raises(ConfigError, match="rows.1"):
        run_suite(p)


def test_the_shipped_pairs_and_h200_all_to_all_keep_their_frozen_scores():
    # scored once when measured (README, the suites' headers): 30.2 % / -23.3 % and
    # 14.0 % / +11.7 %
    for path, (m0, b0, n0) in {"validation/collectives-h100x2-pairs.yaml": (0.302, -0.233, 40),
                               "validation/collectives-h200x4-alltoall.yaml": (0.140, 0.117, 20)
                               }.items():
        m, b, n = run_suite(ROOT / path).at_freeze
        assert (n, round(m, 3), round(b, 3)) == (n0, m0, b0), path
