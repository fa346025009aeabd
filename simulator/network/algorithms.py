"""Collective algorithms as NCCL builds them: each becomes a list of phases of identical
steps, each step a set of point-to-point transfers between GPUs of the group.

* ring (NCCL rings, one channel per NIC across nodes, snaking so each hop stays on its rail);
* double binary tree (NCCL's tree all-reduce across nodes, a chain inside each node);
* hierarchical (intra-node reduce-scatter, inter-node per rail, intra-node all-gather);
* direct pairwise exchange (all-to-all), chain (broadcast), p2p (send).

:class:`~simulator.network.collectives.CollectiveModel` prices the phases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Phase:
    """``repeat`` identical steps. Bytes are data bytes (before the protocol's factor)."""

    transfers: tuple[tuple[int, int, float], ...]
    repeat: int
    path_s: float  # link latency per step (ring: mean edge; pipeline: sum of hops)
    intra_hops: float  # protocol overheads per step, intra-node ...
    net_hops: float  # ... and network
    local_bytes: float  # extra local memory bytes of the slowest GPU per step (0: hidden)
    family: str = "ring"  # which overhead table: ring | tree
    bw_fraction: float = 1.0



class AlgorithmPhases:
    """Builds the phases of each algorithm (mixed into CollectiveModel, which provides
    ``topology``, ``tree_fraction`` and the ``_rings`` cache)."""

    def _phases(self, alg: str, op: str, g: list[int], S: float) -> list[Phase] | None:
        """The phases of ``alg`` for ``op`` on group ``g``, or None when it does not apply."""
        n = len(g)
        if alg == "ring":
            steps = 2 * (n - 1) if op == "all_reduce" else n - 1
            # local bytes per rank, counted from NCCL's ring primitives (prims_simple.h):
            # all-reduce: send, (n-2) recvReduceSend, recvReduceCopySend, (n-2) recvCopySend,
            # recv -> 2n chunks of S/n beyond the remote stores; all-gather: copySend,
            # (n-2) recvCopySend, recv -> n+1; reduce-scatter: send, (n-2) recvReduceSend,
            # recvReduceCopy -> n+1.
            local = 2 * S if op == "all_reduce" else (n + 1) * S / n
            return [self._ring_phase(self._ring(g), S, steps, local / steps)]
        by_node = self._by_node(g)
        k = len(by_node[0])
        uniform = all(len(x) == k for x in by_node)
        if alg == "tree":
            return [self._tree_phase(by_node, S)] if len(by_node) > 1 and uniform else None
        if alg == "hierarchical":
            if len(by_node) < 2 or k < 2 or not uniform:
                return None
            intra = [self._ring(x) for x in by_node]
            rails = [self._ring([x[i] for x in by_node]) for i in range(k)]
            local = (k + 1) * S / k / (k - 1)
            rs = _merge([self._ring_phase(r, S, k - 1, local) for r in intra])
            ar = _merge([self._ring_phase(r, S / k, 2 * (len(by_node) - 1), 0.0) for r in rails])
            return [rs, ar, rs]
        topo = self.topology
        if alg == "direct":  # all-to-all: every rank sends S/n to every other at once
            tr = tuple((a, b, S / n) for a in g for b in g if a != b)
            # its port and its warps (CollectiveModel._a2a_phase); a rank's own S/n is one of
            # the kernel's pieces of work (src/device/sendrecv.h: a send to self is a
            # reduceCopy from the send buffer to the receive buffer)
            return [self._a2a_phase(self._pxn(tr), [g], [[S / n] * n for _ in range(n)])]
        if alg == "chain":  # broadcast from g[0], pipelined along the ring channels
            chans = self._ring(g)
            tr, path, hops = [], 0.0, [0, 0]
            for c, ring in enumerate(chans):
                r0 = ring.index(g[0])
                o = ring[r0:] + ring[:r0]
                for a, b in zip(o[:-1], o[1:], strict=False):
                    tr.append((a, b, S / len(chans)))
                    if c == 0:
                        path += topo.route_latency(a, b)
                        hops[topo.crosses_network(a, b)] += 1
            net = any(topo.crosses_network(a, b) for a, b, _ in tr)
            return [Phase(tuple(tr), 1, path, hops[0], hops[1], 0.0 if net else S)]
        if alg == "p2p":
            return [self._direct_phase(((g[0], g[1], S),), S)]
        return self._in_network_phases(alg, g, S)  # nvls, nvls_tree, collnet (innetwork.py)

    def _pxn(self, tr):
        """NCCL's PXN (PCI x NVLink, NCCL >= 2.12, on by default): a send to a GPU of another
        node whose NIC is on a different rail first crosses NVLink to the GPU of the sender's
        node that sits on the receiver's rail, which sends it over its own NIC, so inter-node
        all-to-all traffic stays on its rail and off the spine ("Doubling all2all Performance
        with NCCL 2.12", NVIDIA technical blog, 2022). Only on rail-optimised fabrics of
        NVLink-connected nodes; the relayed bytes are two transfers of the same size."""
        topo = self.topology
        cfg = topo.cfg
        k, m = topo.gpus_per_node, topo.nics_per_node
        if not (cfg.rail_optimized and m > 1 and topo.intra != "pcie" and topo.nodes > 1):
            return tr
        out = []
        for a, b, nb in tr:
            if topo.crosses_network(a, b):
                j = topo.nic_of(b)
                if topo.nic_of(a) != j:
                    r = topo.node_of(a) * k + -(-j * k // m)  # first GPU on NIC j
                    if r != a:
                        out += [(a, r, nb), (r, b, nb)]
                        continue
            out.append((a, b, nb))
        return tuple(out)

    def _direct_phase(self, tr, local: float, bw_fraction: float = 1.0) -> Phase:
        topo = self.topology
        net = any(topo.crosses_network(a, b) for a, b, _ in tr)
        path = max(topo.route_latency(a, b) for a, b, _ in tr)
        # received bytes pass once more through the receiver's SMs (FIFO -> output);
        # bw_fraction: the all-to-all's achieved share of the link rate (fabrics.yaml)
        # (measured on NVLink only: a step that crosses the network is not scaled)
        return Phase(tr, 1, path, 0 if net else 1, 1 if net else 0, 0.0 if net else local,
                     bw_fraction=1.0 if net else bw_fraction)

    def _ring_phase(self, chans: list[list[int]], S: float, steps: int, local: float) -> Phase:
        """``steps`` ring steps: every rank of every channel sends S/(n*C) to its successor.

        A ring is a pipeline, so a step's latency is the mean edge latency of the ring (a chunk
        crosses every edge once per lap), not the slowest edge's.
        """
        topo, C, n = self.topology, len(chans), len(chans[0])
        tr = tuple((ring[i], ring[(i + 1) % n], S / (n * C)) for ring in chans for i in range(n))
        ring = chans[0]
        edges = list(zip(ring, ring[1:] + ring[:1], strict=True))
        net_edges = sum(topo.crosses_network(a, b) for a, b in edges)
        path = sum(topo.route_latency(a, b) for a, b in edges) / n
        return Phase(
            tr, steps, path, (n - net_edges) / n, net_edges / n, 0.0 if net_edges else local
        )

    def _tree_phase(self, by_node: list[list[int]], S: float) -> Phase:
        """NCCL's double binary tree: per channel an intra-node chain to the head GPU and two
        binary trees over the nodes, each carrying half of the channel's data, reduce and
        broadcast pipelined together (one step)."""
        topo, N, k = self.topology, len(by_node), len(by_node[0])
        heads = [self._heads(x) for x in by_node]
        C = min(len(h) for h in heads)
        tr: list[tuple[int, int, float]] = []
        intra_lat, net_lat = [], []
        for c in range(C):
            for x, h in zip(by_node, heads, strict=True):
                hd = h[c]
                i = x.index(hd)
                chain = x[i + 1 :] + x[:i] + [hd]  # ... -> head
                for a, b in zip(chain[:-1], chain[1:], strict=False):
                    tr += [(a, b, S / C), (b, a, S / C)]
                    if c == 0:
                        intra_lat.append(topo.route_latency(a, b))
            for parent in _double_binary_tree(N):
                for child, par in enumerate(parent):
                    if par >= 0:
                        a, b = heads[child][c], heads[par][c]
                        tr += [(a, b, S / (2 * C)), (b, a, S / (2 * C))]
                        if c == 0:
                            net_lat.append(topo.route_latency(a, b))
        depth = _depth(_double_binary_tree(N)[0])
        il = float(np.mean(intra_lat)) if intra_lat else 0.0
        nl = float(np.mean(net_lat)) if net_lat else 0.0
        path = 2 * ((k - 1) * il + depth * nl)
        return Phase(tuple(tr), 1, path, 2 * (k - 1), 2 * depth, 0.0, "tree", self.tree_fraction)

    # ------------------------------------------------------------------ ring construction

    def _by_node(self, g: Sequence[int]) -> list[list[int]]:
        nodes: dict[int, list[int]] = {}
        for x in sorted(g):
            nodes.setdefault(self.topology.node_of(x), []).append(x)
        return [nodes[n] for n in sorted(nodes)]

    def _heads(self, gpus: list[int]) -> list[int]:
        """One GPU per distinct NIC among ``gpus`` (the channels' entry points)."""
        out: dict[int, int] = {}
        if self.topology.nics_per_node:
            for x in gpus:
                out.setdefault(self.topology.nic_of(x), x)
        return list(out.values()) or gpus[:1]

    def _ring(self, g: Sequence[int]) -> list[list[int]]:
        """The channels' rank orders: node by node; across nodes one channel per rail pair,
        snaking so that each network hop leaves and enters on the same rail."""
        key = tuple(g)
        hit = self._rings.get(key)
        if hit is not None:
            return hit
        by_node = self._by_node(g)
        heads = [self._heads(x) for x in by_node]
        C = min(len(h) for h in heads)
        flat = [x for node in by_node for x in node]
        n = len(flat)
        if len(by_node) == 1 and self.topology.intra == "mesh":
            # direct links only: one ring per stride coprime to n, so that several of each
            # GPU's links carry traffic (NCCL likewise builds several rings on NVLink meshes)
            chans = [
                [flat[i * s % n] for i in range(n)] for s in range(1, n) if math.gcd(s, n) == 1
            ]
        elif len(by_node) == 1 or C < 2 or any(len(x) != len(by_node[0]) for x in by_node):
            chans = [flat]
        else:
            chans = []
            for c in range(C):
                order = []
                for pos, (x, h) in enumerate(zip(by_node, heads, strict=True)):
                    a, b = h[c], h[(c + C // 2) % C]
                    if pos % 2:
                        a, b = b, a
                    i = x.index(a)
                    rest = [y for y in x[i + 1 :] + x[:i] if y != b]
                    order += [a, *rest, b]
                chans.append(order)
        self._rings[key] = chans
        return chans


def _merge(phases: list[Phase]) -> Phase:
    """Concurrent identical-length phases (e.g. one per node) as one phase."""
    p0 = phases[0]
    return Phase(
        tuple(t for p in phases for t in p.transfers),
        p0.repeat,
        max(p.path_s for p in phases),
        max(p.intra_hops for p in phases),
        max(p.net_hops for p in phases),
        max(p.local_bytes for p in phases),
    )


def phase_at(seq, step: int):
    for item in seq:
        if step < item[0].repeat:
            return item
        step -= item[0].repeat
    return None


def _binary_tree(n: int) -> list[int]:
    """Parent of each position 0..n-1 in NCCL's in-order binary tree (root: -1).

    With 1-based positions p and b = the lowest set bit of p, p's parent is p + b or p - b,
    whichever is a multiple of 4b (the next level up); parents past n are skipped upwards.
    The leaves are the odd p (even 0-based positions); the root is the largest power of 2
    <= n (Sanders, Speck & Traeff 2009, as used by NCCL's double binary tree).
    """
    parent = [-1] * n
    for p in range(1, n + 1):
        q = p
        while True:
            b = q & -q
            q = q - b if q & (2 * b) else q + b
            if q > 2 * n:
                q = -1
                break
            if q <= n:
                break
        parent[p - 1] = q - 1 if q > 0 else -1
    return parent


def _double_binary_tree(n: int) -> tuple[list[int], list[int]]:
    """NCCL's two complementary trees over n nodes: the second mirrors the first (n even) or
    shifts it by one position (n odd), so that a leaf of one tree is an inner node of the other.
    """
    t1 = _binary_tree(n)
    t2 = [-1] * n
    for pos, par in enumerate(t1):
        if n % 2 == 0:
            t2[n - 1 - pos] = -1 if par < 0 else n - 1 - par
        else:
            t2[(pos + 1) % n] = -1 if par < 0 else (par + 1) % n
    return t1, t2


def _depth(parent: list[int]) -> int:
    best = 0
    for i in range(len(parent)):
        d, j = 0, i
        while parent[j] >= 0:
            j, d = parent[j], d + 1
        best = max(best, d)
    return max(best, 1)
