"""NCCL all-to-all: bytes per link from first principles, PXN keeping inter-node traffic on
its rail, and uneven splits (all_to_all_single with split sizes)."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.network.collectives import CollectiveModel
from tests.test_collectives import dgx, h200x4


def _by_kind(topo, link_bytes):
    out: dict[str, float] = {}
    for lid, b in link_bytes.items():
        out[topo.link_kinds[lid]] = out.get(topo.link_kinds[lid], 0.0) + b
    return out


def test_intra_node_bytes_per_gpu():
    # every GPU sends (n-1)/n of its buffer over its NVLink port (protocol overhead aside)
    topo = h200x4()
    cm = CollectiveModel(topo)
    S = 64 * 2**20
    c = cm.cost("all_to_all", [list(range(4))], S, "direct/Simple")
    # wire bytes: data / (protocol fraction x the all-to-all's measured share of the link rate)
    frac = 1 / next(p.fraction for p in cm.protocols if p.name == "Simple") / cm.a2a_bw_fraction
    kinds = _by_kind(topo, c.link_bytes)
    nv = [v for k, v in kinds.items() if "nvlink" in k or "up" in k]
    assert sum(kinds.values()) == pytest.approx(2 * 4 * 3 / 4 * S * frac)  # up and down
    assert nv


def test_pxn_keeps_inter_node_traffic_off_the_spine():
    # 2 nodes on different leaves: without PXN a GPU's send to another rail crosses the spine
    # (see topology.py); with PXN it relays over NVLink to the GPU on the destination's rail.
    topo = dgx(nodes=2, nodes_per_leaf=1)
    cm = CollectiveModel(topo)
    c = cm.cost("all_to_all", [list(range(16))], 256 * 2**20, "direct/Simple")
    kinds = _by_kind(topo, c.link_bytes)
    up = kinds.get("leaf_up", 0.0)
    nic = sum(v for k, v in kinds.items() if "nic" in k or "pcie" in k)
    assert nic > 0
    # rail-optimised leaves are per rail; only same-rail pairs on different leaves go up, and
    # with PXN every inter-node send is a same-rail send
    rails = {topo.nic_of(g) for g in range(16)}
    assert len(rails) == 8
    simple = next(p.fraction for p in cm.protocols if p.name == "Simple")
    s = 256 * 2**20 / 16 * 8 * 8 / simple  # (the NVLink-measured share does not apply here)
    assert up == pytest.approx(2 * s, rel=1e-9)  # node 0 -> 1 and 1 -> 0, 64 pairs each


def test_uneven_split_is_timed_by_the_busiest_receiver():
    topo = h200x4()
    cm = CollectiveModel(topo)
    S = 256 * 2**20
    even = cm.all_to_all_v([list(range(4))], S, [0.25] * 4)
    ref = cm.cost("all_to_all", [list(range(4))], S)
    assert even.time_s == pytest.approx(ref.time_s, rel=1e-6)
    skew = cm.all_to_all_v([list(range(4))], S, [0.5, 0.5 / 3, 0.5 / 3, 0.5 / 3])
    # rank 0 receives 3 x S/2 instead of 3 x S/4: the bandwidth part doubles
    bw_even = even.time_s - even.launch_s
    bw_skew = skew.time_s - skew.launch_s
    assert bw_skew == pytest.approx(2 * bw_even, rel=0.05)
    assert np.isclose(sum(skew.link_bytes.values()), sum(even.link_bytes.values()))


def test_collective_command_accepts_nccl_tests_names(capsys, root):
    from simulator.cli import main

    assert main(["collective", "alltoall", "--bytes", "1MiB", "--topology",
                 str(root / "topologies/h200x4-nvswitch.yaml"), "--json"]) == 0  # fmt: skip
    assert '"direct/' in capsys.readouterr().out
