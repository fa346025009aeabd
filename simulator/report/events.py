"""The events table of a step (:data:`~simulator.engine.records.EVENT_COLUMNS`), made from the
engine's rows when it is asked for.

The table -- a row per timed event, in order of start, then GPU, stream and end -- is what a
run writes (``events.parquet``, the trace, the timeline). Its string columns cost pandas about
2 us a row to make, so a step whose files are not written (``--json --no-files``, ``plan``,
``sweep``, the shorter steps of an extrapolated one) reads what it needs from the rows as
arrays (:meth:`EventRows.column`, in the table's order) and never makes it.
"""

from __future__ import annotations

from functools import cached_property
from operator import itemgetter

import numpy as np
import pandas as pd

from simulator.engine.records import EVENT_COLUMNS

#: The table's order: by these columns, ties kept in the order the engine wrote the rows.
ORDER = ("start_s", "gpu", "stream", "end_s")
#: The columns of text.
STRINGS = frozenset({"proc", "stream", "kind", "dim", "name", "parts"})


class EventRows:
    """The engine's event rows (tuples in :data:`EVENT_COLUMNS` order, as written)."""

    def __init__(self, rows: list[tuple]):
        self.rows = rows
        self._cols: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def _raw(self, name: str) -> np.ndarray:
        """Column ``name`` in the order the rows were written (made once)."""
        hit = self._cols.get(name)
        if hit is None:  # (a C loop over the rows that allocates nothing per row)
            vals = list(map(itemgetter(EVENT_COLUMNS.index(name)), self.rows))
            hit = self._cols[name] = np.array(vals, dtype=object if name in STRINGS else None)
        return hit

    @cached_property
    def order(self) -> np.ndarray:
        """The rows' positions in table order (what :meth:`table`'s stable sort gives)."""
        keys = []
        for c in reversed(ORDER):  # np.lexsort: last key first; text by its rank in order
            v = self._raw(c)
            if c in STRINGS:
                rank = {t: j for j, t in enumerate(sorted(set(v.tolist())))}
                v = np.array([rank[t] for t in v.tolist()], dtype=np.int64)
            keys.append(v)
        return np.lexsort(keys) if self.rows else np.zeros(0, dtype=np.int64)

    def column(self, name: str) -> np.ndarray:
        """Column ``name`` in table order."""
        return self._raw(name)[self.order]

    def table(self) -> pd.DataFrame:
        """The events table."""
        events = pd.DataFrame.from_records(self.rows, columns=list(EVENT_COLUMNS))
        return events.sort_values(list(ORDER), kind="stable").reset_index(drop=True)
