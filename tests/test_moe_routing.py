"""Node-limited routing and the node-aware (DeepEP) dispatch: distinct nodes and GPUs a token
reaches against closed forms and brute-force enumeration of the routing model, inter-node
bytes per rank against the links the collective model loads, and the engine's use of it on
DeepSeek-V3 (arXiv:2412.19437, Sections 2.1.2 and 3.2.2)."""

from __future__ import annotations

import itertools
from math import comb

import pytest

from simulator.config.load import load_workload
from simulator.config.schema import MoEConfig
from simulator.engine.dispatch import DEEPEP_RATE, routed_cost
from simulator.model import moe_routing as mr
from simulator.run import make_machine, simulate
from tests.conftest import ROOT, small_topology, write_case

DS = load_workload(ROOT / "workloads" / "deepseek-v3.yaml")
MOE = DS.workload.model.moe  # 256 experts, top-8, 8 groups of which 4 per token
NODES = tuple(r // 8 for r in range(64))  # EP 64 over 8 nodes of 8 GPUs


def _brute(moe: MoEConfig, ep: int, units) -> tuple[float, float]:
    """Expected distinct ranks and units by enumerating every group choice and every
    top_k-subset of its experts (all equally likely in the routing model)."""
    E, k, G = moe.experts, moe.top_k, moe.router_groups
    M = moe.router_group_top_k or G
    per_g, per_r = E // G, E // ep
    ranks = units_hit = cases = 0
    for S in itertools.combinations(range(G), M):
        pool = [e for g in S for e in range(g * per_g, (g + 1) * per_g)]
        for chosen in itertools.combinations(pool, k):
            rs = {e // per_r for e in chosen}
            ranks += len(rs)
            units_hit += len({units[r] for r in rs})
            cases += 1
    return ranks / cases, units_hit / cases


def test_group_limited_routing_reaches_the_closed_form_of_nodes():
    # groups = nodes: M (1 - C((M-1) G', k) / C(M G', k)), G' = 32 experts a node
    gpus, nodes = mr.expected_distinct(MOE, 64, NODES)
    assert nodes == pytest.approx(4 * (1 - comb(96, 8) / comb(128, 8)), rel=1e-12)
    assert 3.6 < nodes < 4  # "at most 4 nodes" (Section 2.1.2)
    # a GPU (4 experts) is hit when its node is one of the 4 and one of its experts is chosen
    assert gpus == pytest.approx(64 * 4 / 8 * (1 - comb(124, 8) / comb(128, 8)), rel=1e-12)
    free = MOE.model_copy(update={"router_groups": 1, "router_group_top_k": None})
    _, nodes_free = mr.expected_distinct(free, 64, NODES)  # plain top-8 of 256
    assert nodes_free == pytest.approx(8 * (1 - comb(224, 8) / comb(256, 8)), rel=1e-12)


@pytest.mark.parametrize(
    "moe, ep, units",
    [
        # groups inside nodes: 4 groups on 2 nodes, 2 of them per token
        (MoEConfig(experts=8, top_k=3, ffn_hidden=8, router_groups=4, router_group_top_k=2),
         4, (0, 0, 1, 1)),
        # nodes inside groups: 2 groups over 4 nodes, 1 per token
        (MoEConfig(experts=16, top_k=3, ffn_hidden=8, router_groups=2, router_group_top_k=1),
         8, (0, 0, 1, 1, 2, 2, 3, 3)),
        # groups straddling nodes (3 groups of 4 over 2 nodes of 6 experts)
        (MoEConfig(experts=12, top_k=2, ffn_hidden=8, router_groups=3, router_group_top_k=2),
         6, (0, 0, 0, 1, 1, 1)),
        # no groups
        (MoEConfig(experts=8, top_k=2, ffn_hidden=8), 8, (0, 0, 1, 1, 2, 2, 3, 3)),
    ],
)  # fmt: skip
def test_expectation_is_the_enumerated_one(moe, ep, units):
    assert mr.expected_distinct(moe, ep, units) == pytest.approx(_brute(moe, ep, units),
                                                                 rel=1e-12)  # fmt: skip


def test_inter_node_tokens_per_rank():
    # each token crosses the network once per distinct other node: (n - 1) D / n of it
    _, D = mr.expected_distinct(MOE, 64, NODES)
    assert mr.inter_node_tokens_per_rank(MOE, 64, NODES) == pytest.approx(7 * D / 8)
    # a plain all-to-all sends top_k (1 - 1/n) = 7 copies of every token over the network
    assert mr.inter_node_tokens_per_rank(MOE, 64, NODES) < 0.46 * 7
    # one NVLink domain: nothing crosses
    assert mr.inter_node_tokens_per_rank(MOE, 64, (0,) * 64) == 0.0


def test_split_rows_carry_every_hit_once():
    split = mr.node_aware_split(MOE, 64, NODES)
    ranks, by_node = mr.hit_probabilities(MOE, 64, NODES)
    # inside its node a rank delivers its own tokens and forwards those of the 7 same-index
    # ranks of other nodes: 8 x P(hit) to each node peer; to each other node one crossing
    row = split[0]
    assert row[1] == pytest.approx(8 * ranks[1])
    assert row[8] == pytest.approx(by_node[1]) and row[9] == 0.0
    assert all(split[i][j] == pytest.approx(split[j][i]) for i in range(64) for j in range(64))


def test_collective_loads_the_nics_with_the_crossings():
    # the bytes every NIC uplink carries in a node-aware dispatch of the DeepSeek-V3 layout
    machine = make_machine(DS)
    topo = machine.topology
    group = list(range(64))
    S = 4096 * 7168.0  # one byte per element, one vector per token
    cost = routed_cost(machine.collectives, MOE, [group], S, rate=1.0)
    kinds: dict[str, float] = {}
    for lid, b in cost.link_bytes.items():
        kinds[topo.link_kinds[lid]] = kinds.get(topo.link_kinds[lid], 0.0) + b
    plain = machine.collectives.cost("all_to_all", [tuple(group)], S * 8)
    wire = plain_nic = 0.0
    for lid, b in plain.link_bytes.items():
        plain_nic += b if topo.link_kinds[lid] == "nic" else 0.0
    per_rank = mr.inter_node_tokens_per_rank(MOE, 64, NODES) * S
    # up and down NIC links of both ends; wire bytes = data / protocol fraction
    wire = kinds["nic"] / (2 * 64 * per_rank)
    assert plain_nic / (2 * 64 * 7 * S) == pytest.approx(wire, rel=1e-9)
    assert cost.time_s < plain.time_s * 0.55
    # DeepEP's kernels at DEEPEP_RATE of the links' rate: its wire bytes over that rate
    slow = routed_cost(machine.collectives, MOE, [group], S)
    assert sum(slow.link_vals) == pytest.approx(sum(cost.link_vals) / DEEPEP_RATE, rel=1e-9)


SMALL = {
    "name": "dep", "model": {
        "layers": 2, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 16,
        "vocab": 32000, "seq_len": 2048, "activation": "swiglu",
        "moe": {"experts": 16, "top_k": 4, "ffn_hidden": 1024, "router": "sigmoid",
                "router_groups": 4, "router_group_top_k": 2}},
    "training": {"global_batch": 64, "micro_batch": 1},
    "parallelism": {"tp": 1, "pp": 1, "ep": 16, "zero": 1},
}  # fmt: skip


def _run(tmp_path, *sets, detail="folded"):
    p = write_case(tmp_path, SMALL, small_topology(4, 4))
    return simulate(load_workload(p, list(sets)), detail=detail).summary


def test_deepep_moves_fewer_bytes_across_nodes_and_full_detail_agrees(tmp_path):
    # EP 16 over 4 nodes of 4 GPUs, 4 groups = 4 nodes, 2 per token
    plain = _run(tmp_path)
    dep = _run(tmp_path, "training.moe_dispatcher=deepep")
    # at 8K tokens a micro-batch the exchange outweighs DeepEP's host waits (its counts and the
    # routing map's host synchronisations, which at 2K tokens of this two-layer model cost
    # more than the bytes it saves)
    long = ("model.seq_len=8192",)
    assert (_run(tmp_path, *long, "training.moe_dispatcher=deepep")["step_time_s"]
            < _run(tmp_path, *long)["step_time_s"])
    # bytes a rank sends across the network per MoE layer (bf16): NCCL's 4 copies of each of
    # its 2,048 tokens, 3/4 of them to other nodes; DeepEP once per other node reached
    moe = load_workload(write_case(tmp_path, SMALL, small_topology(4, 4))).workload.model.moe
    units = tuple(r // 4 for r in range(16))
    assert plain["moe"]["network_bytes_per_rank_per_layer"] == 4 * 0.75 * 2048 * 1024 * 2
    assert dep["moe"]["network_bytes_per_rank_per_layer"] == pytest.approx(
        mr.inter_node_tokens_per_rank(moe, 16, units) * 2048 * 1024 * 2)
    assert dep["moe"]["nvlink_domains_per_token"] == pytest.approx(
        2 * (1 - comb(4, 4) / comb(8, 4)))  # 2 of 4 groups (= nodes) of 4 experts, top-4
    assert dep["model_flops_per_step"] == plain["model_flops_per_step"]
    full = _run(tmp_path, "training.moe_dispatcher=deepep", detail="full")
    assert full["step_time_s"] == pytest.approx(dep["step_time_s"], rel=0.01)
    # combined 1F1B cannot shorten this step: it is host-bound (a layer's GPU work is well
    # under Megatron-Core's host time to issue it), and one host issues both passes
    both = _run(tmp_path, "training.moe_dispatcher=deepep",
                "training.overlap_moe_expert_parallel_comm=true")  # fmt: skip
    assert both["step_time_s"] <= dep["step_time_s"] * (1 + 1e-9)
    assert both["breakdown_s"]["host"] > 0.5 * both["breakdown_s"]["compute"]


def test_uneven_domains_still_deliver_every_hit():
    # 12 ranks over domains of 8 and 4: each rank's tokens cross to the other domain once
    # (with its hit probability), whichever rank of it receives them
    units = (0,) * 8 + (1,) * 4
    moe = MoEConfig(experts=24, top_k=4, ffn_hidden=8)
    split = mr.node_aware_split(moe, 12, units)
    ranks, by_unit = mr.hit_probabilities(moe, 12, units)
    crossings = sum(split[i][j] for i in range(12) for j in range(12) if units[i] != units[j])
    assert crossings == pytest.approx(8 * by_unit[1] + 4 * by_unit[0])
