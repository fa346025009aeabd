"""The SimPy engine: simulated GPU processes running a pipeline schedule, with streams.

Each simulated process (:class:`Proc`) stands for one GPU (``detail="full"``) or for a set of
GPUs that behave identically (``detail="folded"``: a whole TP group, in every DP replica of a
replica class). A process has a compute stream that walks its stage's pipeline schedule, and
communication streams (``dp`` for gradient reduction, ``gather`` for ZeRO-3 / ZeRO parameter
gathers, ``pp`` for point-to-point sends) that run beside it, like CUDA streams.

Collectives rendezvous: the n-th collective a process issues on a group matches the n-th of every
other member, starts once all have issued it and their stream is free, and takes the time the
network gives it. In folded mode a pipeline send takes the collective model's cost on the real
groups' links (all concurrent copies sharing them), and data-parallel / ZeRO collectives run as
bundles of every concurrent group's flows in the max-min fair
:class:`~simulator.network.flows.FlowNetwork`, so collectives that overlap share links; in full
mode every algorithm step of every collective is a set of flows in that network. Gathers and
reductions of one process queue on one communicator; while one is in flight the process's
kernels run slower by the measured interference factor.

Inside a process, back-to-back parts with nothing else depending on them (a layer's kernels and
its TP collectives in folded mode; a whole chunk's layers when no ZeRO-3 gather interleaves) are
one SimPy timeout, while the events table still gets one row per layer with the parts listed.
"""

from __future__ import annotations

import gc
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from heapq import heappush

import simpy

from simulator.engine.combined import CombinedSteps
from simulator.engine.deepspeed_zero import DeepSpeedPlan, DeepSpeedZero3
from simulator.engine.host import FSDP_CALLS, HostRates, program_matrix, with_drains
from simulator.engine.program import Part, Program, StagePrograms, program_time
from simulator.engine.records import part_entry
from simulator.engine.sends import CommSpec, PipelineSends
from simulator.engine.split import SplitBackward, grads_done, unit_of
from simulator.engine.torch_memory import TorchPipelineMemoryEvents
from simulator.engine.torch_sends import TorchPipelineSends
from simulator.model.pipeline_memory import TorchPipelineMemory
from simulator.parallel.schedules import Work, chunks_per_rank, combined, schedule, virtual_stage

