"""In-network reductions: NVLink SHARP (NCCL's NVLS, NVLS Tree) and InfiniBand SHARP (CollNet).

NVLink SHARP (NVSwitch 3rd generation and later: HGX H100/H200/B200/B300 boards, GB200/GB300
NVL72 racks) reduces in the switch: every GPU reads its 1/n share of the buffer already summed
over the group (``multimem.ld_reduce``) and stores the result once for every GPU to receive
(``multimem.st``). Per GPU and per direction its NVLink carries S + S/n bytes of an all-reduce
of S bytes, against the ring's 2(n-1)/n x S. InfiniBand SHARP (Quantum-2 NDR switches, SHARPv3,
through NCCL's CollNet and the SHARP plugin) reduces in the leaf and spine switches: each NIC
sends its share of the buffer up the aggregation tree once and receives the reduced result once,
S/H per NIC where H NICs of a node share the buffer, against 2(N-1)/N x S/H for a ring.

The flow network has no multicast, so each pattern is written as point-to-point transfers that
load every link exactly as the in-switch traffic does: on a non-blocking NVSwitch only a GPU's
up and down links matter, and a *shift* (GPU i sends B to GPU i+1 of its domain) puts B on
every up and every down link; across nodes, a shift over one rail's NICs (in node order) puts
S/H on every NIC link in both directions and one stream on each leaf (and spine) boundary, as an
aggregation tree does. Each algorithm is one pipelined phase (NCCL pipelines the intra-node and
network parts chunk by chunk), so its time is the slower part's.

Achieved rates are the measured share of the link a multimem or SHARP stream reaches
(``fabrics.yaml`` ``in_network``, with sources); they scale the bytes of the transfers (bytes on
the wire), and the phase's fixed latency is NCCL's tuning-model figure for the algorithm.
Algorithms (``all_reduce`` only; NVLS reduce-scatter / all-gather move S one way and S/n the
other per GPU, slower than a ring at the measured NVLS rate, and SHARP does not shorten them):

* ``nvls``: one NVLink domain; or, with ``ib_sharp``, NVLS in each domain plus SHARP across
  them (NCCL's NVLS algorithm on several nodes needs CollNet).
* ``nvls_tree``: NVLS in each domain, NCCL's double binary tree across domains per NIC rail.
* ``collnet``: CollNet Direct: direct reduce-scatter / all-gather over NVLink inside the node,
  SHARP across nodes (one GPU per node: SHARP alone).
"""

from __future__ import annotations

from typing import Any

from simulator.network.algorithms import Phase, _depth, _double_binary_tree

#: The algorithms of this module (``all_reduce``).
IN_NETWORK = ("nvls", "nvls_tree", "collnet")


