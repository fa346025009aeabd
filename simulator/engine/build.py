"""Turn a resolved job into a :class:`~simulator.engine.sim.StepPlan`.

Folding (``detail="folded"``): DP replicas are grouped into *replica classes* by their
signature (per-stage straggler slowdown and whether a faulted link touches them); each
(class, stage) is one simulated process standing for every GPU of the stage in every replica of
the class: the ranks of its *inner* dimensions (all but ``dp`` and ``pp``: ``tp`` and ``cp``),
which synchronise at every layer, and the replicas, whose op sequences and network positions
are equivalent. Every collective is still priced on the real groups' links with all of the
class's concurrent copies sharing them. A fault that breaks the symmetry adds classes (more
processes), never removes detail.

Full detail (``detail="full"``): one process per GPU, every collective and send executed
step by step as flows in the max-min fair network.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np
import simpy

from simulator.config.checks import Resolved
from simulator.config.schema import TopologyConfig, WorkloadConfig
from simulator.engine.contention import contention_modes
from simulator.engine.deepspeed_zero import deepspeed_plan
from simulator.engine.dispatch import DEEPEP, deepep_copies, routed_cost, routed_steps
from simulator.engine.host import (
    HostRates,
    dtensor_extra,
    dtensor_opt_s,
    dtensor_param_tensors,
    multihot_op_s,
)
from simulator.engine.program import (
    Part,
    Pricer,
    StagePrograms,
    build_stage_programs,
    embed_grad,
    embed_tp,
    optimizer_parts,
    weight_cast_share,
    weight_quant_share,
)
from simulator.engine.sim import DP_STREAMS, CommSpec, Proc, StepPlan
from simulator.errors import ConfigError
from simulator.hardware import power
from simulator.hardware.catalog import GPUSpec
from simulator.hardware.compute import ComputeModel
from simulator.hardware.precision import non_tn_fp8, pricing_dtype, weight_bytes
from simulator.model import comm as mc
from simulator.model import deepspeed as dsz
from simulator.model import eager, kernel_first, moe_layer, moe_sizes, mtp, shape_cache
from simulator.model import memory as mem
from simulator.model import moe as moe_math
from simulator.model import transformer as tf
from simulator.model.moe import (
    beside_ep_slowdown,
    ep_comm_extra,
    first_launch_drains,
    new_shape_share,
)
from simulator.model.ops import DTYPE_BYTES as BYTES
from simulator.model.ops import Op
from simulator.model.pipeline_memory import TorchPipelineMemory, runtime_memory
from simulator.model.sync import (
    group_sync_factor,
    host_barrier_s,
    host_group_factor,
    host_group_size,
    sync_group_size,
)
from simulator.network.collectives import CollectiveCost, CollectiveModel, Step
from simulator.network.flows import FlowNetwork
from simulator.network.interference import slowdown_fn
from simulator.network.topology import Topology, load_fabrics
from simulator.parallel.layout import Layout
from simulator.parallel.schedules import chunks_per_rank, mirror, stage_rank, virtual_stage

#: Dimensions whose gradients are reduced together, and over which ZeRO shards the model
#: states: context- and data-parallel ranks hold the same weights (Megatron-LM's
#: data-parallel group "with context parallel").
GRAD_DIMS = ("cp", "dp")
#: Largest job whose folded program collectives and sends may run in the flow network
#: (contention with DP / ZeRO traffic); the same bound as ``--detail full``.
CONTENTION_MAX_GPUS = 512
#: Dimensions that are not folded into one process: replicas and pipeline stages.
OUTER_DIMS = ("dp", "pp")


@dataclass
class Machine:
    """The hardware side of a run: GPU, topology graph, compute and collective models."""

    gpu: GPUSpec
    topology: Topology
    compute: ComputeModel
    collectives: CollectiveModel


@dataclass(frozen=True)
class Job:
    """A resolved job, what every lower layer receives: the workload's model and training
    settings, its layout (every dimension's size and order, the pipeline split) and the
    number of micro-batches, the cluster, and the machine models."""

    work: WorkloadConfig
    topo: TopologyConfig
    layout: Layout
    microbatches: int
    machine: Machine
    #: further layouts over the same GPUs, by name: ``moe`` (``etp, ep, edp, pp``, MoE
    #: Parallel Folding) when the model has experts spread over several GPUs
    others: tuple[tuple[str, Layout], ...] = ()

    @property
    def inner_dims(self) -> tuple[str, ...]:
        return tuple(d for d in self.layout.dims if d not in OUTER_DIMS)

    def layout_of(self, dim: str) -> Layout:
        """The layout that has dimension ``dim`` (the dense one first)."""
        if dim in self.layout.dims:
            return self.layout
        for _, lay in self.others:
            if dim in lay.dims:
                return lay
        return self.layout  # a dimension of size 1 everywhere


#: Order of the MoE layout's dimensions, innermost first (Megatron-Core's expert rank order).
MOE_DIMS = ("etp", "ep", "edp", "pp")


def make_layout(work: WorkloadConfig, res: Resolved) -> Layout:
    """The layout of a resolved workload (every dimension, in the workload's rank order)."""
    return Layout.of(dict(res.sizes), res.order, virtual_stages=res.virtual_stages,
                     stage_layers=res.stage_layers)  # fmt: skip


def make_job(work: WorkloadConfig, topo: TopologyConfig, res: Resolved, machine: Machine) -> Job:
    """The resolved job: the dense layout, and the MoE one where experts are split."""
    others = ()
    ep, etp = getattr(res, "ep", 1), getattr(res, "etp", 1)
    if ep * etp > 1:
        sizes = {"etp": etp, "ep": ep, "edp": getattr(res, "edp", 1), "pp": res.size("pp")}
        moe = Layout.of(sizes, MOE_DIMS, virtual_stages=res.virtual_stages,
                        stage_layers=res.stage_layers)  # fmt: skip
        others = (("moe", moe),)
    return Job(work, topo, make_layout(work, res), res.microbatches, machine, others)


def gpu_slowdowns(work: WorkloadConfig, topo: TopologyConfig) -> dict[int, float]:
    """Compute slowdown factor per GPU from the workload's stragglers (1.0 when absent)."""
    slow: dict[int, float] = {}
    for s in work.faults.stragglers:
        gpus = (
            [s.gpu]
            if s.gpu is not None
            else range(s.node * topo.gpus_per_node, (s.node + 1) * topo.gpus_per_node)
        )
        for g in gpus:
            slow[g] = max(slow.get(g, 1.0), s.slowdown)
    return slow


def faulted_gpus(work: WorkloadConfig, topo: TopologyConfig) -> set[int]:
    """GPUs next to a degraded or failed link (their replicas get their own class)."""
    out: set[int] = set()
    for lf in work.faults.links:
        if lf.kind == "nvlink" and lf.gpu is not None:
            out.add(lf.gpu)
        elif lf.node is not None:
            out.update(range(lf.node * topo.gpus_per_node, (lf.node + 1) * topo.gpus_per_node))
    return out


def replica_classes(
    layout: Layout, slow: dict[int, float], faulted: set[int]
) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """Group DP replicas with identical behaviour: [(replicas, per-stage slowdown)]."""
    if not slow and not faulted:  # every replica alike: one class
        return [(tuple(range(layout.size("dp"))), (1.0,) * layout.size("pp"))]
    inner = tuple(d for d in layout.dims if d not in OUTER_DIMS)
    sig_of: dict[tuple, list[int]] = defaultdict(list)
    for d in range(layout.size("dp")):
        sig = []
        special = False
        for s in range(layout.size("pp")):
            grp = layout.group(inner, {"dp": d, "pp": s})
            sig.append(max(slow.get(g, 1.0) for g in grp))
            special |= any(g in faulted for g in grp)
        key = (tuple(sig), d if special else -1)
        sig_of[key].append(d)
    classes = sorted(sig_of.items(), key=lambda kv: kv[1][0])
    return [(tuple(ds), key[0]) for key, ds in classes]


#: Streams whose collectives run on the routed experts' expert-data-parallel groups.
EXPERT_STREAMS = ("edp", "egather")


def _stream_dims(stream: str) -> str | tuple[str, ...]:
    """The dimension(s) whose groups a stream's collectives run on."""
    if stream in ("dp", "gather"):
        return GRAD_DIMS
    return "edp" if stream in EXPERT_STREAMS else stream


def ring_pairs(group: tuple[int, ...]) -> list[tuple[int, int]]:
    """Every member's send to its ring successor (a context-parallel K/V hop)."""
    n = len(group)
    return [(group[i], group[(i + 1) % n]) for i in range(n)] if n > 1 else []


class _Comm:
    """Groups and prices of a job's collectives (folded and full detail alike)."""

    def __init__(self, job: Job):
        self.job = job
        self.layout = job.layout
        self.coll = job.machine.collectives
        self._groups: dict[tuple, list[tuple[int, ...]]] = {}

    def group_of(self, dims: str | tuple[str, ...], gpu: int) -> tuple[int, ...]:
        """The group of ``dims`` that GPU ``gpu`` belongs to, in whichever layout has them."""
        lay = self.job.layout_of(dims if isinstance(dims, str) else dims[0])
        return lay.group(dims, lay.coords(gpu))

    def proc_groups(self, dim, p: Proc) -> list[tuple[int, ...]]:
        """The groups of ``dim`` among the GPUs ``p`` stands for (its concurrent copies)."""
        key = (dim, p.pid)
        hit = self._groups.get(key)
        if hit is None:
            hit = self._groups[key] = self._proc_groups(dim, p)
        return hit

    def deepep_copies(self) -> float:
        """Token vectors a rank sends per token of its own in DeepEP's dispatch (its first
        EP group, every group placed alike; 1 without DeepEP)."""
        work = self.job.work
        return deepep_copies(work.training.moe_dispatcher, work.model.moe, self.coll.topology,
                             lambda: self.job.layout_of("ep").groups("ep", {"pp": (0,)})[0])

    def _proc_groups(self, dim, p: Proc) -> list[tuple[int, ...]]:
        if p.coords is not None:
            return [self.group_of(dim, p.gpu)]
        if dim in self.layout.dims or isinstance(dim, tuple):
            return self.layout.groups(dim, {"dp": p.replicas, "pp": (p.stage,)})
        # a dimension of another layout (MoE): its groups that meet this process's GPUs
        gpus = {g for d in p.replicas
                for g in self.layout.group(self.job.inner_dims, {"dp": d, "pp": p.stage})}
        lay = self.job.layout_of(dim)
        return [g for g in lay.groups(dim, {"pp": (p.stage,)}) if not gpus.isdisjoint(g)]

    def cost(self, op: str, groups: list[tuple[int, ...]], nbytes: float) -> CollectiveCost:
        if op == "send_recv":
            return self.coll.p2p_cost([pr for g in groups for pr in ring_pairs(g)], nbytes)
        if op == DEEPEP:
            return routed_cost(self.coll, self.job.work.model.moe, groups, nbytes)
        return self.coll.cost(op, tuple(groups), nbytes)

    def part_cost(self, p: Proc, part: Part) -> CollectiveCost:
        return self.cost(part.op, self.proc_groups(part.dim, p), part.nbytes)

    def launch_s(self, op: str, group) -> float:
        if op == "send_recv":  # one launch for the send to the successor
            return self.coll.launch_s("send", tuple(group[:2])) if len(group) > 1 else 0.0
        return self.coll.launch_s("all_to_all" if op == DEEPEP else op, group)

    def steps(self, op: str, groups: list[tuple[int, ...]], nbytes: float) -> list[Step]:
        """The flow sets of ``op`` on ``groups`` (bundled: identical steps merged)."""
        if op == "send_recv":
            return self.coll.bundles("send", [pr for g in groups for pr in ring_pairs(g)], nbytes)
        if op == DEEPEP:
            return routed_steps(self.coll, self.job.work.model.moe, groups, nbytes)
        return self.coll.bundles(op, tuple(groups), nbytes)


def build_plan(
    job: Job, *, detail: str = "folded", env: simpy.Environment | None = None
) -> tuple[StepPlan, FlowNetwork | None]:
    """Build the processes, programs and communication hooks of one training step."""
    b = _Builder(job, detail, env)
    return b.plan(), b.net


class _Builder:
    """The parts of a :class:`StepPlan`: processes, sizes, communication, framework work."""

    def __init__(self, job: Job, detail: str, env):
        self.job, self.detail, self.env = job, detail, env
        work, lay = job.work, job.layout
        self.m, self.t, self.par = work.model, work.training, work.parallelism
        self.lay = lay
        self.tp, self.pp, self.v = lay.size("tp"), lay.size("pp"), lay.virtual_stages
        self.shard = 1  # ranks that hold the same weights: gradients reduced, ZeRO shards
        for d in GRAD_DIMS:
            self.shard *= lay.size(d)
        self.sp = self.par.sequence_parallel and self.tp > 1
        self.embed_tp = embed_tp(self.par, self.tp)
        self.local_model = mc.cp_local(self.m, lay.size("cp"))
        # MoE Parallel Folding: experts split ep x etp ways, their states sharded over edp
        self.ep = job.layout_of("ep").size("ep")
        self.etp = job.layout_of("etp").size("etp")
        self.edp = job.layout_of("edp").size("edp") if self.ep * self.etp > 1 else self.shard
        # DualPipe: each stage is held by two ranks (i and pp - 1 - i) in every replica, whose
        # gradients are summed and whose model states ZeRO shards over both
        self.schedule = self.par.pp_schedule
        self.chunks = chunks_per_rank(self.schedule, self.v)
        if mirror(self.schedule, 0, self.pp) is not None:
            self.shard, self.edp = 2 * self.shard, 2 * self.edp
        self.comm = _Comm(job)
        self.net = FlowNetwork(env, job.machine.topology)
        self._progs: dict[tuple, StagePrograms] = {}
        self._cost_cache: dict[tuple, CollectiveCost] = {}
        self._grad_groups: dict[int, list[tuple[int, ...]]] = {}
        self.procs: list[Proc] = []
        self.pid_of: dict[tuple, int] = {}
        self._make_procs()

    # ---- processes and programs

    def programs_for(self, p: Proc) -> StagePrograms:
        if p.coords is None:
            key: tuple = (p.stage, p.replicas)
        else:
            key = (p.stage, tuple(self.comm.proc_groups(d, p)[0] for d in self.job.inner_dims))
        hit = self._progs.get(key)
        if hit is None:
            cache: dict[tuple, float] = {}

            def comm_cost(dim: str, op: str, nbytes: float) -> float:
                k = (dim, op, nbytes)
                if k not in cache:
                    cache[k] = self.comm.cost(op, self.comm.proc_groups(dim, p), nbytes).time_s
                return cache[k]

            t = self.t

            def build(scale: float) -> StagePrograms:
                return build_stage_programs(
                    model=self.m, micro_batch=t.micro_batch, tp=self.tp, sp=self.sp,
                    recompute=t.recompute, dtype=pricing_dtype(t), cm=self.job.machine.compute,
                    comm_cost=comm_cost, flash_attention=t.flash_attention, kernels=t.kernels,
                    param_dtype=t.param_dtype, cp=self.lay.size("cp"), cp_comm=self.par.cp_comm,
                    moe_kw=self.moe_kw(), recompute_modules=moe_sizes.recompute_modules(t),
                    tp_input_dtype=self.par.tp_input_dtype,
                    tp_impl=self.par.tp_impl, grad_accumulation=self.grad_accumulation(),
                    tp_loss=self.par.tp_loss, embed_grad=embed_grad(t, self.m, self.pp),
                    embed_tp=self.embed_tp, gemm_scale=scale,
                    weight_cast_share=weight_cast_share(self.par, t, self.m, self.pp,
                                                        self.job.microbatches),
                    weight_quant_share=weight_quant_share(t, self.job.microbatches),
                )  # fmt: skip
            hit = build(1.0)
            scale = self.gemm_clock_scale(p, hit)
            if scale != 1.0:
                hit = build(scale)
            if self.pp > 1 and self.tp > 1 and self.par.pp_scatter_gather and not self.sp:
                # Megatron's scatter/gather (Narayanan et al. 2021, Sec. 4.1): each TP rank
                # sends 1/tp of the boundary tensor; the receiver all-gathers it over its TP
                # group before using it (activations forward, gradients backward).
                whole = tf.pp_activation_bytes(
                    self.local_model, micro_batch=t.micro_batch, tp=1, sequence_parallel=False,
                    dtype_bytes=tf.pp_stream_bytes(t.kernels, t.param_dtype))  # fmt: skip
                gather = Part("pp all_gather", "comm", comm_cost("tp", "all_gather", whole),
                              op="all_gather", nbytes=whole, dim="tp")  # fmt: skip
                hit = replace(hit, pp_gather=(gather,))
            self._progs[key] = hit
        return hit

    def gemm_clock_scale(self, p: Proc, sp: StagePrograms) -> float:
        """``training.gemm_clock: power_limited``: GEMM time relative to its calibration at the
        SM clock this stage's kernel mix keeps under the GPU's power cap
        (:func:`simulator.hardware.power.gemm_clock_factor`): the
        tensor-core share of the stage's compute time in a step (layers, recompute, the head on
        the last stage and the embedding on the first, every micro-batch; the optimizer step)."""
        gpu = self.job.machine.gpu
        pc = getattr(gpu, "power_clock", None)
        if not pc or self.t.gemm_clock != "power_limited":
            return 1.0
        m = self.job.microbatches
        layers = self.m.layers / self.pp
        # each kind of layer (an MoE model's dense layers, local attention) by its share of
        # the stage's layers
        own = [g for c in range(self.chunks) for g in self.layers_of(p.stage, c)]
        kinds: dict[int, int] = {}
        for g in own:
            kinds[sp.kind(g)] = kinds.get(sp.kind(g), 0) + 1
        share = {k: n / len(own) for k, n in kinds.items()} if own else {0: 1.0}
        progs = [(prog, layers * m * w) for k, w in share.items()
                 for prog in sp.kind_programs(k)]  # fmt: skip
        progs.append((self.optimizer_program(p), 1.0))
        if p.stage == 0:
            progs += [(sp.embed_fwd, m), (sp.embed_bwd, m)]
        if p.stage == self.pp - 1:
            progs += [(sp.head_fwd, m), (sp.head_bwd, m)]
        tc = mem = 0.0
        for prog, w in progs:
            for part in prog:
                if part.kind != "compute":
                    continue
                if part.flops > 0:
                    tc += part.dur * w
                else:
                    mem += part.dur * w
        if tc + mem <= 0:
            return 1.0
        return power.gemm_clock_factor(pc, gpu.power_W, tc / (tc + mem))

    def grad_accumulation(self) -> tuple[int, float] | None:
        """``(buffer bytes, share of micro-batches)`` of an unfused gradient accumulation
        (``training.grad_accumulation_fusion: false``, fused kernels with 16-bit weights; eager
        code with 16-bit weights, see below; fp32 master weights already add into ``.grad``
        in their op lists). A 16-bit buffer is
        autograd's ``.grad``, which the first micro-batch fills without an addition; an fp32
        one is LocalDDP's ``main_grad``, added to every micro-batch
        (:func:`simulator.model.transformer.unfused_grad_accumulation`)."""
        t = self.t
        m = self.job.microbatches
        if t.kernels == "eager":
            # eager code with 16-bit parameters: autograd's AccumulateGrad adds each fresh
            # weight gradient into ``.grad`` (``.grad += g``, read both, write the sum) on every
            # micro-batch after the first (data/measured/acgemm-h100x1: the profiled step has one add
            # kernel per weight, in the second micro-batch's backward only). fp32 parameters add in
            # the eager op list itself (``_linear_bwd``); sharded gradients (ZeRO-2/3, FSDP)
            # and MoE layers are not covered here.
            if (t.param_dtype == "fp32" or m < 2 or self.par.zero >= 2
                    or self.m.moe is not None):
                return None
            return tf.DTYPE_BYTES[t.param_dtype], (m - 1) / m
        if t.grad_accumulation_fusion or t.kernels != "fused" or t.param_dtype != "bf16":
            return None
        acc = tf.DTYPE_BYTES[t.grad_reduce_dtype]
        return acc, 1.0 if acc > 2 else (m - 1) / m

    def moe_kw(self) -> dict | None:
        """The MoE block's settings for :func:`simulator.model.moe_layer.layer_ops`."""
        if self.m.moe is None:
            return None
        return moe_layer.layer_settings(self.t, self.ep, self.etp)

    def sync_group(self) -> int:
        """GPUs that meet at every layer's collective on the critical path
        (:func:`simulator.model.sync.sync_group_size`)."""
        return sync_group_size(self.tp, self.lay.size("cp"), self.ep, self.etp,
                               self.m.moe is not None)

    def _make_procs(self) -> None:
        lay, inner = self.lay, self.job.inner_dims
        slow = gpu_slowdowns(self.job.work, self.job.topo)
        # each layer waits for the group's slowest GPU (simulator/model/sync.py); a straggler
        # slower than that is the slowest anyway, so the larger of the two factors
        sync = group_sync_factor(self.sync_group(), self.job.machine.gpu.sync_jitter)
        self.slow = slow
        self.classes = replica_classes(lay, slow, faulted_gpus(self.job.work, self.job.topo))
        self.class_of_replica = {d: c for c, (reps, _) in enumerate(self.classes) for d in reps}
        procs = self.procs
        if self.detail == "folded":
            for c, (replicas, sig) in enumerate(self.classes):
                for s in range(self.pp):
                    p = Proc(len(procs), f"c{c}.s{s}", s, c, replicas, None,
                             lay.rank({"dp": replicas[0], "pp": s}), max(sig[s], sync),
                             None)  # fmt: skip
                    self.pid_of[(c, s)] = p.pid
                    p.programs = self.programs_for(p)
                    procs.append(p)
            return
        for d in range(lay.size("dp")):
            for s in range(self.pp):
                for g in lay.group(inner, {"dp": d, "pp": s}):
                    p = Proc(len(procs), f"g{g}", s, d, (d,), lay.coords(g), g,
                             max(slow.get(g, 1.0), sync), None)  # fmt: skip
                    self.pid_of[g] = p.pid
                    p.programs = self.programs_for(p)
                    procs.append(p)

    def _holders(self, stage: int) -> tuple[int, ...]:
        """The pipeline ranks holding ``stage``'s weights: itself, and DualPipe's mirror."""
        twin = mirror(self.schedule, stage, self.pp)
        return (stage,) if twin is None else tuple(sorted((stage, twin)))

    def participants(self, p: Proc, stream: str) -> tuple[int, ...]:
        if p.coords is None and stream not in DP_STREAMS:
            return (p.pid,)  # a program collective: the process holds its whole group
        if p.coords is None:
            return tuple(
                sorted({self.pid_of[(self.class_of_replica[d], s)]
                        for d in range(self.lay.size("dp")) for s in self._holders(p.stage)})
            )  # fmt: skip
        return tuple(self.pid_of[g] for g in self.stream_group(stream, p.gpu))

    def stream_group(self, stream: str, gpu: int) -> tuple[int, ...]:
        """The group of GPU ``gpu`` that a stream's collectives run on; a data-parallel one
        also over DualPipe's mirrored rank (the same coordinates but ``pp``)."""
        dims = _stream_dims(stream)
        coords = self.lay.coords(gpu)
        if stream not in DP_STREAMS or len(self._holders(coords["pp"])) == 1:
            return self.comm.group_of(dims, gpu)
        # (every member lists the group in the same order: the rendezvous key)
        return sum((self.comm.group_of(dims, self.lay.rank({**coords, "pp": s}))
                    for s in self._holders(coords["pp"])), ())  # fmt: skip

    def peer(self, p: Proc, phase: str, dst_vs: int, chunk: int = 0) -> int:
        dst_stage = stage_rank(self.schedule, dst_vs, chunk, self.pp)
        if p.coords is None:
            return self.pid_of[(p.replica_class, dst_stage)]
        return self.pid_of[self.lay.rank({**p.coords, "pp": dst_stage})]

    # ---- sizes and memory

    def layer_local(self, layer: int) -> tuple[float, float]:
        """Parameters of global layer ``layer`` on one rank: (the part split over TP and
        replicated over cp x dp, the routed experts split over ep x etp)."""
        return moe_sizes.layer_local_params(self.m, layer, tp=self.tp, ep=self.ep, etp=self.etp)

    def layers_of(self, stage: int, chunk: int) -> range:
        """Global layers of chunk ``chunk`` of pipeline rank ``stage`` (the layout's
        ``layers_of`` takes the virtual stage as ``chunk * pp + stage``)."""
        vs = virtual_stage(self.schedule, stage, chunk, self.pp)
        return self.lay.layers_of(vs % self.pp, vs // self.pp)

    def vs_local(self, vs: int) -> tuple[float, float]:
        """:meth:`layer_local` summed over a virtual stage, the embedding on the first and
        the final norm and head on the last (split over TP)."""
        start = sum(self.lay.stage_layers[:vs])
        dense = expert = 0.0
        for layer in range(start, start + self.lay.stage_layers[vs]):
            a, b = self.layer_local(layer)
            dense, expert = dense + a, expert + b
        if vs == 0:  # (whole on every TP rank with parallelism.tp_embedding: replicated)
            dense += tf.embedding_params(self.m) / self.embed_tp
        if vs == self.pp * self.v - 1:
            dense += (tf.head_params(self.m) + tf.final_norm_params(self.m)) / self.tp
            if self.m.mtp_depth:  # MTP modules: a layer of the last kind, eh_proj, norms
                a, b = self.layer_local(self.m.layers - 1)
                dense += self.m.mtp_depth * a + mtp.mtp_params(self.m, 0) / self.tp
                expert += self.m.mtp_depth * b
        return dense, expert

    def stage_local(self, stage: int) -> tuple[float, float]:
        """:meth:`vs_local` summed over the chunks rank ``stage`` holds."""
        parts = [self.vs_local(virtual_stage(self.schedule, stage, c, self.pp))
                 for c in range(self.chunks)]  # fmt: skip
        return sum(a for a, _ in parts), sum(b for _, b in parts)

    def stage_params(self, stage: int) -> float:
        """Parameters one TP rank of ``stage`` holds, TP-equivalent (x tp): the dense part
        and the experts of this rank."""
        dense, expert = self.stage_local(stage)
        return (dense + expert) * self.tp

    def static_mem(self, p: Proc) -> dict[str, float]:
        t, zero = self.t, self.par.zero
        dense, expert = self.stage_local(p.stage)
        kw = dict(zero=zero, param_dtype=t.param_dtype, grad_dtype=t.grad_reduce_dtype,
                  kernels=t.kernels, moments_dtype=t.optimizer_moments_dtype,
                  master_weights=t.master_weights,
                  weight_bytes=weight_bytes(t, BYTES[t.param_dtype],
                                            non_tn_fp8(self.job.machine.gpu))[0])  # fmt: skip
        ds_w = ds_g = 0.0
        if t.zero_impl == "deepspeed":  # DeepSpeed's own states, whatever the kernels
            kw["kernels"] = "fused"
            ds_w, ds_g = dsz.extra_state_bytes(
                self.m, tp=self.tp, world=self.shard, work_bytes=BYTES[t.param_dtype],
                threshold=t.deepspeed.param_persistence_threshold,
                bucket=t.deepspeed.reduce_bucket_size)  # fmt: skip
        ms = mem.model_state_bytes(dense, dp=self.shard, **kw)
        mx = mem.model_state_bytes(expert, dp=self.edp, **kw)
        return {"weights": ms.weights + mx.weights + ds_w,
                "gradients": ms.gradients + mx.gradients + self._buckets(p) - self.lazy_grads(p)
                + ds_g,
                "optimizer": ms.optimizer + mx.optimizer}  # fmt: skip

    def _buckets(self, p: Proc) -> float:
        """PyTorch DDP's gradient buckets (eager): gradient copies, counted with the gradients."""
        t = self.t
        return mem.ddp_bucket_bytes(
            sum(self.stage_local(p.stage)), kernels=t.kernels, zero=self.par.zero, dp=self.shard,
            param_dtype=t.param_dtype, grad_dtype=t.grad_reduce_dtype, buckets=t.ddp_buckets,
            micro_batches=self.job.microbatches,
        )  # fmt: skip

    def first_steps_extra(self, p: Proc) -> float:
        """Bytes beyond the steady-state peak in a run's first steps: PyTorch DDP's constructor
        bucket set, still live at the peak of the iteration that rebuilds the buckets
        (:data:`simulator.model.memory.DDP_REBUILD_EXTRA_SETS`)."""
        t = self.t
        if t.kernels != "eager" or self.par.zero != 0 or self.shard <= 1 or t.ddp_buckets == "none":
            return 0.0
        one_set = mem.ddp_bucket_bytes(
            sum(self.stage_local(p.stage)), kernels=t.kernels, zero=0, dp=self.shard,
            param_dtype=t.param_dtype, grad_dtype=t.grad_reduce_dtype,
        )  # fmt: skip
        return mem.DDP_REBUILD_EXTRA_SETS * one_set / mem.DDP_BUCKET_SETS

    def lazy_grads(self, p: Proc) -> float:
        """Gradient bytes that exist only from the step's first backward: eager code's ``.grad``
        tensors, freed by ``zero_grad(set_to_none=True)`` (PyTorch's default since 2.0) and
        made again by the next backward, so the first micro-batch's forward and loss run
        without them. Not DDP's buckets (kept by the Reducer), and with
        ``gradient_as_bucket_view`` the gradients are the buckets: there only the ``no_sync``
        micro-batches' gradients beside them are lazy. Fused (Megatron-LM) code keeps one
        contiguous gradient buffer: none."""
        t = self.t
        if t.kernels != "eager":
            return 0.0
        if self.par.zero == 0 and self.shard > 1 and t.ddp_buckets == "view":
            return self._buckets(p)
        dense, expert = self.stage_local(p.stage)
        kw = dict(zero=self.par.zero, param_dtype=t.param_dtype, grad_dtype=t.grad_reduce_dtype,
                  kernels=t.kernels, moments_dtype=t.optimizer_moments_dtype)  # fmt: skip
        return (mem.model_state_bytes(dense, dp=self.shard, **kw).gradients
                + mem.model_state_bytes(expert, dp=self.edp, **kw).gradients)  # fmt: skip

    def optimizer_temp(self, p: Proc) -> float:
        """Bytes ``torch.optim.AdamW(foreach=True)`` allocates during its step
        (``training.optimizer_impl: foreach``): ``_multi_tensor_adam`` writes
        ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``, a new list as large as the
        second moments of the rank's parameters (torch/optim/adam.py), divides and adds eps
        in place and frees it after the ``addcdiv_``; every ``.grad`` is alive then. The
        fused step (one kernel a tensor chunk) allocates nothing. Counted over all the rank's
        parameters (one ``(device, dtype)`` group; a script's second parameter group of a few
        replicated tensors runs after the first and is smaller)."""
        t = self.t
        if t.optimizer_impl != "foreach":
            return 0.0
        return self.optimizer_params(p) * BYTES[t.optimizer_moments_dtype]

    def optimizer_params(self, p: Proc) -> float:
        """Parameters the rank's optimizer step updates: its stage's, sharded over dp x cp
        (experts over edp) from ZeRO-1 up."""
        dense, expert = self.stage_local(p.stage)
        z = self.par.zero >= 1
        return dense / (self.shard if z else 1) + expert / (self.edp if z else 1)

    def optimizer_program(self, p: Proc) -> tuple[Part, ...]:
        return optimizer_parts(self.job.machine.compute, self.t, self.optimizer_params(p))

    def layer_activation(self, layer: int) -> float:
        """Bytes a micro-batch keeps for global layer ``layer`` of an MoE or MLA model
        (:func:`simulator.model.moe_sizes.layer_activation_bytes`)."""
        return moe_sizes.layer_activation_bytes(
            self.local_model, self.t, layer, tp=self.tp, sp=self.sp, ep=self.ep, etp=self.etp
        )

    def layer_sizes(self, layer: int) -> tuple[float, float, float]:
        """(activation, gradient, parameter) bytes of global layer ``layer`` on one rank."""
        dense, expert = self.layer_local(layer)
        n = dense + expert
        pb, gb = BYTES[self.t.param_dtype], BYTES[self.t.grad_reduce_dtype]
        return self.layer_activation(layer), n * gb, n * pb

    def expert_bytes(self, layer: int) -> tuple[float, float]:
        """(gradient, parameter) bytes of global layer ``layer``'s routed experts on one rank
        (their share of :meth:`layer_sizes`), reduced over edp in buckets of their own."""
        expert = self.layer_local(layer)[1]
        return expert * BYTES[self.t.grad_reduce_dtype], expert * BYTES[self.t.param_dtype]

    def activations(self) -> tuple[float, float, float, float]:
        """Bytes a micro-batch keeps per layer, for the embedding and for the head (one
        context-parallel rank keeps its ``s/cp`` tokens' share), and what a recomputed layer
        holds again from its recompute to the end of its backward: recompute re-runs the
        layer's forward just before its backward, so what it dropped in the forward
        (everything but the layer input with ``full``, the attention core with
        ``selective``) is allocated again until the layer's backward ends."""
        t, m = self.t, self.local_model
        mkw = dict(micro_batch=t.micro_batch, tp=self.tp, sequence_parallel=self.sp,
                   kernels=t.kernels, param_dtype=t.param_dtype)  # fmt: skip
        code = moe_sizes.activation_code(t)
        layer = mem.activation_bytes_per_layer(
            m, recompute=t.recompute, flash_attention=t.flash_attention, **mkw, **code
        )
        whole = mem.activation_bytes_per_layer(
            m, recompute="none", flash_attention=t.flash_attention, **mkw, **code
        )
        # eager: the loss's working set too (the head's peak, from its forward to its backward)
        head = mem.head_activation_bytes(
            m, include_transient=t.kernels == "eager", norm_gain=t.rmsnorm_gain,
            tp_loss=self.par.tp_loss, tp_impl=self.par.tp_impl, **mkw
        )
        if m.mtp_depth:  # each MTP module keeps a layer's and a head's activations, and
            # its norms' and projection's inputs (h, h and 2h per token, 16-bit)
            last = (self.layer_activation(m.layers - 1)
                    if m.moe is not None or m.attention_kind == "mla" else layer)
            proj = 4 * t.micro_batch * m.seq_len * m.hidden * 2 / (self.tp if self.sp else 1)
            head += m.mtp_depth * (last + mem.head_activation_bytes(m, norm_gain=t.rmsnorm_gain, **mkw) + proj)
        ekw = dict(mkw, tp=self.embed_tp, sequence_parallel=self.sp and self.embed_tp > 1)
        return layer, mem.embedding_activation_bytes(m, **ekw), head, max(0.0, whole - layer)

    def torch_memory(self) -> TorchPipelineMemory | None:
        """What ``torch.distributed.pipelining`` holds beside the saved activations, where it
        applies (:func:`simulator.model.pipeline_memory.runtime_memory`)."""
        t = self.t
        return runtime_memory(
            self.local_model, pp_runtime=self.par.pp_runtime, pp=self.pp,
            micro_batch=t.micro_batch, microbatches=self.job.microbatches, tp=self.tp,
            sequence_parallel=self.sp, kernels=t.kernels, param_dtype=t.param_dtype,
        )  # fmt: skip

    def head_transient(self) -> float:
        """The part of the head's bytes (eager) that is the loss's working set: alive while
        one micro-batch's loss runs, not for every micro-batch the head keeps."""
        t = self.t
        if t.kernels != "eager":
            return 0.0
        return mem.head_transient_bytes(
            self.local_model, micro_batch=t.micro_batch, tp=self.tp, sequence_parallel=self.sp,
            kernels=t.kernels, tp_loss=self.par.tp_loss, tp_impl=self.par.tp_impl,
        )  # fmt: skip

    # ---- communication: folded costs, or full-detail executors
    # Folded mode runs data-parallel / ZeRO collectives (every concurrent group's flows, steps
    # merged into bundles) through the same dynamic network, so that collectives overlapping
    # each other -- ZeRO-3 gathers beside gradient reduce-scatters, buckets of different
    # stages -- share links as they do in full detail. Pipeline sends and the collectives in
    # the programs (TP, CP) are priced in isolation (their own concurrent groups only).

    def send_pairs(self, p: Proc, dst: Proc) -> list[tuple[int, int]]:
        """Every GPU of ``p`` to its counterpart (same coordinates) in ``dst``'s stage."""
        lay = self.lay
        shift = lay.rank({"pp": dst.stage}) - lay.rank({"pp": p.stage})
        # a replica's group is its first GPU plus the offsets of the group at the origin
        offsets = lay.group(self.job.inner_dims, {})
        first, per_replica = lay.rank({"pp": p.stage}), lay.rank({"dp": 1})
        return [(g, g + shift) for d in p.replicas
                for g in [first + d * per_replica + o for o in offsets]]  # fmt: skip

    def comm_cost(self, spec: CommSpec, p: Proc) -> CollectiveCost:
        """The CollectiveCost of a folded collective or send (memoised)."""
        cache = self._cost_cache
        if spec.stream == "pp":
            dst = self.procs[spec.key[2]]
            key = ("pp", p.pid, dst.pid, spec.nbytes)
            if key not in cache:
                cache[key] = self.job.machine.collectives.p2p_cost(
                    self.send_pairs(p, dst), spec.nbytes
                )
            return cache[key]
        key = (spec.op, p.stage, spec.nbytes, spec.stream in EXPERT_STREAMS)
        if key not in cache:
            cache[key] = self.comm.cost(spec.op, self.stream_groups(spec.stream, p.stage),
                                        spec.nbytes)  # fmt: skip
        return cache[key]

    def stream_dims(self) -> dict[str, str]:
        """The layout dimension(s) of each data-parallel stream's groups and of the pipeline
        sends, as their events record them: a group over several axes names those of size
        > 1, joined by ``+`` (``cp+dp``; ``dp`` alone when cp is 1). DualPipe's gradient
        groups also take in each stage's mirrored rank (:meth:`_holders`)."""
        out = {"pp": "pp"}
        for stream in DP_STREAMS:
            dims = _stream_dims(stream)
            dims = (dims,) if isinstance(dims, str) else dims
            lay = self.job.layout_of(dims[0])
            out[stream] = "+".join(d for d in dims if lay.size(d) > 1) or dims[-1]
        return out

    def comm_time(self, spec: CommSpec, p: Proc) -> float:
        return self.comm_cost(spec, p).time_s

    def stream_groups(self, stream: str, stage: int) -> list[tuple[int, ...]]:
        """Every group of a stage that a data-parallel stream's collectives run on: the
        routed experts' edp groups (``edp``, ``egather``) or the cp x dp groups."""
        if stream not in EXPERT_STREAMS:
            return self.grad_groups(stage)
        hit = self._grad_groups.get(("edp", stage))
        if hit is None:
            lay = self.job.layout_of("edp")
            hit = self._grad_groups[("edp", stage)] = self._merged(lay, "edp", stage)
        return hit

    def grad_groups(self, stage: int) -> list[tuple[int, ...]]:
        """Every gradient-reduction (cp x dp) group of a stage (DualPipe: with the mirrored
        rank's)."""
        hit = self._grad_groups.get(stage)
        if hit is None:
            hit = self._grad_groups[stage] = self._merged(self.lay, GRAD_DIMS, stage)
        return hit

    def _merged(self, lay: Layout, dims, stage: int) -> list[tuple[int, ...]]:
        """The groups of ``dims`` on ``stage``, each joined with its counterpart (the same
        other coordinates) on every other rank holding the stage's weights."""
        per = [lay.groups(dims, {"pp": (s,)}) for s in self._holders(stage)]
        return [sum(gs, ()) for gs in zip(*per, strict=True)]

    def comm_exec_folded(self, spec: CommSpec, p: Proc):
        if spec.stream == "pp":
            dst = self.procs[spec.key[2]]
            if spec.op != "send_flows":
                yield self.env.timeout(self.comm_time(spec, p))
                return
            pairs = self.send_pairs(p, dst)
            yield self.env.timeout(self.comm.launch_s("send", pairs[0]))
            key = ("send_flows", p.pid, dst.pid, spec.nbytes)
            steps = self._cost_cache.get(key)
            if steps is None:
                steps = self._cost_cache[key] = self.job.machine.collectives.bundles(
                    "send", pairs, spec.nbytes
                )
        elif spec.stream in DP_STREAMS:
            groups = self.stream_groups(spec.stream, p.stage)
            yield self.env.timeout(self.comm.launch_s(spec.op, groups[0]))
            steps = self.comm.steps(spec.op, groups, spec.nbytes)
        else:  # a program collective of every group the process stands for (contention)
            groups = self.comm.proc_groups(spec.stream, p)
            yield self.env.timeout(self.comm.launch_s(spec.op, groups[0]))
            steps = self.comm.steps(spec.op, groups, spec.nbytes)
        for st in steps:
            yield self.net.transfer(st.transfers)
            if st.latency_s:
                yield self.env.timeout(st.latency_s)

    def contention(self) -> None:
        """Which folded program collectives and sends share links with other traffic and so
        run in the flow network (:mod:`simulator.engine.contention`). Only on clusters that
        full detail also takes (CONTENTION_MAX_GPUS): at 16K GPUs with context parallelism
        across nodes it made a step 10x slower to simulate; larger jobs keep static
        pricing (README states it)."""
        self.comm_mode: dict[int, str] = {}
        self.net_sends: dict = {}
        if self.detail == "full" or self.lay.n_gpus > CONTENTION_MAX_GPUS:
            return
        route = self.job.machine.topology.route

        def links_of(pairs) -> set[int]:
            return {link for a, b in pairs for link in route(a, b)}

        prog_links, send_links, dp_links = {}, {}, {}
        for p in self.procs:
            links: set[int] = set()
            for prog in p.programs.all_programs():
                for part in prog:
                    if part.kind == "comm":
                        links.update(self.comm.part_cost(p, part).link_bytes)
            prog_links[p.pid] = links
            if self.pp > 1:
                for dst_stage in {(p.stage + 1) % self.pp, (p.stage - 1) % self.pp}:
                    dst = self.procs[self.pid_of[(p.replica_class, dst_stage)]]
                    send_links[(p.pid, dst.pid)] = links_of(self.send_pairs(p, dst))
        if self.shard > 1:
            # the links of a ring over each group: every GPU's way to its successor (a tree
            # uses the same GPU, NIC and leaf links)
            for s in range(self.pp):
                groups = self.grad_groups(s)
                dp_links[s] = links_of(
                    (g[i], g[(i + 1) % len(g)]) for g in groups for i in range(len(g))
                )
        stage_of = {p.pid: p.stage for p in self.procs}
        self.comm_mode, self.net_sends = contention_modes(
            prog_links, stage_of, send_links, dp_links
        )

    def pp_bytes(self) -> float:
        t = self.t
        return tf.pp_activation_bytes(
            self.local_model, micro_batch=t.micro_batch, tp=self.tp, sequence_parallel=self.sp,
            scatter_gather=self.par.pp_scatter_gather,
            dtype_bytes=tf.pp_stream_bytes(t.kernels, t.param_dtype),
        )

    def comm_exec(self, spec: CommSpec, p: Proc):
        if spec.stream == "pp":
            groups, op = [(p.gpu, self.procs[spec.key[2]].gpu)], "send"
        else:
            groups, op = [self.stream_group(spec.stream, p.gpu)], spec.op
        yield self.env.timeout(self.comm.launch_s(op, groups[0]))
        if op in ("send_recv", DEEPEP):
            steps = self.comm.steps(op, groups, spec.nbytes)
        else:
            steps = self.job.machine.collectives.steps(op, groups[0], spec.nbytes)
        for st in steps:
            yield self.net.transfer(st.transfers)
            if st.latency_s:
                yield self.env.timeout(st.latency_s)

    # ---- the framework's work on gradients around the data-parallel reduction
    # Per parameter (first principles, bytes read + written on the compute stream):
    # * fused (Megatron-LM): gradients accumulate in the bucket (fp32 main_grad) already;
    #   the bucket is scaled by 1/dp before it is reduced: read + write in grad dtype.
    # * eager (PyTorch): DDP copies each gradient into its bucket and divides it by the world
    #   size (2 x read + write), and copies the reduced bucket back into .grad afterwards;
    #   FSDP casts the unsharded bf16 gradient to the fp32 reduce dtype (2 + 4 bytes) and
    #   pre-divides it (2 x 4 bytes).

    def host_rates(self) -> HostRates | None:
        """The host's rates (:meth:`one_host_rates`) at the pace of the job's slowest host
        (:func:`simulator.model.sync.host_group_factor` over
        :func:`~simulator.model.sync.host_group_size`: every rank's process)."""
        rates = self.one_host_rates()
        if rates is None:
            return None
        gpu = self.job.machine.gpu
        rates = rates.scaled(host_group_factor(host_group_size(self.lay.n_gpus), gpu.host_jitter))
        # each count synchronisation of an MoE layer is a barrier of its EP group's hosts
        group = self.ep * self.etp if self.m.moe is not None else 1
        return replace(rates, barrier_s=host_barrier_s(group, gpu.host_barrier_s))

    def one_host_rates(self) -> HostRates | None:
        """Eager code: the host's time per kernel, per collective call and per MoE count
        synchronisation (gpus.yaml). Fused (Megatron-Core) kernels: only an MoE model's, whose
        every MoE layer forward waits on its host for the token counts
        (:func:`simulator.model.moe_layer._sync_at`), with ``host_fused_op_s`` and
        ``host_fused_collective_s`` per kernel and collective call (Megatron-Core's own rate
        per kernel launched, measured on its MoE layer: the host shows after each of those
        synchronisations and wherever it is the slower one); ``None`` otherwise (dense fused
        models: nothing makes their host wait, so it stays ahead of the GPU)."""
        gpu = self.job.machine.gpu
        if self.t.kernels != "eager":
            if self.m.moe is None or max(gpu.host_sync_s, gpu.host_barrier_s,
                                         gpu.host_fused_op_s, gpu.host_fused_collective_s) <= 0.0:
                return None
            multihot = 0.0
            if gpu.host_multihot_s > 0.0:
                multihot = multihot_op_s(gpu.host_multihot_s, gpu.host_sync_s,
                                         len(moe_math.MULTIHOT_KERNELS), moe_math.MULTIHOT_SYNCS)
            return HostRates(gpu.host_fused_op_s, gpu.host_fused_collective_s, gpu.host_sync_s,
                             multihot_op_s=multihot)
        if gpu.host_op_s <= 0.0 and gpu.host_collective_s <= 0.0:
            return None
        extra: dict[str, float] = {}
        if self.par.tp_impl == "dtensor" and self.tp > 1:
            if not gpu.host_dtensor:
                raise ConfigError(f"{gpu.name} has no host_dtensor rates in gpus.yaml (DTensor's "
                                  "host time per unit, not measured)", field="parallelism.tp_impl")
            layers = max(sum(1 for c in range(self.chunks) for _ in self.layers_of(s, c))
                         for s in range(self.pp))
            tensors = dtensor_param_tensors(layers, self.sp,
                                            1 if self.m.norm_kind == "rmsnorm" else 2,
                                            self.m.tied_embeddings)
            extra = dtensor_extra(gpu.host_dtensor, self.sp,
                                  dtensor_opt_s(gpu.host_dtensor_opt_step_s,
                                                gpu.host_dtensor_opt_tensor_s if self.sp
                                                else gpu.host_dtensor_opt_tensor_nosp_s,
                                                tensors))
        loc, layers = self.moe_layers_on_rank()
        share = new_shape_share(self.m, self.t, loc, layers * self.job.microbatches,
                                self.ep * self.etp)
        local = loc.local_experts if loc is not None else 0
        fwd = shape_cache.slowest_share(share, local, self.ep)
        bwd = shape_cache.slowest_share(share, local * layers, self.ep)
        # first launches of cuBLAS kernels in the expert backwards: a drain holds its rank's
        # GPU, and the layer's backward all-to-all holds the EP group for it, so each layer
        # pays its slowest rank's drains (of its local experts), every layer and micro-batch
        mbs = self.job.microbatches
        drains = first_launch_drains(self.m, self.t, loc, layers * mbs, self.ep * self.etp)
        bwds = local * layers * mbs
        pre, post = kernel_first.launch_work()
        if drains > 0.0 and bwds > 0:
            drains = bwds * shape_cache.slowest_share(min(1.0, drains / bwds), local, self.ep)
        return HostRates(gpu.host_op_s, gpu.host_collective_s, gpu.host_sync_s,
                         gpu.host_moe_op_s, gpu.host_fsdp_call_s, gpu.host_fsdp_tensor_s,
                         MappingProxyType(extra),
                         (fwd * gpu.host_gemm_new_shape_fwd_s,
                          bwd * gpu.host_gemm_new_shape_dgrad_s,
                          bwd * gpu.host_gemm_new_shape_wgrad_s),
                         engine_op_s=gpu.host_engine_op_s, drains=drains,
                         drain_bwds=layers * mbs, drain_s=kernel_first.DRAIN_S,
                         launch_pre_s=pre, launch_post_s=post,
                         fwd_drains=kernel_first.FORWARD)

    def moe_layers_on_rank(self) -> tuple[moe_math.MoELocal | None, int]:
        """The busiest EP rank's experts at their mean loads and the MoE layers of the pipeline
        rank holding most of them: what :func:`simulator.model.moe.new_shape_share` and
        :func:`simulator.model.moe.first_launch_drains` draw row counts from.

        A learned router's experts are taken at their mean shares (``moe_expert_load``), not
        at the busiest rank's share of a call (:func:`simulator.model.moe_routing`'s
        ``Learned``): how a call's copies pile on some experts is what the row counts'
        correlation ``moe_route_correlation`` already describes around those means (refitted
        by ``calibrate routes`` on every rank's counts at ``p = top_k / experts``), and which
        rank meets the most new counts in a layer is :func:`simulator.model.shape_cache.
        slowest_share`'s; the busiest rank's share on top counted that concentration twice."""
        if self.m.moe is None:
            return None, 0
        t = self.t
        load = t.moe_expert_load if t.moe_routing == "learned" else moe_math.load_spec(t)
        loc = moe_math.moe_local(self.local_model, t.micro_batch, self.tp, 1, self.ep, self.etp,
                                 load)
        layers = max(sum(moe_sizes.is_moe_layer(self.m, g)
                         for c in range(self.chunks) for g in self.layers_of(s, c))
                     for s in range(self.pp))
        return loc, layers

    def unit_tensors(self, unit: int | str) -> int:
        """Parameter tensors of a ZeRO-3 unit (a global layer, ``embed`` or ``head``) on one
        rank, as the eager model holds them (:func:`simulator.model.eager.layer_param_tensors`;
        an MoE layer's routed experts split over ep)."""
        if unit == "embed":
            return eager.embedding_param_tensors(self.m)
        if unit == "head":
            return eager.head_param_tensors(self.m)
        moe = moe_sizes.is_moe_layer(self.m, unit)
        local = self.m.moe.experts // self.ep if moe else 0
        return eager.layer_param_tensors(self.m, moe, local)

    def gather_copy_out(self) -> Callable[[float], tuple[Part, ...]] | None:
        """FSDP2's all-gather copy-out (``foreach_all_gather_copy_out``: one
        ``split_with_sizes_copy`` on the compute stream, after the all-gather and before the
        unit runs) as a program of a unit's gathered bytes: reads the all-gather output and
        writes the unit's parameters, memory-bound. None where it does not run (not FSDP2:
        FSDP1's all-gather writes the flat parameter in place)."""
        t = self.t
        if not (t.kernels == "eager" and self.par.zero == 3 and t.zero_impl == "unit"
                and t.fsdp_version == 2 and self.pp * self.v == 1):
            return None
        pr = Pricer(self.job.machine.compute, pricing_dtype(t), t.kernels, t.param_dtype)
        cache: dict[float, tuple[Part, ...]] = {}

        def copy_out(nbytes: float) -> tuple[Part, ...]:
            if nbytes not in cache:
                cache[nbytes] = (pr.part(Op("gather_copy_out", "memory", "optimizer",
                                            bytes=2 * nbytes)),)
            return cache[nbytes]

        return copy_out

    def grad_work(self) -> tuple[Callable, Callable]:
        t, gb = self.t, BYTES[self.t.grad_reduce_dtype]
        if t.kernels == "eager" and self.par.zero == 3:
            prep_per_param, fin_per_param = 2 + gb + 2 * gb, 0.0  # cast bf16 -> gb, pre-divide
        elif t.kernels == "eager" and t.ddp_buckets == "view" and self.par.zero == 0:
            # the gradients are the buckets: no copy in or out, only the in-place division
            prep_per_param, fin_per_param = 2.0 * gb, 0.0
        elif t.kernels == "eager":
            prep_per_param, fin_per_param = 4.0 * gb, 2.0 * gb
        else:
            prep_per_param, fin_per_param = 2.0 * gb, 0.0
        prep_cache: dict[float, tuple[Part, ...]] = {}
        pr = Pricer(self.job.machine.compute, pricing_dtype(t), t.kernels, t.param_dtype)

        def grad_prep(grad_bytes: float) -> tuple[Part, ...]:
            if grad_bytes not in prep_cache:
                n = grad_bytes / gb * prep_per_param
                prep_cache[grad_bytes] = (pr.part(Op("grad_prep", "memory", "optimizer", bytes=n)),)
            return prep_cache[grad_bytes]

        def grad_finalize(p: Proc) -> tuple[Part, ...]:
            if not fin_per_param:
                return ()
            n = self.stage_params(p.stage) / self.tp * fin_per_param
            return (pr.part(Op("grad_copy_back", "memory", "optimizer", bytes=n)),)

        return grad_prep, grad_finalize

    # ---- the plan

    def plan(self) -> StepPlan:
        self.contention()
        t, par, tp, m = self.t, self.par, self.tp, self.m
        pb, gb = weight_bytes(t, BYTES[t.param_dtype])[1], BYTES[t.grad_reduce_dtype]
        lp, emb = tf.layer_params(m), tf.embedding_params(m)
        head = tf.head_params(m) + tf.final_norm_params(m)
        act_layer, act_embed, act_head, act_recompute = self.activations()
        torch_mem = self.torch_memory()
        if torch_mem is not None:  # its weight casts held once a step, not per micro-batch
            act_layer -= torch_mem.layer_cast
            act_head -= torch_mem.head_cast
        grad_prep, grad_finalize = self.grad_work()
        full = self.detail == "full"
        sizes = {d: self.lay.size(d) for d in self.lay.dims}
        ep_overlap = moe_sizes.ep_overlap(self.job.work)
        nccl = load_fabrics()["nccl"]
        interference = float(nccl.get("compute_slowdown_beside_comm", 0.0))
        return StepPlan(
            procs=self.procs,
            pp=self.pp,
            virtual_stages=self.v,
            microbatches=self.job.microbatches,
            schedule_name=par.pp_schedule,
            pp_runtime=par.pp_runtime,
            torch_memory=torch_mem,
            ep_overlap=ep_overlap,
            delay_wgrad=ep_overlap and t.delay_wgrad_compute,
            straggler_scope=self.job.work.faults.straggler_scope,
            layers_of=self.layers_of,
            zero=par.zero,
            overlap_grad_reduce=t.overlap_grad_reduce,
            overlap_param_gather=t.overlap_param_gather,
            bucket_bytes=t.grad_bucket_bytes,
            grad_bytes_per_layer=lp / tp * gb,
            param_bytes_per_layer=lp / tp * pb,
            # eager (PyTorch FSDP) gathers a unit into a new full-size buffer beside its shard
            gather_keep_fraction=1.0 if t.kernels == "eager" else (1.0 - 1.0 / self.shard),
            stage_param_bytes=lambda vs: sum(self.vs_local(vs)) * pb,
            act_bytes_layer=act_layer,
            act_bytes_embed=act_embed,
            act_bytes_head=act_head,
            act_bytes_head_transient=self.head_transient(),
            act_bytes_recompute=act_recompute,
            static_mem=self.static_mem,
            lazy_grad_mem=self.lazy_grads,
            first_steps_mem=self.first_steps_extra,
            optimizer_program=self.optimizer_program,
            optimizer_temp=self.optimizer_temp,
            pp_bytes=self.pp_bytes(),
            participants=self.participants,
            peer=self.peer,
            comm_time=None if full else self.comm_time,
            comm_cost=None if full else self.comm_cost,
            comm_exec=self.comm_exec if full else self.comm_exec_folded,
            detail=self.detail,
            group_size={**sizes, "dp": self.shard, "gather": self.shard,
                        "edp": self.edp, "egather": self.edp},
            stream_dims=self.stream_dims(),
            grad_prep=grad_prep,
            unit_bytes=lambda u: tuple(
                (emb / self.embed_tp if u == "embed" else head / tp) * b for b in (pb, gb)),
            grad_finalize=grad_finalize,
            interference=interference,
            ep_interference=beside_ep_slowdown(
                interference, DEEPEP, self.job.machine.gpu.sm_count,
            ) if m.moe is not None and self.t.moe_dispatcher == DEEPEP else None,
            host=self.host_rates(),
            unit_tensors=self.unit_tensors,
            fsdp2_memory=(t.kernels == "eager" and par.zero == 3 and t.zero_impl != "deepspeed"
                          and self.pp * self.v == 1),
            fsdp2_grad_ratio=pb / gb,
            fsdp2_reshard=t.fsdp_reshard_after_forward,
            fsdp2_loss_in_root=t.loss_in_model,
            fsdp2_copy_out=self.gather_copy_out(),
            ds=deepspeed_plan(m, t, tp=tp, world=self.shard, work_bytes=BYTES[t.param_dtype],
                              grad_bytes=gb) if t.zero_impl == "deepspeed" else None,
            comm_slowdown=slowdown_fn(nccl, self.job.machine.gpu.name),
            ep_comm_extra=ep_comm_extra(
                nccl, self.job.machine.gpu.name, self.ep,
                self.t.moe_dispatcher, self.job.machine.gpu.sm_count, self.comm.deepep_copies(),
            ) if m.moe is not None else None,
            part_cost=self.comm.part_cost,
            comm_mode=lambda p: self.comm_mode.get(p.pid, "never"),
            send_in_network=lambda p, dst, dp_now: self.net_sends.get((p.pid, dst)) in (
                "always", "with_dp" if dp_now else "always"),
            layer_sizes=(
                self.layer_sizes if m.moe is not None or m.attention_kind == "mla" else None
            ),
            expert_bytes=self.expert_bytes if self.ep * self.etp > 1 else None,
            stage_expert_param_bytes=(
                (lambda vs: self.vs_local(vs)[1] * pb) if self.ep * self.etp > 1 else None
            ),
        )


def folded_link_bytes(engine, coll: CollectiveModel, n_links: int):
    """Bytes every link carried in a folded run: each collective's and each program's
    collectives' per-link bytes (over all the concurrent groups a process stands for), times
    how often it ran."""
    out = np.zeros(n_links)
    procs = engine.plan.procs
    by_id = {}
    for p in procs:
        for prog in vars(p.programs).values():
            by_id[(p.pid, id(prog))] = prog
    runs_of: dict[int, list] = {}  # one addition per distinct cost: [cost, times it ran]
    by_id.update(engine.derived)
    for (pid, pid_prog), runs in engine.prog_runs.items():
        prog = by_id.get((pid, pid_prog))
        if not prog:
            continue
        p = procs[pid]
        for part in prog:
            if part.kind == "comm":
                cost = engine.plan.part_cost(p, part)
                runs_of.setdefault(id(cost), [cost, 0])[1] += runs
    for p, spec in engine.comm_log:
        if spec.stream != "pp" or spec.op == "send_flows":
            continue  # collectives that ran in the flow network: it counted them
        cost = engine.plan.comm_cost(spec, p)
        runs_of.setdefault(id(cost), [cost, 0])[1] += 1
    for cost, runs in runs_of.values():
        cost.add_to(out, runs)
    return out
