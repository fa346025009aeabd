"""Pricing of the node-aware MoE exchange (``moe_dispatcher: deepep``) on the real links.

The model emits the dispatch and combine as comm ops of collective
:data:`simulator.model.moe.DEEPEP` whose bytes are one vector per token of the rank; here the
routing math (:func:`simulator.model.moe_routing.node_aware_split`: which rank of the EP group
sends how many token vectors to which, a crossing per destination node and an NVLink forward
per destination GPU) meets the group's placement on the topology (its NVLink domains), and the
collective model prices that split as one uneven all-to-all step
(:meth:`~simulator.network.collectives.CollectiveModel.all_to_all_v`). A fluid step of both
hops at once is DeepEP's pipelined forwarding at its bandwidth limit (its kernels forward
chunks over NVLink while later chunks still arrive over the network).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.config.schema import MoEConfig
from simulator.model.moe import DEEPEP
from simulator.model.moe_routing import node_aware_split
from simulator.network.collectives import CollectiveCost, CollectiveModel, Step
from simulator.network.topology import Topology

__all__ = ["DEEPEP", "routed_cost", "routed_split", "routed_steps"]


def routed_split(moe: MoEConfig, topo: Topology, group: Sequence[int]):
    """The token vectors each rank of EP group ``group`` (GPU ids in EP-rank order) sends to
    each other, per token of a rank, from the NVLink domains the GPUs sit in."""
    return node_aware_split(moe, len(group), tuple(topo.node_of(g) for g in group))


def routed_cost(coll: CollectiveModel, moe: MoEConfig, groups: Sequence[Sequence[int]],
                nbytes: float) -> CollectiveCost:  # fmt: skip
    """The node-aware exchanges of ``groups`` at once (every group placed alike), ``nbytes``
    per rank (its tokens, one vector each)."""
    return coll.all_to_all_v(groups, nbytes, routed_split(moe, coll.topology, groups[0]))


def routed_steps(coll: CollectiveModel, moe: MoEConfig, groups: Sequence[Sequence[int]],
                 nbytes: float) -> list[Step]:  # fmt: skip
    """:func:`routed_cost` as flow sets for the dynamic network."""
    return coll.all_to_all_v_steps(groups, nbytes, routed_split(moe, coll.topology, groups[0]))