#: Streams of the data-parallel communicators (gradient reductions and ZeRO gathers: dense over
#: cp x dp, routed experts over edp), which share the GPU with compute (interference).
DP_STREAMS = ("dp", "gather", "edp", "egather")
#: Allocations between two collections of the youngest generation while a step runs.
GC_THRESHOLD = 50_000


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts the events it schedules (the reported event count)."""

    def __init__(self) -> None:
        super().__init__()
        self.n_events = 0

    def schedule(self, event, priority=1, delay=0):  # noqa: D102 (SimPy hook)
        self.n_events += 1
        # simpy.Environment.schedule, inlined (it runs once per event)
        heappush(self._queue, (self._now + delay, priority, next(self._eid), event))


@dataclass
class Proc:
    """A simulated process: one GPU, or a set of GPUs with identical behaviour."""

    pid: int
    label: str
    stage: int
    replica_class: int
    replicas: tuple[int, ...]
    coords: dict[str, int] | None  # full detail: the GPU's coordinates; None when folded
    gpu: int  # representative GPU
    slowdown: float
    programs: StagePrograms
    # filled while running
    busy: list[tuple[float, float, float, float, str]] = field(default_factory=list)
    comm_iv: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    end_s: float = 0.0
    host_s: float = 0.0  # eager code: when its host has issued everything so far
    moe_bwds: int = 0  # eager MoE: layer backwards issued so far (where the drains fall)
    moe_fwds: int = 0  # and layer forwards (their first launches, where modelled)


@dataclass
class StepPlan:
    """Everything the engine needs, prepared by :mod:`simulator.engine.build`."""

    procs: list[Proc]
    pp: int
    virtual_stages: int
    microbatches: int
    schedule_name: str
    layers_of: Callable[[int, int], range]
    zero: int
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    bucket_bytes: float
    grad_bytes_per_layer: float  # per TP rank, in grad_reduce dtype
    param_bytes_per_layer: float  # layer params per TP rank (ZeRO-3 gather size)
    stage_param_bytes: Callable[[int], float]  # ZeRO-1/2 param all-gather size of a stage
    act_bytes_layer: float
    act_bytes_embed: float
    act_bytes_head: float
    static_mem: Callable[[Proc], dict[str, float]]
    optimizer_program: Callable[[Proc], Program]
    pp_bytes: float
    # group resolution: participants (pids) and the cost / executor of a collective
    participants: Callable[[Proc, str], tuple[int, ...]]
    #: pid of the process running the next/prev virtual stage for the micro-batches of a chunk
    peer: Callable[[Proc, str, int, int], int]
    comm_time: Callable[[CommSpec, Proc], float] | None  # folded: cost of a collective
    comm_exec: Callable[[CommSpec, Proc], object] | None  # full: generator running the steps
    detail: str = "folded"
    interference: float = 0.0  # compute slowdown while a collective shares the GPU
    #: compute slowdown beside the EP collectives of a paired step (None: ``interference``;
    #: DeepEP's kernels hold SMs of their own: simulator.model.moe.beside_ep_slowdown)
    ep_interference: float | None = None
    #: GPUs in a group of each stream (``dp`` and ``gather``: the gradient-reduction group,
    #: cp x dp); a collective over one GPU completes at once and moves nothing
    group_size: dict[str, int] = field(default_factory=dict)
    #: the layout dimension(s) of the groups of each data-parallel stream and of ``pp``, as
    #: its events record them (``dp``: ``cp+dp`` where cp > 1; ``edp``: ``edp``)
    stream_dims: dict[str, str] = field(default_factory=dict)
    # (op, nbytes, group) -> how much longer a data-parallel / ZeRO collective takes, as a
    # fraction of the time its GPU computed beside it (simulator/network/interference.py)
    comm_slowdown: Callable[[str, float, int], float] | None = None
    #: combined 1F1B / DualPipe: an EP collective's extra fraction beside running kernels
    #: (:func:`simulator.model.moe.ep_comm_extra`; None: taken at its own cost)
    ep_comm_extra: Callable | None = None
    grad_prep: Callable[[float], Program] | None = None  # work on a bucket of grad bytes
    unit_bytes: Callable[[str], tuple[float, float]] | None = None  # ZeRO-3 embed/head sizes
    grad_finalize: Callable[[Proc], Program] | None = None  # after the reduction, per step
    comm_cost: Callable[[CommSpec, Proc], object] | None = None  # folded: the CollectiveCost
    gather_keep_fraction: float = 0.0  # of a gathered ZeRO-3 layer not already held locally
    #: faults.straggler_scope: "layers" stretches only layer and LM-head segments
    straggler_scope: str = "gpu"
    #: of ``act_bytes_head``: the loss's working set, alive only while one micro-batch's head
    #: backward runs (not kept for every micro-batch in flight)
    act_bytes_head_transient: float = 0.0
    #: bytes the optimizer step allocates for itself while it runs (foreach Adam's sqrt list)
    optimizer_temp: Callable[[Proc], float] | None = None
    # what a recomputed layer holds again from its recompute to the end of its backward
    act_bytes_recompute: float = 0.0
    #: gradient bytes of a process not in ``static_mem``: allocated by its step's first
    #: backward (eager code after ``zero_grad(set_to_none=True)``), counted from its end
    lazy_grad_mem: Callable[[Proc], float] | None = None
    #: bytes a process holds beyond a steady-state step's peak in the run's first steps (DDP's
    #: constructor bucket set, live through the iteration that rebuilds the buckets)
    first_steps_mem: Callable[[Proc], float] | None = None
    part_cost: Callable[[Proc, Part], object] | None = None  # folded: a program collective's cost
    #: folded: when a process's program collectives run in the flow network (``never`` |
    #: ``with_dp`` | ``always``), and whether a send (process, destination pid) does
    #: (:mod:`simulator.engine.contention`)
    comm_mode: Callable[[Proc], str] | None = None
    send_in_network: Callable[[Proc, int, bool], bool] | None = None  # (.., DP traffic now?)
    #: per-layer (activation, gradient, parameter) bytes where layers differ (an MoE model's
    #: dense and MoE layers); None: every layer has the ``*_layer`` sizes above
    layer_sizes: Callable[[int], tuple[float, float, float]] | None = None
    #: MoE with experts split over ep x etp: (gradient, parameter) bytes of a layer's routed
    #: experts on one rank, reduced (and ZeRO-gathered) over the expert-data-parallel group on
    #: streams ``edp`` / ``egather`` in buckets of their own (Megatron-Core's expert buffers);
    #: None: every gradient is in the dense buckets over cp x dp
    expert_bytes: Callable[[int], tuple[float, float]] | None = None
    #: the routed experts' part of :attr:`stage_param_bytes` (ZeRO-1/2 gather over edp)
    stage_expert_param_bytes: Callable[[int], float] | None = None
    #: combined 1F1B (``overlap_moe_expert_parallel_comm``): one more warm-up forward, and
    #: each steady-state forward run beside the backward of another micro-batch
    #: (:mod:`simulator.engine.combined`)
    ep_overlap: bool = False
    #: with it, ``training.delay_wgrad_compute``: a layer's weight gradients off the chain
    delay_wgrad: bool = False
    #: parallelism.pp_runtime: "torch" plays torch.distributed.pipelining's interleaved
    #: runtime's P2P stream (simulator/engine/torch_sends.py)
    pp_runtime: str = "megatron"
    #: torch.distributed.pipelining's own memory (receive buffers, kept outputs, the weight
    #: casts autocast holds once a step): simulator.model.pipeline_memory; None: not that runtime
    torch_memory: TorchPipelineMemory | None = None
    #: eager code: the host that issues the kernels (:mod:`simulator.engine.host`); None:
    #: fused kernels, whose host stays ahead of the GPU
    host: HostRates | None = None
    #: eager ZeRO-3: parameter tensors of a unit (a global layer, ``embed`` or ``head``)
    unit_tensors: Callable[[int | str], int] | None = None
    #: ``training.zero_impl: deepspeed``: DeepSpeed's ZeRO-3 gathers and gradient buckets
    #: (:mod:`simulator.engine.deepspeed_zero`); None: one gather and reduce-scatter per unit
    ds: DeepSpeedPlan | None = None
    #: eager ZeRO-3 as FSDP2 runs it (``fully_shard`` per block, then on the root): its memory
    #: beyond one gathered unit and its prefetch (:meth:`Engine._fsdp2_mem`); bytes of the
    #: gradients as autograd makes them (param dtype) per reduce-dtype byte
    fsdp2_memory: bool = False
    fsdp2_grad_ratio: float = 1.0
    #: FSDP2's ``reshard_after_forward`` (``training.fsdp_reshard_after_forward``): default
    #: (the root stays gathered through the backward), all (the root too is freed after the
    #: forward and gathered again after the loss's backward), none (no unit freed after the
    #: forward, no all-gather in backward)
    fsdp2_reshard: str = "default"
    #: FSDP2: the root's forward returns the loss (``training.loss_in_model``), so its
    #: pre-backward hook (root gather, last block's prefetch) runs before the loss's backward
    fsdp2_loss_in_root: bool = False
    #: FSDP2's all-gather copy-out on the compute stream, a program of a unit's gathered bytes
    #: (``training.fsdp_version: 2``); None: none (FSDP1, not FSDP)
    fsdp2_copy_out: Callable[[float], Program] | None = None

    def vs_of(self, stage: int, chunk: int) -> int:
        """The model (virtual) stage that chunk ``chunk`` of pipeline rank ``stage`` holds."""
        return virtual_stage(self.schedule_name, stage, chunk, self.pp)

    @property
    def chunks(self) -> int:
        """Model chunks per rank (two for DualPipe, ``virtual_stages`` otherwise)."""
        return chunks_per_rank(self.schedule_name, self.virtual_stages)

    def last_microbatch(self, chunk: int) -> int:
        """The last micro-batch through ``chunk`` (DualPipe: each chunk takes one half)."""
        m = self.microbatches
        return (m // 2 if chunk == 0 else m) - 1 if self.schedule_name == "dualpipe" else m - 1

    def layer_bytes(self, layer: int) -> tuple[float, float, float]:
        """(activation, gradient, parameter) bytes of global layer ``layer`` on one rank."""
        if self.layer_sizes is None:
            return self.act_bytes_layer, self.grad_bytes_per_layer, self.param_bytes_per_layer
        return self.layer_sizes(layer)


class Engine(CombinedSteps, PipelineSends, TorchPipelineSends, TorchPipelineMemoryEvents,
             SplitBackward, DeepSpeedZero3):
    """Run one training step of a :class:`StepPlan`."""

    def __init__(self, plan: StepPlan, env: CountingEnvironment | None = None):
        self.plan = plan
        self.env = env or CountingEnvironment()
        self.rows: list[tuple] = []
        self.mem: list[tuple] = []
        self._recv: dict[tuple, simpy.Event] = {}
        self._rdv: dict[tuple, list] = {}
        self._seq: dict[tuple, int] = defaultdict(int)
        self._last_done: dict[tuple[int, str], simpy.Event | None] = {}
        self._pending: dict[int, list[simpy.Event]] = defaultdict(list)
        self._ptime_cache: dict[tuple[int, float], tuple[float, float, float]] = {}
        self._host_cache: dict[tuple[int, float], tuple] = {}
        self._pair_cache: dict[tuple[int, int, float], tuple] = {}  # combined steps with a host
        self._text_cache: dict[int, tuple] = {}  # id(program) -> (program, parts text)
        self._flops_cache: dict[int, tuple] = {}  # id(program) -> (program, FLOPs)
        #: executions of each program per process, and every collective run (for link accounting)
        self.prog_runs: dict[tuple[int, int], int] = defaultdict(int)
        self.comm_log: list[tuple[Proc, CommSpec]] = []
        self._inflight: dict[int, int] = defaultdict(int)
        self._dp_running = 0  # DP / ZeRO collectives on the links now, over all processes
        self._segs_cache: dict[tuple, list] = {}  # (pid, chunk, phase) -> segments
        self._runs_cache: dict[int, tuple] = {}  # id(segments) -> (segments, runs of a kind)
        #: (id(program), slowdown) -> (program, total, compute, comm, FLOPs, parts, parts text,
        #: the row's dim)
        self._seg_info: dict[tuple[int, float], tuple] = {}
        self._comm_cache: dict[int, tuple] = {}  # id(program) -> (program, has a collective)
        self._segs_comm: dict[int, bool] = {}  # id(cached segments) -> has a collective
        #: (pid, dst pid) -> whether its sends run in the flow network (beside DP traffic,
        #: without), and (spec, time, receiver's intervals) of its static sends
        self._send_ways: dict[tuple[int, int], tuple[bool, bool]] = {}
        self._send_static_cache: dict[tuple[int, int], tuple] = {}
        self._routes: dict[tuple, tuple] = {}  # (pid, phase, vs, chunk) -> a send's destination
        self._torch_events: dict[tuple, simpy.Event] = {}  # pp_runtime torch rendezvous
        self._dp_starting = 0  # DP / ZeRO collectives issued by all members, not yet running
        #: programs made here, not in a stage's :class:`StagePrograms` (a backward split into
        #: input and weight gradients): (pid, id(program)) -> program, for link accounting
        self.derived: dict[tuple[int, int], Program] = {}
        #: FSDP2 (``plan.fsdp2_memory``): whether a process's root unit is gathered, whether
        #: its lazy ``.grad`` tensors are still to come, and the shards made before they do
        self._root_held: dict[int, bool] = {}
        self._lazy_open: dict[int, bool] = {}
        self._early_grads: dict[int, float] = defaultdict(float)

    # -------------------------------------------------------------------------------- running

    def run(self) -> None:
        for p in self.plan.procs:
            for what, nbytes in self.plan.static_mem(p).items():
                if nbytes:
                    self.mem.append((0.0, p.pid, nbytes, what))
            self.env.process(self._compute(p))
        # A step allocates containers by the hundred thousand (events, rows), most short-lived;
        # at the default threshold (700) the cyclic collector walks the young ones that often:
        # 14 % of a GPT-530B step's CPU. Rarer while the step runs, as before after it.
        threshold = gc.get_threshold()
        gc.set_threshold(max(threshold[0], GC_THRESHOLD), *threshold[1:])
        try:
            self.env.run()
        finally:
            gc.set_threshold(*threshold)

    # -------------------------------------------------------------------------------- helpers

    def _ptime(self, prog: Program, slowdown: float) -> tuple[float, float, float]:
        key = (id(prog), slowdown)
        hit = self._ptime_cache.get(key)
        if hit is None:
            hit = self._ptime_cache[key] = program_time(prog, slowdown, self.plan.interference)
        return hit

    def _slowdown(self, p: Proc, label: str = "", layer: int = 0) -> float:
        """The process's compute slowdown now for segment ``label`` of ``layer``: its straggler
        factor (under ``straggler_scope: layers`` only on layer segments and the LM head),
        times the interference of a data-parallel / ZeRO collective in flight on its GPU."""
        slow = p.slowdown
        if self.plan.straggler_scope == "layers" and layer < 0 and label != "head":
            slow = 1.0
        if self._inflight[p.pid]:
            return slow * (1.0 + self.plan.interference)
        return slow

    def _parts_text(self, parts) -> str:
        """A row's ``parts`` column: its parts and their durations (built once per program;
        the cache keeps the program alive, so its id is not reused)."""
        hit = self._text_cache.get(id(parts))
        if hit is None:
            # '~' marks a collective that ran beside the next kernel (overlap_next).
            text = ";".join(part_entry(q.name, q.dur, q.dim if q.kind == "comm" else "",
                                       q.overlap_next) for q in parts)
            hit = self._text_cache[id(parts)] = (parts, text)
        return hit[1]

    def _prog_flops(self, prog) -> float:
        hit = self._flops_cache.get(id(prog))
        if hit is None:
            hit = self._flops_cache[id(prog)] = (prog, _flops(prog))
        return hit[1]

    def _row(self, p: Proc, stream, kind, name, start, end, nbytes, flops, layer, mb, parts=(),
             dim=""):
        text = self._parts_text(parts) if len(parts) > 1 else ""
        self.rows.append(
            (p.gpu, p.label, p.stage, stream, kind, dim or _row_dim(parts), name, start, end,
             nbytes, flops, layer, mb, max(1, len(parts)), text)
        )

    def _recv_event(self, pid: int, phase: str, vs: int, mb: int) -> simpy.Event:
        key = (pid, phase, vs, mb)
        ev = self._recv.get(key)
        if ev is None:
            ev = self._recv[key] = self.env.event()
        return ev

    # -------------------------------------------------------------------------------- compute

    def _segments_folded(self, p: Proc, segs, kind, mb: int, mem_after) -> simpy.Event:
        """Segments back to back as one timeout (returned, for the caller to wait on); rows
        and memory recorded now, at their exact offsets. ``kind`` None: each backward
        segment's own (``recompute`` or ``bwd``)."""
        env = self.env
        t = start = env.now
        pid, rows, busy, runs, info_of = p.pid, self.rows, p.busy, self.prog_runs, self._seg_info
        for label, layer, prog in segs:
            slowdown = self._slowdown(p, label, layer)
            info = info_of.get((id(prog), slowdown))
            if info is None:  # (keeps the program alive, so its id is not reused)
                info = info_of[(id(prog), slowdown)] = (
                    prog, *self._ptime(prog, slowdown), self._prog_flops(prog),
                    max(1, len(prog)), self._parts_text(prog) if len(prog) > 1 else "",
                    _row_dim(prog))
            _, total, comp, comm, flops, nparts, text, dim = info
            runs[(pid, id(prog))] += 1
            end = t + total
            if self.plan.host is not None:
                end, comm = self._host_issue(p, prog, slowdown, t, end, comm)
            k = kind or _kind(label)
            rows.append((p.gpu, p.label, p.stage, "compute", k, dim, label, t, end, 0.0, flops,
                         layer, mb, nparts, text))
            busy.append((t, end, comp, comm, k))
            t = end
            if mem_after is not None:
                delta = mem_after(label, layer)
                if delta:
                    self.mem.append((t, p.pid, delta, "activations"))
        return env.timeout(t - start)

    def _host_issue(self, p: Proc, prog: Program, slowdown: float, start: float, end: float,
                    comm: tuple) -> tuple[float, tuple]:
        """Eager code: when the GPU, which would finish ``prog`` at ``end``, finishes it once
        the host has issued it (:mod:`simulator.engine.host`), and ``comm`` with the wait as
        ``("host", seconds)``; advances the process's host clock."""
        drains, forward, rates = 0, False, self.plan.host
        if rates.drains > 0.0:
            moe_fwd, moe_bwd = p.programs.moe_passes
            if id(prog) in moe_bwd:
                # an eager MoE layer's backward: the first launches of cuBLAS kernels it drains at
                drains = rates.drains_at(p.moe_bwds)
                p.moe_bwds += 1
            elif rates.fwd_drains and id(prog) in moe_fwd:
                # its forward: the expert forwards' first launches (their own kernels, as many)
                drains, forward = rates.drains_at(p.moe_fwds), True
                p.moe_fwds += 1
        key = (id(prog), slowdown, drains, forward)
        hit = self._host_cache.get(key)
        if hit is None:  # (keeps the program alive, so its id is not reused)
            def gpu_time(parts) -> float:
                return program_time(parts, slowdown, self.plan.interference)[0]

            m = program_matrix(with_drains(prog, drains, forward) if drains else prog,
                               self.plan.host, gpu_time)
            # what a synchronisation adds to the GPU's own path (the GPU idles while the host
            # resumes and issues what follows): gg beyond the program's time back to back
            hit = self._host_cache[key] = (prog, m, max(0.0, m[0] - gpu_time(prog)))
        _, (_, gh, hg, hh), sync_gap = hit
        # the GPU term is the engine's own ``end`` (not ``start + gg``: a program split at a
        # synchronisation prices its pieces apart, which can differ from the engine's time),
        # plus what its synchronisations add when the host is ahead
        done = max(end + sync_gap, p.host_s + gh)
        p.host_s = max(start + hg, p.host_s + hh)
        return done, ((*comm, ("host", done - end)) if done > end else comm)

    def _segment_full(self, p: Proc, label: str, layer: int, prog: Program, kind: str, mb: int):
        """Run one segment part by part, collectives through the network (full mode)."""
        env = self.env
        start = env.now
        slowdown = self._slowdown(p, label, layer)
        comp = 0.0
        comm: dict[str, float] = {}
        pending = None
        for part in prog:
            if part.kind == "comm":
                if part.overlap_next:
                    pending = (self._comm_full(part, p), part.dim)
                    continue
                t0 = env.now
                yield self._comm_full(part, p)
                comm[part.dim] = comm.get(part.dim, 0.0) + env.now - t0
                continue
            d = part.dur * self._slowdown(p, label, layer)
            if pending is not None and not pending[0].triggered:
                # slowed by the interference while the collective runs, then at full speed
                i, t0 = self.plan.interference, env.now
                yield env.any_of([env.timeout(d * (1.0 + i)), pending[0]])
                done = (env.now - t0) / (1.0 + i)
                if done < d:
                    yield env.timeout(d - done)
                d = env.now - t0
            else:
                yield env.timeout(d)
            comp += d
            if pending is not None:
                t0 = env.now
                yield pending[0]
                comm[pending[1]] = comm.get(pending[1], 0.0) + env.now - t0
                pending = None
        if pending is not None:
            t0 = env.now
            yield pending[0]
            comm[pending[1]] = comm.get(pending[1], 0.0) + env.now - t0
        waits = tuple(comm.items())
        if self.plan.host is not None:
            done, waits = self._host_issue(p, prog, slowdown, start, env.now, waits)
            if done > env.now:
                yield env.timeout(done - env.now)
        self._row(p, "compute", kind, label, start, env.now, 0.0, _flops(prog), layer, mb, prog)
        p.busy.append((start, env.now, comp, waits, kind))

    def _in_network(self, p: Proc, segs) -> bool:
        """Whether these segments' collectives run in the flow network, part by part: always
        in full detail; folded, where they share links with traffic in flight."""
        if not self._has_comm(segs):
            return False
        if p.coords is not None:
            return True
        mode = self.plan.comm_mode(p) if self.plan.comm_mode else "never"
        if mode == "never":
            return False
        # while a DP / ZeRO collective of this process is issued and not finished, or (links
        # shared with other stages' traffic) while any runs: the rest of the step prices
        # them statically, so the cost stays that of the distinct ranks at scale
        for q in ("dp", "edp"):
            last = self._last_done.get((p.pid, q))
            if last is not None and not last.triggered:
                return True
        return mode == "always" and self._dp_running > 0

    def _settled(self, p: Proc, segs) -> bool:
        """Whether ``segs`` run now would be priced as they are now until they end, so that
        one timeout runs them all: folded, no collective of ``p``'s on a data-parallel
        communicator issued and unfinished (only ``p`` could issue one, and it is computing;
        so its kernels' slowdown stays), none of their collectives in the flow network now,
        and none that traffic of other processes starting meanwhile would move there."""
        if p.coords is not None:
            return False
        for q in ("dp", "edp"):
            last = self._last_done.get((p.pid, q))
            if last is not None and not last.triggered:
                return False
        # (then :meth:`_in_network` is False now, and stays so but in mode ``always``)
        if not self._has_comm(segs):
            return True
        return (self.plan.comm_mode(p) if self.plan.comm_mode else "never") != "always"

    def _has_comm(self, segs) -> bool:
        """Whether a program of ``segs`` has a collective (cached per program, and per list
        of the segment caches; each cache keeps what it is keyed by alive, so that no id is
        reused)."""
        known = self._segs_comm.get(id(segs))
        if known is not None:
            return known
        for seg in segs:
            prog = seg[2]
            hit = self._comm_cache.get(id(prog))
            if hit is None:
                hit = self._comm_cache[id(prog)] = (prog, any(q.kind == "comm" for q in prog))
            if hit[1]:
                return True
        return False

    def _run_segments(self, p: Proc, segs, kind: str, mb: int, mem_after=None):
        if not self._in_network(p, segs):
            yield self._segments_folded(p, segs, kind, mb, mem_after)
            return
        for label, layer, prog in segs:
            yield from self._segment_full(p, label, layer, prog, kind, mb)
            if mem_after is not None:
                delta = mem_after(label, layer)
                if delta:
                    self.mem.append((self.env.now, p.pid, delta, "activations"))

    def _compute(self, p: Proc):
        plan, env = self.plan, self.env
        progs = p.programs
        pp, v = plan.pp, plan.virtual_stages
        last_vs = pp * v - 1
        m = plan.microbatches
        order = schedule(plan.schedule_name, p.stage, pp, m, v, plan.ep_overlap)
        # (DualPipe's order has its pairs already: it always overlaps its F&B chunks)
        steps = combined(order, m) if plan.ep_overlap and plan.schedule_name not in (
            "dualpipe", "dualpipev") else order
        by_vs = sorted(range(plan.chunks), key=lambda c: plan.vs_of(p.stage, c))
        buckets: dict[int, float] = defaultdict(float)
        ebuckets: dict[int, float] = defaultdict(float)  # routed experts' gradients (edp)
        bucket_id = [0]
        dp_reduce_op = "all_reduce" if plan.zero == 0 else "reduce_scatter"
        start_gathers: dict[int, simpy.Event] = {}

        if plan.zero in (1, 2) and plan.overlap_param_gather:
            for c in by_vs:  # (mirrored DualPipe ranks issue them in the same order)
                start_gathers[c] = self.env.all_of(self._param_gathers(p, plan.vs_of(p.stage, c),
                                                                       c))  # fmt: skip

        def act_delta(sign: float):
            def f(label: str, layer: int) -> float:
                if label == "embed":
                    return sign * plan.act_bytes_embed
                if unit_of(label) == "head":  # kept per micro-batch; the loss's working set below
                    return plan.act_bytes_head * sign if sign < 0 else (
                        plan.act_bytes_head - plan.act_bytes_head_transient)
                if "recompute" in label:  # the layer's activations exist again ...
                    return plan.act_bytes_recompute
                act = plan.layer_bytes(layer)[0]
                if sign < 0:  # ... until its backward frees them with the stored ones
                    return -act - plan.act_bytes_recompute
                return act
            return f

        fwd_mem, bwd_mem = act_delta(+1), act_delta(-1)
        # torch.distributed.pipelining's interleaved runtime: its transfers on one stream
        torch_ends = (iter(self._torch_post(p, steps)) if plan.pp_runtime == "torch"
                      and plan.schedule_name == "interleaved" and pp > 1 else None)
        lazy = [plan.lazy_grad_mem(p) if plan.lazy_grad_mem is not None else 0.0]

        self._lazy_open[p.pid] = bool(lazy[0])

        def grads_allocated():  # the first backward made the .grad tensors
            if lazy[0]:  # (less the FSDP2 shards its reduce-scatters made already)
                self.mem.append((env.now, p.pid, lazy[0] - self._early_grads.pop(p.pid, 0.0),
                                 "gradients"))
                lazy[0] = 0.0
                self._lazy_open[p.pid] = False

        torch_mem = plan.torch_memory is not None and pp > 1
        torch_casts = self._torch_mem_open(p) if torch_mem else 0.0
        for w in steps:
            if not isinstance(w, Work):  # a combined step (forward, backward)
                yield from self._pair(p, w, act_delta, start_gathers)
                grads_allocated()
                continue
            vs = plan.vs_of(p.stage, w.chunk)
            segs = self._phase_segments(p, w.chunk, w.phase)
            if w.phase == "F":
                if vs > 0:
                    yield self._recv_event(p.pid, "F", vs, w.microbatch)
                    if progs.pp_gather:
                        yield from self._pp_gather(p, "act", w.microbatch)
                if w.chunk in start_gathers:
                    yield start_gathers.pop(w.chunk)
                if plan.ds is not None:
                    yield from self._ds_zero3_pass(p, segs, "fwd", w.microbatch, fwd_mem)
                elif plan.zero == 3:
                    yield from self._zero3_pass(p, segs, "fwd", w.microbatch, fwd_mem)
                elif self._in_network(p, segs):
                    yield from self._run_segments(p, segs, "fwd", w.microbatch, fwd_mem)
                else:
                    yield self._segments_folded(p, segs, "fwd", w.microbatch, fwd_mem)
                if torch_mem:
                    self._torch_mem_pass(p, vs, "F")
                if torch_ends is not None:
                    next(torch_ends).succeed()
                elif vs < last_vs:
                    self._send(p, "F", vs, w.microbatch, w.chunk)
            else:
                weights = w.phase == "W"  # DualPipe's deferred weight gradients: no transfer
                if vs < last_vs and not weights:
                    yield self._recv_event(p.pid, "B", vs, w.microbatch)
                    if progs.pp_gather:
                        yield from self._pp_gather(p, "grad", w.microbatch)
                if vs == last_vs and plan.act_bytes_head_transient and not weights:
                    # the loss's working set, from the start of the head's backward
                    self.mem.append((env.now, p.pid, plan.act_bytes_head_transient,
                                     "activations"))
                last_mb = w.microbatch == plan.last_microbatch(w.chunk)
                # (a W pass frees nothing: its input-gradient pass freed the activations)
                freed = None if weights else bwd_mem
                if plan.ds is not None:
                    yield from self._ds_zero3_pass(p, segs, "bwd", w.microbatch, freed)
                elif plan.zero == 3:
                    yield from self._zero3_pass(p, segs, "bwd", w.microbatch, freed)
                elif last_mb and plan.overlap_grad_reduce:
                    # Gradients of the last micro-batch complete layer by layer: launch buckets.
                    for seg in segs:
                        yield from self._run_segments(p, [seg], _kind(seg[0]), w.microbatch,
                                                      freed)
                        if not grads_done(seg[0]):
                            continue
                        expert = self._expert_grad_bytes(seg)
                        buckets[w.chunk] += self._grad_bytes(seg, vs) - expert
                        ebuckets[w.chunk] += expert
                        for bk, stream in ((buckets, "dp"), (ebuckets, "edp")):
                            if bk[w.chunk] >= plan.bucket_bytes:
                                yield from self._dp_bucket(p, dp_reduce_op, bk[w.chunk],
                                                           bucket_id, stream)  # fmt: skip
                                bk[w.chunk] = 0.0
                    for bk, stream in ((buckets, "dp"), (ebuckets, "edp")):
                        if bk[w.chunk] and w.phase != "I":  # (I: the rest after its W)
                            yield from self._dp_bucket(p, dp_reduce_op, bk[w.chunk], bucket_id,
                                                       stream)  # fmt: skip
                            bk[w.chunk] = 0.0
                else:
                    yield from self._run_backward_segments(p, segs, w.microbatch, freed)
                    if last_mb:
                        done = [s for s in segs if grads_done(s[0])]
                        expert = sum(self._expert_grad_bytes(s) for s in done)
                        buckets[w.chunk] += sum(self._grad_bytes(s, vs) for s in done) - expert
                        ebuckets[w.chunk] += expert
                if torch_mem and not weights:
                    self._torch_mem_pass(p, vs, "B")
                if torch_ends is not None:
                    next(torch_ends).succeed()
                elif vs > 0 and not weights:
                    self._send(p, "B", vs, w.microbatch, w.chunk)
                grads_allocated()

        if torch_mem:
            self._torch_mem_close(p, torch_casts)
        if plan.zero != 3 and not plan.overlap_grad_reduce:
            # Without overlap Megatron-LM puts a model chunk's whole gradient buffer in one
            # bucket (megatron/core/distributed/distributed_data_parallel.py: bucket_size =
            # None when overlap_grad_reduce is off): one collective per chunk, after backward.
            for c in sorted(buckets.keys() | ebuckets.keys(), key=lambda c: by_vs.index(c)):
                for bk, stream in ((buckets, "dp"), (ebuckets, "edp")):
                    if bk[c] > 0:
                        yield from self._dp_bucket(p, dp_reduce_op, bk[c], bucket_id, stream)
        pending = self._pending.pop(p.pid, [])
        if pending:
            yield env.all_of(pending)
        if plan.grad_finalize is not None and plan.group_size.get("dp", 1) > 1:
            # e.g. PyTorch DDP copies the reduced buckets back into the parameters' .grad
            fin = plan.grad_finalize(p)
            if fin:
                yield self._segments_folded(p, [("grad finalize", -1, fin)], "bwd", -1, None)
        # Optimizer step on this GPU's shard.
        opt = plan.optimizer_program(p)
        temp = plan.optimizer_temp(p) if plan.optimizer_temp is not None else 0.0
        if temp:  # (beside every gradient: the step's peak where activations are small)
            self.mem.append((env.now, p.pid, temp, "optimizer"))
        yield self._segments_folded(p, [("optimizer", -1, opt)], "optimizer", -1, None)
        if temp:
            self.mem.append((env.now, p.pid, -temp, "optimizer"))
        if plan.zero in (1, 2) and not plan.overlap_param_gather:
            evs = []
            for c in by_vs:
                evs.extend(self._param_gathers(p, plan.vs_of(p.stage, c), c))
            yield env.all_of(evs)
        p.end_s = env.now

    def _chunk_segments(self, p: Proc, chunk: int, phase: str) -> list:
        """The (label, layer, program) segments of a forward (``"F"``) or backward pass of
        model chunk ``chunk`` on ``p``'s stage (the same for every micro-batch: built once)."""
        key = (p.pid, chunk, phase)
        hit = self._segs_cache.get(key)
        if hit is not None:
            return hit
        plan, progs = self.plan, p.programs
        vs, last_vs = plan.vs_of(p.stage, chunk), plan.pp * plan.virtual_stages - 1
        layers = plan.layers_of(p.stage, chunk)
        segs = []
        if phase == "F":
            if vs == 0:
                segs.append(("embed", -1, progs.embed_fwd))
            segs += [(f"L{layer} fwd", layer, progs.layer(layer)[0]) for layer in layers]
            if vs == last_vs:
                segs.append(("head", -1, progs.head_fwd))
        else:
            if vs == last_vs:
                segs.append(("head", -1, progs.head_bwd))
            for layer in reversed(layers):
                _, bwd, rec = progs.layer(layer)
                if rec:
                    segs.append((f"L{layer} recompute", layer, rec))
                segs.append((f"L{layer} bwd", layer, bwd))
            if vs == 0:
                segs.append(("embed", -1, progs.embed_bwd))
        self._segs_cache[key] = segs
        self._segs_comm[id(segs)] = self._has_comm(segs)
        return segs

    def _param_gathers(self, p: Proc, vs: int, c: int) -> list[simpy.Event]:
        """ZeRO-1/2: issue the all-gathers of virtual stage ``vs``'s updated parameters: the
        dense part over cp x dp (``gather``) and, where they have their own communicator, the
        routed experts over edp (``egather``)."""
        plan = self.plan
        expert = plan.stage_expert_param_bytes(vs) if plan.stage_expert_param_bytes else 0.0
        evs = [self._issue(p, self._spec(p, "gather", "zero_gather", "all_gather",
                                         plan.stage_param_bytes(vs) - expert,
                                         f"param all_gather c{c}"))]  # fmt: skip
        if expert:
            evs.append(self._issue(p, self._spec(p, "egather", "zero_gather", "all_gather",
                                                 expert, f"expert param all_gather c{c}")))
        return evs

    def _pp_gather(self, p: Proc, what: str, mb: int):
        """The receiver's TP all-gather of a pipeline transfer sent split (scatter/gather)."""
        if p.programs.pp_gather:
            seg = (f"{what} mb{mb} all_gather", -1, p.programs.pp_gather)
            yield from self._run_segments(p, [seg], "pp_comm", mb)

    def _run_backward_segments(self, p, segs, mb, mem_after):
        """Backward segments; a recompute allocates, the layer's backward frees. Recompute
        and backward rows carry their own kinds: each run of one kind is one timeout, or the
        whole pass one where nothing can change its pricing before it ends (:meth:`_settled`)."""
        if self._settled(p, segs):
            yield self._segments_folded(p, segs, None, mb, mem_after)
            return
        hit = self._runs_cache.get(id(segs))
        if hit is None:  # (keeps the segments alive, so their id is not reused)
            runs: list = []
            for seg in segs:
                if runs and runs[-1][0] == _kind(seg[0]):
                    runs[-1][1].append(seg)
                else:
                    runs.append((_kind(seg[0]), [seg]))
            hit = self._runs_cache[id(segs)] = (segs, runs)
            for _, run in runs:
                self._segs_comm[id(run)] = self._has_comm(run)
        for kind, run in hit[1]:
            if self._in_network(p, run):
                yield from self._run_segments(p, run, kind, mb, mem_after)
            else:
                yield self._segments_folded(p, run, kind, mb, mem_after)

    def _grad_bytes(self, seg, vs: int) -> float:
        """Gradient bytes (per TP rank, reduce dtype) a backward segment completes."""
        unit = unit_of(seg[0])
        if unit in ("embed", "head"):
            return self.plan.unit_bytes(unit)[1]
        return self.plan.layer_bytes(seg[1])[1]

    def _expert_grad_bytes(self, seg) -> float:
        """The routed experts' part of :meth:`_grad_bytes` where they are reduced over edp."""
        if self.plan.expert_bytes is None or seg[1] < 0:
            return 0.0
        return self.plan.expert_bytes(seg[1])[0]

    # -------------------------------------------------------------------------------- ZeRO-3

    def _zero3_pass(self, p: Proc, segs, kind: str, mb: int, mem_after):
        """ZeRO-3 / FSDP, one unit at a time (a layer, the embedding, the LM head): wait for
        its parameter all-gather (prefetched one unit ahead), compute, release the gathered
        parameters; in backward also reduce-scatter the unit's gradients.

        Eager ZeRO-3 (``plan.fsdp2_memory``) as FSDP2 runs it (``torch/distributed/fsdp/
        _fully_shard/``, PyTorch 2.11): the embedding, final norm and head are one root unit,
        gathered by one all-gather at the forward's start and reduce-scattered by one
        reduce-scatter after the embedding's backward (the root's post-backward runs in the
        final callback); ``plan.fsdp2_reshard`` says which units free their parameters after
        the forward (:meth:`_fsdp2_gather`). In backward the root's pre-backward hook runs on
        the gradient of the root's output: where that is the logits (``plan.fsdp2_loss_in_root``
        False) the loss's backward has run, so what the hook gathers (the root if it was freed,
        the last block's prefetch) is allocated after the loss's working set is freed; where it
        is the loss, before the loss's backward."""
        plan = self.plan
        gathers: dict[object, simpy.Event] = {}
        # eager (FSDP2): the host's time of each unit's hooks and collective calls, on the
        # host clock before the unit's kernels (hidden where the GPU is the slower one)
        fsdp_s = plan.host.fsdp_call_s if plan.host is not None else 0.0
        tensor_s = plan.host.fsdp_tensor_s if plan.host is not None else 0.0
        hooked: set[object] = set()

        def unit(label: str, layer: int) -> object:
            return layer if layer >= 0 else label  # "embed" | "head"

        def sizes(u: object) -> tuple[float, float]:
            if isinstance(u, int):
                _, grad, param = plan.layer_bytes(u)
                return param, grad
            return plan.unit_bytes(u) if plan.unit_bytes else (0.0, 0.0)

        def name(u: object) -> str:
            return f"L{u}" if isinstance(u, int) else str(u)

        fs = plan.fsdp2_memory
        root_units = ("embed", "head")
        root_bytes = sum(sizes(r)[0] for r in root_units)
        ratio = plan.fsdp2_grad_ratio
        held = {"rs": 0.0, "root_grads": 0.0}  # FSDP2: the last reduce-scatter input, ...
        shard_of = self._fsdp2_shard_fraction(p) if fs and kind == "bwd" else 0.0
        root_rs = 0.0  # FSDP2: the head's gradient bytes, reduce-scattered with the embedding's
        # FSDP2's backward: gathered bytes held back until the loss's working set is freed
        deferred: list[float] = []
        defer = fs and kind == "bwd" and not plan.fsdp2_loss_in_root
        copy_out = plan.fsdp2_copy_out if fs else None
        fresh: dict[object, float] = {}  # units gathered in this pass, bytes to copy out

        def mem(delta: float, what: str) -> None:
            if delta:
                self.mem.append((self.env.now, p.pid, delta, what))

        def hold(nbytes: float) -> None:
            if defer:
                deferred.append(nbytes)
            else:
                mem(nbytes, "zero_params")

        def gather(u: object) -> None:
            pbytes = sizes(u)[0]
            if u in gathers or pbytes <= 0:
                return
            if fs:
                nbytes = self._fsdp2_gather(p, u, kind, root_bytes, pbytes)
                if not nbytes:
                    return
                label = "root" if u in root_units else name(u)
                layer = u if isinstance(u, int) else -1
                spec = self._spec(p, "gather", "zero_gather", "all_gather", nbytes,
                                  f"{label} param all_gather", layer=layer, mb=mb)
                ev = self._issue(p, spec)
                for r in (root_units if u in root_units else (u,)):
                    gathers[r] = ev
                    fresh[r] = nbytes
                hold(nbytes if u in root_units else nbytes * plan.gather_keep_fraction)
                return
            layer = u if isinstance(u, int) else -1
            spec = self._spec(p, "gather", "zero_gather", "all_gather", pbytes,
                              f"{name(u)} param all_gather", layer=layer, mb=mb)
            mem(pbytes * plan.gather_keep_fraction, "zero_params")
            gathers[u] = self._issue(p, spec)

        order: list[object] = []
        for label, layer, _ in segs:
            u = unit(label, layer)
            if u not in order:
                order.append(u)
        defer = defer and bool(order) and order[0] == "head"
        if order:
            gather(order[0])
        for seg in segs:
            label, layer, prog = seg
            u = unit(label, layer)
            idx = order.index(u)
            if idx + 1 < len(order):
                gather(order[idx + 1])
            if u in gathers:
                yield gathers[u]
            if copy_out is not None and u in fresh:  # FSDP2's wait_for_unshard: the copy-out
                nbytes = fresh.pop(u)
                for r in (root_units if u in root_units else ()):
                    fresh.pop(r, None)
                prog = copy_out(nbytes)
                yield self._segments_folded(
                    p, [(f"{'root' if u in root_units else name(u)} gather copy-out", -1, prog)],
                    kind, mb, None)
            hook = "root" if fs and u in root_units else u  # FSDP2's root: one unit's hooks
            if (fsdp_s or tensor_s) and hook not in hooked:
                hooked.add(hook)
                count = self._fsdp2_calls if fs else self._unit_calls
                calls, tensors = count(u, kind, sizes(u), bool(tensor_s))
                p.host_s += calls * (fsdp_s + tensor_s * tensors)
            # Let the collectives issued at this instant start, so the kernels see them.
            yield self.env.timeout(0)
            f = mem_after
            pbytes, gbytes = sizes(u)
            grads = fs and kind == "bwd" and "recompute" not in label and gbytes > 0
            if grads and u != "head":  # a block's unsharded gradients, made by its backward
                # (its MLP's first, beside the recomputed activations); the head's weight
                # gradient comes last, after the loss's fp32 working set is freed
                mem(gbytes * ratio, "gradients")
            yield from self._run_segments(p, [seg], _kind(label) if kind == "bwd" else kind, mb, f)
            if defer and u == "head":  # the root's pre-backward: its gathers take memory now
                defer = False
                for nbytes in deferred:
                    mem(nbytes, "zero_params")
            last_use = kind == "fwd" or "recompute" not in label
            if fs and u in root_units:
                post_fwd = kind == "fwd" and u == "head" and plan.fsdp2_reshard == "all"
                if (post_fwd or kind == "bwd" and u == "embed") and self._root_held.pop(
                        p.pid, False):
                    mem(-root_bytes, "zero_params")  # resharded: after the forward or backward
            elif fs and kind == "fwd" and plan.fsdp2_reshard == "none":
                pass  # kept to the end of the unit's backward
            elif last_use and pbytes > 0:
                mem(-pbytes * plan.gather_keep_fraction, "zero_params")
            if grads:
                self._fsdp2_post_backward(p, u, gbytes, held, shard_of, mem)
            if kind == "bwd" and "recompute" not in label and gbytes > 0:
                if fs and u == "head":  # waits for the root's reduce-scatter, after the embedding
                    root_rs = gbytes
                    continue
                nbytes = gbytes + (root_rs if fs and u == "embed" else 0.0)
                what = "root" if fs and u == "embed" else name(u)
                yield from self._grad_prep(p, nbytes, f"{what} grad prep")
                spec = self._spec(p, "dp", "dp_comm", "reduce_scatter", nbytes,
                                  f"{what} grad reduce_scatter",
                                  layer=layer if layer >= 0 else -1, mb=mb)
                self._pending[p.pid].append(self._issue(p, spec))
        if held["rs"] or held["root_grads"]:
            mem(-held["rs"] - held["root_grads"], "gradients")

    def _unit_calls(self, u: object, kind: str, moved: tuple[float, float],
                    count_tensors: bool) -> tuple[int, int]:
        """(collective calls, parameter tensors) of unit ``u`` in a pass, FSDP2's hooks on
        every unit (:data:`FSDP_CALLS`)."""
        by_op = dict(zip(("all_gather", "reduce_scatter"), moved, strict=True))
        calls = sum(by_op[c] > 0 for c in FSDP_CALLS[kind])
        tensors = self.plan.unit_tensors(u) if count_tensors and self.plan.unit_tensors else 0
        return calls, tensors

    def _fsdp2_calls(self, u: object, kind: str, moved: tuple[float, float],
                     count_tensors: bool) -> tuple[int, int]:
        """:meth:`_unit_calls` as FSDP2 makes them: the root (embedding, final norm, head) is
        one unit of their tensors, all-gathered in the forward and in the backward only when
        resharded after the forward (``all``), reduce-scattered once; a block is not
        all-gathered in the backward under ``none``. A hook whose unshard is a no-op costs no
        call (``FSDPParamGroup.unshard`` returns before the copy-in)."""
        plan = self.plan
        root = u in ("embed", "head")
        if kind == "fwd":
            gathered = True
        elif root:
            gathered = plan.fsdp2_reshard == "all"
        else:
            gathered = plan.fsdp2_reshard != "none"
        if root:
            pbytes = sum(plan.unit_bytes(r)[0] for r in ("embed", "head"))
            gbytes = sum(plan.unit_bytes(r)[1] for r in ("embed", "head"))
        else:
            pbytes, gbytes = moved
        calls = int(gathered and pbytes > 0) + int(kind == "bwd" and gbytes > 0)
        tensors = 0
        if count_tensors and plan.unit_tensors:
            tensors = sum(plan.unit_tensors(r) for r in ("embed", "head")) if root \
                else plan.unit_tensors(u)
        return calls, tensors

    def _fsdp2_gather(self, p: Proc, u: object, kind: str, root_bytes: float,
                      pbytes: float) -> float:
        """Bytes FSDP2 all-gathers for unit ``u`` now (0: none). The root unit (``u`` the
        embedding or the head) is gathered whole, unless it is still gathered: ``_lazy_init``
        (``_fsdp_state.py``) leaves the root unresharded after the forward unless
        ``reshard_after_forward`` was passed to ``fully_shard`` (PyTorch >= 2.8, pytorch#155319;
        always before), so under ``default`` and ``none`` its backward gathers nothing. A block
        is gathered in every forward (``post_backward`` reshards it) and, unless its
        ``reshard_after_forward`` is False (``none``), again in the backward."""
        if u in ("embed", "head"):
            if self._root_held.get(p.pid):
                return 0.0
            self._root_held[p.pid] = True
            return root_bytes
        if kind == "bwd" and self.plan.fsdp2_reshard == "none":
            return 0.0
        return pbytes

    def _fsdp2_shard_fraction(self, p: Proc) -> float:
        """Sharded ``.grad`` bytes a process keeps per byte of a unit's unsharded gradient
        (its lazy gradients over every unit's; 0 where there are none)."""
        plan = self.plan
        lazy = plan.lazy_grad_mem(p) if plan.lazy_grad_mem is not None else 0.0
        units = sum(plan.layer_bytes(layer)[1] for layer in plan.layers_of(p.stage, 0))
        if plan.unit_bytes is not None:
            units += plan.unit_bytes("embed")[1] + plan.unit_bytes("head")[1]
        return lazy / units if units > 0 else 0.0

    def _fsdp2_post_backward(self, p: Proc, u: object, gbytes: float, held: dict,
                             shard_of: float, mem: Callable[[float, str], None]) -> None:
        """FSDP2's post-backward of unit ``u`` (``_fsdp_param_group.py``: ``post_backward``,
        ``foreach_reduce``): a block's unsharded gradients are copied into a new reduce-scatter
        input (reduce dtype) and dropped; the previous unit's input, kept until now, is freed
        (one in flight); the reduce-scatter's output is the unit's sharded ``.grad``. The root
        (embedding, final norm, head) reduces once, after the embedding's backward: the head's
        gradients wait for it."""
        ratio = self.plan.fsdp2_grad_ratio
        if isinstance(u, int):
            mem(gbytes - gbytes * ratio - held["rs"], "gradients")
            held["rs"] = gbytes
            if self._lazy_open.get(p.pid) and shard_of:
                mem(gbytes * shard_of, "gradients")
                self._early_grads[p.pid] += gbytes * shard_of
        elif u == "head":
            held["root_grads"] += gbytes * ratio
            mem(gbytes * ratio, "gradients")
        else:
            mem(-gbytes * ratio - held["root_grads"] - held["rs"], "gradients")
            held["rs"] = held["root_grads"] = 0.0

    # -------------------------------------------------------------------------------- comm

    def _comm_full(self, part: Part, p: Proc) -> simpy.Event:
        """Issue a collective of one GPU's program (full mode) on the stream of its dimension;
        its completion event."""
        spec = self._spec(p, part.dim, f"{part.dim}_comm", part.op, part.nbytes, part.name,
                          dim=part.dim)
        return self._issue(p, spec)

    def _spec(self, p: Proc, stream, kind, op, nbytes, name, layer=-1, mb=-1, dim=None
              ) -> CommSpec:
        """The record of a collective ``p`` issues on ``stream``, over the groups of ``dim``
        (default: the stream's own, :attr:`StepPlan.stream_dims`)."""
        members = self.plan.participants(p, stream)
        seq_key = (stream, members)
        n = self._seq[(p.pid, seq_key)]
        self._seq[(p.pid, seq_key)] = n + 1
        return CommSpec(stream, kind, self.plan.stream_dims[stream] if dim is None else dim, op,
                        nbytes, (seq_key, n), name, layer, mb)

    def _grad_prep(self, p: Proc, nbytes: float, label: str, stream: str = "dp"):
        """The framework's work on a gradient bucket before it is reduced (copy into the
        bucket, scaling, casting), on the compute stream."""
        prog = self.plan.grad_prep(nbytes) if self.plan.grad_prep else ()
        if prog and self.plan.group_size.get(stream, 1) > 1:
            yield self._segments_folded(p, [(label, -1, prog)], "bwd", -1, None)

    def _dp_bucket(self, p: Proc, op: str, nbytes: float, bucket_id: list[int], stream="dp"):
        """Issue a gradient bucket's reduction on ``stream`` (``dp``: over cp x dp; ``edp``:
        routed experts over the expert-data-parallel group)."""
        what = "grad" if stream == "dp" else "expert grad"
        yield from self._grad_prep(p, nbytes, f"bucket {bucket_id[0]} prep", stream)
        spec = self._spec(p, stream, "dp_comm", op, nbytes, f"{what} {op} bucket {bucket_id[0]}")
        bucket_id[0] += 1
        self._pending[p.pid].append(self._issue(p, spec))
        yield self.env.timeout(0)  # the reduction starts now, beside the next kernels

    def _issue(self, p: Proc, spec: CommSpec) -> simpy.Event:
        """Issue a collective on ``p``'s stream; returns the event of its completion on ``p``.

        A collective over a single GPU moves nothing: it completes at once."""
        if self.plan.group_size.get(spec.stream, 2) == 1:
            ev = self.env.event()
            ev.succeed()
            return ev
        done = self.env.event()
        # Gathers and gradient reductions share the data-parallel communicator, so they run
        # one after another in issue order (one NCCL stream per process group).
        queue = {"gather": "dp", "egather": "edp"}.get(spec.stream, spec.stream)
        prev = self._last_done.get((p.pid, queue))
        self._last_done[(p.pid, queue)] = done
        entry = self._rdv.setdefault(spec.key, [])
        entry.append((p, done, prev, self.env.now))
        members = spec.key[0][1]
        if len(entry) == len(members):
            del self._rdv[spec.key]
            self._dp_starting += spec.stream in DP_STREAMS
            self.env.process(self._run_collective(spec, entry))
        return done

    def _run_collective(self, spec: CommSpec, entry):
        env = self.env
        prevs = [e[2] for e in entry if e[2] is not None and not e[2].processed]
        if prevs:
            yield env.all_of(prevs)
        start = env.now
        p0 = entry[0][0]
        shares_gpu = spec.stream in DP_STREAMS
        if shares_gpu:
            self._dp_starting -= 1
            self._dp_running += 1
            for p, *_ in entry:
                self._inflight[p.pid] += 1
        if self.plan.comm_exec is not None:
            yield env.process(self.plan.comm_exec(spec, p0))
        else:
            yield env.timeout(self.plan.comm_time(spec, p0))
        slow = (self.plan.comm_slowdown(spec.op, spec.nbytes, self.plan.group_size.get(
            spec.stream, 2)) if shares_gpu and self.plan.comm_slowdown else 0.0)
        if slow:
            # the collective's kernels ran slower for as long as their GPU computed beside them
            beside = max(_busy_within(p.busy, start, env.now) for p, *_ in entry)
            if slow * beside > 1e-9:  # (below a nanosecond: a rounding tie, no extra event)
                yield env.timeout(slow * beside)
        if shares_gpu:
            self._dp_running -= 1
            for p, *_ in entry:
                self._inflight[p.pid] -= 1
        end = env.now
        self.comm_log.append((p0, spec))
        for p, done, _, _ in entry:
            self._row(p, spec.stream, spec.kind, spec.name, start, end, spec.nbytes, 0.0,
                      spec.layer, spec.microbatch, dim=spec.dim)
            p.comm_iv[spec.stream].append((start, end))
            done.succeed()


def _busy_within(busy: list[tuple], a: float, b: float) -> float:
    """Seconds of [a, b] during which a process's compute ran (its ``busy`` intervals are in
    time order and do not overlap)."""
    out = 0.0
    for iv in reversed(busy):
        s, e = iv[0], iv[1]
        if e <= a:
            break
        out += max(0.0, min(e, b) - max(s, a))
    return out


def _row_dim(prog: Sequence[Part]) -> str:
    """A compute-stream row's ``dim``: its collective's where the row is one collective (a
    pipeline tensor's TP all-gather); "" otherwise (coalesced ones carry theirs in parts)."""
    return prog[0].dim if len(prog) == 1 and prog[0].kind == "comm" else ""


def _flops(prog: Sequence[Part]) -> float:
    return float(sum(q.flops for q in prog))


def _kind(label: str) -> str:
    if "recompute" in label:
        return "recompute"
    return "bwd"
