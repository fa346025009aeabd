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

DeepEP's kernels reach :data:`DEEPEP_RATE` of the rate that step prices: on H800 with CX7
400 Gb/s NICs its README's normal kernels (V1, ``docs/legacy.md``: DeepSeek-V3's 4,096 tokens
of 7,168, top-8 of 256 experts in 4 of 8 groups, FP8 dispatch and BF16 combine; intranode EP 8
and internode EP 16, 32, 64) take 1.06-1.11x the time this step gives for the same tokens on
``topologies/hgx-h800.yaml``, and 1.9x at EP 16 (whose figure its V2 nearly doubles on the same
hardware); the median of the eight (``python -m simulator.calibrate deepep``,
``data/published/deepep-v1-h800/``) is applied as a rate on the bytes (a kernel moving bytes at
that share of the links' rate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from simulator.config.schema import MoEConfig
from simulator.model.moe import DEEPEP
from simulator.model.moe_routing import node_aware_split
from simulator.network.collectives import CollectiveCost, CollectiveModel, Step
from simulator.network.topology import Topology

__all__ = ["DEEPEP", "DEEPEP_RATE", "deepep_copies", "routed_copies", "routed_cost",
           "routed_split", "routed_steps"]

#: Share of the modelled link rate DeepEP's normal dispatch and combine kernels reach: the
#: median over its README's eight H800 figures of (this module's time at rate 1) / (the
#: README's time), refitted by ``python -m simulator.calibrate deepep`` (module docstring).
DEEPEP_RATE = 0.9069


def routed_split(moe: MoEConfig, topo: Topology, group: Sequence[int]):
    """The token vectors each rank of EP group ``group`` (GPU ids in EP-rank order) sends to
    each other, per token of a rank, from the NVLink domains the GPUs sit in."""
    return node_aware_split(moe, len(group), tuple(topo.node_of(g) for g in group))


def routed_copies(moe: MoEConfig, topo: Topology, group: Sequence[int]) -> float:
    """Token vectors a rank of EP group ``group`` sends per token of its own (its tokens once
    per destination GPU of its domain and once per other domain, and those it forwards):
    what its dispatch kernels move, per token, as an ``all_to_all_single`` moves ``top_k``."""
    split = routed_split(moe, topo, group)
    return sum(split[0])


def deepep_copies(dispatcher: str, moe: MoEConfig | None, topo: Topology,
                  group: Callable[[], Sequence[int]]) -> float:
    """:func:`routed_copies` of the EP group ``group()`` (built only when needed) where
    DeepEP dispatches over more than one GPU; 1 otherwise (an all-to-all's bytes already
    count its copies)."""
    if dispatcher != DEEPEP or moe is None:
        return 1.0
    g = group()
    return routed_copies(moe, topo, g) if len(g) > 1 else 1.0


def routed_cost(coll: CollectiveModel, moe: MoEConfig, groups: Sequence[Sequence[int]],
                nbytes: float, rate: float = DEEPEP_RATE) -> CollectiveCost:  # fmt: skip
    """The node-aware exchanges of ``groups`` at once (every group placed alike), ``nbytes``
    per rank (its tokens, one vector each), DeepEP's kernels at ``rate`` of the links'
    modelled rate."""
    split = routed_split(moe, coll.topology, groups[0])
    return coll.all_to_all_v(groups, nbytes / rate, split, nccl=False)


def routed_steps(coll: CollectiveModel, moe: MoEConfig, groups: Sequence[Sequence[int]],
                 nbytes: float, rate: float = DEEPEP_RATE) -> list[Step]:  # fmt: skip
    """:func:`routed_cost` as flow sets for the dynamic network."""
    split = routed_split(moe, coll.topology, groups[0])
    return coll.all_to_all_v_steps(groups, nbytes / rate, split, nccl=False)
