"""Combined 1F1B: the forward of one micro-batch beside the backward of another, so that the
expert-parallel all-to-alls of each run while the other computes.

What the frameworks do (facts; the code here is this project's own):

* Megatron-Core's ``overlap_moe_expert_parallel_comm`` ("Combined 1F1B: Expert-Parallel
  All-to-All Overlap", Megatron-Core user guide; ``megatron/core/pipeline_parallel/
  combined_1f1b.py`` and ``schedules.py``): in the steady state each 1F1B step runs the forward
  of one micro-batch and the backward of another together, layer by layer, on a compute and a
  communication stream; the EP dispatch and combine of one are hidden behind the attention and
  MLP compute of the other, and vice versa. The dependency chain inside one micro-batch
  (attention -> dispatch -> experts -> combine -> next layer) is unchanged. The warm-up runs one
  more forward than plain 1F1B so that the paired forward and backward belong to independent
  micro-batches (one more micro-batch of activations in flight); warm-up forwards and
  cool-down backwards run alone. With pipeline parallelism Megatron-Core needs the interleaved
  schedule; here plain 1F1B is paired the same way, as DeepSeek-V3's DualPipe pairs a forward
  and a backward chunk of different micro-batches (arXiv:2412.19437, Section 3.2.1).
* A GPU's kernels run slower while an NCCL kernel shares it (the measured ``interference``
  of the machine); the all-to-all itself is taken at its own cost.

:func:`pair_schedule` is the steady-state step: two chains of items (GPU work, or an EP
collective on the communication stream), each item after the previous one of its chain, each
stream running one item at a time, an item starting as soon as its chain and its stream are
free (on a tie, the longer-waiting chain first, then the backward). With GPU work ``c_i`` and
collectives ``a_i`` alternating it takes between ``max(sum c, sum a)`` and ``sum c + sum a``
(run alone, one after the other).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simulator.engine.program import Part, Program, program_time
from simulator.model.ops import HOST_SYNC
from simulator.parallel.schedules import Work

#: the parallel dimension whose collectives run on the communication stream when paired
EP_DIM = "ep"


@dataclass(frozen=True)
class Item:
    """One piece of a chain: GPU work (``comm`` False: kernels and the collectives of other
    dimensions that hold the compute stream) or one EP collective (``comm`` True)."""

    seg: int  # index of the segment (a layer, the embedding, the head) it belongs to
    comm: bool
    dur: float  # seconds alone (GPU work: with the straggler slowdown)
    comp: float = 0.0  # of ``dur``, kernel time (slowed while a collective runs beside it)
    exposed: tuple[tuple[str, float], ...] = ()  # GPU work: other dimensions' collectives


@dataclass(frozen=True)
class PairResult:
    """A combined step: wall time, kernel seconds, exposed collective seconds per dimension,
    and each chain's segments as ``(start, end)`` offsets from the step's start."""

    total: float
    comp: float
    exposed: tuple[tuple[str, float], ...]
    fwd_segs: tuple[tuple[float, float], ...]
    bwd_segs: tuple[tuple[float, float], ...]


def _comm_stream(prog: Program, k: int) -> bool:
    """Whether part ``k`` runs on the EP communication stream when paired: an EP collective,
    except a count exchange the compute stream runs before a permutation. Megatron-Core's
    alltoall dispatcher exchanges the counts in its ``preprocess``, which the combined 1F1B
    schedule runs in the pre-dispatch computation node, with the router and the permutation
    (``megatron/core/models/gpt/fine_grained_callables.py``); DeepEP's count exchange is part
    of its dispatch, on the communication stream, where the dispatch follows it directly."""
    part = prog[k]
    if part.kind != "comm" or part.dim != EP_DIM:
        return False
    if part.name != "moe_counts":
        return True
    nxt = next((q for q in prog[k + 1:] if q.kind != HOST_SYNC), None)
    return nxt is not None and nxt.kind == "comm" and nxt.dim == EP_DIM


def chain_items(segs: Sequence[tuple[str, int, Program]], slowdown: float,
                interference: float) -> list[Item]:  # fmt: skip
    """A pass's segments as a chain: each segment's parts split at the collectives of the EP
    communication stream (:func:`_comm_stream`); the GPU work between them priced as
    :func:`program_time` prices a program run alone."""
    items: list[Item] = []
    for i, (_, _, prog) in enumerate(segs):
        n0 = len(items)
        run: list[Part] = []
        for k, part in enumerate((*prog, None)):  # None: the end of the segment
            if part is not None and part.kind == HOST_SYNC:
                continue  # the host's wait: no GPU work (the host is not modelled here)
            if part is None or _comm_stream(prog, k):
                if run:
                    total, comp, exposed = program_time(tuple(run), slowdown, interference)
                    items.append(Item(i, False, total, comp, exposed))
                    run = []
                if part is not None:
                    items.append(Item(i, True, part.dur))
            else:
                run.append(part)
        if len(items) == n0:
            items.append(Item(i, False, 0.0))  # an empty segment still has a place in time
    return items


def pair_schedule(fwd: Sequence[Item], bwd: Sequence[Item], interference: float) -> PairResult:
    """Run a forward chain and a backward chain together on one GPU (module docstring).

    GPU work runs ``1 + interference * comp / dur`` times slower for the part of it during
    which a collective runs (only its kernels slow down)."""
    chains = (bwd, fwd)
    idx, ready, busy = [0, 0], [0.0, 0.0], [False, False]
    spans: tuple[dict[int, list[float]], dict[int, list[float]]] = ({}, {})
    t = 0.0
    gpu: list | None = None  # [chain, item, remaining seconds alone, actual seconds so far]
    comm: list | None = None  # [chain, item, end time]
    gpu_busy = comp = 0.0
    exposed: dict[str, float] = {}

    def start(c: int, it: Item) -> None:
        busy[c] = True
        spans[c].setdefault(it.seg, [t, t])

    def finish(c: int, it: Item) -> None:
        busy[c] = False
        ready[c] = t
        idx[c] += 1
        spans[c][it.seg][1] = t

    while True:
        for want_comm in (True, False):
            if (comm if want_comm else gpu) is not None:
                continue
            cands = [c for c in (0, 1) if not busy[c] and idx[c] < len(chains[c])
                     and chains[c][idx[c]].comm == want_comm]  # fmt: skip
            if not cands:
                continue
            c = min(cands, key=lambda k: (ready[k], k))
            it = chains[c][idx[c]]
            start(c, it)
            if want_comm:
                comm = [c, it, t + it.dur]
            else:
                gpu = [c, it, it.dur, 0.0]
        if gpu is None and comm is None:
            break
        stretch = 1.0
        if gpu is not None and comm is not None and gpu[1].dur > 0:
            stretch = 1.0 + interference * gpu[1].comp / gpu[1].dur
        t_gpu = t + gpu[2] * stretch if gpu is not None else float("inf")
        t_comm = comm[2] if comm is not None else float("inf")
        t_next = min(t_gpu, t_comm)
        if gpu is not None:
            gpu[2] = 0.0 if t_next == t_gpu else gpu[2] - (t_next - t) / stretch
            gpu[3] += t_next - t
        t = t_next
        if gpu is not None and t_next == t_gpu:
            c, it, _, actual = gpu
            gpu_busy += actual
            comp += actual - (it.dur - it.comp)
            for dim, s in it.exposed:
                exposed[dim] = exposed.get(dim, 0.0) + s
            finish(c, it)
            gpu = None
        if comm is not None and t_next == t_comm:
            finish(comm[0], comm[1])
            comm = None
    if t - gpu_busy > 0.0:
        exposed[EP_DIM] = exposed.get(EP_DIM, 0.0) + t - gpu_busy

    def segs(c: int) -> tuple[tuple[float, float], ...]:
        return tuple((s, e) for _, (s, e) in sorted(spans[c].items()))

    return PairResult(t, comp, tuple(exposed.items()), segs(1), segs(0))


class CombinedSteps:
    """The engine's combined 1F1B step (mixed into :class:`simulator.engine.sim.Engine`)."""

    def _pair(self, p, pair: tuple[Work, Work], act_delta, start_gathers):
        """A combined 1F1B step: wait for both inputs, run the forward and the backward as
        two chains on the compute and EP communication streams
        (:func:`simulator.engine.combined.pair_schedule`), record every segment where its
        chain put it, and send each result when its chain ends."""
        plan, env = self.plan, self.env
        f, b = pair
        last_vs = plan.pp * plan.virtual_stages - 1
        vs_f, vs_b = plan.vs_of(p.stage, f.chunk), plan.vs_of(p.stage, b.chunk)
        if vs_f > 0:
            yield self._recv_event(p.pid, "F", vs_f, f.microbatch)
            yield from self._pp_gather(p, "act", f.microbatch)
        if f.chunk in start_gathers:
            yield start_gathers.pop(f.chunk)
        if vs_b < last_vs:
            yield self._recv_event(p.pid, "B", vs_b, b.microbatch)
            yield from self._pp_gather(p, "grad", b.microbatch)
        fs = self._chunk_segments(p, f.chunk, "F")
        bs = self._chunk_segments(p, b.chunk, "B")
        slow, i = self._slowdown(p), plan.interference
        ie = i if plan.ep_interference is None else plan.ep_interference
        res = pair_schedule(chain_items(fs, slow, i), chain_items(bs, slow, i), ie)
        t0 = env.now
        for segs, spans, sign, mb in ((fs, res.fwd_segs, 1, f.microbatch),
                                      (bs, res.bwd_segs, -1, b.microbatch)):  # fmt: skip
            delta = act_delta(sign)
            for (label, layer, prog), (s, e) in zip(segs, spans, strict=True):
                self.prog_runs[(p.pid, id(prog))] += 1
                kind = "fwd" if sign > 0 else ("recompute" if "recompute" in label else "bwd")
                self._row(p, "compute", kind, label, t0 + s, t0 + e, 0.0,
                          self._prog_flops(prog), layer, mb, prog)  # fmt: skip
                if label == "head" and sign < 0 and plan.act_bytes_head_transient:
                    self.mem.append((t0 + s, p.pid, plan.act_bytes_head_transient,
                                     "activations"))  # fmt: skip
                d = delta(label, layer)
                if d:
                    self.mem.append((t0 + e, p.pid, d, "activations"))
        p.busy.append((t0, t0 + res.total, res.comp, res.exposed, "fwd"))
        for end, phase in sorted([(res.fwd_segs[-1][1], "F"), (res.bwd_segs[-1][1], "B")]):
            yield env.timeout(max(0.0, t0 + end - env.now))
            if phase == "F" and vs_f < last_vs:
                self._send(p, "F", vs_f, f.microbatch, f.chunk)
            elif phase == "B" and vs_b > 0:
                self._send(p, "B", vs_b, b.microbatch, b.chunk)
        yield env.timeout(max(0.0, t0 + res.total - env.now))

