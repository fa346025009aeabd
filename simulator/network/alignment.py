"""NCCL's copies off a 16-byte boundary: which bytes a collective moves through narrow packs.

NCCL's device copy (``src/device/common_kernel.h`` ``reduceCopy``, 2.28) moves 16-byte packs
only when every source and destination pointer of the copy is 16-byte aligned; otherwise the
whole copy runs ``reduceCopyPacks`` with packs of ``sizeof(T)`` bytes (2 for bf16), eight
times the memory instructions for the same bytes, with half the bytes in flight per thread
(``Unroll * (16 / sizeof(T)) / 2`` packs against ``Unroll`` of 16 bytes). NCCL's own chunks
are aligned, so what decides is where the caller's buffers put each rank's part:

* **All-reduce** never: NCCL cuts the one buffer itself.
* **Ring all-gather / reduce-scatter** (``src/device/all_gather.h``, ``reduce_scatter.h``
  ``runRing``): the steps that touch rank ``k``'s block of the user buffer, at offset
  ``k x share``, run narrow where ``k x share`` is not a multiple of 16 bytes. In a group of 3
  with a share of 2^m / 3 bytes (``benchmarks/device/comm.py`` cuts ``elems // n`` elements),
  two blocks of three are off the boundary.
* **All-to-all** (``src/device/sendrecv.h``: a send copies the user buffer into the peer's
  FIFO, a receive copies the FIFO into the user buffer, a rank's share for itself is one copy
  between its buffers): a part runs narrow where its offset in the send or receive buffer is
  off the boundary.

The functions here count, for the busiest rank, the bytes its copies *store* through narrow
packs and through 16-byte packs (each destination of a copy is one store stream: the
all-gather's middle step stores to the output and to the next rank's FIFO, a reduce-scatter
step to one place). :func:`narrow_time` prices them. Training code keeps its shares aligned (an MoE dispatch moves whole tokens of
``hidden x 2`` bytes; frameworks pad flat buffers), so only measured rows whose layout says so
use this (``validate.timed_collective_s``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

#: NCCL's large pack (``BigPackSize``, ``common_kernel.h``): pointers off it go narrow
PACK_BYTES = 16


class _Cost(Protocol):
    time_s: float
    launch_s: float


def narrow_time(cost: _Cost, stores: tuple[float, float], narrow_Bps: float) -> float:
    """The time of a call priced ``cost`` with its 16-byte copies, when its busiest rank
    stores ``stores = (narrow, wide)`` bytes through narrow and wide packs: the launch, the
    wide share of the call's data time as priced, and the narrow bytes at ``narrow_Bps``
    (fabrics.yaml ``nccl.unaligned_copy_GBps``; the kernel does a rank's steps one after
    another, so the two add)."""
    narrow, wide = stores
    if narrow <= 0 or narrow_Bps <= 0:
        return cost.time_s
    data = cost.time_s - cost.launch_s
    return cost.launch_s + data * wide / (narrow + wide) + narrow / narrow_Bps


def _off(offset: float) -> bool:
    return offset % PACK_BYTES != 0


def ring_stores(op: str, n: int, share_bytes: float) -> tuple[float, float]:
    """(narrow, wide): the bytes the busiest rank of a ring ``op`` (``all_gather`` or
    ``reduce_scatter``) over ``n`` ranks stores through narrow and through 16-byte packs, with
    rank ``k``'s block of the user buffer at ``k x share_bytes``. Per chunk, rank ``r`` runs
    (NCCL's ``runRing``) for the all-gather: its own block (copy to the output and send: 2
    stores), the blocks of ranks ``r-1 .. r-n+2`` (receive, copy, send: 2), then block
    ``r-n+1`` (receive into the output: 1); for the reduce-scatter: block ``r-1`` (send: 1),
    blocks ``r-2 .. r-n+1`` (receive, reduce, send: 1), its own block (receive, reduce into the
    output: 1)."""
    if op not in ("all_gather", "reduce_scatter"):
        raise ValueError(f"no ring blocks for {op!r}")
    if n < 2:
        return 0.0, 0.0
    off = [_off(k * share_bytes) for k in range(n)]
    worst = (0.0, 0.0)
    for r in range(n):
        if op == "all_gather":
            steps = [(r, 2)] + [((r - j) % n, 2) for j in range(1, n - 1)] + [((r + 1) % n, 1)]
        else:
            steps = [((r - j) % n, 1) for j in range(1, n)] + [(r, 1)]
        narrow = sum(w * share_bytes for k, w in steps if off[k])
        wide = sum(w * share_bytes for k, w in steps if not off[k])
        worst = max(worst, (narrow, wide))
    return worst


def a2a_stores(table: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(narrow, wide) of an all-to-all whose group rank ``s`` sends ``table[s][j]`` bytes to
    rank ``j``, parts laid out in rank order in both buffers (``all_to_all_single``): for the
    busiest rank, its sends (user buffer to FIFO), receives (FIFO to user buffer) and the copy
    of its own share, each narrow where the part's offset is off the 16-byte boundary (the own
    share: in either buffer)."""
    n = len(table)
    worst = (0.0, 0.0)
    for r in range(n):
        send_off = [sum(table[r][:j]) for j in range(n)]
        recv_off = [sum(table[s][r] for s in range(j)) for j in range(n)]
        narrow = wide = 0.0
        for j in range(n):
            parts = (
                [(table[r][j], _off(send_off[j]) or _off(recv_off[j]))]
                if j == r
                else [(table[r][j], _off(send_off[j])), (table[j][r], _off(recv_off[j]))]
            )
            for b, bad in parts:
                narrow, wide = (narrow + b, wide) if bad else (narrow, wide + b)
        worst = max(worst, (narrow, wide))
    return worst


