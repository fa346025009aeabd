"""``faults.straggler_scope``: a slow GPU stretches every kernel; a benchmark's padding
(``layers``) only the transformer layers and the LM head."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "validation" / "heldout7" / "h7_single_X.yaml"


def _run(tmp_path: Path, name: str, faults: dict | None) -> tuple[float, pd.DataFrame]:
    w = yaml.safe_load(BASE.read_text())
    w["name"] = name
    w["training"]["kernels"] = "fused"  # no host clock: the GPU's time alone
    w["cluster"]["topology"] = str(BASE.parent / w["cluster"]["topology"])
    if faults:
        w["faults"] = faults
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(w))
    out = tmp_path / name
    cmd = [sys.executable, "-m", "simulator", "run", str(f), "--json", "--out", str(out)]
    s = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return s["step_time_s"], pd.read_parquet(out / "events.parquet")


@pytest.mark.parametrize("slow", [1.2, 1.5])
def test_scope_stretches_what_it_says(tmp_path, slow):
    """One GPU, nothing to wait for: a slow GPU's step is ``slow`` times the healthy one; the
    padded benchmark's is the healthy step plus ``slow - 1`` times its layer and LM-head
    segments, the embedding and optimizer at full speed."""
    base, ev = _run(tmp_path, "base", None)
    stragglers = [{"gpu": 0, "slowdown": slow}]
    gpu, _ = _run(tmp_path, "gpu", {"stragglers": stragglers})
    layers, _ = _run(tmp_path, "layers", {"stragglers": stragglers, "straggler_scope": "layers"})
    seg = ev[ev["stream"] == ev["stream"].iloc[0]]
    padded = seg[(seg["layer"] >= 0) | (seg["name"] == "head")]
    other = seg[(seg["layer"] < 0) & (seg["name"] != "head")]
    assert len(other) and len(padded)
    assert gpu == pytest.approx(slow * base, rel=1e-9)
    t_pad = float((padded["end_s"] - padded["start_s"]).sum())
    assert layers == pytest.approx(base + (slow - 1) * t_pad, rel=1e-9)
    assert base < layers < gpu
