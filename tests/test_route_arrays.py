"""Topology.route_arrays (many routes at once, with array operations) gives exactly the routes
of Topology.route, link by link and in order, on every fabric shape; and falls back to it where
faults or rail-only routing make routes depend on more than the GPUs' places."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.config.schema import LinkFault
from tests.test_topology import topo

SHAPES = {
    "two tiers, rail-optimised": {},
    "two tiers, one leaf per node group": {"rail_optimized": False},
    "fewer NICs than GPUs": {"nics_per_node": 2},
    "three tiers": {"nodes": 16, "tiers": 3, "nodes_per_pod": 4},
    "three tiers, partial last pod": {"nodes": 14, "tiers": 3, "nodes_per_pod": 4},
    "2:1 oversubscribed": {"oversubscription": 2.0},
    "NVLink mesh": {"intra_node": "mesh", "gpus_per_node": 4, "nics_per_node": 4},
    "PCIe nodes": {"intra_node": "pcie", "nics_per_node": 2},
    "NVL72-like domain of 2 trays": {"nvlink_domain_gpus": 16},
    "rail-only (falls back)": {"network": "rail_only"},
}


def _both(t, src, dst):
    links, lens = t.route_arrays(np.asarray(src), np.asarray(dst))
    expect = [t.route(a, b) for a, b in zip(src, dst, strict=True)]
    got = np.split(links, np.cumsum(lens)[:-1]) if len(lens) else []
    return [tuple(int(x) for x in r) for r in got], expect


@pytest.mark.parametrize("shape", list(SHAPES))
def test_route_arrays_equal_route(shape):
    t = topo(**SHAPES[shape])
    rng = np.random.default_rng(7)
    n = t.n_gpus
    src = rng.integers(0, n, 400).tolist() + list(range(n))
    dst = rng.integers(0, n, 400).tolist() + list(range(n))  # includes src == dst
    got, expect = _both(t, src, dst)
    assert got == expect


def test_route_arrays_with_a_failed_nic_reroute_as_route():
    t = topo(faults=(LinkFault(kind="nic", node=1, nic=3, bandwidth_factor=0.0),))
    src = [3 + 8, 2, 8 + 3, 0]
    dst = [0, 8 + 3, 16 + 5, 31]
    got, expect = _both(t, src, dst)
    assert got == expect


def test_route_arrays_of_nothing():
    links, lens = topo().route_arrays(np.zeros(0, dtype=int), np.zeros(0, dtype=int))
    assert len(links) == 0 and len(lens) == 0


# ---- concurrent groups priced by shape (CollectiveModel._classes) against group by group

def _coll_cases():
    from simulator.network.collectives import CollectiveModel
    from tests.test_collectives import dgx

    t = dgx(nodes=16, nodes_per_leaf=4)
    rails = [[n * 8 + r for n in range(16)] for r in range(8)]  # 8 DP rings, one per rail
    nodes = [list(range(n * 8, n * 8 + 8)) for n in range(16)]  # 16 TP groups, one per node
    pairs = [[g, (g + 40) % 128] for g in range(128)]  # sends 5 nodes on, across leaves
    mixed = [[n * 8, n * 8 + 1] for n in range(16)] + [[3, 100], [7, 64]]  # two sizes, shapes
    return CollectiveModel, t, [
        ("all_reduce", rails, 2.0**28, None),
        ("all_reduce", rails, 2.0**20, "tree"),
        ("reduce_scatter", rails, 2.0**26, None),
        ("all_gather", nodes, 2.0**24, None),
        ("all_to_all", nodes, 2.0**24, None),
        ("all_to_all", [[8 * i, 8 * i + 9] for i in range(0, 16, 2)], 2.0**24, None),  # PXN
        # relays through a GPU outside the group: priced group by group
        ("send", pairs, 2.0**22, None),
        ("all_reduce", mixed, 2.0**25, None),
    ]


def test_cost_by_shape_equals_cost_group_by_group():
    CollectiveModel, t, cases = _coll_cases()
    for op, groups, nbytes, alg in cases:
        fast, slow = CollectiveModel(t), CollectiveModel(t)
        slow.MANY_GROUPS = 10**9
        shapes = fast._classes(op, [tuple(g) for g in groups], nbytes, alg)
        assert (shapes is None) == (op == "all_to_all" and len(groups[0]) == 2), op
        a, b = fast.cost(op, groups, nbytes, alg), slow.cost(op, groups, nbytes, alg)
        assert a.time_s == pytest.approx(b.time_s, rel=1e-12), op
        assert (a.algorithm, a.n_steps, a.launch_s) == (b.algorithm, b.n_steps, b.launch_s)
        assert np.array_equal(a.link_ids, b.link_ids), op
        assert np.allclose(a.link_vals, b.link_vals, rtol=1e-12, atol=0), op
        ba, bb = fast.bundles(op, groups, nbytes, alg), slow.bundles(op, groups, nbytes, alg)
        assert len(ba) == len(bb)
        for x, y in zip(ba, bb, strict=True):
            assert x.latency_s == pytest.approx(y.latency_s, rel=1e-12)
            tx, ty = sorted(x.transfers), sorted(y.transfers)
            assert [t[:-1] for t in tx] == [t[:-1] for t in ty]  # same (src, dst) pairs
            assert [t[-1] for t in tx] == pytest.approx([t[-1] for t in ty], rel=1e-12)
