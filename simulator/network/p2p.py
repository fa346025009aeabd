"""How NCCL 2.28 lays a grouped send/receive (an all-to-all) out on its p2p channels, and
what that makes the busiest piece of work.

PyTorch's ``all_to_all_single`` is one NCCL group of a send and a receive per peer (itself
included, parts of zero elements left out). Facts from NCCL's source (2.28), none of its code:

* **Rounds** (``src/init.cc``, the p2p schedule): within one node, round ``d`` pairs the send to
  group rank ``r + d`` with the receive from ``r - d`` (mod n); round 0 is the rank's own part.
* **Channels of a round** (``src/enqueue.cc`` ``addP2pToPlan``, ``scheduleP2pTasksToPlan``):
  a direction of ``b`` bytes is cut into ``k`` parts, ``k`` starting at
  ``min(kmin, ceil(b / (chunk / 8)))`` -- ``kmin`` the p2p channels per peer halved until
  ``kmin x n <= p2p channels`` -- and doubling while a part is over ``32 x chunk`` and ``k`` is
  at most half the channels per peer (``chunk``: ``p2pChunkSize``, 512 KiB on NVLink). The round
  occupies the larger direction's count of consecutive channels (mod the p2p channels) from
  its base, the bit reversal of ``d`` over log2(p2p channels) bits (``src/include/channel.h``).
  Parts are ``ceil(b / k)`` rounded up to 4 KiB (``device.h`` ``ncclP2pPartBounds``).
* **Warps** (``src/device/sendrecv.h``): a channel is one thread block of ``NCCL_MAX_NTHREADS``
  (640: 20 warps) that runs every round placed on it (up to 8 in one batch) at once, each
  with ``w = floor(20 / works)`` warps, fixed for the whole call (a warp whose work is done
  idles). ``w`` is split into ``w/2`` receiving and ``w/2`` sending warps for ``w <= 4``, else
  ``(w-1)/2`` and ``(w-1)/2 + 1``, and the work keeps only their sum (19 of 20, 9 of 10, 5 of
  6, 2 of 3): a work that both sends and receives on the channel uses the two halves, a send
  or receive alone on the channel all of the sum, and a rank's own part is one copy by all of
  the sum.

So an uneven split makes some pieces big *and* few-warped: a rank that receives 40 % of a
gigabyte from one peer in a channel that three rounds share receives it with 2 warps. The
cost model (:func:`warp_time`) prices each **block** -- a rank's channel in one batch: the
works placed on it, each a round's send part to ``r + d`` and receive part from ``r - d`` --
as every side of its works one after the other, each side's bytes at the rate of all the
block's warps (the sum of its works' halves; :class:`WarpRates`: 16-byte copies, and NCCL's
narrow copies where the part's offset in the sender's or the receiver's buffer is off the
16-byte boundary, :mod:`simulator.network.alignment`): the warp groups are one thread block
on one SM, whose copy rate they share, so a lightly loaded side or work does not leave its
share idle (a pair with 0.7 / 0.3 splits moves as fast as an even one; docs/DESIGN_NOTES.md
"A channel's warps share one rate"). A rank's own part is one copy, the slowest block of a
batch on any rank counts (a send and its receive run through the receiver's FIFO in lock
step), a channel's batches one after another, and the call at its slowest channel: the bound
the channels put on the exchange beside its port's (:meth:`CollectiveModel._a2a_phase`
combines the two).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: NCCL's thread block for p2p kernels: NCCL_MAX_NTHREADS (640) / 32
WARPS = 20
#: works of one batch on a channel (NCCL_MAX_DEV_WORK_P2P_PER_BATCH)
BATCH = 8
#: a part's size is rounded up to this (ncclP2pPartBounds)
PART_ALIGN = 4096
#: fabrics.yaml ``nccl.all_to_all.p2p``'s rates, in :class:`WarpRates`'s order
WARP_RATE_KEYS = ("warp_GBps", "warp_exponent", "narrow_send_GBps", "narrow_send_exponent",
                  "narrow_recv_GBps", "narrow_recv_exponent")


@dataclass(frozen=True)
class P2pLayout:
    """A communicator's p2p channels (``fabrics.yaml`` ``nccl.all_to_all.p2p``)."""

    channels: int  # p2pnChannels (a power of 2)
    per_peer: int  # p2pnChannelsPerPeer (a power of 2)
    chunk_bytes: int  # p2pChunkSize

    def min_channels(self, n: int) -> int:
        """``kmin``: the channels per peer halved until ``kmin x n`` fits the channels."""
        k = self.per_peer
        while k * n > self.channels and k > 1:
            k //= 2
        return k


