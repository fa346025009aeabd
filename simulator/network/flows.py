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
    links, fidx, lens = _incidence([f[0] for f in flows])
    links, cap = _compress(links, capacity)
    left = np.array([float(f[1]) for f in flows])
    done = np.zeros(len(flows))
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


class _Batch:
    __slots__ = ("event", "pending")

    def __init__(self, event: simpy.Event, pending: int):
        self.event = event
        self.pending = pending


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
        self._routes: list[tuple[int, ...]] = []
        self._left: list[float] = []
        self._size: list[float] = []
        self._batch: list[_Batch] = []
        self._rate = np.zeros(0)
        self._load = np.zeros(topology.n_links)
        self._t = env.now
        self._version = 0

    @property
    def active(self) -> int:
        """Number of flows in progress."""
        return len(self._routes)

    def transfer(self, transfers: Sequence[tuple[int, int, float]]) -> simpy.Event:
        """Start ``(src_gpu, dst_gpu, nbytes)`` transfers now; the event fires when all of
        them have completed (bandwidth part only: latency is the caller's)."""
        ev = self.env.event()
        self._advance()
        batch = _Batch(ev, 0)
        for src, dst, nbytes in transfers:
            route = self.topology.route(src, dst)
            if nbytes <= 0 or not route:
                continue
            self._routes.append(route)
            self._left.append(float(nbytes))
            self._size.append(float(nbytes))
            self._batch.append(batch)
            batch.pending += 1
        if batch.pending == 0:
            ev.succeed()
        else:
            self._reshare()
        return ev

    def _advance(self) -> None:
        """Move every flow forward to ``env.now`` at its current rate; account link usage."""
        dt = self.env.now - self._t
        self._t = self.env.now
        if dt <= 0 or not self._routes:
            return
        for i in range(len(self._left)):
            self._left[i] -= self._rate[i] * dt
        self.link_bytes += self._load * dt
        self.link_busy_s[self._load > 0] += dt

    def _reshare(self) -> None:
        """Recompute the max-min rates and schedule the next completion."""
        self._version += 1
        if not self._routes:
            self._rate = np.zeros(0)
            self._load[:] = 0.0
            return
        links, fidx, lens = _incidence(self._routes)
        self._rate = _fill(links, fidx, lens > 0, self.capacity)
        self._load = np.bincount(links, weights=self._rate[fidx], minlength=len(self.capacity))
        left = np.asarray(self._left)
        with np.errstate(divide="ignore"):
            ttf = np.where(self._rate > 0, left / np.where(self._rate > 0, self._rate, 1), np.inf)
        dt = float(ttf.min())
        if not np.isfinite(dt):
            return  # every remaining flow is stuck behind a failed link
        version = self._version
        timer = self.env.timeout(max(dt, 0.0))
        timer.callbacks.append(lambda _ev, v=version: self._on_timer(v))

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return
        self._advance()
        keep = []
        finished: list[_Batch] = []
        for i, left in enumerate(self._left):
            tol = _REL * self._size[i] + self._rate[i] * 1e-15
            if left <= tol:
                finished.append(self._batch[i])
            else:
                keep.append(i)
        self._routes = [self._routes[i] for i in keep]
        self._left = [self._left[i] for i in keep]
        self._size = [self._size[i] for i in keep]
        self._batch = [self._batch[i] for i in keep]
        self._reshare()
        for b in finished:
            b.pending -= 1
            if b.pending == 0:
                b.event.succeed()
