"""Collective algorithms as NCCL runs them, and their cost on a topology.

A collective expands into *steps*; a step is a set of transfers that run at the same time
(sharing links max-min fairly, :mod:`simulator.network.flows`) followed by a fixed latency.
The time of a collective is

    launch_s + sum over steps of ( fluid completion of the step's transfers + step.latency_s )

and the full-detail engine executes exactly these steps through
:class:`~simulator.network.flows.FlowNetwork`, so both agree.

Algorithms (``algorithm`` strings are ``"<algorithm>/<protocol>"``, e.g. ``"ring/Simple"``):

* ``ring`` (all-reduce, all-gather, reduce-scatter): reduce-scatter then all-gather, 2(n-1)
  steps of S/n per rank to the ring successor (n-1 steps for all-gather or reduce-scatter)
  (Patarasuk & Yuan 2009; NCCL). Ranks are ordered node by node as NCCL builds its rings.
  Across nodes NCCL runs one ring per NIC ("channel"), each carrying S/C; here each channel
  enters a node on one rail and leaves it on another, alternating node by node ("snake") so
  that every network hop stays on one rail, and every NIC carries one channel's traffic.
* ``tree`` (all-reduce across nodes): NCCL's double binary tree (Sanders et al. 2009; NCCL 2.4):
  in every node a chain to the channel's head GPU, across nodes two binary trees each reducing
  and broadcasting half the data. It is pipelined, so it is one step holding every hop's
  traffic, whose latency is the pipeline's depth.
* ``hierarchical`` (all-reduce, on request): intra-node reduce-scatter ring, inter-node ring
  all-reduce per rail on S/k, intra-node all-gather.
* ``direct`` (all-to-all): every pair exchanges S/n at once, LL or Simple by NCCL's p2p rule
  (:meth:`CollectiveModel._p2p_protocol`). ``chain`` (broadcast): NCCL's
  pipelined ring from the root, one step. ``p2p`` (send): one transfer.

A step's ``latency_s`` is the route's link latency (a ring's mean edge, a pipeline's sum of
hops), plus the protocol's per-step overhead, plus -- for steps that move data only over
NVLink/PCIe, where NCCL's own SMs do the stores -- the kernel's extra local memory work
(reading the receive buffer, reading the input for a reduction, writing the output) at
``copy_GBps``; the bytes per primitive are counted from NCCL's ring primitives. Over the
network the NIC's DMA overlaps that work, so it is not charged.

Protocols (NCCL's LL, LL128 and Simple) scale the bytes a step puts on the links by
1/bandwidth_fraction and add per-step overheads (``fabrics.yaml``). Within one NVLink domain
the protocol of each algorithm is the one NCCL's own tuner model rates fastest, elsewhere the
one the model prices fastest; a protocol adds its base latency beyond LL's, and an all-to-all
with Simple its p2p pipeline fill (:mod:`simulator.network.protocols`).
:meth:`CollectiveModel.algorithm` then picks the algorithm with the lowest predicted time for
one group. NVLS (NVLink SHARP) and CollNet (InfiniBand SHARP) all-reduces are in
:mod:`simulator.network.innetwork`; PAT is not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from simulator.errors import ConfigError
from simulator.network.algorithms import AlgorithmPhases, Phase, phase_at
from simulator.network.flows import FlowSet, fluid_completion, fluid_completion_arrays
from simulator.network.innetwork import IN_NETWORK, InNetworkPhases, in_network_constants
from simulator.network.p2p import (
    WARP_RATE_KEYS,
    P2pLayout,
    WarpRates,
    narrow_parts,
    warp_time,
)
from simulator.network.protocols import BUSBW, ProtocolCosts
from simulator.network.topology import Topology, load_fabrics

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send")
#: how a measurement timed a collective (:meth:`CollectiveModel.timed_s`; a collectives
#: suite's ``timing``, ``simulator collective --timing``)
TIMINGS = ("device", "events", "loop", "host_sync")
ALGORITHMS = {
    "all_reduce": ("ring", "tree", "hierarchical", *IN_NETWORK),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "all_to_all": ("direct",),
    "broadcast": ("chain",),
    "send": ("p2p",),
}
#: Algorithms the automatic choice considers (NCCL's defaults; NVLS and CollNet join them where
#: the fabric has them, :meth:`CollectiveModel.auto`).
AUTO = {**ALGORITHMS, "all_reduce": ("ring", "tree", *IN_NETWORK)}


@dataclass(frozen=True)
class Step:
    """Transfers ``(src_gpu, dst_gpu, nbytes)`` started together, then ``latency_s``.

    ``nbytes`` are bytes on the wire (the protocol's overhead included); ``latency_s`` is the
    step's fixed time (link latency, protocol overhead, local copies).
    """

    transfers: tuple[tuple[int, int, float], ...]
    latency_s: float


_NO_LINKS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class CollectiveCost:
    """Predicted time of one collective call (or of identical concurrent calls).

    The bytes each link carried (all groups, all steps) are two arrays, ``link_ids`` and
    ``link_vals`` (ids unique), so that summing them over a run's hundreds of thousands of
    flows is a vector operation; :attr:`link_bytes` is the same as a mapping.
    """

    time_s: float
    algorithm: str
    n_steps: int
    launch_s: float
    link_ids: np.ndarray = field(default_factory=lambda: _NO_LINKS, repr=False)
    link_vals: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    @classmethod
    def from_dense(cls, time_s, algorithm, n_steps, launch_s, dense: np.ndarray):
        """A cost whose per-link bytes are given as one value per link id."""
        nz = np.flatnonzero(dense)
        return cls(time_s, algorithm, n_steps, launch_s, nz, dense[nz])

    @property
    def link_bytes(self) -> Mapping[int, float]:
        """Bytes per link id, as a mapping (built on each call: prefer :meth:`add_to`)."""
        return dict(zip(self.link_ids.tolist(), self.link_vals.tolist(), strict=True))

    def add_to(self, out: np.ndarray, times: float = 1.0) -> None:
        """Add ``times`` x this cost's per-link bytes into ``out`` (indexed by link id)."""
        if len(self.link_ids):
            out[self.link_ids] += times * self.link_vals



@dataclass(frozen=True)
class _Proto:
    name: str
    fraction: float
    ring: tuple[float, float]  # (intra, net) seconds per step
    tree: tuple[float, float]
    base_s: float = 0.0  # fixed cost per call beyond LL's (NCCL's base latency difference)


class CollectiveModel(InNetworkPhases, AlgorithmPhases, ProtocolCosts):
    """Cost of collectives on a topology (see the module docstring)."""

    def __init__(self, topology: Topology, fabrics: Mapping[str, Any] | None = None):
        """``fabrics``: the constants of ``fabrics.yaml`` (default) or a variant of them (the
        calibration refits them: ``python -m simulator.calibrate network``)."""
        self.topology = topology
        if fabrics is None:
            fabrics = load_fabrics()
            self.capacity = topology.effective_capacity()
        else:
            self.capacity = topology.effective_capacity(
                {kind: float(v["efficiency"]) for kind, v in fabrics["links"].items()})
        fab = fabrics["nccl"]
        self._launch = float(fab["launch_us"]) * 1e-6
        a2a = fab.get("all_to_all", {})
        #: all-to-all's extra fixed cost per call and achieved fraction of the link rate
        self.a2a_launch_extra_s = float(a2a.get("launch_extra_us", 0.0)) * 1e-6
        self.a2a_bw_fraction = float(a2a.get("bandwidth_fraction", 1.0))
        #: p2p Simple's pipeline fill: bytes per peer whose time is not overlapped
        self.a2a_fill_bytes = float(a2a.get("simple_fill_bytes", 0.0))
        #: what a port direction's data costs the opposite direction of the same port, as a
        #: share of its bytes (:meth:`_port_load`; ``nccl.all_to_all.reverse_load``)
        self.a2a_reverse_load = float(a2a.get("reverse_load", 0.0))
        #: how the port's ceiling and NCCL's warps combine into an exchange's data time within
        #: one NVLink domain: (ports^p + warps^p)^(1/p) (:meth:`_a2a_phase`;
        #: ``nccl.all_to_all.port_softness``)
        self.a2a_softness = float(a2a.get("port_softness", 0.0))
        ring_fill = fab.get("ring_simple_fill", {})
        #: NCCL's ring / Simple pipeline fill within one NVLink domain: its channel count, the
        #: bytes of one chunk per channel and the share of the first chunk's step not overlapped
        #: (:meth:`~simulator.network.protocols.ProtocolCosts._ring_fill`)
        self.ring_fill = (int(ring_fill.get("channels", 1)), float(ring_fill.get("chunk_bytes", 0.0)),
                          float(ring_fill.get("fraction", 0.0)),
                          float(ring_fill.get("slice_us", 0.0)) * 1e-6)
        p2p = a2a.get("p2p")
        #: NCCL's p2p channels within one NVLink domain and a warp's copy rate, 16-byte and
        #: narrow (:mod:`simulator.network.p2p`; fabrics.yaml ``nccl.all_to_all.p2p``)
        self.p2p_layout = (P2pLayout(int(p2p["channels"]), int(p2p["channels_per_peer"]),
                                     int(p2p["chunk_bytes"])) if p2p else None)
        self.p2p_rates = (WarpRates(*(float(p2p[k]) for k in WARP_RATE_KEYS)) if p2p else None)
        ll = a2a.get("ll_max_bytes_per_peer", {})
        #: NCCL's p2p protocol rule: LL up to these bytes per peer, Simple above (never LL128)
        self.p2p_ll_max_bytes = (float(ll.get("nvlink", 0.0)), float(ll.get("net", 0.0)))
        #: what a host-synchronised measurement of one call adds to it (not paid in training)
        self.host_sync_overhead_s = float(fab.get("host_sync_overhead_us", 0.0)) * 1e-6
        #: the host's interval between calls of a Python loop issuing them back to back
        #: (what an event-timed measurement of a call shorter than it shows; not in training):
        #: the box's own (gpus.yaml ``host_events_call_s``)
        self.events_call_s = float(topology.gpu.host_events_call_s)
        #: an all-to-all's (gpus.yaml ``host_events_a2a_s``; the box's interval where unset)
        self.events_a2a_s = float(topology.gpu.host_events_a2a_s) or self.events_call_s
        #: what an all-to-all adds to it per peer of its group (gpus.yaml host_events_peer_s)
        self.events_peer_s = dict(topology.gpu.host_events_peer_s)
        #: what the event recorded after each call adds to it (gpus.yaml host_event_record_s)
        self.event_record_s = float(topology.gpu.host_event_record_s)
        self.copy_Bps = float(fab["copy_GBps"]) * 1e9
        #: a rank's store rate through NCCL's narrow packs (copies off a 16-byte boundary;
        #: :func:`simulator.network.alignment.narrow_time`)
        self.unaligned_Bps = float(fab.get("unaligned_copy_GBps", 0.0)) * 1e9
        self.tree_fraction = float(fab["tree_bandwidth_fraction"])
        #: NVLS / SHARP constants (fabrics.yaml ``in_network``)
        self.in_network = in_network_constants(fabrics)
        #: NCCL's own tuning model, used to choose the protocol as NCCL does (:meth:`_nccl_time`)
        self.tuner = fab.get("tuner")
        base = {n: 0.0 for n in fab["protocols"]}
        if self.tuner:
            base.update({n: float(v) for n, v in self.tuner["base_latency_us"].items()})
        self.protocols = tuple(
            _Proto(
                name,
                float(p["bandwidth_fraction"]),
                (p["ring_step_us"]["intra"] * 1e-6, p["ring_step_us"]["net"] * 1e-6),
                (p["tree_hop_us"]["intra"] * 1e-6, p["tree_hop_us"]["net"] * 1e-6),
                (base[name] - min(base.values())) * 1e-6,
            )
            for name, p in fab["protocols"].items()
        )
        self._cost_cache: dict[tuple, CollectiveCost] = {}
        self._steps_cache: dict[tuple, list[Step]] = {}
        self._bundle_cache: dict[tuple, list[Step]] = {}
        self._template_cache: dict[tuple, tuple] = {}
        self._faulty = bool(np.any(topology.capacity != topology._nominal))
        self._plan_cache: dict[tuple, tuple[str, _Proto, list[tuple[Phase, float]]]] = {}
        self._rings: dict[tuple[int, ...], list[list[int]]] = {}
        self._places: np.ndarray | None = None  # tray_places as an array (group shapes)

    # ------------------------------------------------------------------ public API

    def events_interval_s(self, op: str, n: int, splits: str = "uniform") -> float:
        """The host's interval between back-to-back calls of ``op`` over groups of ``n`` in an
        event-timed Python loop (what such a measurement shows of a shorter call; never paid
        in training): the box's interval, for an all-to-all the box's all-to-all interval
        with its extra per peer added (with split lists where ``splits`` is not
        ``uniform``)."""
        if op != "all_to_all":
            return self.events_call_s
        kind = "all_to_all" if splits == "uniform" else "all_to_all_splits"
        return self.events_a2a_s + self.events_peer_s.get(kind, 0.0) * max(n - 1, 0)

    def loop_interval_s(self, op: str, n: int, splits: str = "uniform") -> float:
        """The host's interval a call of a loop issuing ``op`` back to back between one pair of
        CUDA events (nccl-tests' method in a PyTorch loop: the interval over the calls): the event-timed interval
        (:meth:`events_interval_s`) less the event record after each call (gpus.yaml
        ``host_event_record_s``)."""
        return max(self.events_interval_s(op, n, splits) - self.event_record_s, 0.0)

    def timed_s(self, device_s: float, op: str, n: int, timing: str,
                splits: str = "uniform") -> float:
        """What a measurement timed by ``timing`` (:data:`TIMINGS`) shows of a call of ``op``
        over groups of ``n`` whose device time is ``device_s``: ``device`` itself; ``events``
        (a CUDA event after each call of a Python loop) the longer of it and
        :meth:`events_interval_s`; ``loop`` (calls back to back between one pair of events,
        the interval over the calls: nccl-tests' method in a PyTorch loop) the longer of it and
        :meth:`loop_interval_s`; ``host_sync`` (a barrier and a synchronisation around each
        call) it plus the host's overhead of them."""
        if timing == "device":
            return device_s
        if timing == "events":
            return max(device_s, self.events_interval_s(op, n, splits))
        if timing == "loop":
            return max(device_s, self.loop_interval_s(op, n, splits))
        if timing == "host_sync":
            return device_s + self.host_sync_overhead_s
        raise ValueError(f"unknown timing {timing!r} (accepted: {', '.join(TIMINGS)})")

    def algorithm(self, op: str, group: Sequence[int], nbytes: float) -> str:
        """The ``"algorithm/protocol"`` NCCL would pick: the lowest predicted time."""
        return self._plan(op, tuple(group), nbytes, None)[0]

    def launch_s(self, op: str, group: Sequence[int]) -> float:
        """Fixed cost of one collective call (host + kernel launch), 0 for a 1-GPU group."""
        self._check(op, group)
        return self._launch_of(op) if len(group) > 1 else 0.0

    def _launch_of(self, op: str) -> float:
        return self._launch + (self.a2a_launch_extra_s if op == "all_to_all" else 0.0)

    def steps(
        self, op: str, group: Sequence[int], nbytes: float, algorithm: str | None = None
    ) -> list[Step]:
        """The steps of one collective, transfers in bytes on the wire (protocol included).

        Identical consecutive steps (a ring's) are one shared :class:`Step` object. Cached.
        """
        key = (op, tuple(group), float(nbytes), algorithm)
        out = self._steps_cache.get(key)
        if out is None:
            _, proto, phases = self._plan(*key)
            out = []
            for ph, _ in phases:
                w = self._wire(ph, proto)
                st = Step(tuple((s, d, b * w) for s, d, b in ph.transfers), self._lat(ph, proto))
                out.extend([st] * ph.repeat)
            self._steps_cache[key] = out
        return list(out)

    def cost(
        self,
        op: str,
        groups: Sequence[Sequence[int]],
        nbytes: float,
        algorithm: str | None = None,
    ) -> CollectiveCost:
        """Time of identical collectives running at once on ``groups`` (their transfers share
        links); the time is the slowest group's. Cached."""
        key = (op, tuple(tuple(g) for g in groups), float(nbytes), algorithm)
        hit = self._cost_cache.get(key)
        if hit is None:
            hit = self._cost(*key)
            if (
                algorithm is None
                and op != "all_to_all"  # NCCL's p2p protocol depends on the size alone
                and hit.algorithm.endswith("/LL")
                and sum(len(g) > 1 for g in key[1]) > 1
                and not (self.tuner and all(self._one_domain(g) for g in key[1] if len(g) > 1))
            ):
                # Each group's plan was chosen as if it ran alone; where concurrent groups
                # share links, another algorithm/protocol can be faster for all of them: LL
                # (picked alone for its latency) doubles the wire bytes, which loses once a
                # NIC is shared. NCCL's tuner sees the contended bandwidth, so take the best
                # of the joint choices. (Within NVLink domains the tuner's own choice stands:
                # :meth:`_plan_one`.)
                for alg in AUTO[op]:
                    for proto in self._protocols_of(alg):
                        try:
                            alt = self._cost(key[0], key[1], key[2], f"{alg}/{proto.name}")
                        except ConfigError:
                            continue
                        if alt.time_s < hit.time_s:
                            hit = alt
            self._cost_cache[key] = hit
        return hit

    def bundles(
        self,
        op: str,
        groups: Sequence[Sequence[int]],
        nbytes: float,
        algorithm: str | None = None,
    ) -> list[Step]:
        """The collectives on ``groups`` as few flow sets as possible, for a dynamic network.

        Consecutive identical steps (a ring's 2(n-1)) merge into one :class:`Step` whose flows
        carry all their bytes and whose latency is the steps' sum: in a fluid network flows
        that start together finish in time proportional to their bytes, so run alone the
        bundles take exactly ``cost(op, groups, nbytes).time_s - launch_s``. Run beside other
        traffic they share links with it. Cached.
        """
        if algorithm is None and sum(len(g) > 1 for g in groups) > 1:
            # Use the joint choice cost() made for these concurrent groups.
            chosen = self.cost(op, groups, nbytes).algorithm
            if "," not in chosen and chosen != "none":
                algorithm = chosen
        key = (op, tuple(tuple(g) for g in groups), float(nbytes), algorithm)
        hit = self._bundle_cache.get(key)
        if hit is not None:
            return hit
        classes = self._classes(op, key[1], float(nbytes), algorithm)
        if classes is not None:
            out = []
            for k, live in self._segments(classes):
                src, dst, nb = self._flows(live)
                out.append(Step(FlowSet(src, dst, nb * k), k * max(c[2] for c, _ in live)))
            self._bundle_cache[key] = out
            return out
        plans = [self._plan(op, tuple(g), nbytes, algorithm) for g in key[1] if len(g) > 1]
        plans = [p for p in plans if p[2]]
        out: list[Step] = []
        if plans:
            seqs = [
                [(ph, self._wire(ph, pr), self._lat(ph, pr), f) for ph, f in ps]
                for _, pr, ps in plans
            ]
            bounds = sorted({0} | {c for s in seqs for c in np.cumsum([p[0].repeat for p in s])})
            for a, b in zip(bounds[:-1], bounds[1:], strict=False):
                live = [x for x in (phase_at(s, a) for s in seqs) if x is not None]
                k = b - a
                transfers = tuple(
                    (src, dst, nb * w * k) for ph, w, _, _ in live for src, dst, nb in ph.transfers
                )
                out.append(Step(transfers, k * max(lt for _, _, lt, _ in live)))
        self._bundle_cache[key] = out
        return out

    def all_to_all_v(
        self, groups: Sequence[Sequence[int]], nbytes: float, split: Sequence,
        nccl: bool = True, narrow=None,
    ) -> CollectiveCost:
        """Uneven all-to-alls (``all_to_all_single`` with split sizes) running at once on
        ``groups``: every rank sends ``nbytes * split[j]`` to the ``j``-th rank of its group
        (``split`` sums to 1; uniform ``1/n`` is :meth:`cost` of ``all_to_all``), or, with
        ``split`` a matrix, group rank ``i`` sends ``nbytes * split[i][j]`` to rank ``j``. One
        direct step (with PXN, :meth:`_pxn`), at NCCL's p2p protocol for its largest pair,
        priced by :meth:`_a2a_phase` (``nccl``: NCCL's p2p kernels move it, so its warps
        bound it within one NVLink domain; False for another kernel, DeepEP's; ``narrow``: per
        (s, j) whether the part is off 16 bytes in the send / receive buffer,
        :func:`simulator.network.p2p.narrow_parts`). Cached."""
        n = len(split)
        rows = [tuple(r) for r in split] if isinstance(split[0], Sequence) else [tuple(split)] * n
        flags = None if narrow is None else tuple(tuple(r) for r in narrow)
        key = ("all_to_all_v", tuple(tuple(g) for g in groups), float(nbytes), tuple(rows),
               nccl, flags)
        hit = self._cost_cache.get(key)
        if hit is not None:
            return hit
        planned = self._a2a_v_plan(key[1], nbytes, rows, nccl, flags)
        if planned is None:
            return CollectiveCost(0.0, "none", 0, 0.0)
        ph, fluid, best = planned
        w = self._wire(ph, best)
        flows = [(self.topology.route(s, d), nb * w) for s, d, nb in ph.transfers]
        lens = [len(r) for r, _ in flows]
        ln = np.fromiter((x for r, _ in flows for x in r), dtype=np.int64, count=sum(lens))
        dense = np.bincount(ln, np.repeat([nb for _, nb in flows], lens), self.topology.n_links)
        hit = CollectiveCost.from_dense(
            self._launch_of("all_to_all") + fluid * w + self._lat(ph, best),
            f"direct/{best.name}", 1, self._launch_of("all_to_all"), dense,
        )
        self._cost_cache[key] = hit
        return hit

    def all_to_all_table(
        self, groups: Sequence[Sequence[int]], table: Sequence[Sequence[float]],
        laid_out: bool = True,
    ) -> CollectiveCost:
        """NCCL's ``all_to_all_single`` with split sizes on ``groups`` at once: group rank ``s``
        sends ``table[s][j]`` bytes to rank ``j`` (:meth:`all_to_all_v`). ``laid_out``: the
        parts sit in rank order in both buffers, so a part whose offset is off 16 bytes runs
        NCCL's narrow copies (the measuring scripts' buffers); False for a caller whose parts
        are whole tokens."""
        nbytes = max(sum(row) for row in table)
        if nbytes <= 0:
            return CollectiveCost(0.0, "none", 0, 0.0)
        share = [[b / nbytes for b in row] for row in table]
        return self.all_to_all_v(groups, float(nbytes), share,
                                 narrow=narrow_parts(table) if laid_out else None)

    def _a2a_v_plan(self, groups, nbytes: float, rows, nccl: bool = True, narrow=None):
        """The one direct phase of :meth:`all_to_all_v` (PXN applied), its fluid time and
        the protocol NCCL's tuner would pick; None when nothing moves."""
        n = len(rows)
        tr = []
        for g in groups:
            if len(g) != n:
                raise ValueError(f"split has {n} entries for a group of {len(g)}")
            tr += [(a, b, nbytes * rows[i][j]) for i, a in enumerate(g) for j, b in enumerate(g)
                   if a != b and rows[i][j]]  # fmt: skip
        if not any(len(g) > 1 for g in groups) or not tr:
            return None
        table = [[nbytes * x for x in r] for r in rows]
        ph = self._a2a_phase(self._pxn(tuple(tr)), groups, table, nccl, narrow)
        fluid = self._fluid(ph)
        peer = max(nbytes * rows[i][j] for i in range(n) for j in range(n) if i != j)
        proto = self._p2p_protocol(groups[0], peer)
        fill = self._p2p_fill(ph, fluid, proto)
        return (replace(ph, path_s=ph.path_s + fill) if fill else ph), fluid, proto

    def _port_load(self, table) -> float:
        """The busiest port direction's load against its larger side: a rank's port carries
        what it receives plus ``reverse_load`` x what it sends (and the other direction the
        converse), so max_r max(in + a x out, out + a x in) / max_r max(in, out) over the
        group ranks of ``table`` (own parts left out): 1 + a for any exchange whose busiest
        port is loaded the same both ways (uniform), down to 1 for one loaded one way."""
        a = self.a2a_reverse_load
        n = len(table)
        ins = [sum(table[i][j] for i in range(n) if i != j) for j in range(n)]
        outs = [sum(table[i][j] for j in range(n) if j != i) for i in range(n)]
        plain = max(max(ins), max(outs))
        if plain <= 0:
            return 1.0
        return max(max(x + a * y, y + a * x) for x, y in zip(ins, outs, strict=True)) / plain

    def _warps_apply(self, groups) -> bool:
        """Whether NCCL's p2p layout and warp rates (``nccl.all_to_all.p2p``, measured on
        NVLink 4: H100) price these groups: every group within one NVLink domain of an
        NVLink-4 GPU."""
        gen = getattr(self.topology.gpu, "nvlink_generation", None)
        return (self.p2p_layout is not None and self.a2a_softness > 0 and gen == 4
                and all(self._one_domain(g) for g in groups if len(g) > 1))

    def _a2a_phase(self, tr, groups, table, nccl: bool = True, narrow=None) -> Phase:
        """The direct phase of an all-to-all whose group rank ``s`` sends ``table[s][j]``
        bytes to ``j`` in every one of ``groups`` (transfers ``tr``). Within one NVLink
        domain (docs/DESIGN_NOTES.md, "All-to-all: the port's ceiling and the warps"):

        * **the port**: NCCL's senders store into the receivers' FIFOs over NVLink, the
          receivers copy out while the next chunks land, so the busiest port direction moves
          its load (:meth:`_port_load`) at ``bandwidth_fraction`` of the link's rate, its
          ceiling one way, and no copy-out is added after the wire;
        * **the warps**: NCCL's channels move the exchange's pieces of work at their warps'
          rates (:func:`simulator.network.p2p.warp_time`, the slowest channel), where its
          protocol is Simple and its GPUs NVLink 4 (:meth:`_warps_apply`);
        * the two combine as (ports^p + warps^p)^(1/p), ``p`` = ``port_softness``: a port fed by
          few pieces, or pieces that nearly fill it, runs below both bounds (a pair's 16
          blocks of 19 warps, each sending and receiving, reach 262-275 GB/s two ways where
          the port alone would carry 355 and the warps 375, ``data/measured/a2a-pair-h100x4``).

        The combined time rides on the phase's ``bw_fraction`` so that every pricing of the
        plan (cost, steps, the engine's flows) carries it. Across the network: the links
        alone, as NCCL's proxy and the NIC move the bytes."""
        ph = self._direct_phase(tr, 0.0, self.a2a_bw_fraction / self._port_load(table))
        if ph.net_hops or not nccl or not self._warps_apply(groups):
            return ph
        n = len(table)
        peer = max(table[i][j] for i in range(n) for j in range(n) if i != j)
        if self._p2p_protocol(groups[0], peer).name != "Simple":
            return ph
        tw = warp_time(table, self.p2p_layout, self.p2p_rates, narrow)
        tc = self._fluid(ph) / ph.bw_fraction
        if tw <= 0 or tc <= 0:
            return ph
        p = self.a2a_softness
        return replace(ph, bw_fraction=ph.bw_fraction * tc / (tc ** p + tw ** p) ** (1 / p))

    def _p2p_protocol(self, group: Sequence[int], peer_bytes: float) -> _Proto:
        """The protocol NCCL 2.28 runs a send/receive pair with (``enqueue.cc``
        ``addP2pToPlan``): LL where the bytes to one peer are at most NCCL_P2P_LL_THRESHOLD
        (16 KiB) x the communicator's p2p channels per peer, else Simple; p2p never uses LL128
        (``fabrics.yaml`` ``nccl.all_to_all.ll_max_bytes_per_peer``: within one NVLink domain,
        and for a group that crosses the network)."""
        topo = self.topology
        one = topo.intra != "pcie" and len({topo.node_of(g) for g in group}) == 1
        name = "LL" if peer_bytes <= self.p2p_ll_max_bytes[0 if one else 1] else "Simple"
        return next(p for p in self.protocols if p.name == name)

    def all_to_all_v_steps(
        self, groups: Sequence[Sequence[int]], nbytes: float, split: Sequence, nccl: bool = True,
    ) -> list[Step]:
        """:meth:`all_to_all_v` as flow sets for a dynamic network: its one step, transfers
        in bytes on the wire, then its latency (run alone it takes the cost's time less the
        launch)."""
        n = len(split)
        rows = [tuple(r) for r in split] if isinstance(split[0], Sequence) else [tuple(split)] * n
        planned = self._a2a_v_plan(tuple(tuple(g) for g in groups), nbytes, rows, nccl)
        if planned is None:
            return []
        ph, _, best = planned
        w = self._wire(ph, best)
        return [Step(tuple((s, d, b * w) for s, d, b in ph.transfers), self._lat(ph, best))]

    def p2p_cost(self, pairs: Sequence[tuple[int, int]], nbytes: float) -> CollectiveCost:
        """Concurrent sends of ``nbytes`` each, from ``src`` to ``dst`` of every pair."""
        return self.cost("send", [tuple(p) for p in pairs], nbytes)

    # ------------------------------------------------------------------ costing

    def _cost(self, op, groups, nbytes, algorithm) -> CollectiveCost:
        classes = self._classes(op, groups, float(nbytes), algorithm)
        if classes is not None:
            return self._cost_classes(op, classes)
        plans = [self._plan(op, g, nbytes, algorithm) for g in groups if len(g) > 1]
        plans = [p for p in plans if p[2]]
        if not plans:
            return CollectiveCost(0.0, "none", 0, 0.0)
        # Walk all groups' step sequences together; cut where any group changes phase.
        seqs = [
            [(ph, self._wire(ph, pr), self._lat(ph, pr), f) for ph, f in ps] for _, pr, ps in plans
        ]
        bounds = sorted({0} | {c for s in seqs for c in np.cumsum([p[0].repeat for p in s])})
        total, n_steps = 0.0, bounds[-1]
        link_bytes = np.zeros(self.topology.n_links)
        memo: dict[tuple, tuple[float, np.ndarray]] = {}
        for a, b in zip(bounds[:-1], bounds[1:], strict=False):
            active = tuple(phase_at(s, a) for s in seqs)
            ids = tuple(None if x is None else id(x[0]) for x in active)
            if ids not in memo:
                flows, lat = [], 0.0
                live = [x for x in active if x is not None]
                for ph, w, lt, _ in live:
                    lat = max(lat, lt)
                    flows += [(self.topology.route(s, d), nb * w) for s, d, nb in ph.transfers]
                if len(live) == 1:  # one group alone: its fluid time is known from planning
                    fmax = live[0][3] * live[0][1]
                else:
                    fmax = float(fluid_completion(flows, self.capacity).max()) if flows else 0.0
                lens = [len(r) for r, _ in flows]
                ln = np.fromiter((x for r, _ in flows for x in r), dtype=np.int64, count=sum(lens))
                wt = np.repeat([nb for _, nb in flows], lens)
                memo[ids] = (fmax + lat, np.bincount(ln, wt, self.topology.n_links))
            dt, lb = memo[ids]
            total += (b - a) * dt
            link_bytes += (b - a) * lb
        names = sorted({p[0] for p in plans})
        return CollectiveCost.from_dense(
            self._launch_of(op) + total, ",".join(names), int(n_steps), self._launch_of(op),
            link_bytes,
        )

    # ---- many concurrent groups: one plan per group shape, flows as arrays

    #: Fewest concurrent groups priced by shape (:meth:`_classes`); fewer go group by group.
    MANY_GROUPS = 8

    def _classes(self, op, groups, nbytes, algorithm):
        """The groups (of more than one GPU) by shape (:meth:`_signature`): per shape, the
        plan of its first group, that plan's phases with their transfers as positions in
        the group, and the members of every group of the shape as a matrix (a row per
        group, in the given order). None where shapes cannot be shared (faults, a plan
        relaying through a GPU outside its group, few groups): priced group by group."""
        live = [g for g in groups if len(g) > 1]
        if self._faulty or len(live) < self.MANY_GROUPS or nbytes <= 0:
            return None
        by_size: dict[int, list[int]] = {}
        for i, g in enumerate(live):
            by_size.setdefault(len(g), []).append(i)
        out = []
        for idx in by_size.values():
            mat = np.array([live[i] for i in idx], dtype=np.int64)
            shape_of: dict[bytes, int] = {}  # signature -> shape number, in order of first use
            inv = np.array([shape_of.setdefault(r.tobytes(), len(shape_of))
                            for r in self._signature_rows(mat)])  # fmt: skip
            for c in range(len(shape_of)):
                rows = mat[inv == c]
                name, proto, phases = self._plan(op, tuple(rows[0].tolist()), nbytes, algorithm)
                if not phases:
                    continue
                pos = {g: i for i, g in enumerate(rows[0].tolist())}
                rel = []
                for ph, f in phases:
                    try:
                        a = np.array([pos[x] for x, _, _ in ph.transfers], dtype=np.int64)
                        b = np.array([pos[x] for _, x, _ in ph.transfers], dtype=np.int64)
                    except KeyError:  # relayed through a GPU outside the group (PXN)
                        return None
                    nb = np.array([x for _, _, x in ph.transfers], dtype=float)
                    rel.append((ph, self._wire(ph, proto), self._lat(ph, proto), f, a, b, nb))
                out.append((name, rows, rel))
        return out

    def _signature_rows(self, mat: np.ndarray) -> np.ndarray:
        """:meth:`_signature` of every row of ``mat`` (groups of one size), as array rows."""
        topo = self.topology
        places = self._places
        if places is None:
            places = self._places = np.array(topo.tray_places, dtype=np.int64).reshape(-1, 4)
        node = mat // topo.gpus_per_node
        pl = places[mat // topo.tray_gpus]
        cols = [node - node[:, :1], mat % topo.gpus_per_node, pl[..., 0] - pl[:, :1, 0],
                pl[..., 2], pl[..., 1] - pl[:, :1, 1], pl[..., 3]]  # fmt: skip
        return np.stack(cols, axis=2).reshape(len(mat), -1)

    @staticmethod
    def _segments(classes):
        """Walk every shape's phases together, cut where any changes phase: [(steps in the
        segment, [(phase entry, group matrix) of each shape still running])]."""
        seqs = [rel for _, _, rel in classes]
        bounds = sorted({0} | {int(c) for r in seqs for c in np.cumsum([e[0].repeat for e in r])})
        out = []
        for a, b in zip(bounds[:-1], bounds[1:], strict=False):
            live = []
            for (_, rows, _), seq in zip(classes, seqs, strict=True):
                e = phase_at(seq, a)
                if e is not None:
                    live.append((e, rows))
            out.append((b - a, live))
        return out

    @staticmethod
    def _flows(live) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sources, destinations, wire bytes) of the running phases of every group, group
        after group within each shape."""
        src, dst, nb = [], [], []
        for (_, w, _, _, a, b, n), rows in live:
            src.append(rows[:, a].reshape(-1))
            dst.append(rows[:, b].reshape(-1))
            nb.append(np.tile(n * w, len(rows)))
        return np.concatenate(src), np.concatenate(dst), np.concatenate(nb)

    def _cost_classes(self, op, classes) -> CollectiveCost:
        """:meth:`_cost` of groups by shape (:meth:`_classes`), every flow routed at once."""
        if not classes:
            return CollectiveCost(0.0, "none", 0, 0.0)
        topo = self.topology
        total, n_steps = 0.0, 0
        link_bytes = np.zeros(topo.n_links)
        memo: dict[tuple, tuple[float, np.ndarray]] = {}
        for k, live in self._segments(classes):
            n_steps += k
            ids = tuple(id(e[0]) for e, _ in live)
            if ids not in memo:
                src, dst, nb = self._flows(live)
                links, lens = topo.route_arrays(src, dst)
                lat = max(e[2] for e, _ in live)
                if sum(len(rows) for _, rows in live) == 1:  # one group: known from planning
                    fmax = live[0][0][3] * live[0][0][1]
                else:
                    fmax = float(fluid_completion_arrays(links, lens, nb, self.capacity).max())
                memo[ids] = (fmax + lat, np.bincount(links, np.repeat(nb, lens), topo.n_links))
            dt, lb = memo[ids]
            total += k * dt
            link_bytes += k * lb
        names = sorted({name for name, _, _ in classes})
        return CollectiveCost.from_dense(
            self._launch_of(op) + total, ",".join(names), int(n_steps), self._launch_of(op),
            link_bytes,
        )

    def _wire(self, ph: Phase, proto: _Proto) -> float:
        return 1.0 / (proto.fraction * ph.bw_fraction)

    def _lat(self, ph: Phase, proto: _Proto) -> float:
        if ph.family == "offload":  # NVLS / SHARP: the algorithm's own fixed latency
            return ph.path_s
        intra, net = proto.tree if ph.family == "tree" else proto.ring
        return (
            ph.path_s + ph.intra_hops * intra + ph.net_hops * net + ph.local_bytes / self.copy_Bps
        )

    def _signature(self, group: Sequence[int]) -> tuple | None:
        """A group's shape up to the fabric's symmetry: for each member, its node (NVLink
        domain) relative to the first member's, its place in the node, its leaf group and pod
        relative to the first member's, and their sizes. Groups of one signature have the same
        plan, GPUs relabelled, and the same time alone. None when faults break the symmetry."""
        topo = self.topology
        if self._faulty:
            return None
        gpn, T = topo.gpus_per_node, topo.tray_gpus
        places = topo.tray_places
        n0 = group[0] // gpn
        l0, p0 = places[group[0] // T][:2]
        return tuple(
            (g // gpn - n0, g % gpn, lg - l0, lsize, pod - p0, psize)
            for g in group
            for lg, pod, lsize, psize in (places[g // T],)
        )

    def _plan(self, op, group, nbytes, algorithm):
        """(algorithm/protocol, protocol, [(phase, fluid time of its data bytes)]).

        Planned once per group signature (see :meth:`_signature`) and relabelled for the other
        groups of that shape, so pricing thousands of identical concurrent groups costs one plan.
        """
        key = (op, group, float(nbytes), algorithm)
        hit = self._plan_cache.get(key)
        if hit is not None:
            return hit
        sig = self._signature(group) if len(group) > 1 else None
        tkey = (op, sig, float(nbytes), algorithm)
        tmpl = self._template_cache.get(tkey) if sig is not None else None
        if tmpl is not None:
            name, proto, rel = tmpl
            out = (
                name,
                proto,
                [
                    (replace(ph, transfers=tuple((group[a], group[b], nb) for a, b, nb in tr)), f)
                    for ph, tr, f in rel
                ],
            )
            self._plan_cache[key] = out
            return out
        out = self._plan_one(op, group, nbytes, algorithm)
        if sig is not None:
            pos = {g: i for i, g in enumerate(group)}
            if all(s in pos and d in pos for ph, _ in out[2] for s, d, _ in ph.transfers):
                rel = [
                    (ph, tuple((pos[s], pos[d], nb) for s, d, nb in ph.transfers), f)
                    for ph, f in out[2]
                ]
                self._template_cache[tkey] = (out[0], out[1], rel)
        self._plan_cache[key] = out
        return out

    def _plan_one(self, op, group, nbytes, algorithm):
        """Plan one group from scratch (see :meth:`_plan`)."""
        self._check(op, group)
        algs, protos = AUTO[op], self.protocols
        if algorithm is not None:
            name, _, pname = algorithm.partition("/")
            if name not in ALGORITHMS[op]:
                raise ConfigError(
                    f"{op} has no algorithm {name!r} (accepted: {', '.join(ALGORITHMS[op])})",
                    field="algorithm",
                )
            algs = (name,)
            if pname:
                protos = tuple(p for p in self._protocols_of(name) if p.name == pname)
                if not protos:
                    raise ConfigError(
                        f"unknown protocol {pname!r} (accepted: "
                        f"{', '.join(p.name for p in self.protocols)})",
                        field="algorithm",
                    )
        best = None
        if len(group) < 2 or nbytes <= 0:
            best = (f"{algs[0]}/{protos[0].name}", protos[0], [])
        else:
            for alg in algs:
                phases = self._phases(alg, op, list(group), float(nbytes))
                if phases is None:
                    continue
                timed = [(ph, self._fluid(ph)) for ph in phases]
                cands = self._protocols_of(alg, protos)
                if alg == "direct" and len(cands) > 1:  # NCCL's p2p rule, not a time race
                    cands = (self._p2p_protocol(group, nbytes / len(group)),)
                elif len(cands) > 1 and self.tuner and self._one_domain(group):
                    # NCCL's tuner picks the protocol (checked against its log on one NVLink
                    # domain only; across nodes the fastest protocol is taken, as before)
                    cands = (min(cands, key=lambda p: self._nccl_time(alg, op, group, nbytes,
                                                                       p, timed)),)
                for pr in cands:
                    fixed = self._fixed(alg, pr, timed)
                    t = sum(
                        ph.repeat * (f * self._wire(ph, pr) + self._lat(ph, pr) + x)
                        for (ph, f), x in zip(timed, fixed, strict=True)
                    )
                    if best is None or t < best[0]:
                        best = (t, f"{alg}/{pr.name}", pr, timed, fixed)
            if best is None:
                raise ConfigError(
                    f"algorithm {algorithm!r} does not apply to this group", field="algorithm"
                )
            _, name, pr, timed, fixed = best
            # the protocol's fixed costs ride on the steps' path latency, so that every pricing
            # of the plan (cost, steps, bundles) and the engine's flow-level run include them
            best = (name, pr, [(replace(ph, path_s=ph.path_s + x) if x else ph, f)
                               for (ph, f), x in zip(timed, fixed, strict=True)])
        return best

    def _protocols_of(self, alg: str, protos=None) -> tuple[_Proto, ...]:
        """The protocols ``alg`` runs with: NVLS and CollNet only with Simple (NCCL)."""
        protos = self.protocols if protos is None else protos
        return tuple(p for p in protos if alg not in IN_NETWORK or p.name == "Simple")

    def _fluid(self, ph: Phase) -> float:
        flows = [(self.topology.route(s, d), b) for s, d, b in ph.transfers]
        return float(fluid_completion(flows, self.capacity).max()) if flows else 0.0

    def _check(self, op: str, group: Sequence[int]) -> None:
        if op not in OPS:
            raise ConfigError(f"unknown collective {op!r} (accepted: {', '.join(OPS)})", field="op")
        if len(set(group)) != len(group):
            raise ValueError(f"{op}: group lists a GPU twice: {list(group)}")
        if op == "send" and len(group) != 2:
            raise ValueError(f"send needs a (src, dst) pair, got {list(group)}")

    # ------------------------------------------------------------------ algorithms

def collective_summary(topology: Topology, op: str, nbytes: float, gpus: int | None = None,
                       timing: str = "device") -> dict:
    """One collective on GPUs 0..gpus-1 (default all), with nccl-tests' figures.

    ``send`` runs nccl-tests' sendrecv pattern: every GPU sends ``nbytes`` to the next one
    (in a ring) at once. Returns ``time_s``, ``algbw_GBps`` (bytes / time), ``busbw_GBps``
    (algbw x the nccl-tests factor), ``algorithm``, ``n_steps``, ``launch_s`` and ``gpus``;
    with a ``timing`` other than ``device`` (:data:`TIMINGS`) also ``timing`` and
    ``timed_s``, what a measurement timed so shows of the call
    (:meth:`CollectiveModel.timed_s`: a Python loop's host interval where it is longer).
    """
    n = int(gpus or topology.n_gpus)
    model = CollectiveModel(topology)
    group = list(range(n))
    if op == "send":
        c = model.p2p_cost([(g, group[(i + 1) % n]) for i, g in enumerate(group)], nbytes)
    else:
        c = model.cost(op, [group], nbytes)
    algbw = nbytes / c.time_s / 1e9 if c.time_s > 0 else math.inf
    out = {
        "time_s": float(c.time_s),
        "algbw_GBps": float(algbw),
        "busbw_GBps": float(algbw * BUSBW[op](n)),
        "algorithm": c.algorithm,
        "n_steps": c.n_steps,
        "launch_s": float(c.launch_s),
        "gpus": n,
    }
    if timing != "device":
        out["timing"] = timing
        out["timed_s"] = float(model.timed_s(float(c.time_s), op, n, timing))
    return out
