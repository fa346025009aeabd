"""Layout search: the best (tp, pp, dp, micro-batch, ZeRO, recompute, schedule, SP) for N GPUs.

:func:`plan` works in three passes, each cheaper than the next is accurate:

1. **Enumerate** (:func:`enumerate_layouts`): tp over the divisors of N up to
   ``min(gpus_per_node, 16)`` (TP stays inside the NVLink domain), pp over the divisors of
   ``N / tp`` up to the layer count, ``dp = N / (tp * pp)``, micro-batch 1, 2, 4, 8 (dividing
   the per-replica batch), ZeRO 0-3 (ZeRO > 0 only with dp > 1; ZeRO-3 only without pipeline
   parallelism, as in DeepSpeed and PyTorch FSDP), recompute none / selective / full, schedule
   1F1B or interleaved 1F1B with 2..8 virtual stages (pp > 1), sequence parallelism on or off
   (tp > 1). Everything else (global batch, dtypes, overlap flags, rank order) is the
   workload's. Divisibility is checked by :func:`simulator.config.checks.resolve`, the same
   function ``run`` uses, so a dropped layout has its reason.
2. **Memory pre-screen** (:meth:`Estimator.memory_bytes`): per pipeline stage, the model
   states (:func:`simulator.model.memory.model_state_bytes` of the stage's parameters, sharded
   by ZeRO) plus the activations of the micro-batches in flight at the schedule's peak (1F1B:
   ``min(pp - s, m)`` on stage ``s``; GPipe: ``m``; interleaved: the peak of the schedule's
   own work order, each (micro-batch, chunk) holding its chunk's layers, the embedding on the
   first and the LM head / loss on the last). This is exactly the engine's accounting at the
   end of a forward pass, which is never above the engine's peak, so the screen is *sound*:
   it never drops a layout that the simulator would say fits. (ZeRO-3's transient gathered
   layer parameters are left out for the same reason.)
3. **Throughput estimate** (:meth:`Estimator.estimate`): per stage and micro-batch, forward and
   backward times from the same priced stage programs the engine replays (kernels from the
   calibrated compute model, exposed TP collectives from the collective model on the real TP
   groups); pipeline time ``(m - 1) * max_s T_s + sum_s T_s`` for 1F1B (Narayanan et al. 2021:
   ``(m + p - 1) t`` for equal stages) and ``m * max_s T_s + (p - 1) / v * mean_s T_s`` for the
   interleaved schedule (the bubble shrinks by v, Narayanan et al. SC21); point-to-point sends
   ``2 (m + p v - 1)`` on the critical path; gradient reduction bucket by bucket on the real
   DP groups, overlapping the last micro-batch's backward when ``overlap_grad_reduce``; the
   optimizer's memory-bound step; the ZeRO-1/2 parameter all-gather after it; ZeRO-3
   per-layer gathers where they exceed the layer's compute.

The best ``2 * top`` estimates (and the workload's own layout, scaled to N GPUs, as a
reference) are then simulated in full by :func:`simulator.run.simulate`, and the fitting ones
ranked by simulated tokens/s.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from simulator.config.checks import Resolved, resolve
from simulator.config.load import LoadedWorkload
from simulator.config.schema import (
    ParallelismConfig,
    TopologyConfig,
    TrainingConfig,
    WorkloadConfig,
)
from simulator.engine.build import Machine
from simulator.engine.program import StagePrograms, _compute, build_stage_programs, program_time
from simulator.errors import ConfigError, SimulatorError
from simulator.model import memory as mem
from simulator.model import transformer as tf
from simulator.parallel.layout import Layout
from simulator.parallel.schedules import schedule
from simulator.sweep import process_pool

GiB = 2**30
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
MICRO_BATCHES = (1, 2, 4, 8)
MAX_VIRTUAL_STAGES = 8
MAX_TP = 16
RECOMPUTE = ("none", "selective", "full")
#: DP / PP collectives above this size are costed by linear interpolation (Estimator._cost).
LINEAR_FROM, LINEAR_TO = float(2**25), float(2**30)


# --------------------------------------------------------------------------------------------
# Candidates


@dataclass(frozen=True, order=True)
class Candidate:
    """One layout of the search space."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    zero: int
    recompute: str
    pp_schedule: str
    virtual_stages: int
    sequence_parallel: bool

    def overrides(self) -> dict[str, Any]:
        """The ``--set`` overrides that give this layout."""
        return {
            "parallelism.tp": self.tp,
            "parallelism.pp": self.pp,
            "parallelism.dp": self.dp,
            "parallelism.zero": self.zero,
            "parallelism.sequence_parallel": self.sequence_parallel,
            "parallelism.pp_schedule": self.pp_schedule,
            "parallelism.virtual_stages": self.virtual_stages,
            "training.micro_batch": self.micro_batch,
            "training.recompute": self.recompute,
        }

    def set_args(self) -> str:
        return " ".join(f"--set {k}={_yaml(v)}" for k, v in self.overrides().items())

    def label(self) -> str:
        sched = ""
        if self.pp > 1:
            sched = (
                " 1F1B" if self.pp_schedule == "1f1b" else f" interleaved v{self.virtual_stages}"
            )
            if self.pp_schedule == "gpipe":
                sched = " GPipe"
        return (
            f"TP{self.tp} PP{self.pp} DP{self.dp} mb{self.micro_batch} ZeRO-{self.zero} "
            f"rc:{self.recompute}{sched}{' SP' if self.sequence_parallel else ''}"
        )

    def apply(self, work: WorkloadConfig) -> WorkloadConfig:
        """``work`` with this layout (stage_layers dropped: layers split evenly)."""
        par = work.parallelism.model_dump()
        par.update(
            tp=self.tp, pp=self.pp, dp=self.dp, zero=self.zero,
            sequence_parallel=self.sequence_parallel, pp_schedule=self.pp_schedule,
            virtual_stages=self.virtual_stages, stage_layers=None,
        )  # fmt: skip
        tr = work.training.model_dump()
        tr.update(micro_batch=self.micro_batch, recompute=self.recompute)
        return work.model_copy(
            update={
                "parallelism": ParallelismConfig.model_validate(par),
                "training": TrainingConfig.model_validate(tr),
            }
        )


