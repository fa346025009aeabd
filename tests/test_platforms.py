"""Platform figures from the catalog, NVLink domains beyond a node, three-tier and rail-only
fabrics (issue 11; issue 15 items 2 and 3)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from simulator.config.load import load_workload, read_yaml
from simulator.config.schema import TopologyConfig
from simulator.engine.build import make_job
from simulator.errors import ConfigError
from simulator.hardware.catalog import load_gpu
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology, load_fabrics
from simulator.run import make_machine, resolve_loaded

ROOT = Path(__file__).resolve().parents[1]
EFF = {k: float(v["efficiency"]) for k, v in load_fabrics()["links"].items()}


def shipped(name: str, **over) -> Topology:
    raw = {**read_yaml(ROOT / "topologies" / f"{name}.yaml"), **over}
    cfg = TopologyConfig(**raw)
    return Topology(cfg, load_gpu(cfg.gpu))


def kinds(t: Topology, route) -> list[str]:
    return [t.link_kinds[i] for i in route]


# ------------------------------------------------------------------ issue 15.2: the GPU's fabric


def test_changing_the_gpu_changes_nvlink_nic_and_pcie():
    """`--set topology.gpu=B200` on an H100 topology used to keep NVLink 4's 478 GB/s."""
    loaded = load_workload(ROOT / "workloads/llama70b.yaml", ["topology.gpu=B200"])
    t = Topology(loaded.topology, load_gpu(loaded.topology.gpu))
    # NVLink 5: 18 links x 53.125 GB/s per direction
    assert t.nvlink_Bps == pytest.approx(18 * 53.125e9)
    assert t.figures["nvlink_bandwidth_GBps"] == (956.25, "catalog B200.nvlink_line_GBps")
    assert t.figures["nic_bandwidth_Gbps"][1] == "catalog B200.nic_Gbps"
    b300 = load_workload(ROOT / "workloads/llama70b.yaml", ["topology.gpu=B300"])
    t3 = Topology(b300.topology, load_gpu("B300"))
    assert t3.nic_Bps == pytest.approx(800e9 / 8) and t3.pcie_Bps == pytest.approx(128e9)


def test_a_topology_overrides_only_what_it_states():
    t = shipped("dgx-b200", nvlink_bandwidth_GBps=700.0)
    assert t.figures["nvlink_bandwidth_GBps"] == (700.0, "topology")
    assert t.figures["pcie_bandwidth_GBps"] == (64.0, "catalog B200.pcie_GBps")


def test_run_summary_says_where_each_fabric_figure_came_from(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "simulator", "run", "workloads/llama3-8b.yaml", "--json",
         "--no-files", "--set", "topology.gpu=H200-SXM-141GB",
         "--set", "topology.nic_bandwidth_Gbps=200"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )
    import json

    fab = json.loads(out.stdout)["fabric"]
    assert fab["nvlink_bandwidth_GBps"] == {
        "value": 478.125, "from": "catalog H200-SXM-141GB.nvlink_line_GBps"
    }
    assert fab["nic_bandwidth_Gbps"] == {"value": 200.0, "from": "topology"}
    assert fab["nvlink_generation"]["value"] == 4


# ------------------------------------------------------------------ issue 15.3: PCIe-bound NICs


def test_a_pcie_bound_nic_is_reported():
    """An 800 Gb/s NIC (100 GB/s) behind PCIe Gen5 x16 (64 GB/s) gains far less than 2x."""
    slow = shipped("dgx-h100-ndr-fattree", nic_bandwidth_Gbps=800)
    (w,) = slow.warnings()
    assert "PCIe-bound" in w and "pcie_bandwidth_GBps" in w
    ratio = 64 * EFF["pcie"] / (100 * EFF["nic"])
    assert f"{ratio:.0%}" in w
    assert shipped("dgx-h100-ndr-fattree").warnings() == []  # 400 Gb/s: 48 < 54 GB/s
    assert shipped("dgx-b300").warnings() == []  # 800 Gb/s on PCIe Gen6


