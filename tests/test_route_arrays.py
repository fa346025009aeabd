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
