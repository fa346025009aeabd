"""Turn validated configs into a :class:`~simulator.engine.sim.StepPlan`.

Folding (``detail="folded"``): DP replicas are grouped into *replica classes* by their
signature (per-stage straggler slowdown and whether a faulted link touches them); each
(class, stage) is one simulated process standing for the whole TP group in every replica of the
class. Ranks with identical op sequences and equivalent network positions share a process,
while every collective is priced on the real groups' links with all of the class's concurrent
copies sharing them. A fault that breaks the symmetry adds classes (more processes), never
removes detail.

Full detail (``detail="full"``): one process per GPU, every TP/DP collective and send executed
step by step as flows in the max-min fair network.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import simpy

from simulator.config.checks import Resolved
from simulator.config.schema import TopologyConfig, WorkloadConfig
from simulator.engine.program import Part, Pricer, StagePrograms, build_stage_programs
from simulator.engine.sim import CommSpec, Proc, StepPlan
from simulator.hardware.catalog import GPUSpec
from simulator.hardware.compute import ComputeModel
from simulator.model import memory as mem
from simulator.model import transformer as tf
from simulator.model.ops import Op
from simulator.network.collectives import CollectiveModel
from simulator.network.flows import FlowNetwork
from simulator.network.topology import Topology, load_fabrics
from simulator.parallel.layout import Layout

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


@dataclass
class Machine:
    """The hardware side of a run: GPU, topology graph, compute and collective models."""

    gpu: GPUSpec
    topology: Topology
    compute: ComputeModel
    collectives: CollectiveModel


def make_layout(work: WorkloadConfig, res: Resolved) -> Layout:
    par = work.parallelism
    return Layout(res.tp, res.dp, res.pp, tuple(par.order), res.virtual_stages, res.stage_layers)


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
    sig_of: dict[tuple, list[int]] = defaultdict(list)
    for d in range(layout.dp):
        sig = []
        special = False
        for s in range(layout.pp):
            grp = layout.tp_group(d, s)
            sig.append(max(slow.get(g, 1.0) for g in grp))
            special |= any(g in faulted for g in grp)
        key = (tuple(sig), d if special else -1)
        sig_of[key].append(d)
    classes = sorted(sig_of.items(), key=lambda kv: kv[1][0])
    return [(tuple(ds), key[0]) for key, ds in classes]


def build_plan(
    work: WorkloadConfig,
    topo_cfg: TopologyConfig,
    res: Resolved,
    machine: Machine,
    *,
    detail: str = "folded",
    env: simpy.Environment | None = None,
) -> tuple[StepPlan, Layout, FlowNetwork | None]:
    """Build the processes, programs and communication hooks of one training step."""
    m, t, par = work.model, work.training, work.parallelism
    layout = make_layout(work, res)
    tp, pp, dp, v = res.tp, res.pp, res.dp, res.virtual_stages
    sp = par.sequence_parallel and tp > 1
    cm, coll = machine.compute, machine.collectives
    dtype = t.precision
    slow = gpu_slowdowns(work, topo_cfg)
    faulted = faulted_gpus(work, topo_cfg)
    classes = replica_classes(layout, slow, faulted)

    # ---- programs, priced once per (TP groups, slowdown-independent) stage
    prog_cache: dict[tuple, StagePrograms] = {}

    def programs_for(stage: int, groups: tuple[tuple[int, ...], ...]) -> StagePrograms:
        key = (stage, groups)
        if key not in prog_cache:
            tp_cost = None
            if tp > 1:

                def tp_cost(op: str, nbytes: float, groups=groups) -> float:
                    return coll.cost(op, groups, nbytes).time_s

            prog_cache[key] = build_stage_programs(
                model=m, micro_batch=t.micro_batch, tp=tp, sp=sp, recompute=t.recompute,
                dtype=dtype, cm=cm, tp_cost=tp_cost, flash_attention=t.flash_attention,
                kernels=t.kernels, param_dtype=t.param_dtype,
            )
        return prog_cache[key]

    # ---- processes
    procs: list[Proc] = []
    pid_of: dict[tuple, int] = {}
    if detail == "folded":
        for c, (replicas, sig) in enumerate(classes):
            for s in range(pp):
                groups = tuple(layout.tp_group(d, s) for d in replicas)
                pid = len(procs)
                pid_of[(c, s)] = pid
                procs.append(
                    Proc(pid, f"c{c}.s{s}", s, c, replicas, None, layout.rank(0, replicas[0], s),
                         sig[s], programs_for(s, groups))
                )
    else:
        for d in range(dp):
            for s in range(pp):
                for r in range(tp):
                    g = layout.rank(r, d, s)
                    pid = len(procs)
                    pid_of[(d, s, r)] = pid
                    procs.append(
                        Proc(pid, f"g{g}", s, d, (d,), r, g, slow.get(g, 1.0),
                             programs_for(s, (layout.tp_group(d, s),)))
                    )
    class_of_replica = {d: c for c, (reps, _) in enumerate(classes) for d in reps}

    def participants(p: Proc, stream: str) -> tuple[int, ...]:
        if detail == "folded":
            return tuple(sorted({pid_of[(class_of_replica[d], p.stage)] for d in range(dp)}))
        if stream == "tp":
            return tuple(pid_of[(p.replicas[0], p.stage, r)] for r in range(tp))
        return tuple(pid_of[(d, p.stage, p.tp_rank)] for d in range(dp))

    def peer(p: Proc, phase: str, dst_vs: int) -> int:
        dst_stage = dst_vs % pp
        if detail == "folded":
            return pid_of[(p.replica_class, dst_stage)]
        return pid_of[(p.replicas[0], dst_stage, p.tp_rank)]

    # ---- sizes
    pb = BYTES[t.param_dtype]
    gb = BYTES[t.grad_reduce_dtype]
    lp = tf.layer_params(m)
    emb = tf.embedding_params(m)
    head = tf.head_params(m) + tf.final_norm_params(m)

    def vs_params(vs: int) -> float:
        n = res.stage_layers[vs] * lp
        if vs == 0:
            n += emb
        if vs == pp * v - 1:
            n += head
        return n

    def stage_params(stage: int) -> float:
        return sum(vs_params(c * pp + stage) for c in range(v))

    def static_mem(p: Proc) -> dict[str, float]:
        local = stage_params(p.stage) / tp
        ms = mem.model_state_bytes(
            local, zero=par.zero, dp=dp, param_dtype=t.param_dtype,
            grad_dtype=t.grad_reduce_dtype, kernels=t.kernels,
        )
        # PyTorch DDP's gradient buckets (eager): gradient copies, counted with the gradients
        buckets = mem.ddp_bucket_bytes(
            local, kernels=t.kernels, zero=par.zero, dp=dp, param_dtype=t.param_dtype,
            grad_dtype=t.grad_reduce_dtype,
        )
        return {"weights": ms.weights, "gradients": ms.gradients + buckets,
                "optimizer": ms.optimizer}

    def optimizer_program(p: Proc) -> tuple[Part, ...]:
        local = stage_params(p.stage) / tp / (dp if par.zero >= 1 else 1)
        ops = tf.optimizer_ops(local, param_dtype=t.param_dtype, grad_dtype=t.grad_reduce_dtype)
        pr = Pricer(cm, dtype, t.kernels, t.param_dtype)
        return tuple(pr.part(op) for op in ops)

    kw = dict(micro_batch=t.micro_batch, tp=tp, sequence_parallel=sp)
    mkw = dict(kernels=t.kernels, param_dtype=t.param_dtype, **kw)
    act_layer = mem.activation_bytes_per_layer(
        m, recompute=t.recompute, flash_attention=t.flash_attention, **mkw
    )
    act_embed = mem.embedding_activation_bytes(m, **mkw)
    # eager: the loss's working set too (the head's peak, from its forward to its backward)
    act_head = mem.head_activation_bytes(m, include_transient=t.kernels == "eager", **mkw)

    # ---- communication: folded costs, or full-detail executors
    # Folded mode runs data-parallel / ZeRO collectives (every concurrent group's flows, steps
    # merged into bundles) through the same dynamic network, so that collectives overlapping
    # each other -- ZeRO-3 gathers beside gradient reduce-scatters, buckets of different
    # stages -- share links as they do in full detail. Pipeline sends and TP collectives are
    # priced in isolation (their own concurrent groups only).
    net = FlowNetwork(env, machine.topology)
    cost_cache: dict[tuple, object] = {}

    def comm_cost(spec: CommSpec, p: Proc):
        """The CollectiveCost of a folded collective or send (memoised)."""
        if spec.stream == "pp":
            dst = procs[spec.key[2]]
            key = ("pp", p.pid, dst.pid, spec.nbytes)
            if key not in cost_cache:
                pairs = [
                    (layout.rank(r, d, p.stage), layout.rank(r, d, dst.stage))
                    for d in p.replicas
                    for r in range(tp)
                ]
                cost_cache[key] = coll.p2p_cost(pairs, spec.nbytes)
            return cost_cache[key]
        key = (spec.op, p.stage, spec.nbytes)
        if key not in cost_cache:
            groups = tuple(layout.dp_group(r, p.stage) for r in range(tp))
            cost_cache[key] = coll.cost(spec.op, groups, spec.nbytes)
        return cost_cache[key]

    def comm_time(spec: CommSpec, p: Proc) -> float:
        return comm_cost(spec, p).time_s

    def comm_exec_folded(spec: CommSpec, p: Proc):
        if spec.stream == "pp":
            yield env.timeout(comm_time(spec, p))
            return
        groups = tuple(layout.dp_group(r, p.stage) for r in range(tp))
        yield env.timeout(coll.launch_s(spec.op, groups[0]))
        for st in coll.bundles(spec.op, groups, spec.nbytes):
            yield net.transfer(st.transfers)
            if st.latency_s:
                yield env.timeout(st.latency_s)

    def comm_exec(spec: CommSpec, p: Proc):
        if spec.stream == "pp":
            group: Sequence[int] = (p.gpu, procs[spec.key[2]].gpu)
            op = "send"
        elif spec.stream == "tp":
            group, op = layout.tp_group(p.replicas[0], p.stage), spec.op
        else:
            group, op = layout.dp_group(p.tp_rank, p.stage), spec.op
        yield env.timeout(coll.launch_s(op, group))
        for st in coll.steps(op, group, spec.nbytes):
            yield net.transfer(st.transfers)
            if st.latency_s:
                yield env.timeout(st.latency_s)

    # What the framework does to gradients around the data-parallel reduction, per parameter
    # (first principles, bytes read + written on the compute stream):
    # * fused (Megatron-LM): gradients accumulate in the bucket (fp32 main_grad) already;
    #   the bucket is scaled by 1/dp before it is reduced: read + write in grad dtype.
    # * eager (PyTorch): DDP copies each gradient into its bucket and divides it by the world
    #   size (2 x read + write), and copies the reduced bucket back into .grad afterwards;
    #   FSDP casts the unsharded bf16 gradient to the fp32 reduce dtype (2 + 4 bytes) and
    #   pre-divides it (2 x 4 bytes).
    kern = t.kernels
    if kern == "eager" and par.zero == 3:
        prep_per_param, fin_per_param = 2 + gb + 2 * gb, 0.0  # cast bf16 -> gb, pre-divide
    elif kern == "eager":
        prep_per_param, fin_per_param = 4.0 * gb, 2.0 * gb
    else:
        prep_per_param, fin_per_param = 2.0 * gb, 0.0
    prep_cache: dict[float, tuple[Part, ...]] = {}
    pr_mem = Pricer(cm, dtype, t.kernels, t.param_dtype)

    def grad_prep(grad_bytes: float) -> tuple[Part, ...]:
        if grad_bytes not in prep_cache:
            n = grad_bytes / gb * prep_per_param
            prep_cache[grad_bytes] = (pr_mem.part(Op("grad_prep", "memory", "optimizer", bytes=n)),)
        return prep_cache[grad_bytes]

    def grad_finalize(p: Proc) -> tuple[Part, ...]:
        if not fin_per_param:
            return ()
        n = stage_params(p.stage) / tp * fin_per_param
        return (pr_mem.part(Op("grad_copy_back", "memory", "optimizer", bytes=n)),)

    plan = StepPlan(
        procs=procs,
        pp=pp,
        virtual_stages=v,
        microbatches=res.microbatches,
        schedule_name=par.pp_schedule,
        layers_of=layout.layers_of,
        zero=par.zero,
        overlap_grad_reduce=t.overlap_grad_reduce,
        overlap_param_gather=t.overlap_param_gather,
        bucket_bytes=t.grad_bucket_MB * 1e6,
        grad_bytes_per_layer=lp / tp * gb,
        param_bytes_per_layer=lp / tp * pb,
        # eager (PyTorch FSDP) gathers a unit into a new full-size buffer beside its fp32 shard
        gather_keep_fraction=1.0 if t.kernels == "eager" else (1.0 - 1.0 / dp),
        stage_param_bytes=lambda vs: vs_params(vs) / tp * pb,
        act_bytes_layer=act_layer,
        act_bytes_embed=act_embed,
        act_bytes_head=act_head,
        static_mem=static_mem,
        optimizer_program=optimizer_program,
        pp_bytes=tf.pp_activation_bytes(m, scatter_gather=par.pp_scatter_gather, **kw),
        participants=participants,
        peer=peer,
        comm_time=None if detail == "full" else comm_time,
        comm_cost=None if detail == "full" else comm_cost,
        comm_exec=comm_exec if detail == "full" else comm_exec_folded,
        detail=detail,
        dp_size=dp,
        grad_prep=grad_prep,
        unit_bytes=lambda u: (
            (emb if u == "embed" else head) / tp * pb,
            (emb if u == "embed" else head) / tp * gb,
        ),
        grad_finalize=grad_finalize,
        interference=float(load_fabrics()["nccl"].get("compute_slowdown_beside_comm", 0.0)),
    )
    return plan, layout, net


def folded_link_bytes(engine, layout: Layout, coll: CollectiveModel, n_links: int):
    """Bytes every link carried in a folded run: each collective's and each program's TP
    collectives' per-link bytes (over all the concurrent groups a process stands for), times
    how often it ran."""
    out = np.zeros(n_links)
    procs = engine.plan.procs
    by_id = {}
    for p in procs:
        for prog in vars(p.programs).values():
            by_id[(p.pid, id(prog))] = prog
    for (pid, pid_prog), runs in engine.prog_runs.items():
        prog = by_id.get((pid, pid_prog))
        if not prog:
            continue
        p = procs[pid]
        groups = tuple(layout.tp_group(d, p.stage) for d in p.replicas)
        for part in prog:
            if part.kind == "tp":
                lb = coll.cost(part.op, groups, part.nbytes).link_bytes
                ids = np.fromiter(lb.keys(), dtype=np.int64, count=len(lb))
                out[ids] += runs * np.fromiter(lb.values(), dtype=float, count=len(lb))
    for p, spec in engine.comm_log:
        if spec.stream != "pp":
            continue  # data-parallel collectives ran in the flow network, which counted them
        for link, b in engine.plan.comm_cost(spec, p).link_bytes.items():
            out[link] += b
    return out