# ------------------------------------------------------------------ NVLink domains


def test_nvl72_rack_is_one_nvlink_domain():
    t = shipped("gb200-nvl72", nodes=36)  # two racks
    assert t.n_gpus == 144 and t.nodes == 2 and t.gpus_per_node == 72
    assert t.nics_per_node == 72  # 18 trays x 4 ConnectX-7
    # across trays of one rack: NVLink only (up to the switch, down to the GPU)
    assert kinds(t, t.route(3, 4)) == ["nvlink", "nvlink"]
    assert kinds(t, t.route(0, 71)) == ["nvlink", "nvlink"]
    # to the next rack: over the GPU's own NIC
    assert "nic" in kinds(t, t.route(0, 72))
    g = t.graph
    assert sum(1 for _, d in g.nodes(data=True) if d["kind"] == "nvswitch") == 2
    # rail-optimised: 36 trays, 32 per leaf -> 2 leaf groups x 4 rails; each leaf's uplink
    # equals the NICs it serves (1:1)
    assert t.n_leaves == 8
    for lf in range(t.n_leaves):
        nics = (t._leaf_of_nic == lf).sum()
        assert t.capacity[t._leaf_up + lf] == pytest.approx(nics * t.nic_Bps)


def test_a_tp_group_across_trays_costs_what_it_costs_on_one_nvswitch():
    gb = shipped("gb200-nvl72", nodes=18)
    b = shipped("dgx-b200", nodes=1)
    group = list(range(8))  # two GB200 trays
    t_gb = CollectiveModel(gb).cost("all_reduce", [group], 256e6)
    t_b = CollectiveModel(b).cost("all_reduce", [group], 256e6)
    assert t_gb.time_s == pytest.approx(t_b.time_s, rel=1e-9)
    assert all(gb.link_kinds[i] == "nvlink" for i in t_gb.link_bytes)


