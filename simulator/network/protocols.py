"""How NCCL's protocols are chosen and what they add beyond the steps' transfers (mixed into
:class:`~simulator.network.collectives.CollectiveModel`, which provides ``topology``,
``tuner``, ``a2a_fill_bytes`` and the protocols).

* **Choice.** Within one NVLink domain NCCL runs the protocol its own tuning model rates
  fastest (``src/graph/tuning.cc``; constants in ``fabrics.yaml`` ``nccl.tuner``), which is not
  always the fastest: between two H100s it never picks LL128
  (``data/measured/h100x2-nccl-device/tuning-choices.jsonl``). :meth:`ProtocolCosts._nccl_time`
  is that estimate.
* **Base latency.** A protocol's fixed cost beyond LL's (NCCL's ``baseLat``: Simple +1.8 us,
  LL128 +7.4 us on a ring), spread over the call's steps (:meth:`ProtocolCosts._fixed`).
* **p2p fill.** An all-to-all with Simple pays its pipeline's start, a few chunks per channel at
  the busiest rank's rate (:meth:`ProtocolCosts._p2p_fill`).
* **Ring / Simple.** A ring call with Simple inside one NVLink domain pays its first chunk's
  unoverlapped share and a handshake per slice (:meth:`ProtocolCosts._ring_fill`).
"""

from __future__ import annotations

import math

from simulator.network.algorithms import Phase

#: nccl-tests bus-bandwidth factors (nccl-tests doc/PERFORMANCE.md), per rank count
BUSBW = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send": lambda n: 1.0,
}


class ProtocolCosts:
    """The protocol's choice and extra costs (see the module docstring)."""

    def _one_domain(self, group) -> bool:
        """Whether ``group`` lies in one NVLink domain (no step crosses the network)."""
        topo = self.topology
        return topo.intra != "pcie" and len({topo.node_of(g) for g in group}) == 1

    def _nccl_time(self, alg: str, op: str, group, nbytes: float, pr, timed) -> float:
        """NCCL's own estimate of a call within one NVLink domain with protocol ``pr``
        (``src/graph/tuning.cc``: ``baseLat + steps x hwLat + bytes / busBw`` per protocol,
        ``fabrics.yaml`` ``nccl.tuner``), with Simple's bus bandwidth the model's fluid rate
        for these steps, LL128's 0.92 of it, LL's half of it capped at NCCL's ``llMaxBw`` for
        one node (by NVLink generation). Only the order of the protocols is used: NCCL runs the
        one its model says is fastest, which is not always the fastest (between two H100s it
        never picks LL128, data/measured/h100x2-nccl-device/tuning-choices.jsonl)."""
        tu = self.tuner
        steps = sum(ph.repeat for ph, _ in timed)
        lat = float(tu["base_latency_us"][pr.name]) + steps * float(
            tu["hop_latency_us"][pr.name])
        data = sum(ph.repeat * f / ph.bw_fraction for ph, f in timed) * 1e6  # Simple, us
        data /= float(tu["bandwidth_factor"][pr.name])
        if pr.name == "LL":
            gen = str(getattr(self.topology.gpu, "nvlink_generation", None) or 4)
            cap = float(tu["ll_max_GBps"].get(gen, tu["ll_max_GBps"]["4"]))
            data = max(data, nbytes * BUSBW[op](len(group)) / (cap * 1e3))
        return lat + data

    def _fixed(self, alg: str, pr, timed) -> list[float]:
        """Per phase, the latency per step the protocol adds beyond :meth:`_lat`: its base
        latency beyond LL's (NCCL's tuner: ``baseLat[proto]``; fabrics.yaml ``nccl.tuner``),
        spread evenly over the collective's steps; none for NCCL's p2p all-to-all and sends,
        whose fixed cost is their own (``nccl.all_to_all``)."""
        n = sum(ph.repeat for ph, _ in timed) or 1
        if alg == "ring":
            fill = self._ring_fill(pr, timed)
            return [pr.base_s / n + fill / n] * len(timed)
        if alg != "direct":
            return [0.0 if alg == "p2p" else pr.base_s / n] * len(timed)
        return [self._p2p_fill(ph, f, pr) for ph, f in timed]

    def _ring_fill(self, pr, timed) -> float:
        """What NCCL's ring / Simple kernel adds to a call within one NVLink domain beyond its
        steps' transfers and copies (``nccl.ring_simple_fill``; docs/DESIGN_NOTES.md, "Ring /
        Simple: the first chunk and the slices"):

        * *first chunk*: of the first chunk each channel moves (NCCL's chunk, 2 MiB, over its
          24 channels), the share ``fraction`` of one ring step is not overlapped, at the step's
          own rate (links and local copies as priced). A channel's piece of a step smaller
          than a chunk is its first and only chunk: the fill is then that share of a step;
        * *slices*: every slice a channel's primitives move ends with a handshake (a system
          fence, a flag the next rank polls: ``prims_simple.h`` postPeer / waitPeer),
          ``slice_us`` each; a channel runs (steps + 1) primitives per chunk, two slices each
          (SlicePerChunk), chunks = its piece / the chunk, rounded up."""
        channels, chunk, frac, slice_s = self.ring_fill
        if pr.name != "Simple" or not chunk or self.topology.intra == "pcie":
            return 0.0
        ph, f = timed[0]
        if ph.net_hops or not ph.transfers:
            return 0.0
        src = ph.transfers[0][0]  # a rank's bytes per step (over the model's rings) and channel
        piece = sum(b for a, _, b in ph.transfers if a == src) / channels
        if piece <= 0:
            return 0.0
        step = f * self._wire(ph, pr) + ph.local_bytes / self.copy_Bps
        ops = sum(p.repeat for p, _ in timed) + 1  # primitives per chunk on one channel
        slices = ops * 2 * math.ceil(piece / chunk)  # SlicePerChunk = 2
        return frac * step * min(1.0, chunk / piece) + slice_s * slices

    def _p2p_fill(self, ph: Phase, fluid: float, pr) -> float:
        """NCCL's p2p Simple pipeline fill on an all-to-all's direct step within an NVLink
        domain: each channel's part moves through the receiver's FIFO in chunks
        (``p2pChunkSize``, 512 KiB on NVLink) that the receiving kernel copies out after they
        land, so the start of the pipeline is not overlapped: up to ``a2a_fill_bytes``
        (``nccl.all_to_all.simple_fill_bytes``, fitted by ``calibrate alltoall``) of the
        busiest rank's traffic -- its sends or its receives, whichever is larger -- take
        their transfer time again, at the rate ``fluid`` prices that rank's bytes. So the
        fill is the same few chunks per channel however uneven the split: a receiver-hot
        exchange, whose busiest receiver takes 1.5-2x the bytes any rank sends, pays the
        first chunks once at its port's rate, not scaled by that ratio (which a fill in
        units of the busiest sender's bytes did, until 2026-11-27 late morning). A uniform exchange,
        whose ranks send what they receive, is unchanged. LL has no such pipeline; over the
        network the NIC's DMA overlaps it."""
        if pr.name != "Simple" or ph.net_hops or not ph.transfers or not self.a2a_fill_bytes:
            return 0.0
        sent: dict[int, float] = {}
        recv: dict[int, float] = {}
        for a, b, nb in ph.transfers:
            sent[a] = sent.get(a, 0.0) + nb
            recv[b] = recv.get(b, 0.0) + nb
        busiest = max(max(sent.values()), max(recv.values()))
        return fluid * min(1.0, self.a2a_fill_bytes / busiest) if busiest > 0 else 0.0