@dataclass(frozen=True)
class WarpRates:
    """A piece's copy rate by its warps ``w``: ``GBps x w ** exponent`` for 16-byte copies;
    where the part starts off 16 bytes in the sender's buffer, the sending side at
    ``narrow_send_GBps x w ** narrow_send_exponent`` (narrow loads of the user buffer, stored
    into the peer's FIFO over NVLink), in the receiver's buffer the receiving side at
    ``narrow_recv_*`` (narrow stores of its FIFO into the user buffer). ``fabrics.yaml``
    ``nccl.all_to_all.p2p``, fitted with the all-to-all's other constants by ``python -m
    simulator.calibrate alltoall``."""

    GBps: float
    exponent: float
    narrow_send_GBps: float
    narrow_send_exponent: float
    narrow_recv_GBps: float
    narrow_recv_exponent: float

    def seconds(self, nbytes: float, warps: int, narrow: bool, side: str = "send") -> float:
        """One side (``send`` or ``recv``) of a piece of ``nbytes`` on ``warps`` warps."""
        if nbytes <= 0:
            return 0.0
        w = max(warps, 1)
        if not narrow:
            return nbytes / (self.GBps * 1e9 * w ** self.exponent)
        if side == "send":
            return nbytes / (self.narrow_send_GBps * 1e9 * w ** self.narrow_send_exponent)
        return nbytes / (self.narrow_recv_GBps * 1e9 * w ** self.narrow_recv_exponent)


def _bitrev(x: int, bits: int) -> int:
    out = 0
    for _ in range(bits):
        out = (out << 1) | (x & 1)
        x >>= 1
    return out


