"""The cluster as a graph of links: GPUs, NVSwitches, NICs, leaf switches and the spine tier.

Every physical link is two directed links (one per direction), each with an integer id, a
capacity in bytes/s and a latency in seconds. The flow model (:mod:`simulator.network.flows`)
and the collective model (:mod:`simulator.network.collectives`) work on link ids only; the
networkx graph is the same information for inspection, plots and invariant tests.

Modelling choices (documented here once):

* **Inside a node.** ``nvswitch``: each GPU has one up link and one down link of its NVLink
  bandwidth to a non-blocking switch (the third-generation NVSwitch is non-blocking, NVIDIA
  DGX H100 user guide), so intra-node traffic is ``gpu -> nvsw -> gpu``. ``mesh``: direct
  NVLink between every pair of GPUs of the node; the GPU's NVLink bandwidth is split evenly over
  its ``gpus_per_node - 1`` peers. ``pcie``: every GPU hangs off one PCIe switch (link of
  ``pcie_bandwidth_GBps``), which also serves the node's NICs.
* **Between nodes.** ``gpu -> PCIe -> NIC -> leaf [-> spine -> leaf] -> NIC -> PCIe -> gpu``.
  GPU ``g`` (local index) uses NIC ``g * nics_per_node // gpus_per_node``. Rail-optimised: NIC
  ``i`` of every node in a group of ``nodes_per_leaf`` nodes goes to leaf ``i`` of that group
  (NVIDIA DGX SuperPOD reference architecture); otherwise all NICs of a node go to the group's
  single leaf. Traffic between different leaves, including different rails of the same group
  (no PXN), crosses the spine tier.
* **Spine tier at flow level.** ``fat_tree`` and ``leaf_spine`` are modelled alike: each leaf
  has one aggregated up link and one aggregated down link to a single, non-blocking spine
  node, of capacity ``(sum of the leaf's NIC link capacities) / oversubscription``. This is
  ECMP as ideal load balancing over the leaf's uplinks (the standard flow-level abstraction of
  a folded Clos, e.g. SimGrid's fat-tree model); hash collisions and a third switch tier are
  not modelled.
* **Latency.** An intra-node hop costs ``nvlink_latency_us`` (split over up and down link on
  NVSwitch); each PCIe GPU<->NIC crossing costs ``nic_latency_us`` ("NIC + PCIe, each end");
  each switch traversed costs ``switch_latency_us`` (1 for same-leaf traffic, 3 via the
  spine).
* **Faults.** A :class:`~simulator.config.schema.LinkFault` scales a GPU's NVLink port or a
  NIC's cable to its leaf, both directions, by ``bandwidth_factor``. A factor of 0 removes the
  link (capacity 0, dropped from :attr:`Topology.graph`). A GPU whose NIC failed sends and
  receives through the next working NIC of its node, reached over NVLink via a GPU that owns
  that NIC (what NCCL's PXN does) or, on a PCIe node, through the PCIe switch. A pair of GPUs
  with no remaining path raises :class:`~simulator.errors.PlanError` naming them.
* **Efficiency.** Link capacities here are line rates. :meth:`Topology.effective_capacity`
  applies the per-link-kind efficiencies of ``fabrics.yaml`` (what a bulk transfer achieves),
  shared by the collective model and the full-detail flow network.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.config.schema import LinkFault, TopologyConfig
from simulator.config.yaml_safe import read_package_yaml
from simulator.errors import ConfigError, PlanError

if TYPE_CHECKING:  # the hardware catalog is only needed for the annotation
    import networkx as nx

    from simulator.hardware.catalog import GPUSpec

FABRICS_FILE = Path(__file__).with_name("fabrics.yaml")

#: Link kinds, in the order their ids are allocated.
LINK_KINDS = ("nvlink", "pcie", "nic", "leaf_up", "leaf_down", "spine_up", "spine_down")


class Names(Sequence):
    """Names made on demand: item ``j`` is the concatenation of ``parts``, each a string or a
    sequence indexed by ``j`` (``Names("gpu", range(8))[3] == "gpu3"``). A 131,072-GPU fabric
    has ~800,000 links; a run names only those it reports."""

    def __init__(self, *parts):
        self.parts = parts
        self.n = min(len(q) for q in parts if not isinstance(q, str))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(self.n))]
        if not -self.n <= j < self.n:
            raise IndexError(j)
        return "".join(q if isinstance(q, str) else str(q[j]) for q in self.parts)

    def take(self, js: np.ndarray) -> list[str]:
        """``[self[j] for j in js]``, a part at a time."""
        cols = [q if isinstance(q, str) else np.asarray(q)[js].tolist() for q in self.parts]
        if len(cols) == 2 and isinstance(cols[0], str):  # "gpu", "leaf", ...: one number
            return [f"{cols[0]}{v}" for v in cols[1]]
        if len(cols) == 4 and isinstance(cols[0], str) and isinstance(cols[2], str):
            a, c = cols[0], cols[2]  # "nic<tray>.<rail>"
            return [f"{a}{v}{c}{w}" for v, w in zip(cols[1], cols[3], strict=True)]
        out = [""] * len(js)
        for q in self.parts:
            if isinstance(q, str):
                out = [a + q for a in out]
            else:
                out = [a + str(v) for a, v in zip(out, np.asarray(q)[js].tolist(), strict=True)]
        return out


class Picked(Sequence):
    """``names[index[j]]`` for each ``j``, on demand."""

    def __init__(self, names: Sequence[str], index):
        self.names, self.index = names, index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        return self.names[self.index[j]]

    def take(self, js: np.ndarray) -> list[str]:
        """``[self[j] for j in js]``."""
        return take_names(self.names, np.asarray(self.index)[js])


class LinkNames(Sequence):
    """``"src->dst"`` by link id, over the blocks of links the fabric added (each a sequence
    of source names and one of destination names), named only when asked."""

    def __init__(self):
        self.bases: list[int] = []
        self.blocks: list[tuple[Sequence[str], Sequence[str]]] = []
        self.n = 0

    def add(self, src: Sequence[str], dst: Sequence[str]) -> None:
        """Append ``len(src)`` links, ``src[j]->dst[j]``."""
        self.bases.append(self.n)
        self.blocks.append((src, dst))
        self.n += len(src)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        i = int(i) % self.n
        b = bisect_right(self.bases, i) - 1
        src, dst = self.blocks[b]
        j = i - self.bases[b]
        return f"{src[j]}->{dst[j]}"

    def ends(self, ids: np.ndarray) -> tuple[list[str], list[str]]:
        """The source and destination names of links ``ids`` (ascending), block by block."""
        ids = np.asarray(ids, dtype=np.int64)
        cuts = np.searchsorted(ids, self.bases[1:] + [self.n])
        src: list[str] = []
        dst: list[str] = []
        lo = 0
        for base, (s, d), hi in zip(self.bases, self.blocks, cuts.tolist(), strict=True):
            js = ids[lo:hi] - base
            src += take_names(s, js)
            dst += take_names(d, js)
            lo = hi
        return src, dst


def take_names(names: Sequence[str], js: np.ndarray) -> list[str]:
    """``[names[j] for j in js]`` for a list, :class:`Names` or :class:`Picked`."""
    if isinstance(names, Names | Picked):
        return names.take(js)
    return [names[j] for j in js.tolist()]


def link_ends(link_names: Sequence[str], ids: np.ndarray) -> tuple[list[str], list[str]]:
    """Source and destination names of links ``ids`` (ascending ids)."""
    if isinstance(link_names, LinkNames):
        return link_names.ends(ids)
    ends = [link_names[i].partition("->") for i in np.asarray(ids).tolist()]
    return [e[0] for e in ends], [e[2] for e in ends]


@cache
def load_fabrics(path: str | None = None) -> dict[str, Any]:
    """The calibration constants of ``fabrics.yaml`` (per-link-kind efficiency, NCCL protocol
    latencies, launch overhead), parsed once."""
    p = Path(path) if path else FABRICS_FILE
    data = read_package_yaml(p)
    for key in ("links", "nccl"):
        if key not in data:
            raise ConfigError(f"missing section {key!r}", file=str(p), field=key)
    return data


#: Topology keys whose default comes from the GPU catalog: key -> (catalog field, fallback)
CATALOG_DEFAULTS = {
    "nvlink_bandwidth_GBps": ("nvlink_line_GBps", "nvlink_GBps"),
    "nic_bandwidth_Gbps": ("nic_Gbps", None),
    "pcie_bandwidth_GBps": ("pcie_GBps", None),
}
#: Used where neither the topology nor the catalog gives a figure (an inline GPU)
FALLBACKS = {"nic_bandwidth_Gbps": 400.0, "pcie_bandwidth_GBps": 64.0}


def resolve_figures(cfg: TopologyConfig, gpu: Any) -> dict[str, tuple[float | None, str]]:
    """The fabric figures a run uses and where each came from.

    A topology key set in the file (or by ``--set``) wins; otherwise the GPU catalog's figure
    for that GPU (its NVLink generation's line rate, its reference system's NIC and PCIe);
    otherwise a generic default. Returns key -> (value, origin), origin one of ``topology``,
    ``catalog <GPU>.<field>`` or ``default``.
    """
    out: dict[str, tuple[float | None, str]] = {}
    name = getattr(gpu, "name", "?")
    for key, (field, alt) in CATALOG_DEFAULTS.items():
        given = getattr(cfg, key)
        if given is not None:
            out[key] = (float(given), "topology")
            continue
        for f in (field, alt):
            v = getattr(gpu, f, None) if f else None
            if v:
                out[key] = (float(v), f"catalog {name}.{f}")
                break
        else:
            fb = FALLBACKS.get(key)
            out[key] = (fb, "default")
    return out


class Topology:
    """A cluster's links, routes and latencies.

    Args:
        cfg: the topology configuration.
        gpu: the GPU spec (only ``name`` and ``nvlink_GBps`` are used; ``cfg`` may override
            the NVLink bandwidth).
        link_faults: degraded or failed links (``faults.links`` of the workload).

    Attributes:
        cfg, gpu, n_gpus, nodes, gpus_per_node, nics_per_node
        n_links: number of directed links; ids are ``0 .. n_links-1``.
        capacity: bytes/s per link id (line rate, after faults).
        latency: seconds per link id.
        link_names: ``"src->dst"`` per link id; link_kinds: kind per link id
            (``nvlink``, ``pcie``, ``nic``, ``leaf_up``, ``leaf_down``).
        n_leaves: number of leaf switches.
    """

    def __init__(self, cfg: TopologyConfig, gpu: GPUSpec, link_faults: Sequence[LinkFault] = ()):
        self.cfg = cfg
        self.gpu = gpu
        self.figures = resolve_figures(cfg, gpu)
        tray = int(cfg.gpus_per_node)
        dom = int(cfg.nvlink_domain_gpus or tray)
        n_gpus = int(cfg.nodes) * tray
        if dom % tray or n_gpus % dom:
            raise ConfigError(
                f"an NVLink domain of {dom} GPUs must be a multiple of gpus_per_node ({tray}) "
                f"and divide the {n_gpus} GPUs (nodes x gpus_per_node)",
                field="topology.nvlink_domain_gpus",
            )
        if dom > tray and cfg.intra_node != "nvswitch":
            raise ConfigError(
                f"an NVLink domain across nodes needs intra_node: nvswitch, got {cfg.intra_node}",
                field="topology.nvlink_domain_gpus",
            )
        #: physical nodes (compute trays on an NVL72 rack) and GPUs on each
        self.physical_nodes, self.tray_gpus = int(cfg.nodes), tray
        self.trays_per_domain = dom // tray
        # Routing and collectives see an NVLink domain as one node (NCCL does likewise on
        # multi-node NVLink: rings and trees treat the domain as one NVLink-connected node).
        self.gpus_per_node = dom
        self.n_gpus = n_gpus
        self.nodes = n_gpus // dom
        self.nics_per_node = int(cfg.nics_per_node) * self.trays_per_domain if self.nodes > 1 else 0
        if self.nodes > 1 and cfg.nics_per_node < 1:
            raise ConfigError(
                f"{self.nodes} nodes need at least one NIC per node, got 0",
                field="topology.nics_per_node",
            )
        self._check_tiers(cfg)
        nvl = self.figures["nvlink_bandwidth_GBps"][0]
        if cfg.intra_node != "pcie" and not nvl:
            raise ConfigError(
                f"GPU {getattr(gpu, 'name', gpu)!r} has no NVLink bandwidth; set "
                "nvlink_bandwidth_GBps or intra_node: pcie",
                field="topology.nvlink_bandwidth_GBps",
            )
        self.nvlink_Bps = float(nvl or 0.0) * 1e9
        self.pcie_Bps = self.figures["pcie_bandwidth_GBps"][0] * 1e9
        self.nic_Bps = self.figures["nic_bandwidth_Gbps"][0] * 1e9 / 8
        self._build_links()
        self._apply_faults(link_faults)
        self._cap_list: list[float] = self.capacity.tolist()  # fast scalar access for routing
        self._lat_list: list[float] = self.latency.tolist()
        self._leaf_list: list[int] = self._leaf_of_nic.tolist() if self.nics_per_node else []
        self._used_nics = sorted({self.nic_index(x) for x in range(self.gpus_per_node)})
        self._nic_cache: dict[int, int] = {}
        self._eg: dict[int, tuple[tuple[int, ...], int]] = {}
        self._ig: dict[int, tuple[tuple[int, ...], int]] = {}
        self._routes: dict[tuple[int, int], tuple[int, ...]] = {}
        self._route_lat: dict[tuple[int, int], float] = {}

    def _check_tiers(self, cfg: TopologyConfig) -> None:
        per_leaf = int(cfg.nodes_per_leaf)
        pod = cfg.nodes_per_pod or 16 * per_leaf
        if cfg.tiers == 3 and pod % per_leaf:
            raise ConfigError(
                f"nodes_per_pod ({pod}) must be a multiple of nodes_per_leaf ({per_leaf})",
                field="topology.nodes_per_pod",
            )
        if cfg.network == "rail_only" and cfg.tiers == 3:
            raise ConfigError(
                "a rail-only fabric has no spine (accepted: tiers: 2)", field="topology.tiers"
            )
        #: leaf groups under one spine block (tiers: 3), 0 for a two-tier fabric
        self.leaf_groups_per_pod = pod // per_leaf if cfg.tiers == 3 else 0

    def warnings(self) -> list[str]:
        """What the run should say about this fabric: NICs a PCIe link caps."""
        out = []
        if not self.nics_per_node:
            return out
        eff = {k: float(v["efficiency"]) for k, v in load_fabrics()["links"].items()}
        gpus_per_nic = max(1, self.gpus_per_node // self.nics_per_node)
        feed = self.pcie_Bps * eff["pcie"] * (gpus_per_nic if self.intra != "pcie" else 1)
        nic = self.nic_Bps * eff["nic"]
        if feed < nic:
            out.append(
                f"NICs are PCIe-bound: a {self.nic_Bps * 8 / 1e9:.0f} Gb/s NIC "
                f"({nic / 1e9:.0f} GB/s achievable) is fed by {gpus_per_nic} GPU(s) over "
                f"{self.pcie_Bps / 1e9:.0f} GB/s PCIe ({feed / 1e9:.0f} GB/s achievable), so "
                f"network transfers run at most at {feed / nic:.0%} of the NIC's rate "
                "(topology.pcie_bandwidth_GBps)"
            )
        return out

    # ------------------------------------------------------------------ construction

    def _build_links(self) -> None:
        cfg, k, N = self.cfg, self.gpus_per_node, self.nodes
        G = self.n_gpus
        names = LinkNames()
        kinds: list[str] = []
        kind_ids: list[np.ndarray] = []
        caps: list[np.ndarray] = []
        lats: list[np.ndarray] = []
        hop = cfg.nvlink_latency_us * 1e-6

        def add(src: Sequence[str], dst: Sequence[str], kind: str, cap, lat) -> int:
            base, n = len(names), len(src)
            if len(dst) != n:
                raise ValueError(f"{n} link sources, {len(dst)} destinations")
            names.add(src, dst)
            kinds.extend([kind] * n)
            kind_ids.append(np.full(n, LINK_KINDS.index(kind), dtype=np.int64))
            caps.append(np.broadcast_to(np.asarray(cap, float), (n,)).copy())
            lats.append(np.broadcast_to(np.asarray(lat, float), (n,)).copy())
            return base

        gname = Names("gpu", range(G))
        node_of = np.arange(G) // k
        self.intra = cfg.intra_node
        # intra-node fabric
        if cfg.intra_node in ("nvswitch", "pcie"):
            sw = Names("nvsw" if cfg.intra_node == "nvswitch" else "pcisw", node_of)
            kind = "nvlink" if cfg.intra_node == "nvswitch" else "pcie"
            bw = self.nvlink_Bps if kind == "nvlink" else self.pcie_Bps
            self._up = add(gname, sw, kind, bw, hop / 2)
            self._down = add(sw, gname, kind, bw, hop / 2)
        else:  # mesh: k*(k-1) directed links per node
            self._mesh = len(names)
            i, j = np.nonzero(~np.eye(k, dtype=bool))  # (i, j), i != j, in row order
            first = np.arange(N)[:, None] * k  # node n's GPUs: n * k + 0 .. k - 1
            src, dst = (Names("gpu", (first + x).ravel()) for x in (i, j))
            add(src, dst, "nvlink", self.nvlink_Bps / max(k - 1, 1), hop)
        # inter-node fabric
        m = self.nics_per_node
        self.n_leaves = 0
        if m:
            self._build_network(add, N, m)
        self.link_names = names
        self.link_kinds = kinds
        self._kind_id = np.concatenate(kind_ids) if kind_ids else np.zeros(0, dtype=np.int64)
        self.n_links = len(names)
        self.capacity = np.concatenate(caps) if caps else np.zeros(0)
        self.latency = np.concatenate(lats) if lats else np.zeros(0)
        self._nominal = self.capacity.copy()

    def _build_network(self, add, N: int, m: int) -> None:
        """NICs, leaves and the spine (and core, tiers: 3) tiers; see the module docstring."""
        cfg, k = self.cfg, self.gpus_per_node
        G = self.n_gpus
        gname = Names("gpu", range(G))
        nic_lat = cfg.nic_latency_us * 1e-6
        sw_lat = cfg.switch_latency_us * 1e-6
        mt, T = int(cfg.nics_per_node), self.trays_per_domain
        # NIC i of domain n sits on tray n*T + i // mt, rail i % mt (named by its tray)
        tray_of = [n * T + i // mt for n in range(N) for i in range(m)]
        rail_of = [i % mt for _ in range(N) for i in range(m)]
        nics = Names("nic", tray_of, ".", rail_of)
        if cfg.intra_node == "pcie":  # NICs hang off the node's PCIe switch
            psw = Names("pcisw", np.arange(N * m) // m)
            self._pcie_up = add(psw, nics, "pcie", self.pcie_Bps, nic_lat)
            self._pcie_down = add(nics, psw, "pcie", self.pcie_Bps, nic_lat)
        else:  # one PCIe link per GPU to its own NIC (DGX: GPU and NIC share a PCIe switch)
            g = np.arange(G)
            own = Picked(nics, g // k * m + (g % k) * m // k)  # NIC of GPU g (nic_index)
            self._pcie_up = add(gname, own, "pcie", self.pcie_Bps, nic_lat)
            self._pcie_down = add(own, gname, "pcie", self.pcie_Bps, nic_lat)
        per_leaf = int(cfg.nodes_per_leaf)
        if cfg.network == "rail_only":  # one switch fabric per rail spanning every node
            leaf_of = list(rail_of)
            self.n_leaves = mt
        elif cfg.rail_optimized:
            leaf_of = [(t // per_leaf) * mt + r for t, r in zip(tray_of, rail_of, strict=True)]
            self.n_leaves = -(-self.physical_nodes // per_leaf) * mt
        else:
            leaf_of = [t // per_leaf for t in tray_of]
            self.n_leaves = -(-self.physical_nodes // per_leaf)
        self._leaf_of_nic = np.asarray(leaf_of)
        leaves = Names("leaf", leaf_of)
        self._nic_up = add(nics, leaves, "nic", self.nic_Bps, sw_lat)
        self._nic_down = add(leaves, nics, "nic", self.nic_Bps, 0.0)
        self.n_pods = 0
        if cfg.network == "rail_only":
            return
        down_sum = np.bincount(self._leaf_of_nic, minlength=self.n_leaves) * self.nic_Bps
        up_cap = down_sum / cfg.oversubscription
        lname = [f"leaf{x}" for x in range(self.n_leaves)]
        per_group = mt if cfg.rail_optimized else 1  # leaves per leaf group
        if self.leaf_groups_per_pod:
            self._pod_of_leaf = [x // per_group // self.leaf_groups_per_pod for x in range(len(lname))]
            self.n_pods = max(self._pod_of_leaf) + 1
            spine = [f"spine{p}" for p in self._pod_of_leaf]
        else:
            self._pod_of_leaf = [0] * len(lname)
            spine = ["spine"] * self.n_leaves
        self._leaf_up = add(lname, spine, "leaf_up", up_cap, sw_lat)
        self._leaf_down = add(spine, lname, "leaf_down", up_cap, sw_lat)
        if self.n_pods:
            pod_cap = np.bincount(self._pod_of_leaf, weights=up_cap, minlength=self.n_pods)
            pods = [f"spine{p}" for p in range(self.n_pods)]
            core = ["core"] * self.n_pods
            cap = pod_cap / cfg.spine_oversubscription
            self._spine_up = add(pods, core, "spine_up", cap, sw_lat)
            self._spine_down = add(core, pods, "spine_down", cap, sw_lat)

    def _apply_faults(self, faults: Sequence[LinkFault]) -> None:
        m = self.nics_per_node
        for idx, f in enumerate(faults):
            where = f"faults.links.{idx}"
            if f.kind == "nvlink":
                if f.gpu is None or f.gpu >= self.n_gpus:
                    raise ConfigError(
                        f"gpu must be in 0..{self.n_gpus - 1}, got {f.gpu}", field=f"{where}.gpu"
                    )
                ids = self._gpu_port_links(f.gpu)
            else:
                mt = m // self.trays_per_domain
                if f.node is None or f.node >= self.physical_nodes:
                    raise ConfigError(
                        f"node must be in 0..{self.physical_nodes - 1}, got {f.node}",
                        field=f"{where}.node",
                    )
                if f.nic is None or not 0 <= f.nic < max(mt, 1) or not m:
                    raise ConfigError(
                        f"nic must be in 0..{mt - 1}, got {f.nic}"
                        if m
                        else "this topology has no NICs (single node)",
                        field=f"{where}.nic",
                    )
                j = f.node * mt + f.nic  # trays of a domain are consecutive, NICs too
                ids = [self._nic_up + j, self._nic_down + j]
            for i in ids:
                self.capacity[i] *= f.bandwidth_factor

    def _gpu_port_links(self, g: int) -> list[int]:
        """Ids of GPU ``g``'s intra-node links (both directions)."""
        if self.intra == "mesh":
            n, i = divmod(g, self.gpus_per_node)
            out = []
            for j in range(self.gpus_per_node):
                if j != i:
                    out += [self._mesh_link(n, i, j), self._mesh_link(n, j, i)]
            return out
        return [self._up + g, self._down + g]

    # ------------------------------------------------------------------ structure

    def node_of(self, gpu: int) -> int:
        """Node index of a global GPU index."""
        return gpu // self.gpus_per_node

    def nic_index(self, local_gpu: int) -> int:
        """The NIC (0-based, within the node) a GPU of that local index uses."""
        return local_gpu * self.nics_per_node // self.gpus_per_node if self.nics_per_node else 0

    def nic_of(self, gpu: int) -> int:
        """The NIC (within its node) GPU ``gpu`` actually uses: its own, or after a NIC
        failure the next working one. Raises PlanError when the node has none left."""
        hit = self._nic_cache.get(gpu)
        if hit is not None:
            return hit
        n, i = divmod(gpu, self.gpus_per_node)
        m = self.nics_per_node
        own = self.nic_index(i)
        used = self._used_nics
        start = used.index(own)
        for d in range(len(used)):
            j = used[(start + d) % len(used)]
            if self._cap_list[self._nic_up + n * m + j] > 0:
                self._nic_cache[gpu] = j
                return j
        raise PlanError(f"gpu {gpu}: every NIC of node {n} has failed; it cannot reach other nodes")

    def leaf_group_of(self, gpu: int) -> tuple[int, int, int, int]:
        """(leaf group, pod, physical nodes in that leaf group, in that pod) of a GPU's node:
        the fabric's translation symmetry, used to share collective plans between groups."""
        return self.tray_places[gpu // self.tray_gpus]

    @cached_property
    def tray_places(self) -> list[tuple[int, int, int, int]]:
        """:meth:`leaf_group_of` for every physical node, in node order."""
        cfg, N = self.cfg, self.physical_nodes
        per_leaf = N if cfg.network == "rail_only" else int(cfg.nodes_per_leaf)
        per_pod = per_leaf * self.leaf_groups_per_pod if self.leaf_groups_per_pod else N
        out = []
        for tray in range(N):
            lg, pod = tray // per_leaf, tray // per_pod
            out.append((lg, pod,
                        min(per_leaf, N - lg * per_leaf), min(per_pod, N - pod * per_pod)))
        return out

    def leaf_of(self, node: int, nic: int) -> int:
        """Leaf switch of NIC ``nic`` of node ``node``."""
        return self._leaf_list[node * self.nics_per_node + nic]

    def _mesh_link(self, n: int, i: int, j: int) -> int:
        k = self.gpus_per_node
        return self._mesh + n * k * (k - 1) + i * (k - 1) + (j if j < i else j - 1)

    def _intra(self, a: int, b: int) -> tuple[int, ...]:
        if self.intra == "mesh":
            n, i = divmod(a, self.gpus_per_node)
            return (self._mesh_link(n, i, b % self.gpus_per_node),)
        return (self._up + a, self._down + b)

    def _to_nic(self, g: int, j: int) -> tuple[int, ...]:
        """Links from GPU g to NIC j of its node (its own NIC, or another via a peer GPU)."""
        n, i = divmod(g, self.gpus_per_node)
        if self.intra == "pcie":
            return (self._up + g, self._pcie_up + n * self.nics_per_node + j)
        if j == self.nic_index(i):
            return (self._pcie_up + g,)
        h = n * self.gpus_per_node + self._first_gpu_on(j)
        return self._intra(g, h) + (self._pcie_up + h,)

    def _from_nic(self, j: int, g: int) -> tuple[int, ...]:
        n, i = divmod(g, self.gpus_per_node)
        if self.intra == "pcie":
            return (self._pcie_down + n * self.nics_per_node + j, self._down + g)
        if j == self.nic_index(i):
            return (self._pcie_down + g,)
        h = n * self.gpus_per_node + self._first_gpu_on(j)
        return (self._pcie_down + h,) + self._intra(h, g)

    def _first_gpu_on(self, j: int) -> int:
        k, m = self.gpus_per_node, self.nics_per_node
        return -(-j * k // m)

    # ------------------------------------------------------------------ routing

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """Link ids from GPU ``src`` to GPU ``dst`` (empty when equal); cached.

        Raises PlanError (naming both GPUs) when failed links leave no path.
        """
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            r = self._compute_route(src, dst)
            self._routes[key] = r
        return r

    def route_arrays(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`route` of many pairs at once: (every route's link ids, one route after the
        other; the number of links of each route). Computed with array operations on a
        fabric without faults (a 131,072-GPU step routes millions of flows); through
        :meth:`route` otherwise (faults reroute per GPU, rail-only fabrics per destination)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        G = self.n_gpus
        if len(src) and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= G):
            bad = next(int(x) for x in np.concatenate([src, dst]) if not 0 <= x < G)
            raise PlanError(f"gpu {bad} does not exist (the topology has {G} GPUs)")
        if (
            self.cfg.network == "rail_only"
            or bool(np.any(self.capacity != self._nominal))
            or bool(np.any(self._nominal <= 0))
        ):
            routes = [self.route(a, b) for a, b in zip(src.tolist(), dst.tolist(), strict=True)]
            lens = np.fromiter((len(r) for r in routes), dtype=np.int64, count=len(routes))
            links = np.fromiter((x for r in routes for x in r), dtype=np.int64,
                                count=int(lens.sum()))  # fmt: skip
            return links, lens
        k, m = self.gpus_per_node, self.nics_per_node
        na, nb = src // k, dst // k
        ia, ib = src % k, dst % k
        same = na == nb
        pcie = self.intra == "pcie"
        e = 3 if pcie else 2  # links from a GPU to its NIC's leaf (and back)
        M = np.full((len(src), 2 * e + 4), -1, dtype=np.int64)
        # inside a node (domain)
        intra = same & (src != dst)
        if self.intra == "mesh":
            jb = np.where(ib < ia, ib, ib - 1)
            M[intra, 0] = (self._mesh + na * k * (k - 1) + ia * (k - 1) + jb)[intra]
        else:
            M[intra, 0] = self._up + src[intra]
            M[intra, 1] = self._down + dst[intra]
        x = ~same
        if m and x.any():
            nic = (np.arange(k) * m // k).astype(np.int64)  # :meth:`nic_index` per local GPU
            a, b = src[x], dst[x]
            ja, jb2 = na[x] * m + nic[ia[x]], nb[x] * m + nic[ib[x]]
            up = ([self._up + a, self._pcie_up + ja] if pcie else [self._pcie_up + a])
            up.append(self._nic_up + ja)
            down = [self._nic_down + jb2]
            down += [self._pcie_down + jb2, self._down + b] if pcie else [self._pcie_down + b]
            leaf = self._leaf_of_nic
            la, lb = leaf[ja], leaf[jb2]
            rows = np.flatnonzero(x)
            for c, col in enumerate(up):
                M[rows, c] = col
            cross = la != lb
            if cross.any():
                pod = np.asarray(self._pod_of_leaf, dtype=np.int64)
                pa, pb = pod[la], pod[lb]
                r1 = rows[cross]
                M[r1, e] = self._leaf_up + la[cross]
                M[r1, e + 3] = self._leaf_down + lb[cross]
                far = cross & (pa != pb)
                if far.any():  # tiers: 3, leaves in different pods: via the core
                    r2 = rows[far]
                    M[r2, e + 1] = self._spine_up + pa[far]
                    M[r2, e + 2] = self._spine_down + pb[far]
            for c, col in enumerate(down):
                M[rows, e + 4 + c] = col
        keep = M >= 0
        return M[keep], keep.sum(axis=1)

    def _compute_route(self, src: int, dst: int) -> tuple[int, ...]:
        G, k = self.n_gpus, self.gpus_per_node
        if not (0 <= src < G and 0 <= dst < G):
            bad = src if not 0 <= src < G else dst
            raise PlanError(f"gpu {bad} does not exist (the topology has {G} GPUs)")
        if src == dst:
            return ()
        if src // k == dst // k:
            r = self._intra(src, dst)
        else:
            try:
                if self.cfg.network == "rail_only":  # leave on the destination's rail (PXN)
                    up, la = self._egress_via(src, self.nic_of(dst))
                else:
                    up, la = self._egress(src)
                down, lb = self._ingress(dst)
            except PlanError as e:
                raise PlanError(f"no path from gpu {src} to gpu {dst}: {e}") from None
            if la != lb:
                r = up + self._between_leaves(src, dst, la, lb) + down
            else:
                r = up + down
        cap = self._cap_list
        dead = [self.link_names[x] for x in r if cap[x] <= 0]
        if dead:
            raise PlanError(
                f"no path from gpu {src} to gpu {dst}: failed link(s) {', '.join(dead)}"
            )
        return r

    def _between_leaves(self, src: int, dst: int, la: int, lb: int) -> tuple[int, ...]:
        """Links from leaf ``la`` up and down to leaf ``lb`` (via a spine; tiers: 3 via the
        core when the leaves are in different pods)."""
        if self.cfg.network == "rail_only":
            raise AssertionError("rail-only routes change rails over NVLink")
        pa, pb = self._pod_of_leaf[la], self._pod_of_leaf[lb]
        if pa == pb:
            return (self._leaf_up + la, self._leaf_down + lb)
        return (self._leaf_up + la, self._spine_up + pa, self._spine_down + pb, self._leaf_down + lb)

    def _egress(self, g: int) -> tuple[tuple[int, ...], int]:
        """Links from GPU g up to and including its NIC's cable to the leaf, and that leaf."""
        hit = self._eg.get(g)
        if hit is None:
            n, m = g // self.gpus_per_node, self.nics_per_node
            j = self.nic_of(g)
            hit = (self._to_nic(g, j) + (self._nic_up + n * m + j,), self._leaf_list[n * m + j])
            self._eg[g] = hit
        return hit

    def _egress_via(self, g: int, j: int) -> tuple[tuple[int, ...], int]:
        """Links from GPU g to NIC j of its node (over NVLink when j is not its own) and on to
        that NIC's leaf, and the leaf."""
        if j == self.nic_of(g):
            return self._egress(g)
        n, m = g // self.gpus_per_node, self.nics_per_node
        return self._to_nic(g, j) + (self._nic_up + n * m + j,), self._leaf_list[n * m + j]

    def _ingress(self, g: int) -> tuple[tuple[int, ...], int]:
        """Links from the leaf down to GPU g, and that leaf."""
        hit = self._ig.get(g)
        if hit is None:
            n, m = g // self.gpus_per_node, self.nics_per_node
            j = self.nic_of(g)
            hit = ((self._nic_down + n * m + j,) + self._from_nic(j, g), self._leaf_list[n * m + j])
            self._ig[g] = hit
        return hit

    def route_latency(self, src: int, dst: int) -> float:
        """Sum of the link latencies along ``route(src, dst)``, seconds."""
        key = (src, dst)
        v = self._route_lat.get(key)
        if v is None:
            lat = self._lat_list
            v = sum(lat[i] for i in self.route(src, dst))
            self._route_lat[key] = v
        return v

    def crosses_network(self, src: int, dst: int) -> bool:
        """Whether traffic from src to dst leaves the node (goes through a NIC)."""
        return self.node_of(src) != self.node_of(dst)

    # ------------------------------------------------------------------ efficiency

    def effective_capacity(
        self, efficiency: float | Mapping[str, float] | np.ndarray | None = None
    ) -> np.ndarray:
        """Capacity a bulk transfer achieves per link: line rate x efficiency.

        ``efficiency``: None (the per-kind figures of ``fabrics.yaml``), one number for every
        link, a mapping link kind -> factor (missing kinds: 1), or an array per link id.
        """
        if efficiency is None:
            links = load_fabrics()["links"]
            efficiency = {kind: float(v["efficiency"]) for kind, v in links.items()}
        if isinstance(efficiency, Mapping):
            per_kind = np.array([efficiency.get(kd, 1.0) for kd in LINK_KINDS])
            return self.capacity * per_kind[self._kind_id]
        eff = np.asarray(efficiency, dtype=float)
        if eff.ndim and eff.shape != self.capacity.shape:
            raise ValueError(f"efficiency array has shape {eff.shape}, need ({self.n_links},)")
        return self.capacity * eff

    # ------------------------------------------------------------------ graph

    @cached_property
    def graph(self) -> nx.DiGraph:
        """The links as a networkx DiGraph (built on first use).

        Nodes carry ``kind`` (``gpu``, ``nvswitch``, ``pcie_switch``, ``nic``, ``leaf``,
        ``spine``); edges carry ``link`` (id), ``bandwidth_Bps``, ``latency_s`` and ``kind``.
        Failed links (capacity 0) are left out.
        """
        import networkx as nx  # for inspection and tests only; routing does not need it

        g = nx.DiGraph()
        prefixes = (
            ("gpu", "gpu"),
            ("nvsw", "nvswitch"),
            ("pcisw", "pcie_switch"),
            ("nic", "nic"),
            ("leaf", "leaf"),
            ("spine", "spine"),
            ("core", "core"),
        )
        seen: set[str] = set()
        for name in self.link_names:
            seen.update(name.split("->"))
        for name in sorted(seen):
            kind = next(kd for p, kd in prefixes if name.startswith(p))
            g.add_node(name, kind=kind)
        g.add_edges_from(
            (
                *name.split("->"),
                {
                    "link": i,
                    "bandwidth_Bps": float(self.capacity[i]),
                    "latency_s": float(self.latency[i]),
                    "kind": self.link_kinds[i],
                },
            )
            for i, name in enumerate(self.link_names)
            if self.capacity[i] > 0
        )
        return g

    def __repr__(self) -> str:
        return (
            f"Topology({self.cfg.name!r}: {self.nodes} nodes x {self.gpus_per_node} GPUs, "
            f"{self.intra}, {self.nics_per_node} NICs/node, {self.n_leaves} leaves, "
            f"{self.n_links} links)"
        )


def build_topology(
    cfg: TopologyConfig,
    gpu: Any,
    link_faults: Sequence[LinkFault] = (),
    *,
    file: str,
    faults_file: str | None = None,
) -> Topology:
    """``Topology(cfg, gpu, link_faults)`` whose input errors name the file to fix: the
    topology's ``file`` for its own keys (named as in that file, without ``topology.``), the
    workload's ``faults_file`` for a ``faults.`` field. The graph's checks (an NVLink domain,
    NICs for several nodes, tiers) raise :class:`ConfigError` without a file."""
    try:
        return Topology(cfg, gpu, link_faults)
    except ConfigError as e:
        if e.file is not None:
            raise
        field = e.field or ""
        if field.startswith("faults.") and faults_file:
            raise ConfigError(e.detail, file=faults_file, field=field) from None
        field = field.removeprefix("topology.") or None
        raise ConfigError(e.detail, file=file, field=field) from None