def comm_share_elems(nbytes: float, n: int, dtype_bytes: int = 2) -> int:
    """Elements each rank's share holds when a buffer of ``nbytes`` is cut the way the
    measuring scripts here cut it (``benchmarks/device/comm.py``: ``el = max(nbytes //
    dtype, n)``, less ``el % n``, then ``el // n`` a rank; ``measure.py`` the same for the
    power-of-two sizes and groups of 2 and 4 it ran)."""
    el = max(int(nbytes) // dtype_bytes, n)
    return (el - el % n) // n


#: the uneven all-to-all splits of ``benchmarks/device/comm.py`` (its ROTATED_W, HOT_H)
ROTATED = {2: [3, 1], 3: [3, 2, 1], 4: [4, 3, 2, 1]}
HOT = {2: [7, 3], 3: [6, 2, 2], 4: [55, 15, 15, 15]}


def split_table(kind: str, n: int, nbytes: float, dtype_bytes: int = 2) -> list[list[float]]:
    """Bytes group rank ``s`` sends to rank ``j`` as ``comm.py`` cuts them (``splits_for``):
    ``el`` elements (``nbytes // dtype``, less ``el % n``) in proportion to the weights of rank
    ``s`` (``rotated``: W[(j - s) mod n]; ``hot``: H[j]; ``uniform``: equal), floored, the
    remainder to the first."""
    el = max(int(nbytes) // dtype_bytes, n)
    el -= el % n
    if kind == "uniform":
        w = [[1] * n for _ in range(n)]
    elif kind == "rotated":
        w = [[ROTATED[n][(j - s) % n] for j in range(n)] for s in range(n)]
    else:
        w = [list(HOT[n]) for _ in range(n)]
    out = []
    for s in range(n):
        sizes = [el * x // sum(w[s]) for x in w[s]]
        sizes[0] += el - sum(sizes)
        out.append([float(x * dtype_bytes) for x in sizes])
    return out


def measured_stores(op: str, n: int, nbytes: float, dtype_bytes: int = 2) -> tuple[float, float]:
    """(narrow, wide) of a uniform ``op`` over ``n`` ranks of ``nbytes`` as the measuring
    scripts lay it out (:func:`comm_share_elems`); (0, 0) where nothing is cut per rank."""
    if n < 2 or op not in ("all_gather", "reduce_scatter", "all_to_all"):
        return 0.0, 0.0
    share = comm_share_elems(nbytes, n, dtype_bytes) * dtype_bytes
    if op == "all_to_all":  # all_to_all_single without splits: the share to every peer
        return a2a_stores([[share] * n for _ in range(n)])
    return ring_stores(op, n, share)