def test_a_domain_that_does_not_divide_the_cluster_is_an_input_error(tmp_path):
    with pytest.raises((ConfigError, ValueError), match="nvlink_domain_gpus"):
        shipped("gb200-nvl72", nodes=20)
    work = tmp_path / "w.yaml"
    work.write_text((ROOT / "workloads/llama3-8b.yaml").read_text())
    out = subprocess.run(
        [sys.executable, "-m", "simulator", "run", str(ROOT / "workloads/llama3-8b.yaml"),
         "--no-files", "--set", "topology.nvlink_domain_gpus=12"],
        cwd=ROOT, capture_output=True, text=True,
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "nvlink_domain_gpus" in out.stderr


def test_deepseek_on_partial_nvl72_racks_names_the_fix_and_runs_with_it():
    """2,048 GB200 are 28.4 NVL72 racks: the error names whole racks (504 or 522 trays) and
    racks using 16 of their 18 trays (domains of 64); with those, every EP group of 64 sits in
    one rack's NVLink domain."""
    args = [sys.executable, "-m", "simulator", "run", "workloads/deepseek-v3.yaml", "--no-files",
            "--set", "cluster.topology=topologies/gb200-nvl72.yaml", "--set", "topology.nodes=512"]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    err = out.stderr
    assert err.startswith("error: topologies/gb200-nvl72.yaml: nvlink_domain_gpus:")
    assert "nodes: 504 (28 domains)" in err and "nvlink_domain_gpus: 64" in err
    loaded = load_workload(ROOT / "workloads/deepseek-v3.yaml", [
        "cluster.topology=topologies/gb200-nvl72.yaml", "topology.nodes=512",
        "topology.nvlink_domain_gpus=64"])
    res = resolve_loaded(loaded)
    job = make_job(loaded.workload, loaded.topology, res, make_machine(loaded))
    groups = job.layout_of("ep").groups("ep")
    assert len(groups) == 2048 // 64
    assert all(len({g // 64 for g in grp}) == 1 for grp in groups)


# ------------------------------------------------------------------ three tiers, rail-only


def clos(**kw) -> Topology:
    cfg = dict(name="c", gpu="H100-SXM-80GB", nodes=64, gpus_per_node=1, nics_per_node=1,
               nodes_per_leaf=4, tiers=3, nodes_per_pod=16)
    return Topology(TopologyConfig(**{**cfg, **kw}), load_gpu("H100-SXM-80GB"))


def test_three_tier_routes_and_capacities():
    t = clos(oversubscription=2.0, spine_oversubscription=4.0)
    assert t.n_pods == 4 and t.n_leaves == 16
    assert kinds(t, t.route(0, 5)) == [
        "pcie", "nic", "leaf_up", "leaf_down", "nic", "pcie"
    ]  # same pod, other leaf
    assert kinds(t, t.route(0, 20)) == [
        "pcie", "nic", "leaf_up", "spine_up", "spine_down", "leaf_down", "nic", "pcie"
    ]
    cfg = t.cfg
    hops = 5 * cfg.switch_latency_us + 2 * cfg.nic_latency_us
    assert t.route_latency(0, 20) == pytest.approx(hops * 1e-6)
    leaf_up = 4 * t.nic_Bps / 2.0
    assert t.capacity[t._leaf_up] == pytest.approx(leaf_up)
    assert t.capacity[t._spine_up] == pytest.approx(4 * leaf_up / 4.0)


def test_core_oversubscription_slows_an_all_to_all_as_the_cut_predicts():
    """All-to-all over 64 GPUs, one per node, pods of 16: each pod sends 16 x 48 x S/64 =
    12 S over its core link of 16 NICs' worth / spine_oversubscription; each NIC sends
    63/64 S. So the time is max(63/64, 12 os / 16) S / NIC: NIC-bound at os 1, 1.5 and 3.0
    S/NIC at os 2 and 4."""
    S = 4e9
    times = {}
    for os_ in (1.0, 2.0, 4.0):
        t = clos(spine_oversubscription=os_)
        c = CollectiveModel(t).cost("all_to_all", [list(range(64))], S)
        times[os_] = c.time_s - c.launch_s
    nic = 400e9 / 8 * EFF["nic"]
    assert times[1.0] == pytest.approx(63 / 64 * S / nic, rel=0.01)
    assert times[2.0] == pytest.approx(1.5 * S / (nic * EFF["spine_up"] / EFF["nic"]), rel=0.01)
    assert times[4.0] / times[2.0] == pytest.approx(2.0, rel=0.01)


def test_rail_only_changes_rail_over_nvlink_and_has_no_spine():
    t = shipped("hgx-h800", nodes=4)
    assert t.n_leaves == 8  # one switch fabric per plane
    assert "leaf_up" not in t.link_kinds
    # gpu 0 (node 0, rail 0) to gpu 9 (node 1, rail 1): NVLink to gpu 1 first (PXN)
    assert kinds(t, t.route(0, 9)) == ["nvlink", "nvlink", "pcie", "nic", "nic", "pcie"]
    with pytest.raises(ConfigError, match="tiers"):
        shipped("hgx-h800", tiers=3)


@pytest.mark.parametrize(
    "name", ["gb200-nvl72", "gb300-nvl72", "dgx-b200", "dgx-b300", "hgx-h800"]
)
def test_shipped_2026_topologies_are_sized_by_nodes(name):
    raw = read_yaml(ROOT / "topologies" / f"{name}.yaml")
    per = (raw.get("nvlink_domain_gpus") or raw["gpus_per_node"]) // raw["gpus_per_node"]
    t = shipped(name, nodes=2 * per)
    assert t.n_gpus == 2 * per * raw["gpus_per_node"] and t.nodes == 2
    assert t.warnings() == []
