"""Megatron-LM's interleaved 1F1B with its own pipeline sends and receives, against sends that
start as soon as their data is ready (the engine's model): what NCCL's point-to-point
semantics add to a deep pipeline of one-layer chunks.

The engine runs a pipeline send on the sender's ``pp`` stream as soon as the pass that made
its tensor is done, and the receiver's next pass waits only for the data
(:mod:`simulator.engine.sends`). Megatron-LM's ``forward_backward_pipelining_with_interleaving``
(``megatron/core/pipeline_parallel/schedules.py`` at 1e057005, the code of the ModelZoo's
Qwen3 A2A PP 32 row; defaults ``overlap_p2p_comm`` on, ``batch_p2p_comm`` off,
``overlap_p2p_comm_warmup_flush`` off) does more, and this script prices all of it on fixed
chunk times (the host ahead of the GPU):

* **Rendezvous**: a 16 MiB NCCL send moves only while its receive runs on the peer (NCCL's
  p2p buffers hold a few chunks), so a transfer starts when both sides have reached it.
* **One stream a peer**: PyTorch's ProcessGroupNCCL runs every send to and receive from one
  peer on that pair's communicator and stream, in issue order; each NCCL call first waits for
  the issuing compute stream (the tensors must be ready), so a receive posted after a pass
  starts no earlier than that pass's end.
* **The compute stream waits for the previous send**: after posting a step's send the
  schedule calls ``send_next_wait_handle.wait()`` / ``send_prev_wait_handle.wait()`` on the
  previous step's send, and ``recv_*_wait_handle.wait()`` before each pass (FIFO).
* **Blocking warm-up and cool-down**: without ``overlap_p2p_comm_warmup_flush`` the warm-up
  forwards and the cool-down backwards call ``send_forward_recv_forward`` /
  ``send_backward_recv_backward`` without overlap: the compute stream waits for both.

The receive each rank posts follows ``recv_tensor_from_previous_stage`` (the first rank
posts none for a chunk-0 forward, the last none for a last-chunk backward; rank 0 receives
from rank ``pp - 1`` for its later chunks, and back). Transfers take a fixed ``T`` each.

Run from the repository root: ``python benchmarks/megatron_p2p.py`` (the A2A PP 32 row's
chunk times as the engine prices them; ``--help`` for others).
"""

from __future__ import annotations

import argparse
from collections import defaultdict, deque
from collections.abc import Callable

#: a chunk's time: (rank, model chunk, "F" or "B") -> seconds
ChunkTime = Callable[[int, int, str], float]


def _chunk(k: int, pp: int, v: int, forward: bool) -> int:
    c = (k % (pp * v)) // pp
    return c if forward else v - c - 1


def _recv(r: int, k: int, pp: int, v: int, forward: bool) -> bool:
    """Megatron's ``recv_tensor_from_previous_stage``: whether rank ``r`` posts a receive after
    virtual micro-batch ``k`` (forward: from the previous rank; backward: from the next)."""
    leading = r == 0 if forward else r == pp - 1
    if not leading:
        return True
    if k < pp - 1:
        return False
    return _chunk(k - (pp - 1), pp, v, forward) != (v - 1 if forward else 0)


def rank_program(r: int, pp: int, v: int, m: int, megatron: bool) -> list[tuple]:
    """Rank ``r``'s host program in issue order: ``("C", chunk, phase)`` a pass,
    ``("P", kind, peer, handle)`` a send / receive posted, ``("W", handle)`` the compute stream
    waiting for it. ``megatron`` False: the engine's model (no waits on sends, no blocking
    warm-up or cool-down)."""
    total = m * v
    warm = min((pp - r - 1) * 2 + (v - 1) * pp, total)
    nxt, prv = (r + 1) % pp, (r - 1) % pp
    out: list[tuple] = []
    n = [0]

    def post(kind: str, peer: int) -> str:
        n[0] += 1
        out.append(("P", kind, peer, n[0]))
        return n[0]

    def first(c: int) -> bool:
        return r == 0 and c == 0

    def last(c: int) -> bool:
        return r == pp - 1 and c == v - 1

    if not first(0):
        out.append(("W", post("recv", prv)))
    fwd_q: deque = deque()
    bwd_q: deque = deque()
    for k in range(warm):  # warm-up forwards: blocking send_forward_recv_forward
        c = _chunk(k, pp, v, True)
        out.append(("C", c, "F"))
        send = post("send", nxt) if not last(c) else None
        recv = post("recv", prv) if _recv(r, k, pp, v, True) and k != total - 1 else None
        for h in (send if megatron else None, recv):
            if h is not None:
                out.append(("W", h))
        if k == warm - 1 and warm < total and r != pp - 1:
            bwd_q.append(post("recv", nxt))
    send_f = send_b = None
    for k in range(total - warm):  # steady state, overlapped
        f = warm + k
        c = _chunk(f, pp, v, True)
        if not first(c) and fwd_q:
            out.append(("W", fwd_q.popleft()))
        out.append(("C", c, "F"))
        s = post("send", nxt) if not last(c) else None
        if _recv(r, f, pp, v, True) and k != total - warm - 1:
            fwd_q.append(post("recv", prv))
        if megatron and send_f is not None:
            out.append(("W", send_f))
        send_f = s
        c = _chunk(k, pp, v, False)
        if not last(c) and bwd_q:
            out.append(("W", bwd_q.popleft()))
        out.append(("C", c, "B"))
        s = post("send", prv) if not first(c) else None
        if _recv(r, k, pp, v, False):
            bwd_q.append(post("recv", nxt))
        if megatron and send_b is not None:
            out.append(("W", send_b))
        send_b = s
    for k in range(total - warm, total):  # cool-down backwards: blocking
        c = _chunk(k, pp, v, False)
        if not last(c) and bwd_q:
            out.append(("W", bwd_q.popleft()))
        out.append(("C", c, "B"))
        send = post("send", prv) if not first(c) else None
        recv = post("recv", nxt) if _recv(r, k, pp, v, False) and k != total - 1 else None
        for h in (send if megatron else None, recv):
            if h is not None:
                out.append(("W", h))
    for h in (send_b, send_f):
        if megatron and h is not None:
            out.append(("W", h))
    return out