def parts(nbytes: float, kmin: int, layout: P2pLayout) -> int:
    """Channels (parts) one direction of ``nbytes`` is cut into; 0 when nothing moves."""
    if nbytes <= 0:
        return 0
    lo, hi = layout.chunk_bytes // 8, layout.chunk_bytes * 32
    k = min(kmin, -(-int(nbytes) // lo))
    size = max(lo, -(-int(nbytes) // k))
    while size > hi and k <= layout.per_peer // 2:
        k *= 2
        size = -(-int(nbytes) // k)
    return k


def part_bytes(nbytes: float, k: int) -> float:
    """The largest part of ``nbytes`` cut in ``k`` (NCCL rounds a part up to 4 KiB)."""
    if k <= 0:
        return 0.0
    size = -(-int(nbytes) // k)
    size = -(-size // PART_ALIGN) * PART_ALIGN
    return float(min(size, int(nbytes)))


def round_base(d: int, layout: P2pLayout) -> int:
    bits = max(0, layout.channels.bit_length() - 1)
    return _bitrev(d, bits)


def _split(w: int) -> tuple[int, int]:
    """(receive, send) warps of a work with ``w`` warps that both sends and receives."""
    recv = w // 2 if w <= 4 else (w - 1) // 2
    return recv, (recv if w <= 4 else recv + 1)


def _layout_works(table, layout: P2pLayout):
    """Rounds' bases and, per rank and round, (channels of the work, send parts, receive
    parts), and the warps of a rank's round on a channel (module docstring)."""
    n = len(table)
    kmin = layout.min_channels(n)
    C = layout.channels
    base = [round_base(d, layout) for d in range(n)]
    works = []
    for r in range(n):
        row = []
        for d in range(n):
            ks = parts(table[r][(r + d) % n], kmin, layout)
            kr = parts(table[(r - d) % n][r], kmin, layout)
            row.append((max(ks, kr), ks, kr))
        works.append(row)

    def warps_on(r: int, c: int, d: int) -> tuple[int, int]:
        """(receiving, sending) warps of rank r's round d on channel c."""
        batch = [e for e in range(n) if e // BATCH == d // BATCH and works[r][e][0]
                 and (c - base[e]) % C < works[r][e][0]]
        recv, send = _split(WARPS // len(batch))
        _, ks, kr = works[r][d]
        part = (c - base[d]) % C
        has_s, has_r = part < ks, part < kr
        if d == 0 or not (has_s and has_r):
            w = recv + send  # a lone side or a copy: the work's warps after the split
            return (w if has_r else 0), (w if has_s else 0)
        return recv, send

    return base, works, warps_on


def pieces(
    table: Sequence[Sequence[float]],
    layout: P2pLayout,
    narrow: Sequence[Sequence[tuple[bool, bool]]] | None = None,
) -> list[tuple]:
    """Every piece of work of a grouped exchange where group rank ``s`` sends ``table[s][j]``
    bytes to ``j`` (module docstring), as ``((channel, batch), bytes, sending warps, send
    narrow, receiving warps, receive narrow, sending work, its warps, receiving work, its
    warps)``, a work ``(rank, channel, round)`` and its warps the sum of its receive and send
    halves; a rank's own part is one copy (its warps on both sides). ``narrow[s][j]`` = (the
    send part's offset in ``s``'s buffer is off 16 bytes, the receive part's offset in ``j``'s
    buffer is), none by default."""
    n = len(table)
    if n < 2:
        return []
    C = layout.channels
    base, works, warps_on = _layout_works(table, layout)
    out = []
    for s in range(n):
        for d in range(n):
            j = (s + d) % n
            b = table[s][j]
            if b <= 0:
                continue
            k = works[s][d][1]
            piece = part_bytes(b, k)
            ns = bool(narrow and narrow[s][j][0])
            nr = bool(narrow and narrow[s][j][1])
            for part in range(k):
                c = (base[d] + part) % C
                key = (c, d // BATCH)
                if d == 0:  # own part: one copy by all the work's warps
                    w = warps_on(s, c, 0)[1]
                    out.append((key, piece, w, ns or nr, w, ns or nr, (s, c, 0), w, (s, c, 0), w))
                else:  # j receives from s = j - d in round d, on the same channels
                    sr, ss = warps_on(s, c, d)
                    jr, js = warps_on(j, c, d)
                    out.append((key, piece, ss, ns, jr, nr,
                                (s, c, d), sr + ss, (j, c, d), jr + js))
    return out


def warp_time(
    table: Sequence[Sequence[float]],
    layout: P2pLayout,
    rates: WarpRates,
    narrow: Sequence[Sequence[tuple[bool, bool]]] | None = None,
) -> float:
    """The slowest channel of a grouped exchange (:func:`pieces`): each block (a rank's
    channel in one batch) the sum of its works' sending and receiving sides, each side at the
    rate of the block's warps (:meth:`WarpRates.seconds`), the slowest block of a batch on any
    rank, a channel's batches one after another."""
    return works_time(pieces(table, layout, narrow), rates)


def works_time(ps, rates: WarpRates) -> float:
    """:func:`warp_time` of pieces laid out by :func:`pieces`."""
    warps: dict[tuple[int, int, int], dict] = {}  # block -> {work: its warps}
    sides: list[tuple[tuple[int, int, int], float, bool, str]] = []
    key_of: dict[tuple[int, int, int], tuple[int, int]] = {}
    for key, b, _sw, sn, _rw, rn, swork, ws, rwork, wr in ps:
        for work, w, narrow, side in (((swork, ws, sn or rn, "copy"),) if swork == rwork
                                      else ((swork, ws, sn, "send"), (rwork, wr, rn, "recv"))):
            block = (work[0], work[1], key[1])
            warps.setdefault(block, {})[work] = w
            key_of[block] = key
            sides.append((block, b, narrow, side))
    per_block: dict[tuple[int, int, int], float] = {}
    for block, b, narrow, side in sides:
        w = sum(warps[block].values())
        if side == "copy":  # a rank's own part: one copy, at the slower of its two sides
            t = max(rates.seconds(b, w, narrow, "send"), rates.seconds(b, w, narrow, "recv"))
        else:
            t = rates.seconds(b, w, narrow, side)
        per_block[block] = per_block.get(block, 0.0) + t
    per_batch: dict[tuple[int, int], float] = {}
    for block, t in per_block.items():
        key = key_of[block]
        per_batch[key] = max(per_batch.get(key, 0.0), t)
    by_channel: dict[int, float] = {}
    for key, t in per_batch.items():
        by_channel[key[0]] = by_channel.get(key[0], 0.0) + t
    return max(by_channel.values(), default=0.0)


def narrow_parts(table: Sequence[Sequence[float]], pack: int = 16
                 ) -> list[list[tuple[bool, bool]]]:  # fmt: skip
    """Per (s, j): whether the part's offset in the send buffer of ``s`` and in the receive
    buffer of ``j`` is off a ``pack``-byte boundary, parts laid out in rank order in both
    (``all_to_all_single``)."""
    n = len(table)
    out = []
    for s in range(n):
        row = []
        for j in range(n):
            so = sum(table[s][:j])
            ro = sum(table[i][j] for i in range(s))
            row.append((so % pack != 0, ro % pack != 0))
        out.append(row)
    return out
