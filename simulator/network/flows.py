"""Flow-level bandwidth sharing: max-min fairness by progressive filling.

A *flow* is a transfer along a fixed route (a sequence of link ids). At any instant every link
splits its capacity among the flows crossing it so that the allocation is max-min fair: no
flow's rate can grow without lowering the rate of a flow that has no larger rate (Bertsekas &
Gallager, *Data Networks*, 2nd ed., sec. 6.5.2, progressive filling). This is the fluid model
of SimGrid's LV08 network model and of ASTRA-sim's congestion-aware backend, without their
TCP-window corrections.

* :func:`maxmin_rates` -- the rates of a fixed set of flows.
* :func:`fluid_completion` -- completion times when all flows start together and the rates are
  re-shared each time one finishes.
* :class:`FlowNetwork` -- the same inside a SimPy environment, for transfers that start at
  arbitrary times (the full-detail engine).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np
import simpy

from simulator.network.topology import Topology

_REL = 1e-9  # relative tolerance for "this link is saturated" / "this flow is finished"
#: Re-shares in a row at one simulated instant with no flow finishing before the network is
#: declared stuck (a finishing flow can legitimately re-share a few times per instant: one
#: batch completes, the next re-share frees its links; thousands in a row cannot happen).
_MAX_STALLED_RESHARES = 1000


class StuckNetworkError(RuntimeError):
    """Simulated time stopped advancing while transfers were still in progress (a bug)."""


def _incidence(flow_links: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(links, flow index, links per flow) of the flow-link incidence, as flat arrays."""
    n = len(flow_links)
    lens = np.fromiter((len(x) for x in flow_links), dtype=np.int64, count=n)
    links = np.fromiter(chain.from_iterable(flow_links), dtype=np.int64, count=int(lens.sum()))
    return links, np.repeat(np.arange(n), lens), lens


