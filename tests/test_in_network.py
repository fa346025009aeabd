"""In-network reductions (NVLink SHARP / NCCL NVLS, InfiniBand SHARP / CollNet): closed forms,
published NCCL measurements not used to fit, NCCL's size thresholds, the topology switches, and
a training step that changes with them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.config.load import load_workload
from simulator.config.schema import TopologyConfig
from simulator.hardware.catalog import load_gpu
from simulator.network.collectives import CollectiveModel, collective_summary
from simulator.network.topology import Topology, load_fabrics
from simulator.run import simulate

ROOT = Path(__file__).resolve().parents[1]
FAB = load_fabrics()
EFF = {k: v["efficiency"] for k, v in FAB["links"].items()}
IN = FAB["in_network"]
# NVLS runs Simple, whose base latency beyond LL's (NCCL's tuner) every call pays
LAUNCH = (FAB["nccl"]["launch_us"] + FAB["nccl"]["tuner"]["base_latency_us"]["Simple"]
          - FAB["nccl"]["tuner"]["base_latency_us"]["LL"]) * 1e-6
GiB = 2.0**30


def topo(name="dgx-h100-ndr-fattree", gpu="H100-SXM-80GB", **kw) -> Topology:
    cfg = yaml.safe_load((ROOT / "topologies" / f"{name}.yaml").read_text())
    cfg.update(kw)
    return Topology(TopologyConfig(**cfg), load_gpu(gpu))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_nvls_all_reduce_closed_form(n):
    """NVLS all-reduce of S on n GPUs: each NVLink carries S (1 + 1/n) per direction (the
    multimem load-reduce of S, the store of its S/n share) at the NVLS rate, plus NCCL's 25 us
    NVLS latency (16.6 us beyond the launch) and one NVLink hop."""
    t = topo(nodes=1)
    S = GiB
    c = CollectiveModel(t).cost("all_reduce", [range(n)], S, "nvls")
    rate = t.nvlink_Bps * EFF["nvlink"] * IN["nvls_efficiency"][4]
    hop = t.cfg.nvlink_latency_us * 1e-6
    assert c.time_s == pytest.approx(LAUNCH + S * (n + 1) / n / rate + IN["nvls_us"] * 1e-6 + hop)
    assert c.algorithm == "nvls/Simple" and c.n_steps == 1


def test_nvls_matches_published_h100_and_h800_measurements():
    """Measurements not used to fit: NVLS all-reduce algbw on 5, 6, 7 H100 of 258, 265, 270
    GB/s (NVIDIA/nccl#1455, 2-4 GiB) and 8x H800 busbw 215 GB/s (NVIDIA/nccl#1374)."""
    t = topo(nodes=1)
    for n, algbw in ((5, 258.0), (6, 265.0), (7, 270.0)):
        r = collective_summary(t, "all_reduce", 4 * GiB, n)
        assert r["algorithm"] == "nvls/Simple"
        assert r["algbw_GBps"] == pytest.approx(algbw, rel=0.02)
    h800 = collective_summary(topo("hgx-h800", "H800", nodes=1), "all_reduce", 4 * GiB, 8)
    assert h800["busbw_GBps"] == pytest.approx(215.0, rel=0.03)


def test_nvls_is_chosen_by_size_like_nccl_tuner():
    """NCCL's tuner: NVLS's 25 us latency loses to the LL ring on small messages, its
    bandwidth wins on large ones (8 H100: ~1.3x the ring's busbw, 480 vs ~370 GB/s)."""
    m = CollectiveModel(topo(nodes=1))
    assert m.algorithm("all_reduce", range(8), 4096) == "ring/LL"
    assert m.algorithm("all_reduce", range(8), 256 * 2**20) == "nvls/Simple"
    ring = m.cost("all_reduce", [range(8)], 4 * GiB, "ring").time_s
    nvls = m.cost("all_reduce", [range(8)], 4 * GiB).time_s
    assert 1.25 < ring / nvls < 1.5
    # two GPUs: S (1 + 1/2) per link is more than the ring's S, so the ring stays
    assert m.algorithm("all_reduce", range(2), 4 * GiB) == "ring/Simple"
    # the same GPU with NVLS switched off, or an NVLink 3 (A100) board: never NVLS
    off = CollectiveModel(topo(nodes=1, nvls=False))
    assert off.algorithm("all_reduce", range(8), 4 * GiB) == "ring/Simple"
    with pytest.raises(Exception, match="does not apply"):
        off.cost("all_reduce", [range(8)], GiB, "nvls")
    a100 = CollectiveModel(topo("dgx-a100-hdr-fattree", "A100-SXM-80GB", nodes=1))
    assert not a100.algorithm("all_reduce", range(8), 4 * GiB).startswith("nvls")


def test_ib_sharp_all_reduce_moves_s_per_nic():
    """One GPU per node (a data-parallel group beside TP 8): SHARP sends S up the switch tree
    and receives S once per NIC, where the ring moves 2(n-1)/n x S each way."""
    n, S = 16, GiB
    t = topo(nodes=n, ib_sharp=True)
    m = CollectiveModel(t)
    g = [8 * i for i in range(n)]
    c = m.cost("all_reduce", [g], S, "collnet")
    rate = t.nic_Bps * EFF["nic"] * IN["sharp_efficiency"]
    transfer = S / rate
    assert c.time_s - LAUNCH - transfer == pytest.approx(
        IN["collnet_us"] * 1e-6, abs=20e-6)  # plus the path up the tree and back
    nic_up = [t._nic_up + i * t.nics_per_node for i in range(n)]
    nb = c.link_bytes
    assert [nb[x] * IN["sharp_efficiency"] for x in nic_up] == pytest.approx([S] * n)
    ring = m.cost("all_reduce", [g], S, "ring")
    assert ring.link_bytes[nic_up[0]] == pytest.approx(2 * (n - 1) / n * S, rel=0.01)
    assert m.algorithm("all_reduce", g, S) == "collnet/Simple"
    assert 1.5 < ring.time_s / c.time_s < 2.0
    # without the SHARP plugin (the default) CollNet does not exist
    with pytest.raises(Exception, match="does not apply"):
        CollectiveModel(topo(nodes=n)).cost("all_reduce", [g], S, "collnet")


def test_nvls_tree_and_nvls_sharp_across_nodes():
    """Whole nodes: NVLS Tree (NVLS in the node, a double binary tree over nodes per rail)
    without SHARP; NVLS + SHARP with it; both pipelined, so the slower part sets the pace."""
    S = GiB
    plain = CollectiveModel(topo(nodes=8))
    assert plain.algorithm("all_reduce", range(64), S) == "nvls_tree/Simple"
    sharp = CollectiveModel(topo(nodes=8, ib_sharp=True))
    c = sharp.cost("all_reduce", [range(64)], S)
    assert c.algorithm == "nvls/Simple"
    t = sharp.topology
    nvl = S * (1 + 1 / 8) / (t.nvlink_Bps * EFF["nvlink"] * IN["nvls_efficiency"][4])
    net = S / 8 / (t.nic_Bps * EFF["nic"] * IN["sharp_efficiency"])
    assert c.time_s - LAUNCH == pytest.approx(max(nvl, net), abs=80e-6)
    assert c.time_s < plain.cost("all_reduce", [range(64)], S).time_s


def test_sharp_shortens_a_data_parallel_all_reduce_step():
    """Llama-2-70B on 1,024 H100 with plain DDP (zero 0, gradients all-reduced over 32 nodes,
    one GPU per node) and no overlap: the exposed DP reduction shrinks with IB SHARP."""
    base = {"parallelism.zero": 0, "training.overlap_grad_reduce": False}
    path = ROOT / "workloads/llama70b.yaml"
    off = simulate(load_workload(path, base)).summary
    on = simulate(load_workload(path, {**base, "topology.ib_sharp": True})).summary
    dp_off, dp_on = off["breakdown_s"]["dp_comm"], on["breakdown_s"]["dp_comm"]
    assert dp_on < 0.7 * dp_off
    assert on["step_time_s"] < off["step_time_s"]