def step_time(pp: int, v: int, m: int, chunk_time: ChunkTime, transfer_s: float,
              megatron: bool = True) -> tuple[float, list[float]]:
    """(step, each rank's busy time) of the interleaved schedule with ``m`` micro-batches.

    ``megatron``: the semantics of the module docstring; False: the engine's (a send starts
    when its pass is done, on a stream of sends only; a receive completes at its send's end)."""
    progs = [rank_program(r, pp, v, m, megatron) for r in range(pp)]
    ptr, clock, busy = [0] * pp, [0.0] * pp, [0.0] * pp
    ready: dict[tuple, float] = {}  # (edge, index, side) -> when that side can move data
    where: dict[tuple, tuple] = {}  # (rank, handle) -> (edge, index, side)
    count: dict[tuple, int] = defaultdict(int)
    last_on: dict[tuple, tuple] = {}  # a rank's stream -> its last (rank, handle)
    done: dict[tuple, float] = {}

    def finish(key: tuple) -> float | None:
        if key in done:
            return done[key]
        edge, i, side = where[key]
        rs, rr = ready.get((edge, i, "s")), ready.get((edge, i, "r"))
        if rs is None or rr is None:
            return None
        end = (max(rs, rr) if megatron else rs) + transfer_s
        done[key] = end if (megatron or side == "s") else max(end, rr)
        return done[key]

    moved = True
    while moved:
        moved = False
        for r in range(pp):
            prog = progs[r]
            while ptr[r] < len(prog):
                item = prog[ptr[r]]
                if item[0] == "C":
                    dt = chunk_time(r, item[1], item[2])
                    clock[r] += dt
                    busy[r] += dt
                elif item[0] == "W":
                    t = finish((r, item[1]))
                    if t is None:
                        break
                    clock[r] = max(clock[r], t)
                else:
                    _, kind, peer, h = item
                    stream = (r, peer) if megatron else (r, peer, kind)
                    start = clock[r]
                    before = last_on.get(stream)
                    if before is not None:
                        t = finish(before)
                        if t is None:
                            break
                        start = max(start, t)
                    edge = (r, peer) if kind == "send" else (peer, r)
                    side = "s" if kind == "send" else "r"
                    i = count[(edge, side)]
                    count[(edge, side)] += 1
                    ready[(edge, i, side)] = start
                    where[(r, h)] = (edge, i, side)
                    last_on[stream] = (r, h)
                ptr[r] += 1
                moved = True
    stuck = [r for r in range(pp) if ptr[r] < len(progs[r])]
    if stuck:
        raise RuntimeError(f"the schedule deadlocks at ranks {stuck[:4]}")
    return max(clock), busy


def layer_chunks(pp: int, v: int, layer: tuple[float, float], first: tuple[float, float],
                 last: tuple[float, float]) -> ChunkTime:
    """Chunk times of ``[0, 1 x (pp v - 2), 0]`` stages: the first virtual stage ``first``
    (the embedding), the last ``last`` (the head and loss), every other one layer; each a
    (forward, backward) pair in seconds."""
    def t(r: int, c: int, phase: str) -> float:
        vs = c * pp + r
        pair = first if vs == 0 else last if vs == pp * v - 1 else layer
        return pair[0] if phase == "F" else pair[1]
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=int, default=32)
    ap.add_argument("--vpp", type=int, default=3)
    ap.add_argument("--microbatches", type=int, default=512)
    # the engine's chunk times of the ModelZoo's A2A PP 32 row (trace of its run, 2026-11-27):
    # a layer 3.66 ms forward, 5.51 + 0.12 (recompute) backward; the embedding 0.11 / 1.46 ms;
    # the head and loss 8.00 / 9.13 ms; a 16 MiB send over InfiniBand 0.372 ms
    ap.add_argument("--layer", type=float, nargs=2, default=(3.66e-3, 5.63e-3))
    ap.add_argument("--first", type=float, nargs=2, default=(0.11e-3, 1.46e-3))
    ap.add_argument("--last", type=float, nargs=2, default=(8.00e-3, 9.13e-3))
    ap.add_argument("--transfer", type=float, nargs="+", default=(0.372e-3, 2e-3, 5e-3))
    a = ap.parse_args()
    times = layer_chunks(a.pp, a.vpp, tuple(a.layer), tuple(a.first), tuple(a.last))
    m = a.microbatches
    for tr in a.transfer:
        free, busy = step_time(a.pp, a.vpp, m, times, tr, megatron=False)
        meg, _ = step_time(a.pp, a.vpp, m, times, tr, megatron=True)
        print(f"send {tr * 1e3:.3f} ms: engine-like {free:.3f} s, Megatron {meg:.3f} s "
              f"({meg / free - 1:+.2%}); busiest rank {max(busy):.3f} s, "
              f"{max(busy) / m * 1e3:.2f} ms a micro-batch")


if __name__ == "__main__":
    main()
