"""Where ``torch.distributed.pipelining``'s interleaved runtime posts its transfers
(``parallelism.pp_runtime: torch``).

``ScheduleInterleaved1F1B`` runs the compute order of :func:`simulator.parallel.schedules.
interleaved`, and its runtime (``_PipelineScheduleRuntime``, PyTorch 2.11) places each send and
receive by a lock-step pass over the ranks (``_add_send_recv``): the ranks are visited in
turn, and a rank places its next compute once the input it needs has been placed on it (a
receive, or the neighbouring virtual stage's pass on the same rank); placing a pass appends its
send to the rank's own list and the matching receive to the receiver's list, where it often
lands several passes before the receiver consumes it. Every transfer is a ``batch_isend_irecv``
(PyTorch 2.11's ``_batch_p2p``), which ProcessGroupNCCL runs on the group's own communicator
(``pointToPoint``: "for batch P2P, we need to treat it like a collective when selecting
communicator"), so a rank's transfers run one after another on one NCCL stream in the order
posted. The engine plays that stream (:mod:`simulator.engine.torch_sends`).

The pass runs over the runtime's lowered action lists, not over the compute order alone:
before placing sends and receives, ``_prepare_schedule_with_comms`` inserts an ``UNSHARD`` of
each stage before its first use and a ``RESHARD`` once it leaves the window of the next three
stages a rank computes (``_add_unshard_reshard``, inserted for every stage, FSDP or not; no-ops
at run time without FSDP) and a ``REDUCE_GRAD`` after each stage's last backward
(``_add_reduce_grad``). Each takes a turn of the lock-step pass like a compute action, so it
moves where later receives land: on the last rank of 4 x 2 stages with 8 micro-batches, the
receive of the last micro-batch's gradient lands before the first cool-down backward of the
rank's other stage instead of two passes later, and its gradient sends wait behind it
(``_lowered``; checked against PyTorch 2.13's ``_prepare_schedule_with_comms``, whose lowering
functions are the 2.11 ones that ran the measured steps).
"""

from __future__ import annotations

from typing import NamedTuple

from simulator.parallel.schedules import Work


class Post(NamedTuple):
    """One entry of a rank's posting order: a pass (``kind`` "C", ``work`` set) or a transfer
    (``kind`` "S" send / "R" receive) of ``phase`` "F" (activations) or "B" (gradients) for
    virtual stage ``vs`` (a send: the producing stage; a receive: the consuming one) and
    micro-batch ``mb``."""

    kind: str
    phase: str
    vs: int
    mb: int
    work: Work | None = None


#: a turn of the lock-step pass that posts nothing (UNSHARD, RESHARD, REDUCE_GRAD)
TURN = "turn"

#: ``_add_unshard_reshard``'s window: the stages of the next actions that it keeps unsharded
ACTIVE_STAGES = 3


def _lowered(ws: list[Work], m: int) -> list[Work | str]:
    """A rank's compute order with the runtime's non-compute actions as :data:`TURN` entries:
    an unshard of each stage (model chunk) entering the window of the next
    :data:`ACTIVE_STAGES` distinct stages the rank computes, a reshard of each leaving it
    (and of every stage left at the end), a gradient reduction right after a stage's
    ``m``-th backward."""
    out: list[Work | str] = []
    active: set[int] = set()
    backs: dict[int, int] = {}
    for i, w in enumerate(ws):
        window: list[int] = []
        for x in ws[i:]:
            if x.chunk not in window:
                window.append(x.chunk)
                if len(window) == ACTIVE_STAGES:
                    break
        evict = [c for c in active if c not in window]
        fetch = [c for c in window if c not in active]
        active.difference_update(evict)
        active.update(fetch)
        out += [TURN] * (len(evict) + len(fetch))
        out.append(w)
        if w.phase in ("B", "W"):
            backs[w.chunk] = backs.get(w.chunk, 0) + 1
            if backs[w.chunk] == m:
                out.append(TURN)
    return out + [TURN] * len(active)


def posting_order(orders: dict[int, list[Work]], pp: int, v: int) -> dict[int, list[Post]]:
    """Each rank's passes with the transfers it posts, in posting order, from every rank's
    compute order (``orders[rank]``; virtual stage of chunk ``c`` on rank ``r`` = ``c pp + r``)."""
    last = pp * v - 1
    m = max((w.microbatch for ws in orders.values() for w in ws), default=-1) + 1
    todo = {r: _lowered(list(ws), m) for r, ws in orders.items() if ws}
    out: dict[int, list[Post]] = {r: [] for r in orders}
    seen: dict[int, set] = {r: set() for r in orders}
    rank_of = lambda vs: vs % pp  # noqa: E731 (the interleaved placement)

    def ready(r: int, w: Work) -> bool:
        vs = w.chunk * pp + r
        if w.phase == "F" and vs > 0:
            return ("R", "F", vs, w.microbatch) in seen[r] or ("C", "F", vs - 1,
                                                               w.microbatch) in seen[r]
        if w.phase == "B" and vs < last:
            return ("R", "B", vs, w.microbatch) in seen[r] or ("C", "B", vs + 1,
                                                               w.microbatch) in seen[r]
        return True

    while todo:
        progress = False
        for r in sorted(todo):
            w = todo[r][0]
            if isinstance(w, str):  # a turn that posts nothing
                todo[r].pop(0)
                if not todo[r]:
                    del todo[r]
                progress = True
                continue
            if not ready(r, w):
                continue
            vs = w.chunk * pp + r
            out[r].append(Post("C", w.phase, vs, w.microbatch, w))
            seen[r].add(("C", w.phase, vs, w.microbatch))
            dst_vs = vs + 1 if w.phase == "F" else vs - 1
            if 0 <= dst_vs <= last and rank_of(dst_vs) != r:
                out[r].append(Post("S", w.phase, vs, w.microbatch))
                dst = rank_of(dst_vs)
                out[dst].append(Post("R", w.phase, dst_vs, w.microbatch))
                seen[dst].add(("R", w.phase, dst_vs, w.microbatch))
            todo[r].pop(0)
            if not todo[r]:
                del todo[r]
            progress = True
        if not progress:
            raise ValueError("a compute order whose transfers cannot be placed")
    return out
