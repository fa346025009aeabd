"""Pipeline schedules as generators of per-stage work orders.

A schedule gives, for each pipeline stage, the order in which its compute stream runs forward
(``"F"``) and backward (``"B"``) passes of (micro-batch, model chunk). Dependencies between
stages are implied: ``F(mb)`` of virtual stage ``vs`` needs ``F(mb)`` of ``vs - 1``; ``B(mb)`` of
``vs`` needs ``B(mb)`` of ``vs + 1`` (and its own forward).

* GPipe (Huang et al. 2019): all forwards, then all backwards. Bubble fraction
  ``(p - 1) / (m + p - 1)``; all ``m`` micro-batches' activations are alive at once.
* 1F1B (PipeDream-Flush, Narayanan et al. 2021): stage ``s`` runs ``p - s - 1`` warm-up
  forwards, then alternates one forward and one backward, then drains. Same bubble as GPipe, at
  most ``p - s`` micro-batches in flight.
* Interleaved 1F1B (Narayanan et al. SC21, Megatron-LM): each stage holds ``v`` model chunks;
  warm-up ``(p - s - 1) * 2 + (v - 1) * p`` virtual micro-batches; the bubble shrinks by ``v``.
  The order follows Megatron-LM's ``forward_backward_pipelining_with_interleaving``.
* DualPipe (DeepSeek-V3, arXiv:2412.19437 Section 3.2.1; the order of phases of DeepSeek's
  public ``dualpipe/dualpipe.py``): ``pp`` (even) ranks, the model in ``pp`` stages, rank ``r``
  holding stages ``r`` (chunk 0) and ``pp - 1 - r`` (chunk 1); half of the micro-batches enter
  at rank 0 and run through chunk 0 of every rank, the other half enter at rank ``pp - 1`` and
  run through chunk 1. In the steady state a forward of one direction runs beside a backward
  of the other (a pair, as combined 1F1B runs it), and some backwards compute only the input
  gradients (``"I"``), their weight gradients (``"W"``) deferred to fill bubbles.
* DualPipeV (Sea AI Lab's "cut-in-half" DualPipe, DeepSeek's ``dualpipe/dualpipev.py``): the
  same order on ``pp`` ranks holding ``2 pp`` stages in a V (rank ``i``: stages ``i`` and
  ``2 pp - 1 - i``), every micro-batch entering at rank 0; one copy of the parameters.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple


class Work(NamedTuple):
    """One pass of one micro-batch through one model chunk on one stage."""

    #: "F" forward, "B" backward; DualPipe also "I" (a backward's input gradients only) and
    #: "W" (the weight gradients of an earlier "I" of the same micro-batch and chunk)
    phase: str
    microbatch: int
    chunk: int


def gpipe(stage: int, pp: int, m: int) -> list[Work]:
    return [Work("F", i, 0) for i in range(m)] + [Work("B", i, 0) for i in range(m)]


def one_f_one_b(stage: int, pp: int, m: int) -> list[Work]:
    warmup = min(pp - stage - 1, m)
    order = [Work("F", i, 0) for i in range(warmup)]
    for i in range(m - warmup):
        order.append(Work("F", warmup + i, 0))
        order.append(Work("B", i, 0))
    order += [Work("B", i, 0) for i in range(m - warmup, m)]
    return order


def interleaved(stage: int, pp: int, m: int, v: int, extra: int = 0) -> list[Work]:
    """Megatron-LM's interleaved 1F1B; needs ``m % pp == 0``."""
    total = m * v
    if m == pp:
        warmup = total
    else:
        warmup = min((pp - stage - 1) * 2 + (v - 1) * pp + extra, total)

    def chunk(k: int, forward: bool) -> int:
        c = (k % (pp * v)) // pp
        return c if forward else v - c - 1

    def mb(k: int) -> int:
        return (k // (pp * v)) * pp + k % pp

    order = [Work("F", mb(k), chunk(k, True)) for k in range(warmup)]
    for k in range(total - warmup):
        f = warmup + k
        order.append(Work("F", mb(f), chunk(f, True)))
        order.append(Work("B", mb(k), chunk(k, False)))
    order += [Work("B", mb(k), chunk(k, False)) for k in range(total - warmup, total)]
    return order


def dualpipe(stage: int, pp: int, m: int) -> list[Work | tuple[Work, Work]]:
    """DualPipe's order on rank ``stage`` (module docstring): ``pp`` even, ``m`` even and at
    least ``2 pp`` (as DeepSeek's implementation asserts). Micro-batches ``0 .. m/2 - 1`` go
    through chunk 0 (stages on ranks ``0 .. pp - 1``), ``m/2 .. m - 1`` through chunk 1 (ranks
    ``pp - 1 .. 0``). A tuple is a pair run together (forward, backward).

    With ``n = pp / 2`` and ``h = min(stage, pp - 1 - stage)``, in DualPipe's terms (phase 0 is
    the rank's chunk of stage ``h``, phase 1 that of stage ``pp - 1 - h``): ``2 (n - h - 1)``
    F0; ``h + 1`` times F0 F1; ``n - h - 1`` times I1 W F1; ``m/2 - pp + h + 1`` times the pairs
    (F0, B1) (F1, B0) (the middle ranks run their first F0 and B1 apart); ``n - h - 1`` times
    B1 (F1, B0); ``h + 1`` times B1 B0, the second half of them as I; ``n - h - 1`` times W I0;
    ``h + 1`` W. The W are run first in, first out."""
    if pp % 2 or m % 2 or m < 2 * pp:
        raise ValueError(f"DualPipe needs an even pp and an even number of micro-batches of at "
                         f"least 2 pp, got pp={pp}, {m} micro-batches")
    half = m // 2
    second = int(stage >= pp // 2)  # on the second half of the ranks, phase 0 is chunk 1
    return _dual_order(pp // 2, min(stage, pp - 1 - stage), half,
                       lambda phase: phase ^ second, lambda c, k: c * half + k)  # fmt: skip


def dualpipev(stage: int, pp: int, m: int) -> list[Work | tuple[Work, Work]]:
    """DualPipeV's order on rank ``stage`` (Sea AI Lab's "cut-in-half" of DualPipe, in
    DeepSeek's ``dualpipe/dualpipev.py``): ``pp`` ranks, ``2 pp`` stages in a V, rank ``i``
    holding stages ``i`` (chunk 0) and ``2 pp - 1 - i`` (chunk 1); every micro-batch enters at
    rank 0, runs down chunk 0 to rank ``pp - 1`` and back up chunk 1. DualPipe's order with
    ``n = pp``, ``h = stage``, phase ``c`` = chunk ``c`` and all ``m >= 2 pp`` micro-batches
    through both chunks."""
    if m < 2 * pp:
        raise ValueError(f"DualPipeV needs at least 2 pp micro-batches, got pp={pp}, {m}")
    return _dual_order(pp, stage, m, lambda phase: phase, lambda c, k: k)


def _dual_order(n: int, h: int, per_chunk: int, chunk_of, mb_of) -> list[Work | tuple[Work, Work]]:
    """The order of DualPipe's phases (see :func:`dualpipe`) for half-rank ``h`` of ``n``, with
    ``per_chunk`` micro-batches through each chunk: ``chunk_of(phase)`` is the chunk of phase
    0 or 1, ``mb_of(chunk, k)`` the ``k``-th micro-batch through ``chunk``."""
    n_f, n_b = [0, 0], [0, 0]
    deferred: deque[Work] = deque()

    def f(phase: int) -> Work:
        c = chunk_of(phase)
        n_f[c] += 1
        return Work("F", mb_of(c, n_f[c] - 1), c)

    def b(phase: int, split: bool = False) -> Work:
        c = chunk_of(phase)
        n_b[c] += 1
        mb = mb_of(c, n_b[c] - 1)
        if split:
            deferred.append(Work("W", mb, c))
        return Work("I" if split else "B", mb, c)

    order: list[Work | tuple[Work, Work]] = [f(0) for _ in range(2 * (n - h - 1))]
    for _ in range(h + 1):
        order += [f(0), f(1)]
    for _ in range(n - h - 1):
        order += [b(1, True), deferred.popleft(), f(1)]
    for i in range(per_chunk - 2 * n + h + 1):
        if i == 0 and h == n - 1:  # DualPipe does not overlap these two, to shorten the bubble
            order += [f(0), b(1)]
        else:
            order.append((f(0), b(1)))
        order.append((f(1), b(0)))
    for _ in range(n - h - 1):
        order += [b(1), (f(1), b(0))]
    split = False
    for i in range(h + 1):
        split |= i == (h + 1) // 2 and h % 2 == 1
        order.append(b(1, split))
        split |= i == (h + 1) // 2 and h % 2 == 0
        order.append(b(0, split))
    for _ in range(n - h - 1):
        order += [deferred.popleft(), b(0, True)]
    order += [deferred.popleft() for _ in range(h + 1)]
    return order


def virtual_stage(name: str, stage: int, chunk: int, pp: int) -> int:
    """The model stage (virtual stage) that chunk ``chunk`` of rank ``stage`` holds:
    ``chunk * pp + stage``; DualPipe's chunk 1 is stage ``pp - 1 - stage``, DualPipeV's
    ``2 pp - 1 - stage``."""
    if name in ("dualpipe", "dualpipev") and chunk == 1:
        return (pp if name == "dualpipe" else 2 * pp) - 1 - stage
    return chunk * pp + stage


def stage_rank(name: str, vs: int, chunk: int, pp: int) -> int:
    """The rank that runs model stage ``vs`` for the micro-batches of ``chunk`` (the inverse
    of :func:`virtual_stage`)."""
    if name == "dualpipe":
        return vs if chunk == 0 else pp - 1 - vs
    if name == "dualpipev":
        return vs if vs < pp else 2 * pp - 1 - vs
    return vs % pp


def chunks_per_rank(name: str, v: int) -> int:
    """Model chunks a rank holds: ``v`` (the interleaved schedule's virtual stages; two for
    DualPipeV), two for DualPipe (two stages, each of them also held by the mirrored rank)."""
    return 2 if name == "dualpipe" else v


def mirror(name: str, stage: int, pp: int) -> int | None:
    """DualPipe: the rank holding the same two stages (their gradients are summed with it);
    None for the other schedules."""
    return pp - 1 - stage if name == "dualpipe" else None


#: Pipeline schedules by name: each gives a stage's work order from ``(stage, pp, m, v)``
#: (``v``, the model chunks per stage, only matters to the interleaved one).
SCHEDULES = {
    "gpipe": lambda stage, pp, m, v: gpipe(stage, pp, m),
    "1f1b": lambda stage, pp, m, v: one_f_one_b(stage, pp, m),
    "interleaved": interleaved,
    "dualpipe": lambda stage, pp, m, v: dualpipe(stage, pp, m),
    "dualpipev": lambda stage, pp, m, v: dualpipev(stage, pp, m),
}


def schedule(name: str, stage: int, pp: int, m: int, v: int = 1, combine: bool = False) -> list[Work]:
    """The work order of ``stage`` for schedule ``name`` (a key of :data:`SCHEDULES`).

    ``combine``: the order Megatron-Core runs with ``overlap_moe_expert_parallel_comm``
    (schedules.py, which pairs only in its interleaved path; 1F1B is that path with one model
    chunk): the interleaved warm-up ``2 (pp - stage - 1) + (v - 1) pp`` plus one forward, so
    that each steady-state forward and the backward after it belong to independent
    micro-batches and a stage's paired step does not wait on its neighbour's paired step
    (:func:`combined` turns them into steps)."""
    if combine and name in ("1f1b", "interleaved"):
        return interleaved(stage, pp, m, v if name == "interleaved" else 1, extra=1)
    try:
        fn = SCHEDULES[name]
    except KeyError:
        raise ValueError(f"unknown pipeline schedule {name!r}") from None
    return fn(stage, pp, m, v)


def combined(order: list[Work], m: int) -> list[Work | tuple[Work, Work]]:
    """Combined 1F1B (Megatron-Core's ``overlap_moe_expert_parallel_comm``; see
    :mod:`simulator.engine.combined`): every forward immediately followed by a backward of
    another micro-batch -- the steady state of a 1F1B order with one more warm-up forward --
    becomes one step ``(forward, backward)`` that runs both together. Warm-up forwards and
    cool-down backwards stay alone, and so does a backward of the last micro-batch (its
    gradients fill the reduction buckets layer by layer; it is in the cool-down anyway)."""
    out: list[Work | tuple[Work, Work]] = []
    i = 0
    while i < len(order):
        w = order[i]
        nxt = order[i + 1] if i + 1 < len(order) else None
        if (w.phase == "F" and nxt is not None and nxt.phase == "B"
                and nxt.microbatch != w.microbatch and nxt.microbatch != m - 1):  # fmt: skip
            out.append((w, nxt))
            i += 2
        else:
            out.append(w)
            i += 1
    return out


def max_in_flight(order: list[Work]) -> int:
    """Most (micro-batch, chunk) forwards whose backward has not yet run, along ``order``."""
    live, peak = 0, 0
    for item in order:
        for w in (item,) if isinstance(item, Work) else item:
            live += {"F": 1, "W": 0}.get(w.phase, -1)
            peak = max(peak, live)
    return peak


#: Per-device parameter copies and micro-batches of activations in flight of the schedules of
#: DeepSeek-V3's Table 2 (arXiv:2412.19437, Section 3.2.1), with ``pp`` pipeline ranks.
TABLE2_MEMORY = {
    "1f1b": lambda pp: (1, pp),
    "zb1p": lambda pp: (1, pp),
    "dualpipe": lambda pp: (2, pp + 1),
}


def table2_bubble(name: str, pp: int, f: float, b: float, w: float = 0.0,
                  f_and_b: float = 0.0) -> float:  # fmt: skip
    """Pipeline bubble of a schedule as DeepSeek-V3's Table 2 gives it (arXiv:2412.19437,
    Section 3.2.1): 1F1B ``(PP - 1)(F + B)``; ZB1P (zero bubble, Qi et al. 2023)
    ``(PP - 1)(F + B - 2W)``; DualPipe ``(PP / 2 - 1)(F&B + B - 3W)``, with ``F`` a forward
    chunk, ``B`` a full backward chunk, ``W`` its weight-gradient part and ``F&B`` a forward
    and a backward chunk run overlapped. DualPipe needs an even ``pp``.

    The report's closed form: ``benchmarks/dualpipe_estimate.py`` applies it to the
    simulator's chunk times, and the tests hold the engine's DualPipe (:func:`dualpipe`) to
    it where ``W = F`` and ``B = 2 F``. With ``W != F`` the bubble of that order differs
    from the closed form (less, by at most one ``F``, in the cases checked)."""
    if name == "1f1b":
        return (pp - 1) * (f + b)
    if name == "zb1p":
        return (pp - 1) * (f + b - 2 * w)
    if name == "dualpipe":
        if pp % 2:
            raise ValueError(f"DualPipe needs an even number of pipeline ranks, got {pp}")
        return (pp // 2 - 1) * (f_and_b + b - 3 * w)
    raise ValueError(f"unknown schedule {name!r} (accepted: 1f1b, zb1p, dualpipe)")

