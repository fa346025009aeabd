"""The links table of a step (:data:`~simulator.engine.records.LINK_COLUMNS`), named only
when it is asked for.

A step records the bytes and busy seconds of every link that carried traffic as arrays by
link id (:class:`LinkLoads`). The table -- a row per such link, with its ``src->dst`` name,
kind, ends, capacity, bytes, busy time and utilisation, busiest first, then by name -- is made
from them when a run writes its files; the summary's busiest links name only the links that
can be among them. On a 131,072-GPU fabric ~800,000 links carry traffic and naming them all
costs more than a second, which a run that prints its summary does not spend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.engine.records import LINK_COLUMNS
from simulator.network.topology import Topology, link_ends


@dataclass(frozen=True)
class LinkLoads:
    """Bytes and busy seconds of the links of ``topology`` that carried traffic in a step of
    ``step_s`` seconds (``ids`` ascending, ``nbytes`` and ``busy_s`` beside them)."""

    topology: Topology
    ids: np.ndarray
    nbytes: np.ndarray
    busy_s: np.ndarray
    step_s: float

    @classmethod
    def of(cls, topology: Topology, nbytes: np.ndarray, busy_s: np.ndarray,
           step_s: float) -> LinkLoads:  # fmt: skip
        """The loads of a step from per-link arrays over every link id."""
        idx = np.nonzero(nbytes)[0]
        return cls(topology, idx, np.asarray(nbytes)[idx].astype(float),
                   np.asarray(busy_s)[idx].astype(float), step_s)  # fmt: skip

    @property
    def utilization(self) -> np.ndarray:
        """Busy share of the step, per link."""
        return self.busy_s / self.step_s if self.step_s else np.zeros(len(self.ids))

    def _order(self, rows: np.ndarray, names: Sequence[str]) -> np.ndarray:
        """``rows`` busiest first, then by name: numpy's sort of the names as fixed-width
        strings (code point order, as Python's and pandas') is ~4x faster than pandas'."""
        if not len(rows):
            return np.zeros(0, int)
        return np.lexsort((np.array(names, dtype=str), -self.utilization[rows]))

    def table(self) -> pd.DataFrame:
        """The links table, busiest first, then by name."""
        topo, at = self.topology, self.ids.tolist()
        src, dst = link_ends(topo.link_names, self.ids)
        names = [a + "->" + b for a, b in zip(src, dst, strict=True)]
        df = pd.DataFrame(
            {
                "link": names,
                "kind": [topo.link_kinds[i] for i in at],
                "src": src,
                "dst": dst,
                "capacity_GBps": topo.capacity[self.ids] / 1e9,
                "bytes": self.nbytes,
                "busy_s": self.busy_s,
                "utilization": self.utilization,
            },
            columns=list(LINK_COLUMNS),
        )
        return df.iloc[self._order(np.arange(len(at)), names)].reset_index(drop=True)

    def busiest(self, k: int = 5) -> list[dict]:
        """The first ``k`` rows of :meth:`table` (link, kind, utilisation to 1e-6, bytes),
        naming only the links at least as busy as the ``k``-th busiest."""
        util = self.utilization
        if len(util) > k:
            rows = np.nonzero(util >= np.partition(util, len(util) - k)[len(util) - k])[0]
        else:
            rows = np.arange(len(util))
        src, dst = link_ends(self.topology.link_names, self.ids[rows])
        names = [a + "->" + b for a, b in zip(src, dst, strict=True)]
        out = []
        for j in self._order(rows, names)[:k].tolist():
            i = int(rows[j])
            out.append({"link": names[j], "kind": self.topology.link_kinds[int(self.ids[i])],
                        "utilization": round(float(util[i]), 6),
                        "bytes": float(self.nbytes[i])})  # fmt: skip
        return out

    def extended(self, prev: LinkLoads, ratio: float, step_s: float) -> LinkLoads:
        """These loads extended linearly from ``prev``'s, those of a step one schedule cycle
        shorter: ``q + ratio (q - q_prev)`` per link (0 where ``prev`` had none), over a step
        of ``step_s`` (:func:`simulator.extrapolate.extend`: ``ratio = (m - m3) / cycle``)."""
        pos = np.searchsorted(prev.ids, self.ids)
        pos = np.minimum(pos, max(len(prev.ids) - 1, 0))
        hit = (prev.ids[pos] == self.ids) if len(prev.ids) else np.zeros(len(self.ids), bool)

        def grow(cur: np.ndarray, old: np.ndarray) -> np.ndarray:
            before = np.where(hit, old[pos] if len(old) else 0.0, 0.0)
            return cur + ratio * (cur - before)

        return LinkLoads(self.topology, self.ids, grow(self.nbytes, prev.nbytes),
                         grow(self.busy_s, prev.busy_s), step_s)  # fmt: skip