def _yaml(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def candidate_of(work: WorkloadConfig, res: Resolved) -> Candidate:
    """The candidate describing a workload's own (resolved) layout."""
    p, t = work.parallelism, work.training
    return Candidate(
        res.tp, res.pp, res.dp, t.micro_batch, p.zero, t.recompute, p.pp_schedule,
        res.virtual_stages, bool(p.sequence_parallel and res.tp > 1),
    )  # fmt: skip


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(work: WorkloadConfig, n_gpus: int, gpus_per_node: int) -> Iterator[Candidate]:
    """Every layout of the search space (see the module docstring), before any check."""
    m, gb = work.model, work.training.global_batch
    for tp in divisors(n_gpus):
        if tp > min(gpus_per_node, MAX_TP):
            break
        for pp in divisors(n_gpus // tp):
            if pp > m.layers:
                break
            dp = n_gpus // (tp * pp)
            if gb % dp:
                continue
            per_replica = gb // dp
            for mb in MICRO_BATCHES:
                if per_replica % mb:
                    continue
                n_micro = per_replica // mb
                scheds = [("1f1b", 1)]
                if pp > 1 and n_micro % pp == 0:
                    per_stage = m.layers // pp if m.layers % pp == 0 else 0
                    scheds += [
                        ("interleaved", v)
                        for v in range(2, MAX_VIRTUAL_STAGES + 1)
                        if per_stage and per_stage % v == 0
                    ]
                zeros = [0] if dp == 1 else ([0, 1, 2, 3] if pp == 1 else [0, 1, 2])
                sps = [False, True] if tp > 1 else [False]
                for zero in zeros:
                    for rc in RECOMPUTE:
                        for sched, v in scheds:
                            for sp in sps:
                                yield Candidate(tp, pp, dp, mb, zero, rc, sched, v, sp)


def plan_topology(topo: TopologyConfig, n_gpus: int, *, file: str = "--gpus") -> TopologyConfig:
    """The topology resized to ``n_gpus``: ``n_gpus / gpus_per_node`` nodes (or one node of
    ``n_gpus`` GPUs when fewer than a node)."""
    gpn = topo.gpus_per_node
    if n_gpus < 1:
        raise ConfigError(f"must be >= 1, got {n_gpus}", file=file)
    if n_gpus < gpn:
        return topo.model_copy(update={"nodes": 1, "gpus_per_node": n_gpus})
    if n_gpus % gpn:
        raise ConfigError(
            f"{n_gpus} GPUs is not a whole number of {gpn}-GPU nodes of '{topo.name}' "
            f"(try {n_gpus // gpn * gpn} or {(n_gpus // gpn + 1) * gpn})",
            file=file,
        )
    return topo.model_copy(update={"nodes": n_gpus // gpn})


# --------------------------------------------------------------------------------------------
# In-flight activations of a schedule


@lru_cache(maxsize=4096)
def _inflight_profile(
    name: str, stage: int, pp: int, m: int, v: int
) -> tuple[tuple[int, ...], ...]:
    """Per chunk, how many (micro-batch, chunk) forwards are in flight at each forward's end,
    reduced to the Pareto-maximal count vectors (the weighted peak is attained on one)."""
    live = [0] * v
    points: set[tuple[int, ...]] = set()
    for w in schedule(name, stage, pp, m, v):
        if w.phase == "F":
            live[w.chunk] += 1
            points.add(tuple(live))
        else:
            live[w.chunk] -= 1
    pareto = [
        p
        for p in points
        if not any(q != p and all(a >= b for a, b in zip(q, p, strict=True)) for q in points)
    ]
    return tuple(sorted(pareto))


def peak_inflight_bytes(name: str, stage: int, pp: int, m: int, v: int, chunk_bytes) -> float:
    """Largest sum of in-flight activation bytes on ``stage`` (``chunk_bytes[c]`` per
    micro-batch of chunk ``c``), at the end of a forward pass."""
    if name == "1f1b" and v == 1:
        return min(pp - stage, m) * chunk_bytes[0]
    if name == "gpipe":
        return m * chunk_bytes[0]
    return max(
        sum(n * b for n, b in zip(p, chunk_bytes, strict=True))
        for p in _inflight_profile(name, stage, pp, m, v)
    )


# --------------------------------------------------------------------------------------------
# Estimator


@dataclass
class Estimate:
    """Analytic memory and throughput of one candidate."""

    candidate: Candidate
    memory_gib: float
    fits: bool
    step_time_s: float = math.nan
    tokens_per_s: float = math.nan
    breakdown_s: dict[str, float] = field(default_factory=dict)


class Estimator:
    """Fast analytic memory and step time of layouts of one workload on one machine."""

    def __init__(self, work: WorkloadConfig, topo: TopologyConfig, machine: Machine):
        self.work, self.topo, self.machine = work, topo, machine
        self.n_gpus = topo.nodes * topo.gpus_per_node
        m = work.model
        self.lp = tf.layer_params(m)
        self.emb = tf.embedding_params(m)
        self.head = tf.head_params(m) + tf.final_norm_params(m)
        self.capacity = machine.gpu.hbm_GiB * GiB
        self._progs: dict[tuple, StagePrograms] = {}
        self._coll: dict[tuple, float] = {}
        self._opt: dict[float, float] = {}

    # ---- helpers

    def resolve(self, cand: Candidate) -> tuple[WorkloadConfig, Resolved]:
        """The workload with ``cand`` applied and its resolved sizes; ConfigError if invalid."""
        work = cand.apply(self.work)
        return work, resolve(work, self.topo, file="plan", topo_file=self.topo.name)

    def _vs_params(self, res: Resolved, vs: int) -> float:
        n = res.stage_layers[vs] * self.lp
        if vs == 0:
            n += self.emb
        if vs == res.pp * res.virtual_stages - 1:
            n += self.head
        return n

    def _stage_params(self, res: Resolved, stage: int) -> float:
        return sum(self._vs_params(res, c * res.pp + stage) for c in range(res.virtual_stages))

    def _layout(self, res: Resolved) -> Layout:
        order = tuple(self.work.parallelism.order)
        return Layout(res.tp, res.dp, res.pp, order, res.virtual_stages, res.stage_layers)

    def _cost(self, op: str, kind: str, res: Resolved, nbytes: float) -> float:
        """Folded cost of a collective on the real groups of stage 0 (see :meth:`_exact`).

        DP and PP costs above :data:`LINEAR_FROM` bytes are interpolated linearly between
        exact costs at ``LINEAR_FROM`` and ``LINEAR_TO`` (bandwidth-bound collectives take
        a fixed latency plus bytes over bandwidth), so a layout needs two costings per
        operation instead of one per message size."""
        if kind == "tp" or nbytes <= LINEAR_FROM:
            return self._exact(op, kind, res, nbytes)
        a = self._exact(op, kind, res, LINEAR_FROM)
        b = self._exact(op, kind, res, LINEAR_TO)
        return a + (b - a) * (nbytes - LINEAR_FROM) / (LINEAR_TO - LINEAR_FROM)

    def _exact(self, op: str, kind: str, res: Resolved, nbytes: float) -> float:
        """The collective model's cost of ``op`` on every concurrent group of one stage: TP
        groups (only those inside the first node: nothing else shares their NVLink), the
        ``tp`` DP groups of stage 0, or the sends of every (replica, TP rank) from stage 0
        to stage 1. Cached."""
        key = (
            (op, kind, res.tp, nbytes)
            if kind == "tp"
            else (op, kind, res.tp, res.pp, res.dp, nbytes)
        )
        hit = self._coll.get(key)
        if hit is None:
            lay, coll = self._layout(res), self.machine.collectives
            gpn = self.topo.gpus_per_node
            if kind == "tp":
                groups = [lay.tp_group(d, 0) for d in range(res.dp)]
                local = [g for g in groups if max(g) < gpn]
                hit = coll.cost(op, tuple(local or groups), nbytes).time_s
            elif kind == "dp":
                groups = tuple(lay.dp_group(r, 0) for r in range(res.tp))
                hit = coll.cost(op, groups, nbytes).time_s
            else:
                pairs = [
                    (lay.rank(r, d, 0), lay.rank(r, d, 1 % res.pp))
                    for d in range(res.dp)
                    for r in range(res.tp)
                ]
                hit = coll.p2p_cost(pairs, nbytes).time_s
            self._coll[key] = hit
        return hit

    def programs(self, cand: Candidate, res: Resolved) -> StagePrograms:
        key = (cand.tp, cand.sequence_parallel, cand.micro_batch, cand.recompute)
        hit = self._progs.get(key)
        if hit is None:
            t = self.work.training
            tp_cost = None
            if cand.tp > 1:

                def tp_cost(op: str, nbytes: float) -> float:
                    return self._cost(op, "tp", res, nbytes)

            hit = build_stage_programs(
                model=self.work.model, micro_batch=cand.micro_batch, tp=cand.tp,
                sp=cand.sequence_parallel, recompute=cand.recompute, dtype=t.precision,
                cm=self.machine.compute, tp_cost=tp_cost, flash_attention=t.flash_attention,
            )  # fmt: skip
            self._progs[key] = hit
        return hit

    def _optimizer_s(self, local_params: float) -> float:
        hit = self._opt.get(local_params)
        if hit is None:
            t = self.work.training
            ops = tf.optimizer_ops(
                local_params, param_dtype=t.param_dtype, grad_dtype=t.grad_reduce_dtype
            )
            hit = sum(_compute(self.machine.compute, op, t.precision).dur for op in ops)
            self._opt[local_params] = hit
        return hit

    # ---- memory

    def memory_bytes(self, cand: Candidate, res: Resolved) -> float:
        """Peak bytes per GPU (worst stage) as the pre-screen counts them (module docstring)."""
        m, t = self.work.model, self.work.training
        kw = dict(
            micro_batch=cand.micro_batch, tp=cand.tp, sequence_parallel=cand.sequence_parallel
        )
        act_layer = mem.activation_bytes_per_layer(
            m, recompute=cand.recompute, flash_attention=t.flash_attention, **kw
        )
        act_embed = mem.embedding_activation_bytes(m, **kw)
        act_head = mem.head_activation_bytes(m, **kw)
        pp, v = res.pp, res.virtual_stages
        last = pp * v - 1
        worst = 0.0
        for s in range(pp):
            states = mem.model_state_bytes(
                self._stage_params(res, s) / cand.tp, zero=cand.zero, dp=res.dp,
                param_dtype=t.param_dtype, grad_dtype=t.grad_reduce_dtype,
            ).total  # fmt: skip
            chunk = []
            for c in range(v):
                vs = c * pp + s
                b = res.stage_layers[vs] * act_layer
                b += act_embed if vs == 0 else 0.0
                b += act_head if vs == last else 0.0
                chunk.append(b)
            acts = peak_inflight_bytes(cand.pp_schedule, s, pp, res.microbatches, v, tuple(chunk))
            worst = max(worst, states + acts)
        return worst

    # ---- time

    def estimate(self, cand: Candidate, res: Resolved) -> Estimate:
        """Memory and the analytic step time / tokens per second of ``cand``."""
        need = self.memory_bytes(cand, res)
        est = Estimate(cand, need / GiB, need <= self.capacity)
        if not est.fits:
            return est
        work, t = self.work, self.work.training
        progs = self.programs(cand, res)
        pp, v, m, dp, tp = res.pp, res.virtual_stages, res.microbatches, res.dp, res.tp
        last = pp * v - 1
        lf = program_time(progs.layer_fwd)
        lb = program_time(progs.layer_bwd)
        lr = program_time(progs.layer_recompute)
        ef, eb = program_time(progs.embed_fwd), program_time(progs.embed_bwd)
        hf, hb = program_time(progs.head_fwd), program_time(progs.head_bwd)

        pb, gb = BYTES[t.param_dtype], BYTES[t.grad_reduce_dtype]
        bucket = t.grad_bucket_MB * 1e6
        p_layer = self.lp / tp
        # ZeRO-3: every layer's parameters gathered before its forward and its backward, and
        # its gradients reduce-scattered, per micro-batch (prefetch one layer ahead).
        z3_gather = self._cost("all_gather", "dp", res, p_layer * pb) if cand.zero == 3 else 0.0
        z3_rs = self._cost("reduce_scatter", "dp", res, p_layer * gb) if cand.zero == 3 else 0.0

        T, F, B, comp, tpc = [], [], [], [], []
        for s in range(pp):
            f = b = c_ = x = 0.0
            for ch in range(v):
                vs = ch * pp + s
                n = res.stage_layers[vs]
                lf_t, lb_t = lf[0], lb[0] + lr[0]
                if cand.zero == 3:
                    lf_t = max(lf_t, z3_gather)
                    lb_t = max(lb_t, z3_gather)
                f += n * lf_t
                b += n * lb_t
                c_ += n * (lf[1] + lb[1] + lr[1])
                x += n * (lf[2] + lb[2] + lr[2])
                if vs == 0:
                    f, b = f + ef[0], b + eb[0]
                    c_, x = c_ + ef[1] + eb[1], x + ef[2] + eb[2]
                if vs == last:
                    f, b = f + hf[0], b + hb[0]
                    c_, x = c_ + hf[1] + hb[1], x + hf[2] + hb[2]
            if cand.zero == 3:
                f += z3_gather  # the first layer's gather is never hidden
                b += z3_gather
            F.append(f)
            B.append(b)
            T.append(f + b)
            comp.append(c_)
            tpc.append(x)
        t_max = max(T)
        if pp == 1:
            pipe = m * T[0]
        elif v == 1:
            pipe = (m - 1) * t_max + sum(T)
        else:
            pipe = m * t_max + (pp - 1) / v * (sum(T) / pp)
        busy = m * max(T)
        bubble = max(0.0, pipe - busy)
        pp_comm = 0.0
        if pp > 1:
            send = self._cost("send", "pp", res, tf.pp_activation_bytes(
                work.model, micro_batch=cand.micro_batch, tp=tp,
                sequence_parallel=cand.sequence_parallel,
                scatter_gather=work.parallelism.pp_scatter_gather,
            ))  # fmt: skip
            pp_comm = 2 * (m + pp * v - 1) * send

        # Tail per stage: gradient reduction, optimizer, ZeRO-1/2 parameter all-gather. Stage s
        # finishes its last backward about s backward passes before stage 0 (1F1B drain).
        tail, parts = 0.0, (0.0, 0.0, 0.0)
        for s in range(pp):
            params = self._stage_params(res, s) / tp
            grads = params * gb
            slack = s * (B[s] / v if pp > 1 else 0.0)
            if cand.zero == 3:
                total_rs = m * sum(res.stage_layers[c * pp + s] for c in range(v)) * z3_rs
                dp_exposed = max(z3_rs, total_rs - m * B[s])
            else:
                op = "all_reduce" if cand.zero == 0 else "reduce_scatter"
                if t.overlap_grad_reduce:
                    # Buckets fill layer by layer during the last backward and go out once
                    # they reach grad_bucket_MB: whole layers per bucket (as the engine does).
                    per_layer = self.lp / tp * gb
                    k = max(1, math.ceil(bucket / per_layer))
                    size = min(k * per_layer, grads)
                else:
                    size = min(bucket, grads)
                n_b = max(1, math.ceil(grads / size))
                each = self._cost(op, "dp", res, size) if dp > 1 else 0.0
                total = n_b * each
                window = B[s] / v * (1 - 1 / n_b) if t.overlap_grad_reduce else 0.0
                dp_exposed = max(each if t.overlap_grad_reduce else total, total - window)
            opt = self._optimizer_s(params / (dp if cand.zero >= 1 else 1))
            gather = 0.0
            if cand.zero in (1, 2) and dp > 1:
                gather = sum(
                    self._cost("all_gather", "dp", res, self._vs_params(res, c * pp + s) / tp * pb)
                    for c in range(v)
                )
                if t.overlap_param_gather:
                    gather = gather / v  # only the first chunk's gather delays the step
            end = dp_exposed + opt + gather - slack
            if end > tail or s == 0:
                tail, parts = max(end, 0.0), (dp_exposed + gather, opt, slack)
        step = pipe + pp_comm + tail
        est.step_time_s = step
        est.tokens_per_s = t.global_batch * work.model.seq_len / step
        s0 = max(range(pp), key=lambda s: T[s])
        comp_s, tp_s = m * comp[s0], m * tpc[s0]
        est.breakdown_s = {
            "compute": comp_s,
            "tp_comm": tp_s,
            "dp_comm": max(0.0, parts[0] - parts[2]),
            "pp_comm": pp_comm,
            "pp_bubble": bubble + max(0.0, busy - comp_s - tp_s),
            "optimizer": parts[1],
            "other": 0.0,
        }
        return est


# --------------------------------------------------------------------------------------------
# The search


@dataclass
class Planned:
    """One fully simulated layout."""

    candidate: Candidate
    summary: dict
    estimate: Estimate | None
    is_reference: bool = False  # the workload's own layout


@dataclass
class PlanResult:
    """What :func:`plan` found."""

    name: str
    n_gpus: int
    top: list[Planned]  # fitting, best first (at most K)
    reference: Planned | None  # the workload's own layout on N GPUs, simulated
    counts: dict[str, int]
    simulated: list[Planned]
    wall_s: float
    timings: dict[str, float] = field(default_factory=dict)


_WORKER: dict[str, Any] = {}


def _init_worker(loaded: LoadedWorkload) -> None:
    from simulator.run import make_machine

    _WORKER["machine"] = make_machine(loaded)
    _WORKER["loaded"] = loaded


def _simulate_candidate(work: WorkloadConfig) -> dict:
    from simulator.run import simulate

    base: LoadedWorkload = _WORKER["loaded"]
    loaded = LoadedWorkload(work, base.topology, base.workload_path, base.topology_path)
    try:
        return simulate(loaded, machine=_WORKER["machine"]).summary
    except SimulatorError as e:
        return {"error": str(e)}


def plan(
    loaded: LoadedWorkload,
    n_gpus: int,
    *,
    top: int = 5,
    n_simulate: int | None = None,
    workers: int | None = None,
    machine: Machine | None = None,
) -> PlanResult:
    """Search the layouts of ``loaded``'s workload on ``n_gpus`` GPUs (module docstring).

    ``n_simulate`` (default ``2 * top``) layouts with the best estimates are simulated in
    full, besides the workload's own layout; ``workers`` processes run them (default: one per
    core, at most the number of simulations).
    """
    t0 = time.perf_counter()
    if top < 1:
        raise ConfigError(f"must be >= 1, got {top}", file="--top")
    topo = plan_topology(loaded.topology, n_gpus)
    base = LoadedWorkload(loaded.workload, topo, loaded.workload_path, loaded.topology_path)
    if machine is None:
        from simulator.run import make_machine

        machine = make_machine(base)
    est = Estimator(loaded.workload, topo, machine)
    counts = {"enumerated": 0, "invalid": 0, "does_not_fit": 0, "estimated": 0}
    estimates: list[Estimate] = []
    works: dict[Candidate, WorkloadConfig] = {}
    for cand in enumerate_layouts(loaded.workload, est.n_gpus, topo.gpus_per_node):
        counts["enumerated"] += 1
        try:
            work, res = est.resolve(cand)
        except ConfigError:
            counts["invalid"] += 1
            continue
        e = est.estimate(cand, res)
        if not e.fits:
            counts["does_not_fit"] += 1
            continue
        counts["estimated"] += 1
        estimates.append(e)
        works[cand] = work
    t_est = time.perf_counter() - t0
    estimates.sort(key=lambda e: (-e.tokens_per_s, e.memory_gib, e.candidate))

    # The workload's own layout, on N GPUs (dp derived), as the reference.
    ref_cand, ref_work = None, None
    try:
        own = loaded.workload.model_copy(
            update={"parallelism": loaded.workload.parallelism.model_copy(update={"dp": None})}
        )
        res = resolve(own, topo, file=str(loaded.workload_path))
        ref_cand = candidate_of(own, res)
        ref_work = ref_cand.apply(own) if own.parallelism.stage_layers is None else own
    except ConfigError:
        pass

    n_sim = 2 * top if n_simulate is None else n_simulate
    chosen = [e for e in estimates[:n_sim]]
    jobs: list[tuple[Candidate, WorkloadConfig, Estimate | None, bool]] = [
        (e.candidate, works[e.candidate], e, False) for e in chosen
    ]
    if ref_cand is not None and ref_work is not None:
        ref_est = next((e for e in estimates if e.candidate == ref_cand), None)
        jobs = [j for j in jobs if j[0] != ref_cand]
        jobs.append((ref_cand, ref_work, ref_est, True))
    n_workers = min(workers or os.cpu_count() or 1, len(jobs)) or 1
    t1 = time.perf_counter()
    if n_workers > 1:
        with process_pool(n_workers, _init_worker, (base,)) as pool:
            summaries = list(pool.map(_simulate_candidate, [j[1] for j in jobs]))
    else:
        _WORKER["machine"], _WORKER["loaded"] = machine, base
        summaries = [_simulate_candidate(j[1]) for j in jobs]
    t_sim = time.perf_counter() - t1
    simulated = [
        Planned(c, s, e, is_ref) for (c, _, e, is_ref), s in zip(jobs, summaries, strict=True)
    ]
    ok = [p for p in simulated if "error" not in p.summary and p.summary.get("fits")]
    ok.sort(key=lambda p: (-p.summary["tokens_per_s"], p.candidate))
    reference = next((p for p in simulated if p.is_reference), None)
    counts["simulated"] = len(simulated)
    counts["simulated_fit"] = len(ok)
    return PlanResult(
        name=loaded.workload.name,
        n_gpus=est.n_gpus,
        top=ok[:top],
        reference=reference,
        counts=counts,
        simulated=simulated,
        wall_s=time.perf_counter() - t0,
        timings={"estimate_s": t_est, "simulate_s": t_sim, "workers": n_workers},
    )


def plan_path(loaded: LoadedWorkload) -> Path:
    return Path("results") / loaded.workload.name
