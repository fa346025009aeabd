"""DualPipe and DualPipeV in ``plan``'s analytic estimate (:mod:`simulator.plan_estimate`).

DeepSeek-V3's DualPipe (arXiv:2412.19437, Section 3.2.1) and its "cut-in-half" V put two model
stages on each pipeline rank and run, in the steady state, a forward chunk of one micro-batch
beside a backward chunk of another, so that each one's expert-parallel all-to-all hides
behind the other's compute; some backwards run their input gradients (``I``) first and their
weight gradients (``W``) later, in what would be bubbles. The engine runs each rank's order of
:func:`simulator.parallel.schedules.dualpipe` / ``dualpipev``; this module prices the same
order without the network:

* per kind of model stage (its dense and MoE layers, embedding, head), ``F``, ``B``, ``I`` and
  ``W`` from the stage programs the engine replays, each alone as
  :func:`~simulator.engine.program.program_time` prices it, and every forward / backward pair
  the order has as :func:`~simulator.engine.combined.pair_schedule` runs it (the engine's own
  paired step, kernels slowed beside the all-to-all by the same measured or DeepEP-SM
  fraction);
* :func:`walk`: the ranks' orders played against each other -- a forward needs the previous
  stage's forward of that micro-batch, a backward (or ``I``) the next stage's backward, a pair
  waits for both, ``W`` for nothing; an output for another rank arrives one pipeline transfer
  after it ends, transfers between two ranks one after the other (they share those links;
  nothing moves where the next stage is on the same rank, DualPipeV's turn). That gives each
  rank's end, busy time, kernel time and exposed collectives; what it leaves idle is the
  bubble (waiting on transfers included), which is DeepSeek's Table 2 ``(PP/2 - 1)(F&B + B -
  3W)`` where the chunks are equal (the closed form is held to the engine in
  ``tests/test_dualpipe.py``).

Against ``run`` (``tests/test_plan_dualpipe.py``): DeepSeek-V3 as shipped (2,048 H800, PP 16,
EP 64) 14.15 s against 14.14 s; a small MoE on 8 one-GPU nodes within 1 %.

Memory (the pre-screen, :meth:`simulator.plan_estimate.Estimator.memory_bytes`) counts both
stages' model states on every rank (DualPipe: its "2x parameters", the gradients reduced with
the mirrored rank and ZeRO sharding over both; DualPipeV: one copy) and the activations of the
(micro-batch, chunk) forwards in flight along the rank's order, at the end of a forward; a
pair's backward frees before its forward counts, a lower bound of the engine's interleaving
of the two (DeepSeek-V3 as shipped: exact; 8 stages of 8 layers: 2 % under), so the screen
never drops a layout that fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

from simulator.engine.build import GRAD_DIMS
from simulator.engine.combined import chain_items, pair_schedule
from simulator.engine.program import StagePrograms, program_time
from simulator.engine.split import split_segments
from simulator.hardware.precision import weight_bytes
from simulator.model.moe import beside_ep_slowdown, ep_comm_extra
from simulator.model.ops import DTYPE_BYTES
from simulator.model.sync import group_sync_factor, sync_group_size
from simulator.parallel.schedules import (
    Work,
    chunks_per_rank,
    schedule,
    stage_rank,
    virtual_stage,
)

#: The schedules this module estimates.
DUAL = ("dualpipe", "dualpipev")


#: Suffix of a gradient-reduction kind over DualPipe's mirrored ranks
#: (:meth:`simulator.plan_estimate.Estimator._exact`).
MIRROR = "+mirror"


def joined(per_end) -> tuple[tuple[int, ...], ...]:
    """The i-th groups of each list joined (DualPipe: a stage's group and its mirror's)."""
    return tuple(sum(gs, ()) for gs in zip(*[[tuple(g) for g in x] for x in per_end], strict=True))


def holders(sched: str) -> int:
    """Pipeline ranks holding each stage: two under DualPipe (rank i and its mirror
    pp - 1 - i, whose gradients are reduced together and whose states ZeRO shards over both),
    else one."""
    return 2 if sched == "dualpipe" else 1


def is_dual(name: str) -> bool:
    """Whether ``name`` is DualPipe or DualPipeV."""
    return name in DUAL


def rank_stages(name: str, stage: int, pp: int, v: int) -> list[int]:
    """The model stages (virtual stages) pipeline rank ``stage`` holds, by chunk."""
    return [virtual_stage(name, stage, c, pp) for c in range(chunks_per_rank(name, v))]


def chunk_segments(progs: StagePrograms, stage_layers, vs: int, last_vs: int):
    """The (label, layer, program) segments of a forward and of a backward pass through model
    stage ``vs``, as the engine lists them (``Engine._chunk_segments``)."""
    start = sum(stage_layers[:vs])
    layers = range(start, start + stage_layers[vs])
    fwd = [("embed", -1, progs.embed_fwd)] if vs == 0 else []
    fwd += [(f"L{i} fwd", i, progs.layer(i)[0]) for i in layers]
    bwd = [("head", -1, progs.head_bwd)] if vs == last_vs else []
    if vs == last_vs:
        fwd.append(("head", -1, progs.head_fwd))
    for i in reversed(layers):
        _, b, rec = progs.layer(i)
        bwd += ([(f"L{i} recompute", i, rec)] if rec else []) + [(f"L{i} bwd", i, b)]
    if vs == 0:
        bwd.append(("embed", -1, progs.embed_bwd))
    return fwd, bwd


@dataclass(frozen=True)
class Pass:
    """One pass alone or one pair: seconds on the GPU, kernel seconds, exposed collectives per
    dimension, and when its outputs are ready (offsets from its start: ``(F, B)``)."""

    total: float
    comp: float
    exposed: tuple[tuple[str, float], ...]
    ends: tuple[float, float]


class ChunkTimes:
    """The passes of every chunk of one layout, priced once per kind of model stage (its
    leading dense layers, other layers, and whether it holds the embedding or the head)."""

    def __init__(self, progs: StagePrograms, stage_layers, last_vs: int, interference: float,
                 ep_interference: float, slowdown: float = 1.0,
                 comm_extra=None):  # fmt: skip
        """``slowdown``: the factor on every kernel's time (the engine's per-GPU slowdown: the
        group's expected slowest GPU, :func:`simulator.model.sync.group_sync_factor`);
        ``comm_extra``: an EP collective's slowdown beside kernels
        (:func:`simulator.model.moe.ep_comm_extra`)."""
        self.progs, self.stage_layers, self.last_vs = progs, stage_layers, last_vs
        self.i, self.ie, self.slowdown = interference, ep_interference, slowdown
        self.ce = comm_extra
        self._kind: dict[int, tuple] = {}
        self._segs: dict[tuple, tuple[list, list]] = {}
        self._alone: dict[tuple, Pass] = {}
        self._pairs: dict[tuple, Pass] = {}

    def kind(self, vs: int) -> tuple:
        """What the passes of stage ``vs`` depend on (stages of one kind run the same)."""
        hit = self._kind.get(vs)
        if hit is None:
            start, n = sum(self.stage_layers[:vs]), self.stage_layers[vs]
            kinds = tuple(self.progs.kind(i) for i in range(start, start + n))
            hit = self._kind[vs] = (vs == 0, vs == self.last_vs, kinds)
            if hit not in self._segs:
                self._segs[hit] = chunk_segments(self.progs, self.stage_layers, vs, self.last_vs)
        return hit

    def segments(self, vs: int) -> tuple[list, list]:
        return self._segs[self.kind(vs)]

    def alone(self, vs: int, phase: str) -> Pass:
        """Pass ``phase`` (F, B, I or W) of stage ``vs`` run alone."""
        key = (self.kind(vs), phase)
        hit = self._alone.get(key)
        if hit is None:
            fwd, bwd = self.segments(vs)
            segs = {"F": fwd, "B": bwd}.get(phase)
            if segs is None:
                inputs, weights = split_segments(bwd)
                segs = inputs if phase == "I" else weights
            total = comp = 0.0
            exposed: dict[str, float] = {}
            for _, _, prog in segs:
                t, c, x = program_time(prog, self.slowdown, self.i)
                total, comp = total + t, comp + c
                for dim, s in x:
                    exposed[dim] = exposed.get(dim, 0.0) + s
            hit = self._alone[key] = Pass(total, comp, tuple(exposed.items()), (total, total))
        return hit

    def pair(self, vs_f: int, vs_b: int) -> Pass:
        """A forward of stage ``vs_f`` beside a backward of stage ``vs_b`` (the engine's
        combined step)."""
        key = (self.kind(vs_f), self.kind(vs_b))
        hit = self._pairs.get(key)
        if hit is None:
            f, _ = self.segments(vs_f)
            _, b = self.segments(vs_b)
            k = self.slowdown
            ce = self.ce
            r = pair_schedule(chain_items(f, k, self.i, ce), chain_items(b, k, self.i, ce),
                              self.ie)  # fmt: skip
            hit = self._pairs[key] = Pass(r.total, r.comp, r.exposed,
                                          (r.fwd_segs[-1][1], r.bwd_segs[-1][1]))
        return hit


@dataclass
class Walk:
    """What :func:`walk` found, per pipeline rank."""

    end: list[float]  # when the rank's last pass ends
    busy: list[float]  # seconds its GPU runs passes
    comp: list[float]  # of them, kernel seconds
    exposed: list[dict[str, float]] = field(default_factory=list)  # collectives per dimension
    last_b: list[float] = field(default_factory=list)  # a backward of its chunks, seconds


@lru_cache(maxsize=256)
def _compiled(name: str, pp: int, m: int, v: int) -> tuple:
    """Every rank's order of ``name`` as ``(alone, pass, needs, makes)`` entries: ``pass`` is
    ``(stage, phase)`` of a pass alone or ``(forward stage, backward stage)`` of a pair,
    ``needs`` the outputs it waits for, ``makes`` the ``(output, consumer rank)`` it produces
    in the order of :attr:`Pass.ends` (an output is ``(F|B, micro-batch, stage)``; DualPipe's
    micro-batches of one chunk go one way through the ranks, those of the other the other
    way; None: a W pass)."""
    last_vs = pp * v - 1
    stages = [rank_stages(name, r, pp, v) for r in range(pp)]
    out = []
    for r in range(pp):
        entries = []
        for item in schedule(name, r, pp, m, v):
            ws = (item,) if isinstance(item, Work) else item
            needs, makes = [], []
            for w in ws:
                vs = stages[r][w.chunk]
                if w.phase == "W":
                    makes.append(None)
                    continue
                fwd = w.phase == "F"
                src, dst = (vs - 1, vs + 1) if fwd else (vs + 1, vs - 1)
                if 0 <= src <= last_vs:
                    needs.append(("F" if fwd else "B", w.microbatch, src))
                to = stage_rank(name, dst, w.chunk, pp) if 0 <= dst <= last_vs else r
                makes.append((("F" if fwd else "B", w.microbatch, vs), to))
            key = ((stages[r][item.chunk], item.phase) if isinstance(item, Work)
                   else (stages[r][item[0].chunk], stages[r][item[1].chunk]))  # fmt: skip
            entries.append((isinstance(item, Work), key, tuple(needs), tuple(makes)))
        out.append(tuple(entries))
    return tuple(out), tuple(tuple(s) for s in stages)


def walk(name: str, pp: int, m: int, v: int, times: ChunkTimes,
         send_s: dict[tuple[int, int], float]) -> Walk:  # fmt: skip
    """Play every rank's order of ``name`` (module docstring) with passes priced by ``times``
    and ``send_s[(from, to)]`` seconds per pipeline transfer between neighbouring ranks, the
    transfers from one rank to another one after the other (they share its links)."""
    orders, stages = _compiled(name, pp, m, v)
    ready: dict[tuple[str, int, int], float] = {}  # output -> when its consumer has it
    link_free: dict[tuple[int, int], float] = {}  # (from, to) -> when its last transfer ends
    out = Walk([0.0] * pp, [0.0] * pp, [0.0] * pp, [{} for _ in range(pp)],
               [max(times.alone(vs, "B").total for vs in stages[r]) for r in range(pp)])
    idx = [0] * pp
    passes: dict[tuple, Pass] = {}
    progress = True
    while progress:
        progress = False
        for r in range(pp):
            order, i, t = orders[r], idx[r], out.end[r]
            busy = comp = 0.0
            exposed = out.exposed[r]
            while i < len(order):
                alone, key, needs, makes = order[i]
                start = t
                for dep in needs:
                    at = ready.get(dep)
                    if at is None:
                        break
                    start = max(start, at)
                else:
                    ps = passes.get(key)
                    if ps is None:
                        ps = passes[key] = times.alone(*key) if alone else times.pair(*key)
                    for made, end in zip(makes, ps.ends, strict=False):
                        if made is None:
                            continue
                        out_key, to = made
                        at = start + end
                        if to != r:  # sent once the link has carried the earlier ones
                            at = link_free[(r, to)] = max(at, link_free.get((r, to), 0.0)) \
                                + send_s[(r, to)]
                        ready[out_key] = at
                    t = start + ps.total
                    busy, comp = busy + ps.total, comp + ps.comp
                    for dim, x in ps.exposed:
                        exposed[dim] = exposed.get(dim, 0.0) + x
                    i += 1
                    continue
                break
            if i > idx[r]:
                progress = True
                idx[r], out.end[r] = i, t
                out.busy[r] += busy
                out.comp[r] += comp
    if any(i < len(o) for i, o in zip(idx, orders, strict=True)):
        raise ValueError(f"{name}: the ranks' orders wait on each other (pp={pp}, m={m})")
    return out


def estimate_dual(est, cand, res, out):
    """The step of DualPipe / DualPipeV layout ``cand`` into :class:`~simulator.plan_estimate.
    Estimate` ``out``, with the programs, collective costs and tails of the
    :class:`~simulator.plan_estimate.Estimator` ``est``: every rank's order played
    (:func:`walk`) with transfers between neighbouring ranks both ways, then each rank's tail
    (its gradient reduction, with the mirrored rank under DualPipe; optimizer; ZeRO-1/2
    parameter gather); the rank that ends last sets the step."""
    t, sched = est.work.training, cand.pp_schedule
    pp, v, m = res.size("pp"), res.virtual_stages, res.microbatches
    progs = est.programs(cand, res)
    send = {(a, b): est._send_s(cand, res, a, b)
            for r in range(pp - 1) for a, b in ((r, r + 1), (r + 1, r))}  # fmt: skip
    # every kernel at the expected slowest GPU of the group that meets at each layer, as the
    # engine runs it (simulator/model/sync.py)
    sync = group_sync_factor(sync_group_size(res.size("tp"), res.size("cp"), res.ep, res.etp,
                                             est.work.model.moe is not None),
                             est.machine.gpu.sync_jitter)  # fmt: skip
    # (ZeRO and the training knobs change neither the passes nor the walk: cached)
    key = (id(progs), res.stage_layers, sched, pp, m, v, tuple(sorted(send.items())), sync)
    wk = est._walks.get(key)
    if wk is None:
        i = est.interference
        ie = i if est.work.model.moe is None else beside_ep_slowdown(
            i, t.moe_dispatcher, est.machine.gpu.sm_count)  # fmt: skip
        ce = ep_comm_extra(est.nccl, est.machine.gpu.name, res.ep,
                           t.moe_dispatcher, est.machine.gpu.sm_count, est.deepep_copies(res),
                           ) if est.work.model.moe is not None else None  # fmt: skip
        times = ChunkTimes(progs, res.stage_layers, pp * v - 1, i, ie, sync, ce)
        wk = est._walks[key] = walk(sched, pp, m, v, times, send)
    pb, gb = weight_bytes(t, DTYPE_BYTES[t.param_dtype])[1], DTYPE_BYTES[t.grad_reduce_dtype]
    h, z, nch = holders(sched), cand.zero >= 1, chunks_per_rank(sched, v)
    shard, edp = math.prod(res.size(d) for d in GRAD_DIMS) * h, est._edp(res) * h
    ends = []
    for r in range(pp):
        dp_x = est._reduction_s(cand, res, r, nch * wk.last_b[r], gb)
        dense, expert = est._stage_local(res, r, sched)
        opt = est._optimizer_s(dense / (shard if z else 1) + expert / (edp if z else 1))
        gather = est._param_gather_s(res, r, pb, sched) if cand.zero in (1, 2) else 0.0
        ends.append((wk.end[r] + dp_x + opt + gather, -r, dp_x + gather, opt))
    step, r, dp_s, opt_s = max(ends)
    r = -r
    out.step_time_s = step
    out.tokens_per_s = t.global_batch * est.work.model.seq_len / step
    x = wk.exposed[r]
    out.breakdown_s = {
        "compute": wk.comp[r],
        "tp_comm": x.get("tp", 0.0),
        "cp_comm": x.get("cp", 0.0),
        "ep_comm": x.get("ep", 0.0),
        "dp_comm": dp_s,
        "pp_comm": 0.0,  # (waiting on pipeline transfers is idle time: in the bubble)
        "pp_bubble": wk.end[r] - wk.busy[r],
        "pp_imbalance": 0.0,
        "optimizer": opt_s,
        "other": max(0.0, wk.busy[r] - wk.comp[r] - sum(x.values())),
    }
    return out
