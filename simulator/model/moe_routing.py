"""Where a token's routed experts live: the expected number of distinct GPUs and NVLink
domains (nodes) a token reaches, and the traffic of a node-aware dispatch built on it.

Pure functions, no SimPy. Two mechanisms of DeepSeek-V3 (arXiv:2412.19437) meet here:

* **Node-limited routing** (Section 2.1.2, "Node-Limited Routing"; Section 3.2.2): each token
  goes to at most ``M = 4`` nodes, chosen by the sum of the highest ``top_k / M`` affinity
  scores of the experts on each node, then to its ``top_k`` experts among those nodes. In the
  released configuration this is group-limited routing (``n_group: 8``, ``topk_group: 4``);
  with 256 experts on EP 64 over 8 nodes, group ``g`` is exactly the 32 experts of node ``g``.
  ``model.moe.router_groups`` / ``router_group_top_k`` say it; whether the groups coincide with
  nodes follows from the layout and is not assumed.
* **Node-aware dispatch** (DeepEP; Section 3.2.2: "each token ... is first transmitted via IB
  to the GPUs with the same in-node index on its target nodes ... immediately forwarded via
  NVLink to specific GPUs that host their target experts"): a token crosses InfiniBand once per
  distinct destination node, not once per expert, and reaches each destination GPU once (the
  receiver makes its per-expert copies). The combine runs the same path backwards, the
  outputs of one node's GPUs summed at the forwarding GPU before their one IB crossing.

The routing model for the expectations: a token's ``M`` groups are a uniform choice among the
``G`` groups, and its ``top_k`` experts a uniform choice among the ``M * E / G`` experts of those
groups (without groups: a uniform ``top_k``-subset of all experts -- exactly what top-k of
exchangeable scores gives). Under it, a set ``A`` of experts (those of one GPU, or one node) is
missed with probability ``E_S[C(P - |A n pool(S)|, k) / C(P, k)]``, ``P = M E / G``, the mean
taken over the ``C(G, M)`` group choices ``S`` (:func:`miss_probability`, exact). Where groups
and nodes coincide, the expected distinct nodes is ``M (1 - C((M-1) E/G, k) / C(M E/G, k))``:
DeepSeek-V3, ``M = 4``, 32 experts a node, ``k = 8``: 3.63 (without the limit 5.29 of 8).
Sensitivity: DeepSeek's rule selects a node by its best two scores, so a selected node is
more likely to receive one of the token's experts than a uniform draw says; with independent
identically distributed scores a seeded simulation of the rule gives 3.95 (at most 4), about
9 % more inter-node bytes than priced here.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from math import comb

from simulator.config.schema import MoEConfig


def _groups(moe: MoEConfig) -> tuple[int, int]:
    """(router groups, groups a token may use)."""
    G = moe.router_groups
    return G, moe.router_group_top_k or G


@lru_cache(maxsize=4096)
def miss_probability(experts: int, top_k: int, groups: int, group_top_k: int,
                     members: tuple[int, ...]) -> float:  # fmt: skip
    """Probability that a token routes none of its ``top_k`` experts to the experts
    ``members`` (indices), under the module's routing model: ``group_top_k`` of ``groups``
    equal groups of consecutive experts chosen uniformly, then ``top_k`` experts uniformly
    among theirs. Exact: the group choices are counted by their overlap with ``members``."""
    per = experts // groups
    pool = group_top_k * per
    if top_k > pool:
        raise ValueError(f"top_k={top_k} exceeds the {pool} experts of {group_top_k} groups")
    overlap: dict[int, int] = {}
    for e in members:
        overlap[e // per] = overlap.get(e // per, 0) + 1
    z = list(overlap.values())
    # ways[j][s]: choices of j of the overlapping groups whose overlaps sum to s
    ways = [[0] * (len(members) + 1) for _ in range(len(z) + 1)]
    ways[0][0] = 1
    for o in z:
        for j in range(len(z), 0, -1):
            for s in range(len(members), o - 1, -1):
                ways[j][s] += ways[j - 1][s - o]
    rest = groups - len(z)  # groups holding none of ``members``
    total = comb(groups, group_top_k)
    miss = 0
    for j, row in enumerate(ways):
        others = comb(rest, group_top_k - j) if group_top_k - j >= 0 else 0
        for s, w in enumerate(row):
            if w and others:
                miss += w * others * comb(pool - s, top_k)
    return miss / (total * comb(pool, top_k))


def hit_probabilities(moe: MoEConfig, ep: int, units: Sequence[int]) -> tuple[
        tuple[float, ...], dict[int, float]]:  # fmt: skip
    """For an EP group whose rank ``r`` sits in NVLink domain ``units[r]`` (expert ``e`` on
    rank ``e // (experts / ep)``): each rank's probability of receiving a given token, and
    each domain's (by its id)."""
    E = moe.experts
    per_rank = E // ep
    G, M = _groups(moe)

    def p(ranks: Sequence[int]) -> float:
        members = tuple(e for r in ranks for e in range(r * per_rank, (r + 1) * per_rank))
        return 1.0 - miss_probability(E, moe.top_k, G, M, members)

    ranks = tuple(p((r,)) for r in range(ep))
    by_unit: dict[int, list[int]] = {}
    for r, u in enumerate(units):
        by_unit.setdefault(u, []).append(r)
    return ranks, {u: p(rs) for u, rs in by_unit.items()}


def expected_distinct(moe: MoEConfig, ep: int, units: Sequence[int]) -> tuple[float, float]:
    """(expected distinct GPUs, expected distinct NVLink domains) one token reaches."""
    ranks, by_unit = hit_probabilities(moe, ep, units)
    return sum(ranks), sum(by_unit.values())


@lru_cache(maxsize=256)
def node_aware_split(
    moe: MoEConfig, ep: int, units: Sequence[int]
) -> tuple[tuple[float, ...], ...]:
    """The token vectors group rank ``i`` sends to rank ``j`` in a node-aware dispatch, per
    token of a rank (multiply by ``tokens * hidden * bytes``): to each other domain ``Y`` one
    crossing, with ``Y``'s hit probability, to the rank of ``Y`` with its own index inside its
    domain (modulo ``Y``'s ranks, where domains hold different numbers), which forwards it to
    each other rank of ``Y`` with that rank's hit probability; inside its own domain, to each
    rank with its hit probability. Where every domain holds as many ranks, a rank sends a
    peer of its domain ``n_domains`` times the peer's hit probability (its own tokens and
    those it forwards) and the matrix is its own transpose: the combine, the same path
    backwards, moves the same bytes."""
    ranks, by_unit = hit_probabilities(moe, ep, units)
    members: dict[int, list[int]] = {}
    for r, u in enumerate(units):
        members.setdefault(u, []).append(r)
    pos = {r: i for rs in members.values() for i, r in enumerate(rs)}
    out = [[0.0] * ep for _ in range(ep)]
    for i in range(ep):
        for u, rs in members.items():
            if u == units[i]:
                for b in rs:
                    out[i][b] += ranks[b] if b != i else 0.0
                continue
            r = rs[pos[i] % len(rs)]
            out[i][r] += by_unit[u]
            for b in rs:
                out[r][b] += ranks[b] if b != r else 0.0
    return tuple(tuple(row) for row in out)


def inter_node_tokens_per_rank(moe: MoEConfig, ep: int, units: Sequence[int]) -> float:
    """Token vectors one rank sends across the network per token of its own in a node-aware
    dispatch (the busiest rank's): the expected distinct other domains a token reaches,
    ``(n - 1) D / n`` for ``n`` domains alike with ``D`` expected distinct domains. A plain
    all-to-all sends ``top_k (1 - 1/n)``."""
    split = node_aware_split(moe, ep, units)
    return max(sum(v for j, v in enumerate(row) if units[j] != units[i])
               for i, row in enumerate(split))  # fmt: skip
