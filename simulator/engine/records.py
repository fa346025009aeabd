"""The records the engine emits, and the tables the reports read.

Every timed op becomes one row of the *events* table; the summary, the breakdown, the plots and
the Perfetto trace are all views of it.

events (pandas DataFrame, one row per timed event)
    gpu         int    global index of the GPU the row describes (a simulated process stands
                       for one or more GPUs; ``gpu`` is its representative)
    proc        str    the simulated process, e.g. ``"r0.s3"`` (replica class 0, stage 3) or
                       ``"g17"`` in full-detail mode
    stage       int    pipeline stage of the GPU
    stream      str    ``compute`` | ``tp`` | ``dp`` | ``pp`` (the GPU stream the op ran on)
    kind        str    ``fwd`` | ``bwd`` | ``recompute`` | ``optimizer`` | ``tp_comm`` |
                       ``dp_comm`` | ``pp_comm`` | ``zero_gather`` (for breakdown colouring)
    dim         str    a communication row: the parallel dimension(s) of the layout whose group
                       the collective or send runs over, as the engine issued it (``tp``,
                       ``cp``, ``ep``, ``etp``, ``edp``, ``pp``; a group over several axes
                       joins those of size > 1 with ``+``: ``cp+dp``); "" for a compute row
                       (its collectives, if coalesced, carry theirs in ``parts``)
    name        str    human-readable, e.g. ``"L12 fwd"``, ``"all_reduce dp bucket 3"``
    start_s     float
    end_s       float
    bytes       float  bytes moved (communication: the collective's full tensor size)
    flops       float  FLOPs executed (including recomputation)
    layer       int    transformer layer index, -1 when not a layer op
    microbatch  int    micro-batch index, -1 when not per micro-batch
    coalesced   int    number of kernel-level ops this row stands for (1 = not coalesced);
                       ``parts`` lists them
    parts       str    ``"name:dur_s;name:dur_s;..."`` of coalesced sub-ops in order, "" if none;
                       a collective's entry is ``[~]name@dim:dur_s`` (``~``: it ran beside the
                       next kernel; ``dim`` as in the ``dim`` column): :func:`parse_parts`

memory (pandas DataFrame, one row per allocation change of a simulated process)
    gpu, proc, t_s, delta_bytes, total_bytes, what (``weights`` | ``gradients`` | ``optimizer``
    | ``activations`` | ``zero_params``)

links (pandas DataFrame, one row per link that carried traffic)
    link, kind, src, dst, capacity_GBps, bytes, busy_s, utilization
"""

from __future__ import annotations

from typing import NamedTuple

EVENT_COLUMNS = (
    "gpu",
    "proc",
    "stage",
    "stream",
    "kind",
    "dim",
    "name",
    "start_s",
    "end_s",
    "bytes",
    "flops",
    "layer",
    "microbatch",
    "coalesced",
    "parts",
)

MEMORY_COLUMNS = ("gpu", "proc", "t_s", "delta_bytes", "total_bytes", "what")

LINK_COLUMNS = ("link", "kind", "src", "dst", "capacity_GBps", "bytes", "busy_s", "utilization")


class PartEntry(NamedTuple):
    """One entry of a row's ``parts``: the sub-op's name (with its ``~`` / ``re_`` marks), its
    duration and, for a collective, the dimension of its group ("" for a kernel)."""

    name: str
    dur_s: float
    dim: str


def part_entry(name: str, dur_s: float, dim: str = "", overlap_next: bool = False) -> str:
    """The ``parts`` text of one sub-op (see :data:`EVENT_COLUMNS`' ``parts``)."""
    return f"{'~' if overlap_next else ''}{name}{'@' + dim if dim else ''}:{dur_s:.9g}"


def parse_parts(parts: str) -> list[PartEntry]:
    """Split a ``parts`` cell ``"name:dur_s;name@dim:dur_s;..."`` into its entries.

    The name may itself contain ``:``; the duration is what follows the last one, and a
    collective's dimension what follows the last ``@`` before it.
    """
    out: list[PartEntry] = []
    if not isinstance(parts, str) or not parts:
        return out
    for item in parts.split(";"):
        item = item.strip()
        if not item:
            continue
        name, sep, dur = item.rpartition(":")
        if not sep:
            raise ValueError(f"bad parts entry {item!r}: expected 'name:dur_s'")
        base, at, dim = name.rpartition("@")
        out.append(PartEntry(base, float(dur), dim) if at else PartEntry(name, float(dur), ""))
    return out

#: Parallel dimensions with communication of their own: each has the breakdown key and event
#: kind ``<dim>_comm``, a label and a colour. A new dimension is one entry here.
COMM_DIMS = {
    "tp": ("TP", "TP communication", "#E69F00"),
    "cp": ("CP", "CP communication", "#882255"),
    "ep": ("EP", "EP all-to-all", "#44AA99"),
    "etp": ("ETP", "expert TP communication", "#117733"),
    "dp": ("DP", "DP communication", "#D55E00"),
    "pp": ("PP", "PP send/recv", "#F0E442"),
}

#: Breakdown categories of the JSON summary, in the order tables and plots show them.
BREAKDOWN_KEYS = (
    "compute",
    *(f"{d}_comm" for d in COMM_DIMS),
    "host",  # eager code: the GPU idle while its host issues the kernels (engine/host.py)
    "pp_bubble",
    "pp_imbalance",
    "optimizer",
    "other",
)

#: Colours shared by the timeline, compare plots and trace (colour-blind safe, Okabe-Ito).
KIND_COLOURS = {
    "fwd": "#0072B2",
    "bwd": "#56B4E9",
    "recompute": "#CC79A7",
    "optimizer": "#009E73",
    **{f"{d}_comm": colour for d, (_, _, colour) in COMM_DIMS.items()},
    "zero_gather": "#999999",
    "compute": "#0072B2",
    "pp_bubble": "#DDDDDD",
    "pp_imbalance": "#AAAAAA",
    "host": "#332288",
    "other": "#666666",
}
