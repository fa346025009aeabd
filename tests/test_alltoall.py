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
    cm.a2a_softness = 0.0  # the port alone (the warps: test_collective_timing)
    S = 64 * 2**20
    c = cm.cost("all_to_all", [list(range(4))], S, "direct/Simple")
    # wire bytes: data x the port's load both ways (1 + reverse_load, a uniform exchange) /
    # (protocol fraction x the port's one-way ceiling as a share of the link rate)
    simple = next(p.fraction for p in cm.protocols if p.name == "Simple")
    frac = (1 + cm.a2a_reverse_load) / simple / cm.a2a_bw_fraction
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
    # the busiest receiver's bytes alone (its port's reverse load, which makes a port loaded
    # mostly one way faster: test_collective_timing.test_a_port_loaded_one_way_runs_faster...)
    cm.a2a_reverse_load = 0.0
    # and the port alone: NCCL's warps (test_p2p) move every side of a channel's works one
    # after the other, so they do not scale with the busiest receiver's bytes
    cm.a2a_softness = 0.0
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


def _with_copy(copy_GBps: float) -> dict:
    import copy as _copy

    from simulator.network.topology import load_fabrics

    fab = _copy.deepcopy(load_fabrics())
    fab["nccl"]["copy_GBps"] = copy_GBps
    return fab


@pytest.mark.parametrize("n", [2, 4])
def test_exchange_copy_out_overlaps_the_wire(n):
    # NCCL's receiver copies each chunk out of its FIFO while the next ones land, and a rank's
    # own share is one of the kernel's pieces of work (src/device/sendrecv.h), so within one
    # NVLink domain the copy rate adds nothing after the wire, uniform or uneven
    topo = h200x4()
    S = 64 * 2**20
    slow = CollectiveModel(topo, _with_copy(1000.0))
    fast = CollectiveModel(topo, _with_copy(1e9))
    g = [list(range(n))]
    assert slow.cost("all_to_all", g, S).time_s == fast.cost("all_to_all", g, S).time_s
    split = [0.5] + [0.5 / (n - 1)] * (n - 1)
    assert slow.all_to_all_v(g, S, split).time_s == fast.all_to_all_v(g, S, split).time_s


def test_p2p_protocol_is_ll_up_to_the_threshold_then_simple():
    # NCCL 2.28 (enqueue.cc addP2pToPlan): LL while a peer's bytes are at most 16 KiB x the
    # p2p channels per peer (32 on one NVSwitch node: 512 KiB), Simple above; never LL128
    topo = h200x4()
    cm = CollectiveModel(topo)
    g = [list(range(4))]
    assert cm.cost("all_to_all", g, 4 * 512 * 2**10).algorithm == "direct/LL"
    assert cm.cost("all_to_all", g, 4 * 512 * 2**10 + 64).algorithm == "direct/Simple"
    for S in (2**12, 2**16, 2**20, 2**22, 2**24, 2**28):
        assert not cm.cost("all_to_all", g, S).algorithm.endswith("LL128")
        assert not cm.all_to_all_v(g, S, [0.4, 0.2, 0.2, 0.2]).algorithm.endswith("LL128")
    # a group across nodes: 2 channels per peer -> 32 KiB
    big = dgx(nodes=2)
    cm2 = CollectiveModel(big)
    g16 = [list(range(16))]
    assert cm2.cost("all_to_all", g16, 16 * 32 * 2**10).algorithm == "direct/LL"
    assert cm2.cost("all_to_all", g16, 16 * 64 * 2**10).algorithm == "direct/Simple"
