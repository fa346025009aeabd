"""Topology graph: structural invariants, routes, latencies, oversubscription and faults."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import networkx as nx
import pytest
import yaml

from simulator.config.schema import LinkFault, TopologyConfig
from simulator.errors import ConfigError, PlanError
from simulator.network.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
# Stand-in for simulator.hardware.catalog.GPUSpec: the topology only needs these fields.
H100 = SimpleNamespace(name="H100-SXM-80GB", nvlink_GBps=450.0, hbm_TBps=3.35)


def topo(faults=(), **kw) -> Topology:
    cfg = {
        "name": "t",
        "gpu": "H100-SXM-80GB",
        "nodes": 4,
        "gpus_per_node": 8,
        "nics_per_node": 8,
        "nodes_per_leaf": 2,
        **kw,
    }
    return Topology(TopologyConfig(**cfg), H100, faults)


def kinds_of(t: Topology, route) -> list[str]:
    return [t.link_kinds[i] for i in route]


def test_single_node_nvswitch_counts():
    t = topo(nodes=1, gpus_per_node=4)
    assert t.n_gpus == 4 and t.n_links == 8 and t.nics_per_node == 0
    g = t.graph
    assert g.number_of_nodes() == 5 and g.number_of_edges() == 8
    assert {d["kind"] for _, d in g.nodes(data=True)} == {"gpu", "nvswitch"}
    assert all(t.capacity[i] == 450e9 for i in range(8))
    assert t.route(0, 3) == (0, 4 + 3)  # gpu0 up, gpu3 down
    assert t.route(2, 2) == ()


def test_multi_node_counts_and_connectivity():
    t = topo()  # 4 nodes x 8 GPUs, 8 NICs, 2 nodes per leaf, rail-optimised
    G, m = 32, 8
    assert t.n_leaves == 2 * m
    assert t.n_links == 2 * G + 2 * G + 2 * 4 * m + 2 * t.n_leaves
    g = t.graph
    assert g.number_of_nodes() == G + 4 + 4 * m + t.n_leaves + 1
    for a in range(G):
        for b in range(G):
            r = t.route(a, b)
            # the route is a connected path from gpu a to gpu b
            names = [t.link_names[i].split("->") for i in r]
            if a != b:
                assert names[0][0] == f"gpu{a}" and names[-1][1] == f"gpu{b}"
                assert all(x[1] == y[0] for x, y in zip(names, names[1:], strict=False))
    und = g.to_undirected()
    assert nx.is_connected(und)
    assert all(
        nx.has_path(g, "gpu0", f"gpu{b}") and nx.has_path(g, f"gpu{b}", "gpu0") for b in range(G)
    )


def test_rail_optimised_puts_nic_i_on_leaf_i():
    t = topo(nodes=6, nodes_per_leaf=3)
    g = t.graph
    for n in range(6):
        for i in range(8):
            leaves = [v for v in g.successors(f"nic{n}.{i}") if v.startswith("leaf")]
            assert leaves == [f"leaf{(n // 3) * 8 + i}"]
    # same rail, same group: GPU -> NIC -> leaf -> NIC -> GPU; different rail: via the spine
    assert kinds_of(t, t.route(3, 8 + 3)) == ["pcie", "nic", "nic", "pcie"]
    assert kinds_of(t, t.route(3, 8 + 4)) == ["pcie", "nic", "leaf_up", "leaf_down", "nic", "pcie"]
    assert kinds_of(t, t.route(3, 3 * 8 + 3)) == [
        "pcie",
        "nic",
        "leaf_up",
        "leaf_down",
        "nic",
        "pcie",
    ]
    flat = topo(nodes=6, nodes_per_leaf=3, rail_optimized=False)
    assert flat.n_leaves == 2
    assert {v for v in flat.graph.successors("nic4.5") if v.startswith("leaf")} == {"leaf1"}
    assert kinds_of(flat, flat.route(3, 8 + 4)) == ["pcie", "nic", "nic", "pcie"]


def test_gpu_to_nic_mapping_with_fewer_nics():
    t = topo(nics_per_node=4)
    assert [t.nic_of(g) for g in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert t.link_names[t.route(5, 8 + 5)[0]] == "gpu5->nic0.2"


def test_route_latency_closed_form():
    t = topo(nvlink_latency_us=0.8, nic_latency_us=2.0, switch_latency_us=0.6)
    assert t.route_latency(0, 1) == pytest.approx(0.8e-6)
    assert t.route_latency(0, 8) == pytest.approx(2 * 2.0e-6 + 0.6e-6)  # same leaf
    assert t.route_latency(0, 16) == pytest.approx(2 * 2.0e-6 + 3 * 0.6e-6)  # via the spine


def test_oversubscription_halves_leaf_uplinks():
    one = topo(nodes_per_leaf=2)
    two = topo(nodes_per_leaf=2, oversubscription=2.0)
    nic = 400e9 / 8
    up = [i for i, k in enumerate(one.link_kinds) if k in ("leaf_up", "leaf_down")]
    assert all(one.capacity[i] == pytest.approx(2 * nic) for i in up)
    assert all(two.capacity[i] == pytest.approx(nic) for i in up)
    assert all(
        one.capacity[i] == two.capacity[i]
        for i, k in enumerate(one.link_kinds)
        if k not in ("leaf_up", "leaf_down")
    )


def test_mesh_and_pcie_intra_node():
    t = topo(nodes=1, gpus_per_node=4, intra_node="mesh")
    assert t.n_links == 4 * 3
    assert all(c == pytest.approx(450e9 / 3) for c in t.capacity)
    assert len(t.route(1, 2)) == 1 and t.link_names[t.route(1, 2)[0]] == "gpu1->gpu2"
    p = topo(nodes=2, gpus_per_node=4, nics_per_node=2, intra_node="pcie")
    assert kinds_of(p, p.route(0, 3)) == ["pcie", "pcie"]
    assert kinds_of(p, p.route(0, 4)) == ["pcie", "pcie", "nic", "nic", "pcie", "pcie"]


def test_nvlink_fault_scales_both_directions():
    t = topo(faults=[LinkFault(kind="nvlink", gpu=3, bandwidth_factor=0.5)])
    r = t.route(3, 4)
    assert [t.capacity[i] for i in r] == [225e9, 450e9]
    assert [t.capacity[i] for i in t.route(4, 3)] == [450e9, 225e9]


def test_failed_nic_uses_next_nic_of_the_node():
    t = topo(faults=[LinkFault(kind="nic", node=0, nic=2, bandwidth_factor=0.0)])
    assert t.nic_of(2) == 3
    r = t.route(2, 8 + 2)
    names = [t.link_names[i] for i in r]
    # over NVLink to GPU 3, through its PCIe link to NIC 3, on to the rail-3 leaf
    assert names[:4] == ["gpu2->nvsw0", "nvsw0->gpu3", "gpu3->nic0.3", "nic0.3->leaf3"]
    assert not t.graph.has_edge("nic0.2", "leaf2")  # failed links leave the graph
    back = [t.link_names[i] for i in t.route(8 + 2, 2)]
    assert back[-4:] == ["leaf3->nic0.3", "nic0.3->gpu3", "gpu3->nvsw0", "nvsw0->gpu2"]


def test_no_path_raises_plan_error_naming_gpus():
    dead = [LinkFault(kind="nic", node=1, nic=i, bandwidth_factor=0.0) for i in range(8)]
    t = topo(faults=dead)
    with pytest.raises(PlanError, match="gpu 0 to gpu 9"):
        t.route(0, 9)
    t2 = topo(faults=[LinkFault(kind="nvlink", gpu=5, bandwidth_factor=0.0)])
    with pytest.raises(PlanError, match="gpu 4 to gpu 5"):
        t2.route(4, 5)
    assert t2.route(5, 13)  # its NIC path still works


def test_bad_fault_index_is_a_config_error():
    with pytest.raises(ConfigError, match="faults.links.0.gpu"):
        topo(faults=[LinkFault(kind="nvlink", gpu=99)])
    with pytest.raises(ConfigError, match="faults.links.0.nic"):
        topo(faults=[LinkFault(kind="nic", node=0, nic=8)])
    with pytest.raises(ConfigError, match="nics_per_node"):
        topo(nics_per_node=0)


def test_shipped_topologies_build():
    files = sorted((ROOT / "topologies").glob("*.yaml"))
    names = {f.name for f in files}
    for need in (
        "dgx-h100-ndr-fattree.yaml",
        "dgx-h100-ndr-fattree-2to1.yaml",
        "dgx-a100-hdr-fattree.yaml",
        "h200x4-nvswitch.yaml",
        "dgx-h200-ndr-fattree.yaml",
    ):
        assert need in names
    for f in files:
        cfg = TopologyConfig(**yaml.safe_load(f.read_text()))
        t = Topology(cfg, SimpleNamespace(name=cfg.gpu, nvlink_GBps=300.0))
        assert t.route_latency(0, t.n_gpus - 1) > 0


def test_16k_gpus_build_and_routes_are_cached():
    """(Build and routing speed are printed by benchmarks/micro.py, not asserted here.)"""
    t = topo(nodes=2048, nodes_per_leaf=32)
    assert t.n_gpus == 16384
    assert t.graph.number_of_edges() == t.n_links
    r = t.route(5, 16383)
    assert t.route(5, 16383) is r
