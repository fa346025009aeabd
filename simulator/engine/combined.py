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
  of the machine), and both sides of a paired EP all-to-all slow down as measured for an
  all-to-all beside expert GEMMs (``nccl.ep_pair_beside_experts``: the collective's extra
  time and the kernels' beside it, by size and group; :func:`simulator.model.moe.
  ep_comm_extra`, DeepEP's taken as the same kind of kernel).

:func:`pair_schedule` is the steady-state step: two chains of items (GPU work, or an EP
collective on the communication stream), each item after the previous one of its chain, each
stream running one item at a time, an item starting as soon as its chain and its stream are
free (on a tie, the longer-waiting chain first, then the backward). With GPU work ``c_i`` and
collectives ``a_i`` alternating it takes between ``max(sum c, sum a)`` and ``sum c + sum a``
(run alone, one after the other).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from simulator.engine.program import Part, Program, program_time
from simulator.model.ops import HOST_SYNC
from simulator.parallel.schedules import Work

#: the parallel dimension whose collectives run on the communication stream when paired
EP_DIM = "ep"

#: ``f(part)``: for an EP collective paired with the other pass's kernels, ``(extra, beside)``:
#: how much longer it takes while kernels run beside it, and how much longer those kernels
#: take, each as an extra fraction of the time they share (measured beside expert GEMMs:
#: :func:`simulator.model.moe.ep_comm_extra`)
CommExtra = Callable[[Part], tuple[float, float]]


@dataclass(frozen=True)
class Item:
    """One piece of a chain: GPU work (``comm`` False: kernels and the collectives of other
    dimensions that hold the compute stream) or one EP collective (``comm`` True)."""

    seg: int  # index of the segment (a layer, the embedding, the head) it belongs to
    comm: bool
    dur: float  # seconds alone (GPU work: with the straggler slowdown)
    comp: float = 0.0  # of ``dur``, kernel time (slowed while a collective runs beside it)
    exposed: tuple[tuple[str, float], ...] = ()  # GPU work: other dimensions' collectives
    # the host that issues it (:func:`host_chain_items`; all 0 where the host is not modelled)
    host_first: float = 0.0  # host time to issue its first kernel or call
    host_s: float = 0.0  # host time to issue all of it
    host_span: float = 0.0  # from its issue's start, the earliest the GPU can finish it
    wait: int = -1  # the host first waits for this item of its chain to finish (-1: none) ...
    syncs: int = 0  # ... and then spends ``syncs`` times the host's resume time
    dw: bool = False  # delayed weight gradients: the chain's next item does not wait for it
    # an EP collective: the extra fraction of its time it takes while GPU work runs beside it
    # (:data:`CommExtra`; 0: taken at its own cost), and the extra fraction of their kernel
    # time it costs the kernels beside it (negative: the schedule's ``interference``)
    extra: float = 0.0
    beside: float = -1.0


@dataclass(frozen=True)
class PairResult:
    """A combined step: wall time, kernel seconds, exposed collective seconds per dimension,
    and each chain's segments as ``(start, end)`` offsets from the step's start."""

    total: float
    comp: float
    exposed: tuple[tuple[str, float], ...]
    fwd_segs: tuple[tuple[float, float], ...]
    bwd_segs: tuple[tuple[float, float], ...]
    host_end: float = 0.0  # when the host has issued everything (offset; host_pair_schedule)


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
                interference: float, comm_extra: CommExtra | None = None) -> list[Item]:  # fmt: skip
    """A pass's segments as a chain: each segment's parts split at the collectives of the EP
    communication stream (:func:`_comm_stream`); the GPU work between them priced as
    :func:`program_time` prices a program run alone; each collective with its slowdown
    beside compute (``comm_extra``; None: none)."""
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
                    ex, bs = comm_extra(part) if comm_extra else (0.0, -1.0)
                    items.append(Item(i, True, part.dur, extra=ex, beside=bs))
            else:
                run.append(part)
        if len(items) == n0:
            items.append(Item(i, False, 0.0))  # an empty segment still has a place in time
    return items


def pair_schedule(fwd: Sequence[Item], bwd: Sequence[Item], interference: float) -> PairResult:
    """Run a forward chain and a backward chain together on one GPU (module docstring).

    GPU work runs ``1 + interference * comp / dur`` times slower for the part of it during
    which a collective runs (only its kernels slow down; a collective's own ``beside`` where
    it has one); a collective ``1 + extra`` times slower for the part of it during which GPU
    work runs."""
    chains = (bwd, fwd)
    idx, ready, busy = [0, 0], [0.0, 0.0], [False, False]
    spans: tuple[dict[int, list[float]], dict[int, list[float]]] = ({}, {})
    t = 0.0
    gpu: list | None = None  # [chain, item, remaining seconds alone, actual seconds so far]
    comm: list | None = None  # [chain, item, remaining seconds alone]
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
                comm = [c, it, it.dur]
            else:
                gpu = [c, it, it.dur, 0.0]
        if gpu is None and comm is None:
            break
        stretch = cstretch = 1.0
        if gpu is not None and comm is not None and gpu[1].dur > 0:
            ie = comm[1].beside if comm[1].beside >= 0 else interference
            stretch = 1.0 + ie * gpu[1].comp / gpu[1].dur
        if gpu is not None and comm is not None and gpu[2] > 0:
            cstretch = 1.0 + comm[1].extra
        t_gpu = t + gpu[2] * stretch if gpu is not None else float("inf")
        t_comm = t + comm[2] * cstretch if comm is not None else float("inf")
        t_next = min(t_gpu, t_comm)
        if gpu is not None:
            gpu[2] = 0.0 if t_next == t_gpu else gpu[2] - (t_next - t) / stretch
            gpu[3] += t_next - t
        if comm is not None:
            comm[2] = 0.0 if t_next == t_comm else comm[2] - (t_next - t) / cstretch
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


#: :func:`megatron_order`'s layer of the embedding's and the head's segments
EMBED, HEAD = -1, -2

#: the count synchronisation Megatron-Core's dispatchers wait on at the EP dispatch
COUNT_SYNC = "moe_counts_sync"


def host_chain_items(segs: Sequence[tuple[str, int, Program]], slowdown: float,
                     interference: float, rates, delay_wgrad: bool = False,
                     comm_extra: CommExtra | None = None) -> list[Item]:  # fmt: skip
    """:func:`chain_items` with the host that issues each item (``rates``: a
    :class:`simulator.engine.host.HostRates`): the GPU work is split at each synchronisation
    (``HOST_SYNC`` part), and the item after it carries the wait: the host waits for the
    item just before the synchronisation to finish, then spends the host's resume time. The
    count synchronisation (:data:`COUNT_SYNC`) is waited on at the segment's EP dispatch
    instead, where Megatron-Core waits for it: the alltoall dispatcher copies the split
    sizes to the host on a side stream in its preprocess and waits for that copy at the start
    of ``token_dispatch`` (``cuda_sync_point`` ``before_ep_alltoall``), after its
    permutation; DeepEP's dispatch waits on the host for its count exchange before it sends
    (``megatron/core/transformer/moe/token_dispatcher.py``).

    ``delay_wgrad`` (Megatron-Core's ``--delay-wgrad-compute``): a layer's weight-gradient
    kernels (``*_wgrad``) leave each piece of its backward for an item of their own after it
    (``dw``), which the chain's next item does not wait for (``TransformerLayerNode.
    backward_dw`` runs them on the compute stream outside the nodes' events). ``comm_extra``
    as in :func:`chain_items`."""
    items: list[Item] = []
    wait, syncs = -1, 0  # a synchronisation the next item carries
    for i, (_, layer, prog) in enumerate(segs):
        n0 = len(items)
        run: list[Part] = []
        deferred: tuple[int, int] | None = None  # the count wait, for the EP dispatch
        for k, part in enumerate((*prog, None)):  # None: the end of the segment
            if part is None or part.kind == HOST_SYNC or _comm_stream(prog, k):
                if run:
                    dw = [q for q in run if _wgrad(q)] if delay_wgrad and layer >= 0 else []
                    main = tuple(q for q in run if not _wgrad(q)) if dw else tuple(run)
                    if main:
                        items.append(_host_piece(i, main, slowdown, interference, rates,
                                                 wait, syncs))  # fmt: skip
                        wait, syncs = -1, 0
                    if dw:
                        items.append(replace(_host_piece(i, tuple(dw), slowdown, interference,
                                                         rates, wait, syncs), dw=True))
                        wait, syncs = -1, 0
                    run = []
            if part is None:
                break
            if part.kind == HOST_SYNC:
                target = len(items) - 1
                later = any(_comm_stream(prog, j) for j in range(k + 1, len(prog)))
                if part.name == COUNT_SYNC and later:
                    deferred = (target, (deferred[1] if deferred else 0) + 1)
                else:
                    wait, syncs = target, syncs + 1
            elif _comm_stream(prog, k):
                h = rates.part_s(part)
                if deferred is not None and part.name != "moe_counts":
                    w, n = deferred
                    if wait >= 0:
                        w, n = max(w, wait), n + syncs
                    wait, syncs, deferred = w, n, None
                ex, bs = comm_extra(part) if comm_extra else (0.0, -1.0)
                items.append(Item(i, True, part.dur, 0.0, (), h, h, h + part.dur, wait, syncs,
                                  extra=ex, beside=bs))
                wait, syncs = -1, 0
            else:
                run.append(part)
        if len(items) == n0:
            items.append(Item(i, False, 0.0, wait=wait, syncs=syncs))
            wait, syncs = -1, 0
    return items


def _wgrad(part: Part) -> bool:
    """Whether a part is a weight-gradient kernel (a GEMM's ``_wgrad``)."""
    return part.kind != "comm" and part.name.endswith("_wgrad")


def _host_piece(seg: int, piece: tuple[Part, ...], slowdown: float, interference: float,
                rates, wait: int, syncs: int) -> Item:  # fmt: skip
    """GPU work with its host: issued part by part, the GPU runs what follows part ``k``
    back to back at best, so it ends no earlier than the host's time to issue parts ``1 ..
    k`` plus that (:func:`simulator.engine.host.piece_matrix`)."""
    total, comp, exposed = program_time(piece, slowdown, interference)
    issued, span = 0.0, 0.0
    for k, part in enumerate(piece):
        issued += rates.part_s(part)
        span = max(span, issued + program_time(piece[k:], slowdown, interference)[0])
    return Item(seg, False, total, comp, exposed, rates.part_s(piece[0]), issued, span, wait,
                syncs)


def megatron_nodes(prog: Program, forward: bool) -> Program:
    """A layer's program with its shared experts where Megatron-Core's combined 1F1B runs
    them: in the experts' node (``experts_compute`` computes ``shared_expert_output`` beside
    the routed experts on the compute stream; the combine node only adds it, with
    ``combine``'s ``shared_expert_output``, ``fine_grained_callables.py``), so before the
    forward combine and after the backward one rather than after and before it."""
    names = [q.name for q in prog]
    if "moe_combine" not in names:
        return prog
    shared = [q for q in prog if q.name.startswith("shared_") and q.name != "shared_add"]
    if not shared:
        return prog
    moved = {id(q) for q in shared}
    rest = [q for q in prog if id(q) not in moved]
    at = [q.name for q in rest].index("moe_combine") + (0 if forward else 1)
    return tuple(rest[:at] + shared + rest[at:])


def _layers(segs: Sequence[tuple[str, int, Program]]) -> list[int]:
    """Each segment's layer for :func:`megatron_order` (the embedding and the head by label)."""
    return [HEAD if label == "head" else EMBED if layer < 0 else layer
            for label, layer, _ in segs]  # fmt: skip


def _groups(items: Sequence[Item], segs: Sequence[int]) -> list[list[int]]:
    """The indices of ``items`` (those of segments ``segs``) in the five nodes of a layer as
    Megatron-Core splits it: GPU work, EP collective, GPU work, EP collective, GPU work
    (forward: attention and router, dispatch, experts, combine, the rest; backward: the
    rest's gradient, combine, experts, dispatch, attention). A layer without EP collectives
    is one node; anything past the fifth joins the last."""
    out: list[list[int]] = [[] for _ in range(5)]
    g = 0
    for k, it in enumerate(items):
        if it.seg not in segs:
            continue
        if it.comm != (g % 2 == 1) and g < 4:
            g += 1
        out[g].append(k)
    return out


def megatron_order(fwd: Sequence[Item], bwd: Sequence[Item], f_layers: Sequence[int],
                   b_layers: Sequence[int]) -> list[tuple[int, int, bool]]:  # fmt: skip
    """The host's issue order of a combined step, as ``(chain, item, on the communication
    stream)`` with chain 0 the backward and 1 the forward (``f_layers`` / ``b_layers``: each
    segment's layer, :data:`EMBED` or :data:`HEAD`). Megatron-Core's
    ``TransformerModelChunkSchedulePlan.run`` (``megatron/core/models/common/
    model_chunk_schedule_plan.py``): the forward's embedding,
    the backward's head, then layer ``i`` of the forward with layer ``n - 1 - i`` of the
    backward by ``TransformerLayerSchedulePlan.run``: backward combine, forward attention and
    router, backward experts, forward dispatch, backward dispatch, forward experts, forward
    combine, backward attention; then the layers left of either pass, the forward's head and
    the backward's embedding. A head with EP collectives (its multi-token-prediction layer,
    which Megatron-Core schedules as one more layer, before the loss) is paired as a layer.
    The combine node runs the layer's last residual add after the
    combine (``mlp_bda``) on the communication stream, and so its gradient before the
    backward combine (``fine_grained_callables.py``): a layer's GPU work after its forward
    combine, and before its backward combine (but its recomputation), runs there too."""

    def units(layers: Sequence[int], items: Sequence[Item],
              first: int) -> tuple[list, list, list]:  # fmt: skip
        pre: list[list[int]] = []
        mid: list[list[int]] = []
        post: list[list[int]] = []
        moe = {it.seg for it in items if it.comm}
        for s, layer in enumerate(layers):
            if layer == HEAD and s in moe:  # the head with its MTP layer: paired as a layer
                mid.append([s])
                heads.add(s)
            elif layer < 0:  # the embedding or the head: issued before or after the layers
                (pre if layer == first else post).append([s])
            elif mid and layers[mid[-1][-1]] == layer:
                mid[-1].append(s)  # a layer's recompute and its backward
            else:
                mid.append([s])
        return pre, mid, post

    heads: set[int] = set()  # (of either pass: a head is the last forward, first backward unit)
    fpre, fmid, fpost = units(f_layers, fwd, EMBED)
    fheads, heads = heads, set()
    bpre, bmid, bpost = units(b_layers, bwd, HEAD)
    bheads = heads
    order: list[tuple[int, int, bool]] = []
    # delayed weight gradients (``dw`` items): the experts' after the forward dispatch, the
    # attention's after the attention's backward, but the chunk's last backward layer's, which
    # waits for the pipeline's sends (``is_last_layer_in_bwd``)
    tail = [k for k in _groups(bwd, bmid[-1])[4] if bwd[k].dw] if bmid else []

    def whole(c: int, items: Sequence[Item], us: list[list[int]]) -> None:
        for u in us:
            order.extend((c, k, items[k].comm) for k, it in enumerate(items)
                         if it.seg in u and not (c == 0 and k in tail))  # fmt: skip

    whole(1, fwd, fpre)
    whole(0, bwd, bpre)
    for fu, bu in zip(fmid, bmid, strict=False):  # (the layers left: below)
        f, b = _groups(fwd, fu), _groups(bwd, bu)
        # the layer has a combine: its residual add runs beside it (not the head's loss)
        f_bda = bool(f[3]) and fu[-1] not in fheads
        b_bda = bool(b[1]) and bu[-1] not in bheads
        b2 = [k for k in b[2] if not bwd[k].dw]
        b2w = [k for k in b[2] if bwd[k].dw]
        b4 = [k for k in b[4] if not bwd[k].dw or k not in tail]
        for c, g, bda in ((0, b[0], b_bda), (0, b[1], False), (1, f[0], False),
                          (0, b2, False), (1, f[1], False), (0, b2w, False), (0, b[3], False),
                          (1, f[2], False), (1, f[3], False), (1, f[4], f_bda),
                          (0, b4, False)):  # fmt: skip
            items, last = (bwd, bu[-1]) if c == 0 else (fwd, fu[-1])
            order.extend((c, k, items[k].comm or (bda and items[k].seg == last)) for k in g)
    n = min(len(fmid), len(bmid))
    whole(0, bwd, bmid[n:])
    whole(1, fwd, fmid[n:])
    order.extend((0, k, False) for k in tail)
    whole(1, fwd, fpost)
    whole(0, bwd, bpost)
    return order


def host_pair_schedule(fwd: Sequence[Item], bwd: Sequence[Item],
                       order: Sequence[tuple[int, int, bool]], interference: float,
                       sync_s: float, host0: float = 0.0) -> PairResult:
    """A combined step with the one host that issues both passes (``fwd`` / ``bwd`` from
    :func:`host_chain_items`, ``order`` from :func:`megatron_order`; ``host0``: when the host
    is free, from the step's start; negative where it is ahead).

    The host issues the items in ``order`` (each on the stream it names), each in its
    ``host_s``, first waiting where an
    item carries a synchronisation (until the item it names has finished, then ``syncs``
    times ``sync_s``). Each stream runs its items in the order they were issued (a CUDA
    stream is first in, first out), an item once its chain's previous one has finished (the
    schedule's events) and its first kernel is issued; GPU work ends no earlier than
    ``host_span`` after its issue began (its last kernels wait for the host). Kernels run
    slower beside a collective, and a collective beside running kernels, as in
    :func:`pair_schedule`. With every host time 0 it is the
    same streams run in Megatron-Core's order; where the host is the slower one the step is
    the host's time plus what the GPU runs after the host's last issue. The GPU's idle time
    is exposed as ``ep`` while it waits for a collective, ``host`` while it waits for the
    host."""
    chains = (bwd, fwd)
    ends: tuple[dict[int, float], dict[int, float]] = ({}, {})
    issued: dict[tuple[int, int], float] = {}
    queues: dict[bool, deque] = {False: deque(), True: deque()}
    left_gpu = [sum(1 for c, _, on_comm in order if c == ch and not on_comm) for ch in (0, 1)]
    h, pos, n = host0, 0, len(order)
    spans: tuple[dict[int, list[float]], dict[int, list[float]]] = ({}, {})
    t = 0.0
    gpu: list | None = None  # [chain, item, seconds of work left alone, work so far, floor]
    comm: list | None = None  # [chain, item, seconds left alone, floor]
    gpu_busy = comp = 0.0
    exposed: dict[str, float] = {}

    def host() -> None:
        nonlocal h, pos
        while pos < n:
            c, k, on_comm = order[pos]
            it = chains[c][k]
            if it.wait >= 0:
                done = ends[c].get(it.wait)
                if done is None:
                    return  # blocked: the GPU has not got there yet
                h = max(h, done) + it.syncs * sync_s
            issued[(c, k)] = h
            h += it.host_s
            queues[on_comm].append((c, k))
            pos += 1

    def ready(stream: bool) -> float | None:
        """When the head of a stream's queue can start (None: its chain's previous item has
        not finished)."""
        if not queues[stream]:
            return None
        c, k = queues[stream][0]
        it = chains[c][k]
        j = k - 1
        while j >= 0 and chains[c][j].dw:  # nothing waits for delayed weight gradients
            j -= 1
        prev = ends[c].get(j, None) if j >= 0 else 0.0
        if prev is None:
            return None
        return max(prev, issued[(c, k)] + it.host_first)

    while True:
        host()
        for stream in (True, False):
            if (comm if stream else gpu) is not None:
                continue
            r = ready(stream)
            if r is None or r > t:
                continue
            c, k = queues[stream].popleft()
            it = chains[c][k]
            spans[c].setdefault(it.seg, [t, t])
            if stream:
                comm = [c, k, it.dur, issued[(c, k)] + it.host_span]
            else:
                gpu = [c, k, it.dur, 0.0, issued[(c, k)] + it.host_span]
        future = [r for r in (ready(True) if comm is None else None,
                              ready(False) if gpu is None else None) if r is not None and r > t]
        stretch = cstretch = 1.0
        if gpu is not None and comm is not None and gpu[2] > 0:
            it, cit = chains[gpu[0]][gpu[1]], chains[comm[0]][comm[1]]
            ie = cit.beside if cit.beside >= 0 else interference
            stretch = 1.0 + ie * it.comp / it.dur if it.dur > 0 else 1.0
            if comm[2] > 0:  # (a collective waiting for its host slows nothing down)
                cstretch = 1.0 + cit.extra
        t_gpu = float("inf")
        if gpu is not None:
            t_gpu = t + gpu[2] * stretch if gpu[2] > 0 else max(t, gpu[4])
        t_comm = float("inf")
        if comm is not None:
            t_comm = max(t + comm[2] * cstretch, comm[3]) if comm[2] > 0 else max(t, comm[3])
        t_next = min(t_gpu, t_comm, *future) if future else min(t_gpu, t_comm)
        if t_next == float("inf"):
            break
        if gpu is None and t_next > t:  # the compute stream idles: for the host, or the EP
            waiting_host = any(left_gpu) and (
                not queues[False] or issued[queues[False][0]]
                + chains[queues[False][0][0]][queues[False][0][1]].host_first > t)
            key = "host" if waiting_host else EP_DIM
            exposed[key] = exposed.get(key, 0.0) + t_next - t
        if gpu is not None:
            if gpu[2] > 0:
                done = (t_next - t) / stretch
                gpu[2] = 0.0 if t_next == t_gpu else max(0.0, gpu[2] - done)
                gpu[3] += t_next - t
            else:  # its kernels wait for the host
                exposed["host"] = exposed.get("host", 0.0) + t_next - t
        if comm is not None and comm[2] > 0:
            done = (t_next - t) / cstretch
            comm[2] = 0.0 if t_next >= t + comm[2] * cstretch else max(0.0, comm[2] - done)
        t = t_next
        if gpu is not None and gpu[2] <= 0 and t >= gpu[4]:
            c, k, _, actual, _ = gpu
            it = chains[c][k]
            gpu_busy += actual
            comp += actual - (it.dur - it.comp)
            for dim, s in it.exposed:
                exposed[dim] = exposed.get(dim, 0.0) + s
            ends[c][k] = t
            if not it.dw:  # (the pass's result does not wait for them either)
                spans[c][it.seg][1] = t
            left_gpu[c] -= 1
            gpu = None
        if comm is not None and comm[2] <= 0 and t >= comm[3]:
            c, k, _, _ = comm
            ends[c][k] = t
            spans[c][chains[c][k].seg][1] = t
            comm = None
    if pos < n or any(len(e) < len(ch) for e, ch in zip(ends, chains, strict=True)):
        raise RuntimeError("combined step: an item never ran (the issue order breaks a chain)")

    def segs(c: int) -> tuple[tuple[float, float], ...]:
        return tuple((s, e) for _, (s, e) in sorted(spans[c].items()))

    ex = tuple((k, v) for k, v in exposed.items() if v > 0.0)
    return PairResult(t, comp, ex, segs(1), segs(0), h)


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
        t0 = env.now
        if plan.host is not None and plan.schedule_name not in ("dualpipe", "dualpipev"):
            # Megatron-Core's combined 1F1B: one host issues both passes in its fixed order
            key = (id(fs), id(bs), slow)
            hit = self._pair_cache.get(key)
            if hit is None:  # (keeps the segment lists alive, so their ids are not reused)
                nf = [(lb, ly, megatron_nodes(pr, True)) for lb, ly, pr in fs]
                nb = [(lb, ly, megatron_nodes(pr, False)) for lb, ly, pr in bs]
                ce = plan.ep_comm_extra
                cf = host_chain_items(nf, slow, i, plan.host, comm_extra=ce)
                cb = host_chain_items(nb, slow, i, plan.host, plan.delay_wgrad, ce)
                order = megatron_order(cf, cb, _layers(fs), _layers(bs))
                hit = self._pair_cache[key] = (fs, bs, cf, cb, order)
            _, _, cf, cb, order = hit
            res = host_pair_schedule(cf, cb, order, ie, plan.host.sync_s, p.host_s - t0)
            p.host_s = t0 + res.host_end
        else:
            ce = plan.ep_comm_extra
            res = pair_schedule(chain_items(fs, slow, i, ce), chain_items(bs, slow, i, ce), ie)
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

