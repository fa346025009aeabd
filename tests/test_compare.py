"""``compare``: configurations side by side on the shipped topology files.

What a person expects, checked on the shipped DGX H100 SuperPOD files (resized to 2 nodes):

* a 2:1 tapered fabric slows the data-parallel all-reduce whose ring crosses the tapered
  tier, and leaves tensor parallelism (NVLink, inside the node) and compute alone. With
  ``nodes_per_leaf=1`` every inter-node hop of the DP ring crosses the spine, whose uplink is
  half the NIC bandwidth at 2:1, so the inter-node part of the DP all-reduce takes up to twice
  as long;
* H200 instead of H100 for the same layout raises the memory capacity (80 -> 141 GB) and
  changes little else (same NVLink, NICs and tensor-core peak; only the memory-bound kernels
  get the faster HBM).
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from simulator.cli import main as cli_main
from simulator.commands.compare_cmd import (
    configurations,
    parse_variant,
    run_compare,
    split_top_level,
)
from simulator.errors import ConfigError
from tests.conftest import ROOT, SMALL_MODEL

H100 = str(ROOT / "topologies" / "dgx-h100-ndr-fattree.yaml")
H100_2TO1 = str(ROOT / "topologies" / "dgx-h100-ndr-fattree-2to1.yaml")
H200 = str(ROOT / "topologies" / "dgx-h200-ndr-fattree.yaml")
TWO_NODES = ["topology.nodes=2", "topology.nodes_per_leaf=1"]


@pytest.fixture
def workload(tmp_path):
    work = {
        "name": "cmp",
        "model": {**SMALL_MODEL, "layers": 4, "hidden": 2048, "heads": 16, "ffn_hidden": 8192},
        "training": {"global_batch": 8, "micro_batch": 1, "overlap_grad_reduce": False},
        "parallelism": {"tp": 8, "pp": 1, "dp": 2, "zero": 0, "sequence_parallel": True},
        "cluster": {"topology": H100},
    }
    path = tmp_path / "work.yaml"
    path.write_text(yaml.safe_dump(work))
    return path


def test_variant_parsing():
    assert split_top_level("a=1,b=[1,2],c={x: 1, y: 2},d='p,q'") == [
        "a=1",
        "b=[1,2]",
        "c={x: 1, y: 2}",
        "d='p,q'",
    ]
    assert parse_variant("H200:topology.gpu=H200-SXM-141GB") == (
        "H200",
        {"topology.gpu": "H200-SXM-141GB"},
    )
    label, ov = parse_variant("uneven:parallelism.stage_layers=[1,3],parallelism.pp=2")
    assert label == "uneven" and ov == {"parallelism.stage_layers": [1, 3], "parallelism.pp": 2}
    assert parse_variant("parallelism.tp=4")[0] == "parallelism.tp=4"  # no label: the text
    with pytest.raises(ConfigError):
        parse_variant("label:")


def test_configuration_order():
    cfgs = configurations(["a.yaml", "b.yaml"], ["v:x.y=1"], ["x.y=0", "z=2"])
    assert [c.topology for c in cfgs] == ["a.yaml", "b.yaml", "a.yaml"]
    assert cfgs[0].overrides == {"x.y": 0, "z": 2}
    assert cfgs[2].label == "v" and cfgs[2].overrides == {"x.y": 1, "z": 2}  # variant wins
    assert configurations([], [], [])[0].topology is None  # the workload's own


def test_oversubscription_costs_dp_not_tp(workload):
    cmp = run_compare(workload, [H100, H100_2TO1], overrides=TWO_NODES, workers=1)
    one, two = cmp.summaries
    assert cmp.labels == ["dgx-h100-ndr-fattree", "dgx-h100-ndr-fattree-2to1"]
    b1, b2 = one["breakdown_s"], two["breakdown_s"]
    assert b2["dp_comm"] > 1.3 * b1["dp_comm"] > 0
    assert b2["tp_comm"] == pytest.approx(b1["tp_comm"], rel=1e-12)
    assert b2["compute"] == pytest.approx(b1["compute"], rel=1e-12)
    assert two["memory_gib"] == one["memory_gib"]
    assert two["step_time_s"] - one["step_time_s"] == pytest.approx(
        b2["dp_comm"] - b1["dp_comm"], rel=1e-6
    )
    df = cmp.frame()
    assert df["step_time_s_change"].iloc[0] == 0.0
    assert df["step_time_s_change"].iloc[1] == pytest.approx(
        two["step_time_s"] / one["step_time_s"] - 1
    )


def test_h200_changes_headroom_not_much_else(workload):
    cmp = run_compare(
        workload,
        [H100, H200],
        variants=["H200 card:topology.gpu=H200-SXM-141GB"],
        overrides=TWO_NODES,
        workers=2,
    )
    h100, h200, card = cmp.summaries
    m1, m2 = h100["memory_gib"], h200["memory_gib"]
    assert m2["total"] == pytest.approx(m1["total"], rel=1e-12)  # same layout, same bytes
    assert m2["capacity"] / m1["capacity"] == pytest.approx(140.4 / 79.65, rel=1e-6)
    assert m2["capacity"] - m2["total"] > 1.7 * (m1["capacity"] - m1["total"])  # headroom
    assert h200["step_time_s"] == pytest.approx(h100["step_time_s"], rel=0.05)
    assert h200["step_time_s"] <= h100["step_time_s"]  # faster HBM never slows a kernel
    assert h200["breakdown_s"]["tp_comm"] == pytest.approx(h100["breakdown_s"]["tp_comm"], rel=0.02)
    # The shipped H200 file differs from the H100 one only by its GPU: a variant that swaps
    # the GPU gives the same step.
    assert card["step_time_s"] == pytest.approx(h200["step_time_s"], rel=1e-12)


def test_cli_files_and_json(workload, tmp_path, capsys):
    out = tmp_path / "o"
    args = ["compare", str(workload), "--topology", H100, "--topology", H100_2TO1]
    for s in TWO_NODES:
        args += ["--set", s]
    assert cli_main([*args, "--out", str(out), "--workers", "1"]) == 0
    text = capsys.readouterr().out
    assert "DP communication" in text and "(baseline)" in text
    df = pd.read_csv(out / "compare.csv")
    assert df["label"].tolist() == ["dgx-h100-ndr-fattree", "dgx-h100-ndr-fattree-2to1"]
    assert {"step_time_s", "breakdown_s.dp_comm", "memory_gib.total", "step_time_s_change"} <= set(
        df.columns
    )
    assert (out / "compare.png").stat().st_size > 10_000
    assert cli_main([*args, "--json", "--no-files", "--workers", "1"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["label"] for c in doc["configurations"]] == df["label"].tolist()
    assert doc["configurations"][1]["summary"]["step_time_s"] == pytest.approx(
        df["step_time_s"].iloc[1]
    )


def test_bad_variant_is_one_line_error(workload, capsys):
    rc = cli_main(["compare", str(workload), "--variant", "oops:parallelism.tpp=2"])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "variant 'oops'" in err and "tpp" in err
    assert "\n" not in err


def test_shipped_llama70b_on_shipped_fabrics():
    """The shipped workload as it is, on the three shipped 1,024-GPU fabrics.

    Its DP groups (32 consecutive nodes) sit inside one 32-node leaf and NCCL's rings cross a
    leaf boundary only twice, so the 2:1 taper leaves DP time alone here; the pipeline sends
    between leaves (all 32 nodes of a stage at once) are what pay for it.
    """
    w = ROOT / "workloads" / "llama70b.yaml"
    cmp = run_compare(w, [H100, H100_2TO1, H200], workers=2)
    one, two, h200 = cmp.summaries
    b1, b2 = one["breakdown_s"], two["breakdown_s"]
    assert b2["tp_comm"] == pytest.approx(b1["tp_comm"], rel=1e-12)
    assert b2["compute"] == pytest.approx(b1["compute"], rel=1e-12)
    assert b2["dp_comm"] >= b1["dp_comm"] * (1 - 1e-9)
    assert b2["pp_comm"] > b1["pp_comm"]
    assert two["step_time_s"] >= one["step_time_s"] * (1 - 1e-3)
    assert h200["memory_gib"]["total"] == pytest.approx(one["memory_gib"]["total"], rel=1e-12)
    assert h200["memory_gib"]["capacity"] > 1.7 * one["memory_gib"]["capacity"]
    assert h200["step_time_s"] == pytest.approx(one["step_time_s"], rel=0.05)
    # training.tokens is set: compare shows time and cost to train.
    assert one["cost_usd"] > 0 and h200["time_to_train_days"] < one["time_to_train_days"]