class InNetworkPhases:
    """Phases of NVLS, NVLS Tree and CollNet (mixed into CollectiveModel, which provides
    ``topology``, ``in_network`` (the constants of ``fabrics.yaml``), ``_by_node`` and
    ``_heads``)."""

    def nvls_supported(self) -> bool:
        """Whether this fabric runs NVLink SHARP (:func:`nvls_available`)."""
        return nvls_available(self.topology, self.in_network)

    def sharp_supported(self) -> bool:
        """Whether the scale-out fabric reduces in its switches (``topology.ib_sharp``)."""
        return bool(self.topology.cfg.ib_sharp) and self.topology.nodes > 1

    def _in_network_phases(self, alg: str, g: list[int], S: float) -> list[Phase] | None:
        by_node = self._by_node(g)
        k, N = len(by_node[0]), len(by_node)
        if any(len(x) != k for x in by_node):
            return None
        sharp = self.sharp_supported() and N > 1
        if alg in ("nvls", "nvls_tree"):
            if not self.nvls_supported() or k < 2:
                return None
            if alg == "nvls" and N > 1 and not sharp:
                return None  # NCCL: NVLS across nodes only with CollNet
            if alg == "nvls_tree" and N < 2:
                return None
        elif not sharp or (k > 1 and self.topology.intra != "nvswitch"):
            return None  # CollNet Direct needs SHARP and (with several GPUs a node) NVSwitch
        heads = [self._heads(x) for x in by_node]
        H = min(len(h) for h in heads)
        c = self.in_network
        tr: list[tuple[int, int, float]] = []
        if alg == "collnet":
            intra, lat = 2 * S * (k - 1) / k, c["collnet_us"]
        else:
            # multimem.ld_reduce of S plus multimem.st of the share the GPU's head sends on
            intra = S * (1 + 1 / (H if N > 1 else k)) / self._nvls_eff()
            lat = c["nvls_us"]
        if k > 1:
            for x in by_node:
                tr += [(x[i], x[(i + 1) % k], intra) for i in range(k)]
        path = max((self.topology.route_latency(a, b) for a, b, _ in tr[:k]), default=0.0)
        if N > 1 and alg == "nvls_tree":
            net, depth = self._tree_transfers(heads, H, S), _depth(_double_binary_tree(N)[0])
            tr += net
            lat += 2 * depth * c["nvls_tree_hop_us"]
        elif N > 1:
            share = S / H / c["sharp_efficiency"]
            for ch in range(H):
                ring = [h[ch] for h in heads]
                tr += [(ring[i], ring[(i + 1) % N], share) for i in range(N)]
            lat += c["nvls_sharp_us"] if alg == "nvls" else 0.0
        if N > 1:
            a, b = heads[0][0], heads[-1][0]
            path += 2 * self.topology.route_latency(a, b)  # up the tree and back
        return [Phase(tuple(tr), 1, path + lat * 1e-6, 0.0, 0.0, 0.0, "offload")]

    def _nvls_eff(self) -> float:
        gen = str(getattr(self.topology.gpu, "nvlink_generation", None) or 0)
        return float(self.in_network["nvls_efficiency"][gen])

    def _tree_transfers(self, heads: list[list[int]], H: int, S: float):
        """NCCL's double binary tree over the domains, one per head (rail), on S/H each: every
        tree edge carries half of it up (reduce) and down (broadcast)."""
        out = []
        for ch in range(H):
            for parent in _double_binary_tree(len(heads)):
                for child, par in enumerate(parent):
                    if par >= 0:
                        a, b = heads[child][ch], heads[par][ch]
                        out += [(a, b, S / (2 * H)), (b, a, S / (2 * H))]
        return out


def nvls_available(topo, constants: dict[str, Any]) -> bool:
    """Whether a topology has NVLink SHARP: an NVSwitch domain of a GPU of NVLink 4 or later
    (with a measured NVLS rate in ``constants``), and ``nvls`` not set false (default: on where
    supported, as NCCL's NCCL_NVLS_ENABLE)."""
    gen = getattr(topo.gpu, "nvlink_generation", None) or 0
    ok = topo.intra == "nvswitch" and topo.gpus_per_node > 1 and gen >= 4
    return ok and topo.cfg.nvls is not False and str(gen) in constants["nvls_efficiency"]


def in_network_constants(fabrics: dict[str, Any]) -> dict[str, Any]:
    """The ``in_network`` section of ``fabrics.yaml`` with its units resolved."""
    sec = fabrics.get("in_network", {})
    return {
        "nvls_efficiency": {str(k): float(v) for k, v in sec.get("nvls_efficiency", {}).items()},
        "sharp_efficiency": float(sec.get("sharp_efficiency", 1.0)),
        "nvls_us": float(sec.get("nvls_us", 0.0)),
        "nvls_sharp_us": float(sec.get("nvls_sharp_us", 0.0)),
        "nvls_tree_hop_us": float(sec.get("nvls_tree_hop_us", 0.0)),
        "collnet_us": float(sec.get("collnet_us", 0.0)),
    }