def _compress(links: np.ndarray, capacity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Renumber the links the flows use as 0..k-1 (work then scales with the flows, not with
    the whole fabric): (local link ids, their capacities)."""
    used, local = np.unique(links, return_inverse=True)
    return local.astype(np.int64), np.asarray(capacity, dtype=float)[used]


def _fill(
    links: np.ndarray, fidx: np.ndarray, active: np.ndarray, capacity: np.ndarray
) -> np.ndarray:
    """Progressive filling over the flows where ``active`` (all of which cross >= 1 link).

    All unfrozen flows grow at the same pace; when a link fills, the flows crossing it freeze.
    Each round is a few vectorised numpy passes over the incidence; the number of rounds is
    the number of distinct bottleneck levels.
    """
    n_links = len(capacity)
    rate = np.zeros(len(active))
    remaining = np.asarray(capacity, dtype=float).copy()
    free = active.copy()
    while True:
        m = free[fidx]
        if not m.any():
            return rate
        lk = links[m]
        cnt = np.bincount(lk, minlength=n_links)
        used = np.nonzero(cnt)[0]
        share = remaining[used] / cnt[used]
        delta = max(float(share.min()), 0.0)
        rate[free] += delta
        remaining[used] -= delta * cnt[used]
        full = np.zeros(n_links, dtype=bool)
        full[used[share <= delta * (1 + _REL) + 1e-300]] = True
        free[fidx[m][full[lk]]] = False


def maxmin_rates(flow_links: Sequence[Sequence[int]], capacity: np.ndarray) -> np.ndarray:
    """Max-min fair rates (bytes/s) of flows along ``flow_links`` over links of ``capacity``.

    Flows that cross no link get rate ``inf``; flows through a link of capacity 0 get 0.
    """
    links, fidx, lens = _incidence(flow_links)
    links, cap = _compress(links, capacity)
    rate = _fill(links, fidx, lens > 0, cap)
    rate[lens == 0] = np.inf
    return rate


def fluid_completion(
    flows: Sequence[tuple[Sequence[int], float]], capacity: np.ndarray
) -> np.ndarray:
    """Completion times (s) of flows ``(links, nbytes)`` that all start at t = 0.

    Rates are max-min fair and re-shared each time a flow finishes. A flow of 0 bytes or with
    no links completes at 0; a flow stuck behind a zero-capacity link never completes (inf).
    """
    if not flows:
        return np.zeros(0)
    links, _, lens = _incidence([f[0] for f in flows])
    return fluid_completion_arrays(links, lens, np.array([float(f[1]) for f in flows]), capacity)


def fluid_completion_arrays(
    links: np.ndarray, lens: np.ndarray, nbytes: np.ndarray, capacity: np.ndarray
) -> np.ndarray:
    """:func:`fluid_completion` of flows given as arrays: every flow's link ids one flow after
    the other (``links``), the number of links of each (``lens``) and its bytes."""
    if not len(lens):
        return np.zeros(0)
    fidx = np.repeat(np.arange(len(lens)), lens)
    links, cap = _compress(links, capacity)
    left = np.asarray(nbytes, dtype=float).copy()
    done = np.zeros(len(lens))
    alive = (lens > 0) & (left > 0)
    t = 0.0
    while alive.any():
        rate = _fill(links, fidx, alive, cap)
        live = np.nonzero(alive)[0]
        r = rate[live]
        if not (r > 0).any():
            done[live] = np.inf
            break
        with np.errstate(divide="ignore"):
            ttf = np.where(r > 0, left[live] / np.where(r > 0, r, 1.0), np.inf)
        dt = float(ttf.min())
        t += dt
        left[live] -= r * dt
        fin = live[ttf <= dt * (1 + _REL)]
        done[fin] = t
        left[fin] = 0.0
        alive[fin] = False
    return done


class FlowSet:
    """Transfers ``(src_gpu, dst_gpu, nbytes)`` as three arrays (thousands of concurrent
    groups' flows); iterates as tuples, like the tuple of transfers it stands for."""

    __slots__ = ("src", "dst", "nbytes")

    def __init__(self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray):
        self.src = np.asarray(src, dtype=np.int64)
        self.dst = np.asarray(dst, dtype=np.int64)
        self.nbytes = np.asarray(nbytes, dtype=float)

    def __len__(self) -> int:
        return len(self.src)

    def __iter__(self):
        return zip(self.src.tolist(), self.dst.tolist(), self.nbytes.tolist(), strict=True)


class _Batch:
    """The flows of one :meth:`FlowNetwork.transfer` call, as flat numpy arrays."""

    __slots__ = ("event", "links", "lens", "left", "size", "rate")

    def __init__(self, event: simpy.Event, links: np.ndarray, lens: np.ndarray, sizes):
        self.event = event
        self.lens = lens
        self.links = links
        self.size = np.asarray(sizes, dtype=float)
        self.left = self.size.copy()
        self.rate = np.zeros(len(sizes))

    def keep(self, mask: np.ndarray) -> None:
        """Drop the flows where ``mask`` is False."""
        self.links = self.links[np.repeat(mask, self.lens)]
        self.lens, self.left, self.size = self.lens[mask], self.left[mask], self.size[mask]
        self.rate = self.rate[mask]


class FlowNetwork:
    """Max-min fair link sharing among transfers started at arbitrary simulated times.

    Args:
        env: the SimPy environment.
        topology: routes and line rates.
        efficiency: per-link efficiency (see :meth:`Topology.effective_capacity`); None uses
            ``fabrics.yaml``, the same figures the collective model uses, so a collective's
            steps executed here take the time :class:`~simulator.network.collectives.
            CollectiveModel` predicts.

    Attributes:
        link_bytes: bytes carried per link id so far.
        link_busy_s: seconds each link carried at least one flow.

    Each start or finish re-solves the rates of every active flow (progressive filling over
    the links they use); flows are kept as numpy arrays per transfer batch, so a batch of
    thousands of flows (a folded collective's concurrent groups) costs a few array operations.
    """

    def __init__(
        self,
        env: simpy.Environment,
        topology: Topology,
        efficiency: float | Mapping[str, float] | np.ndarray | None = None,
    ):
        self.env = env
        self.topology = topology
        self.capacity = topology.effective_capacity(efficiency)
        self.link_bytes = np.zeros(topology.n_links)
        self.link_busy_s = np.zeros(topology.n_links)
        self._batches: list[_Batch] = []
        self._used = np.zeros(0, dtype=np.int64)  # global ids of the links in use
        self._load = np.zeros(0)  # bytes/s on each of them
        self._t = env.now
        self._version = 0
        self._stalled = 0  # timer firings in a row that finished nothing at the same instant
        #: (time, link ids in use, bytes/s on each) after every re-share, when recording
        self.history: list[tuple[float, np.ndarray, np.ndarray]] | None = None

    def record(self) -> None:
        """Keep the load of every link after each change (for utilisation time series)."""
        self.history = []

    @property
    def active(self) -> int:
        """Number of flows in progress."""
        return int(sum(len(b.left) for b in self._batches))

    def transfer(self, transfers: Sequence[tuple[int, int, float]]) -> simpy.Event:
        """Start ``(src_gpu, dst_gpu, nbytes)`` transfers now; the event fires when all of
        them have completed (bandwidth part only: latency is the caller's)."""
        ev = self.env.event()
        if isinstance(transfers, FlowSet):  # many flows as arrays: routed at once
            links, lens = self.topology.route_arrays(transfers.src, transfers.dst)
            keep = (transfers.nbytes > 0) & (lens > 0)
            sizes = transfers.nbytes[keep]
            if not keep.all():
                links, lens = links[np.repeat(keep, lens)], lens[keep]
        else:
            routes, size_list = [], []
            route = self.topology.route
            for src, dst, nbytes in transfers:
                r = route(src, dst)
                if nbytes > 0 and r:
                    routes.append(r)
                    size_list.append(float(nbytes))
            links, _, lens = _incidence(routes)
            sizes = np.asarray(size_list, dtype=float)
        if not len(lens):
            ev.succeed()
            return ev
        self._advance()
        self._batches.append(_Batch(ev, links, lens, sizes))
        self._reshare()
        return ev

    def _advance(self) -> None:
        """Move every flow forward to ``env.now`` at its current rate; account link usage."""
        dt = self.env.now - self._t
        self._t = self.env.now
        if dt <= 0 or not self._batches:
            return
        for b in self._batches:
            b.left -= b.rate * dt
        self.link_bytes[self._used] += self._load * dt
        self.link_busy_s[self._used[self._load > 0]] += dt

    def _reshare(self) -> None:
        """Recompute the max-min rates and schedule the next completion."""
        self._version += 1
        if not self._batches:
            self._used, self._load = np.zeros(0, dtype=np.int64), np.zeros(0)
            if self.history is not None:
                self.history.append((self.env.now, self._used, self._load))
            return
        links = np.concatenate([b.links for b in self._batches])
        lens = np.concatenate([b.lens for b in self._batches])
        fidx = np.repeat(np.arange(len(lens)), lens)
        used, local = np.unique(links, return_inverse=True)
        rate = _fill(local, fidx, lens > 0, self.capacity[used])
        self._used = used
        self._load = np.bincount(local, weights=rate[fidx], minlength=len(used))
        if self.history is not None:
            self.history.append((self.env.now, used, self._load))
        dt = np.inf
        i = 0
        for b in self._batches:
            b.rate = rate[i : i + len(b.left)]
            i += len(b.left)
            pos = b.rate > 0
            if pos.any():
                dt = min(dt, float((b.left[pos] / b.rate[pos]).min()))
        if not np.isfinite(dt):
            return  # every remaining flow is stuck behind a failed link
        version = self._version
        timer = self.env.timeout(max(dt, 0.0))
        timer.callbacks.append(lambda _ev, v=version: self._on_timer(v))

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        # A flow is finished when what it has left would take less than the clock can resolve
        # at this instant: far into a run (a 1e6x straggler puts the clock at ~5e6 s) the
        # spacing of float64 times is ~1e-9 s, so a few bytes left at 100 GB/s can never be
        # sent in a timer step that advances the clock (now + dt == now).
        tick = 4.0 * float(np.spacing(self.env.now))
        finished: list[simpy.Event] = []
        keep: list[_Batch] = []
        for b in self._batches:
            alive = b.left > _REL * b.size + b.rate * max(1e-15, tick)
            if not alive.any():
                finished.append(b.event)
                continue
            if not alive.all():
                b.keep(alive)
            keep.append(b)
        progressed = len(keep) < len(self._batches) or sum(len(b.left) for b in keep) < sum(
            len(b.left) for b in self._batches
        )
        self._stalled = 0 if progressed else self._stalled + 1
        if self._stalled > _MAX_STALLED_RESHARES:
            raise StuckNetworkError(self._describe_stuck())
        self._batches = keep
        self._reshare()
        for ev in finished:
            ev.succeed()

    def _describe_stuck(self) -> str:
        """One line naming the transfers that stopped progressing (for the internal error)."""
        names = self.topology.link_names
        parts = []
        for b in self._batches[:3]:
            first = [names[int(x)] for x in b.links[: int(b.lens[0])]] if len(b.lens) else []
            parts.append(
                f"{len(b.left)} flow(s), first via {' / '.join(first[:3]) or '-'}: "
                f"{float(b.left[0]):.3g} of {float(b.size[0]):.3g} B left at "
                f"{float(b.rate[0]):.3g} B/s"
            )
        return (
            f"the flow network stopped advancing at t={self.env.now:.6g} s with {self.active} "
            f"transfer(s) in progress ({'; '.join(parts)})"
        )
