"""Fast analytic memory and step time of a layout, for :func:`simulator.plan.plan`.

**Memory pre-screen** (:meth:`Estimator.memory_bytes`): per pipeline stage, the model
states (:func:`simulator.model.memory.model_state_bytes` of the stage's parameters, sharded
by ZeRO) plus the activations of the micro-batches in flight at the schedule's peak (1F1B:
``min(pp - s, m)`` on stage ``s``; GPipe: ``m``; interleaved: the peak of the schedule's
own work order, each (micro-batch, chunk) holding its chunk's layers, the embedding on the
first and the LM head / loss on the last). This is exactly the engine's accounting at the
end of a forward pass, which is never above the engine's peak, so the screen is *sound*:
it never drops a layout that the simulator would say fits. (ZeRO-3's transient gathered
layer parameters are left out for the same reason.)

**Throughput estimate** (:meth:`Estimator.estimate`): per stage and micro-batch, forward and
backward times from the same priced stage programs the engine replays (kernels from the
calibrated compute model, exposed TP collectives from the collective model on the real TP
groups); pipeline time ``(m - 1) * max_s T_s + sum_s T_s`` for 1F1B (Narayanan et al. 2021:
``(m + p - 1) t`` for equal stages) and ``m * max_s T_s + (p - 1) / v * mean_s T_s`` for the
interleaved schedule (the bubble shrinks by v, Narayanan et al. SC21); point-to-point sends
``2 (m + p v - 1)`` on the critical path (DualPipe and DualPipeV: each rank's order played
with the engine's pass and pair times, :mod:`simulator.plan_dualpipe`); gradient reduction bucket by bucket on the real
DP groups, overlapping the last micro-batch's backward when ``overlap_grad_reduce``; the
optimizer's memory-bound step; the ZeRO-1/2 parameter all-gather after it; ZeRO-3
per-layer gathers where they exceed the layer's compute, and its per-layer gradient
reduce-scatters where the backward cannot hide them. DP and PP collectives are priced by
the collective model on the real concurrent groups of one stage (above 32 MiB by linear
interpolation between two exact costings), with the engine's algorithm choice: the lowest
predicted time among ring, tree and, where the fabric has them, NVLS, NVLS Tree and CollNet
(:meth:`~simulator.network.collectives.CollectiveModel.cost`; ``tests/test_plan_nvls.py``). Checked against the engine on Llama-2-70B /
1,024 H100 (tests and the helper's report): within about 6 % (slightly pessimistic) for
TP/PP/ZeRO-0..2 layouts; optimistic by up to ~10-40 % for ZeRO-3, whose parameter
gathers and gradient reduce-scatters share links in the engine but not here. The ranking
only picks what to simulate; the table shows simulated numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING

from simulator.config.checks import Resolved, resolve
from simulator.config.schema import TopologyConfig, WorkloadConfig
from simulator.engine.build import GRAD_DIMS, MOE_DIMS, Machine, make_layout
from simulator.engine.combined import chain_items, pair_schedule
from simulator.engine.dispatch import DEEPEP, deepep_copies, routed_cost
from simulator.engine.program import (
    StagePrograms,
    build_stage_programs,
    embed_grad,
    embed_tp,
    optimizer_parts,
    program_time,
    weight_cast_share,
    weight_quant_share,
)
from simulator.hardware.precision import non_tn_fp8, pricing_dtype, weight_bytes
from simulator.model import comm as mc
from simulator.model import memory as mem
from simulator.model import moe_layer, moe_sizes, mtp
from simulator.model import transformer as tf
from simulator.model.moe import (
    beside_ep_slowdown,
    ep_comm_extra,
)
from simulator.model.ops import DTYPE_BYTES as BYTES
from simulator.model.pipeline_memory import runtime_memory
from simulator.model.sync import group_sync_factor, sync_group_size
from simulator.network.interference import slowdown_fn
from simulator.network.topology import load_fabrics
from simulator.parallel.layout import Layout
from simulator.parallel.schedules import Work, chunks_per_rank, schedule
from simulator.plan_dualpipe import (
    MIRROR,
    Walk,
    estimate_dual,
    holders,
    is_dual,
    joined,
    rank_stages,
)

if TYPE_CHECKING:
    from simulator.plan import Candidate

GiB = 2**30
#: DP / PP collectives above this size are costed by linear interpolation (Estimator._cost).
LINEAR_FROM, LINEAR_TO = float(2**25), float(2**30)


# --------------------------------------------------------------------------------------------
# In-flight activations of a schedule


@lru_cache(maxsize=4096)
def _inflight_profile(
    name: str, stage: int, pp: int, m: int, v: int, combine: bool = False
) -> tuple[tuple[int, ...], ...]:
    """Per chunk, how many (micro-batch, chunk) forwards are in flight at each forward's end,
    reduced to the Pareto-maximal count vectors (the weighted peak is attained on one)."""
    live = [0] * chunks_per_rank(name, v)
    points: set[tuple[int, ...]] = set()
    for item in schedule(name, stage, pp, m, v, combine):
        # (DualPipe: a pair's backward frees before its forward is counted, a lower bound of
        # the engine's interleaving of the two; I frees, W nothing)
        for w in (item,) if isinstance(item, Work) else reversed(item):
            if w.phase == "F":
                live[w.chunk] += 1
                points.add(tuple(live))
            elif w.phase != "W":
                live[w.chunk] -= 1
    pareto = [
        p
        for p in points
        if not any(q != p and all(a >= b for a, b in zip(q, p, strict=True)) for q in points)
    ]
    return tuple(sorted(pareto))


def peak_inflight_bytes(name: str, stage: int, pp: int, m: int, v: int, chunk_bytes,
                        combine: bool = False) -> float:  # fmt: skip
    """Largest sum of in-flight activation bytes on ``stage`` (``chunk_bytes[c]`` per
    micro-batch of chunk ``c``), at the end of a forward pass (``combine``: the combined 1F1B
    order, :func:`simulator.parallel.schedules.schedule`)."""
    if name == "1f1b" and v == 1 and not combine:
        return min(pp - stage, m) * chunk_bytes[0]
    if name == "gpipe":
        return m * chunk_bytes[0]
    return max(
        sum(n * b for n, b in zip(p, chunk_bytes, strict=True))
        for p in _inflight_profile(name, stage, pp, m, v, combine)
    )


# --------------------------------------------------------------------------------------------
# Estimator


def _shard(res: Resolved) -> int:
    """Ranks that hold the same weights: gradients are reduced and ZeRO shards over them."""
    n = 1
    for d in GRAD_DIMS:
        n *= res.size(d)
    return n


def _add(acc: dict[str, float], n: int, *times) -> None:
    """Add ``n`` times the exposed communication per dimension of ``program_time`` results."""
    for t in times:
        for dim, secs in t[2]:
            acc[dim] = acc.get(dim, 0.0) + n * secs


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
        self.reserved = getattr(machine.gpu, "runtime_reserved_GiB", 0.0) * GiB
        self._progs: dict[tuple, StagePrograms] = {}
        self._coll: dict[tuple, float] = {}
        self._opt: dict[float, float] = {}
        self._acts: dict[tuple, tuple[float, float]] = {}
        self._walks: dict[tuple, Walk] = {}  # DualPipe orders played (plan_dualpipe.walk)
        # a DP / ZeRO collective beside compute takes longer (the engine's rule, interference.py)
        # the NCCL tables (combined 1F1B's and DualPipe's paired EP collectives read theirs)
        self.nccl = load_fabrics()["nccl"]
        self.slow = slowdown_fn(self.nccl, machine.gpu.name)
        # kernels slowed beside a collective (the engine's StepPlan.interference)
        self.interference = float(self.nccl.get("compute_slowdown_beside_comm", 0.0))

    # ---- helpers

    def resolve(self, cand: Candidate) -> tuple[WorkloadConfig, Resolved]:
        """The workload with ``cand`` applied and its resolved sizes; ConfigError if invalid."""
        work = cand.apply(self.work)
        return work, resolve(work, self.topo, file="plan", topo_file=self.topo.name)

    def _vs_params(self, res: Resolved, vs: int) -> float:
        """Parameters of virtual stage ``vs`` on one rank, TP-equivalent (x tp): the dense
        part and, in an MoE model, the routed experts of its EP x ETP rank."""
        dense, expert = self._vs_local(res, vs)
        return (dense + expert) * res.size("tp")

    def _vs_local(self, res: Resolved, vs: int) -> tuple[float, float]:
        """(dense part split over TP, routed experts split over ep x etp) of virtual stage
        ``vs`` on one rank, as the engine counts them (``_Builder.vs_local``)."""
        tp, pp = res.size("tp"), res.size("pp")
        if self.work.model.moe is None:
            dense, expert = res.stage_layers[vs] * self.lp / tp, 0.0
        else:
            start = sum(res.stage_layers[:vs])
            dense = expert = 0.0
            for layer in range(start, start + res.stage_layers[vs]):
                a, b = moe_sizes.layer_local_params(self.work.model, layer, tp=tp,
                                                    ep=res.ep, etp=res.etp)  # fmt: skip
                dense, expert = dense + a, expert + b
        if vs == 0:
            dense += self.emb / self._embed_tp(tp)
        if vs == pp * res.virtual_stages - 1:
            dense += self.head / tp
            m = self.work.model
            if m.mtp_depth:  # MTP modules, as the engine counts them (simulator.model.mtp)
                if m.moe is None:
                    a, b = self.lp / tp, 0.0
                else:
                    a, b = moe_sizes.layer_local_params(m, m.layers - 1, tp=tp, ep=res.ep,
                                                        etp=res.etp)  # fmt: skip
                dense += m.mtp_depth * a + mtp.mtp_params(m, 0) / tp
                expert += m.mtp_depth * b
        return dense, expert

    def _embed_tp(self, tp: int) -> int:
        return embed_tp(self.work.parallelism, tp)

    def _stage_params(self, res: Resolved, stage: int) -> float:
        pp = res.size("pp")
        return sum(self._vs_params(res, c * pp + stage) for c in range(res.virtual_stages))

    def _layer_grad_bytes(self, res: Resolved, gb: float) -> float:
        """Gradient bytes of one (last, so MoE where the model has experts) layer on a rank."""
        if self.work.model.moe is None:
            return self.lp / res.size("tp") * gb
        a, b = moe_sizes.layer_local_params(self.work.model,
                                            moe_sizes.last_moe_layer(self.work.model),
                                            tp=res.size("tp"), ep=res.ep, etp=res.etp)  # fmt: skip
        return (a + b) * gb

    def _stage_local(self, res: Resolved, stage: int, sched: str = "1f1b") -> tuple[float, float]:
        """:meth:`_vs_local` over the model stages rank ``stage`` holds under ``sched``."""
        pp = res.size("pp")
        parts = [self._vs_local(res, vs)
                 for vs in rank_stages(sched, stage, pp, res.virtual_stages)]  # fmt: skip
        return sum(a for a, _ in parts), sum(b for _, b in parts)

    def _edp(self, res: Resolved) -> int:
        """Ranks the routed experts' states are sharded over (ZeRO): edp where experts are
        split, else the dense part's ``cp x dp``."""
        return res.edp if res.ep * res.etp > 1 else _shard(res)

    def _layout(self, res: Resolved) -> Layout:
        return make_layout(self.work, res)

    def _cost(self, op: str, kind: str, res: Resolved, nbytes: float) -> float:
        """Folded cost of a collective on the real groups of stage 0 (see :meth:`_exact`).

        DP and PP costs above :data:`LINEAR_FROM` bytes are interpolated linearly between
        exact costs at ``LINEAR_FROM`` and ``LINEAR_TO`` (bandwidth-bound collectives take
        a fixed latency plus bytes over bandwidth), so a layout needs two costings per
        operation instead of one per message size."""
        if kind in ("tp", "cp", "ep", "etp") or nbytes <= LINEAR_FROM:
            return self._exact(op, kind, res, nbytes)
        a = self._exact(op, kind, res, LINEAR_FROM)
        b = self._exact(op, kind, res, LINEAR_TO)
        return a + (b - a) * (nbytes - LINEAR_FROM) / (LINEAR_TO - LINEAR_FROM)

    def _exact(self, op: str, kind: str, res: Resolved, nbytes: float) -> float:
        """The collective model's cost of ``op`` on every concurrent group of one stage: TP
        groups (only those inside the first node: nothing else shares their NVLink), the CP
        groups of stage 0 (a ``send_recv`` is every member's send to its ring successor), the
        gradient-reduction (cp x dp) groups of stage 0, or the sends of every rank of stage 0
        to stage 1. A ``dp`` or ``edp`` kind ending in :data:`MIRROR` is DualPipe's
        reduction: each group of stage 0 joined with its mirror's of the last stage. Cached."""
        key = (op, kind, res.size("tp"), nbytes) if kind == "tp" else (op, kind, res.sizes, nbytes)
        twin, kind = kind.endswith(MIRROR), kind.removesuffix(MIRROR)
        if kind in ("ep", "etp", "edp"):
            key = (op, key[1], res.sizes, res.ep, res.etp, nbytes)
        hit = self._coll.get(key)
        if hit is None:
            lay, coll = self._layout(res), self.machine.collectives
            gpn = self.topo.gpus_per_node
            ends = (0, res.size("pp") - 1) if twin else (0,)
            if kind in ("ep", "etp", "edp"):
                sizes = {"etp": res.etp, "ep": res.ep, "edp": res.edp, "pp": res.size("pp")}
                moe_lay = Layout.of(sizes, MOE_DIMS)
                groups = joined([moe_lay.groups(kind, {"pp": (e,)}) for e in ends])
                if op == DEEPEP:
                    hit = routed_cost(coll, self.work.model.moe, groups, nbytes).time_s
                else:
                    hit = coll.cost(op, groups, nbytes).time_s
            elif kind == "tp":
                groups = lay.groups("tp", {"pp": (0,)})
                local = [g for g in groups if max(g) < gpn]
                hit = coll.cost(op, tuple(local or groups), nbytes).time_s
            elif kind in ("dp", "cp"):
                groups = joined([lay.groups(GRAD_DIMS if kind == "dp" else kind, {"pp": (e,)})
                                  for e in ends])  # fmt: skip
                if op == "send_recv":
                    pairs = [(g[i], g[(i + 1) % len(g)]) for g in groups for i in range(len(g))]
                    hit = coll.p2p_cost(pairs, nbytes).time_s
                else:
                    hit = coll.cost(op, tuple(groups), nbytes).time_s
            else:
                # every rank of stage 0 with its counterpart on stage 1 (rank + stride of pp)
                pp = res.size("pp")
                stride = lay.rank({"pp": 1}) if pp > 1 else 1
                pairs = [(g, g + (1 % pp) * stride) for g in range(lay.n_gpus)
                         if (g // stride) % pp == 0]  # fmt: skip
                hit = coll.p2p_cost(pairs, nbytes).time_s
            self._coll[key] = hit
        return hit

    def programs(self, cand: Candidate, res: Resolved) -> StagePrograms:
        t = self.work.training
        casts = weight_cast_share(self.work.parallelism, t, self.work.model, cand.pp,
                                  res.microbatches)
        wquant = weight_quant_share(t, res.microbatches)
        cp_comm = cand.cp_comm or self.work.parallelism.cp_comm
        key = (cand.tp, cand.cp, cand.sequence_parallel, cand.micro_batch, cand.recompute,
               cand.ep, cand.etp, res.sizes if cand.ep is not None else None,
               cand.pp == 1, casts, wquant, cp_comm)  # fmt: skip
        hit = self._progs.get(key)
        if hit is None:
            moe_kw = None
            if self.work.model.moe is not None:
                moe_kw = moe_layer.layer_settings(t, res.ep, res.etp)

            def comm_cost(dim: str, op: str, nbytes: float) -> float:
                return self._cost(op, dim, res, nbytes)

            hit = build_stage_programs(
                model=self.work.model, micro_batch=cand.micro_batch, tp=cand.tp,
                sp=cand.sequence_parallel, recompute=cand.recompute, dtype=pricing_dtype(t),
                cm=self.machine.compute, comm_cost=comm_cost, flash_attention=t.flash_attention,
                kernels=t.kernels, param_dtype=t.param_dtype, cp=cand.cp,
                cp_comm=cp_comm, moe_kw=moe_kw,
                recompute_modules=moe_sizes.recompute_modules(
                    t.model_copy(update={"recompute": cand.recompute})),
                tp_input_dtype=self.work.parallelism.tp_input_dtype,
                tp_impl=self.work.parallelism.tp_impl, tp_loss=self.work.parallelism.tp_loss,
                embed_grad=embed_grad(t, self.work.model, cand.pp),
                embed_tp=self._embed_tp(cand.tp),
                weight_cast_share=casts,
                weight_quant_share=wquant,
            )  # fmt: skip
            self._progs[key] = hit
        return hit

    def _optimizer_s(self, local_params: float) -> float:
        hit = self._opt.get(local_params)
        if hit is None:
            hit = sum(part.dur for part in optimizer_parts(self.machine.compute,
                                                            self.work.training, local_params))
            self._opt[local_params] = hit
        return hit

    # ---- memory

    def memory_bytes(self, cand: Candidate, res: Resolved) -> float:
        """Peak bytes per GPU (worst stage) as the pre-screen counts them (module docstring)."""
        m, t = mc.cp_local(self.work.model, cand.cp), self.work.training
        kw = dict(
            micro_batch=cand.micro_batch, tp=cand.tp, sequence_parallel=cand.sequence_parallel
        )
        impl = dict(kernels=t.kernels, param_dtype=t.param_dtype)
        code = moe_sizes.activation_code(t)
        act_layer = mem.activation_bytes_per_layer(
            m, recompute=cand.recompute, flash_attention=t.flash_attention, **kw, **impl, **code
        )
        etp = self._embed_tp(cand.tp)
        act_embed = mem.embedding_activation_bytes(
            m, **dict(kw, tp=etp, sequence_parallel=cand.sequence_parallel and etp > 1), **impl)
        act_head = mem.head_activation_bytes(m, norm_gain=t.rmsnorm_gain,
                                             tp_loss=self.work.parallelism.tp_loss, **kw, **impl)
        # a recomputed layer's activations, held again during its backward (as the engine)
        act_rc = max(0.0, mem.activation_bytes_per_layer(
            m, recompute="none", flash_attention=t.flash_attention, **kw, **impl, **code
        ) - act_layer)
        pp, v = res.size("pp"), res.virtual_stages
        last = pp * v - 1
        if m.mtp_depth:  # each MTP module: a layer of the last kind, a head, its inputs
            proj = 4 * cand.micro_batch * m.seq_len * m.hidden * 2 / (
                cand.tp if cand.sequence_parallel else 1)
            act_head += m.mtp_depth * (self._last_layer_activation(cand, res, act_layer)
                                       + act_head + proj)  # fmt: skip
        tm = runtime_memory(  # what torch.distributed.pipelining holds, as the engine counts it
            m, pp_runtime=self.work.parallelism.pp_runtime, pp=pp, micro_batch=cand.micro_batch,
            microbatches=res.microbatches, tp=cand.tp, sequence_parallel=cand.sequence_parallel,
            kernels=t.kernels, param_dtype=t.param_dtype,
        )  # fmt: skip
        if tm is not None:  # torch.distributed.pipelining: one set of weight copies a step
            act_layer -= tm.layer_cast
            act_head -= tm.head_cast
        worst = 0.0
        skw = dict(zero=cand.zero, param_dtype=t.param_dtype, grad_dtype=t.grad_reduce_dtype,
                   kernels=t.kernels,
                   weight_bytes=weight_bytes(t, BYTES[t.param_dtype], non_tn_fp8(self.machine.gpu))[0],
                   moments_dtype=t.optimizer_moments_dtype, master_weights=t.master_weights)
        sched = cand.pp_schedule
        h = holders(sched)  # DualPipe: states sharded over the mirrored ranks too
        for s in range(pp):
            dense, expert = self._stage_local(res, s, sched)
            states = mem.model_state_bytes(dense, dp=_shard(res) * h, **skw).total
            if expert:
                states += mem.model_state_bytes(expert, dp=self._edp(res) * h, **skw).total
            chunk = []
            stages = rank_stages(sched, s, pp, v)
            for vs in stages:
                b = self._vs_activation(cand, res, vs, act_layer)
                b += act_embed if vs == 0 else 0.0
                b += act_head if vs == last else 0.0
                b += tm.per_microbatch(vs == 0, vs == last) if tm is not None else 0.0
                chunk.append(b)
            acts = peak_inflight_bytes(sched, s, pp, res.microbatches, v, tuple(chunk),
                                       self._combine(res))  # fmt: skip
            if tm is not None:  # buffers and copies a step; the last stage's logits (all m
                # at the peak: the forwards' end for GPipe, the last micro-batch for 1F1B)
                acts += sum(tm.buffers(vs == 0, vs == last)
                            + tm.casts(res.stage_layers[vs], vs == last)
                            + (res.microbatches * tm.logits if vs == last else 0.0)
                            for vs in stages)  # fmt: skip
            # The backward after that peak re-runs a layer (recompute) first; on the rank of
            # the last stage the LM head's backward frees its activations before that.
            freed = act_head if last in stages else 0.0
            worst = max(worst, states + acts + max(0.0, act_rc - freed))
        return worst

    def deepep_copies(self, res: Resolved) -> float:
        """Token vectors a rank sends per token in DeepEP's dispatch (the engine's
        ``deepep_copies``; 1 without DeepEP)."""
        sizes = {"etp": res.etp, "ep": res.ep, "edp": res.edp, "pp": res.size("pp")}
        return deepep_copies(self.work.training.moe_dispatcher, self.work.model.moe,
                             self.machine.collectives.topology,
                             lambda: Layout.of(sizes, MOE_DIMS).groups("ep", {"pp": (0,)})[0])

    def _combine(self, res: Resolved) -> bool:
        """Whether the candidate runs combined 1F1B (the overlap switch with ep > 1)."""
        t, m = self.work.training, self.work.model
        return bool(t.overlap_moe_expert_parallel_comm and m.moe is not None and res.ep > 1)

    def _pair_s(self, progs: StagePrograms, res: Resolved, vs: int) -> float:
        """A steady-state combined 1F1B step of virtual stage ``vs``: one micro-batch's
        forward beside another's backward (:func:`simulator.engine.combined.pair_schedule`)."""
        kinds = [progs.layer(i) for i in self._stage_range(res, vs)]
        f = [("", -1, fwd) for fwd, _, _ in kinds]
        b = [("", -1, part) for _, bwd, rec in reversed(kinds) for part in (rec, bwd) if part]
        if vs == 0:
            f, b = [("", -1, progs.embed_fwd), *f], [*b, ("", -1, progs.embed_bwd)]
        if vs == res.size("pp") * res.virtual_stages - 1:
            f, b = [*f, ("", -1, progs.head_fwd)], [("", -1, progs.head_bwd), *b]
        i = self.interference
        ie = beside_ep_slowdown(i, self.work.training.moe_dispatcher,
                                    self.machine.gpu.sm_count)
        ce = ep_comm_extra(self.nccl, self.machine.gpu.name, res.ep,
                           self.work.training.moe_dispatcher, self.machine.gpu.sm_count,
                           self.deepep_copies(res))
        return pair_schedule(chain_items(f, 1.0, i, ce), chain_items(b, 1.0, i, ce), ie).total

    @staticmethod
    def _stage_range(res: Resolved, vs: int) -> range:
        """The global layers of virtual stage ``vs``."""
        start = sum(res.stage_layers[:vs])
        return range(start, start + res.stage_layers[vs])

    def _kind_counts(self, progs: StagePrograms, res: Resolved, vs: int) -> dict[int, int]:
        """Layers of virtual stage ``vs`` per kind of program they run
        (:meth:`StagePrograms.kind`: an MoE model's dense layers, local-attention layers)."""
        counts: dict[int, int] = {}
        for i in self._stage_range(res, vs):
            k = progs.kind(i)
            counts[k] = counts.get(k, 0) + 1
        return counts

    def _last_layer_activation(self, cand: Candidate, res: Resolved, act_layer: float) -> float:
        """Activation bytes of the model's last layer (the kind an MTP module repeats)."""
        m = self.work.model
        if m.moe is None and m.attention_kind != "mla":
            return act_layer
        t = self.work.training.model_copy(
            update={"micro_batch": cand.micro_batch, "recompute": cand.recompute})
        return moe_sizes.layer_activation_bytes(mc.cp_local(m, cand.cp), t, m.layers - 1,
                                                tp=cand.tp, sp=cand.sequence_parallel,
                                                ep=res.ep, etp=res.etp)  # fmt: skip

    def _vs_activation(self, cand: Candidate, res: Resolved, vs: int, act_layer: float) -> float:
        """Activation bytes a micro-batch keeps for the layers of virtual stage ``vs``: the
        dense ``act_layer`` each, or (MoE / MLA) each layer's own, as the engine counts them
        (:func:`simulator.model.moe_sizes.layer_activation_bytes`)."""
        m = self.work.model
        if m.moe is None and m.attention_kind != "mla":
            return res.stage_layers[vs] * act_layer
        key = (cand.tp, cand.cp, cand.micro_batch, cand.recompute, res.ep, res.etp)
        hit = self._acts.get(key)
        if hit is None:
            t = self.work.training.model_copy(
                update={"micro_batch": cand.micro_batch, "recompute": cand.recompute}
            )
            local = mc.cp_local(m, cand.cp)
            # one layer of each kind, dense and MoE (local attention keeps the same tensors)
            pick = {m.is_moe_layer(i): i for i in reversed(range(m.layers))}
            hit = {
                moe: moe_sizes.layer_activation_bytes(local, t, layer, tp=cand.tp,
                                                      sp=cand.sequence_parallel, ep=res.ep,
                                                      etp=res.etp)
                for moe, layer in pick.items()
            }  # fmt: skip
            self._acts[key] = hit
        n_moe = sum(m.is_moe_layer(i) for i in self._stage_range(res, vs))
        n_dense = res.stage_layers[vs] - n_moe
        return (n_dense * hit[False] if n_dense else 0.0) + (n_moe * hit[True] if n_moe else 0.0)

    # ---- time

    def _split_experts(self, res: Resolved) -> bool:
        """Whether the routed experts' gradients have their own (edp) communicator, as the
        engine does where experts are split over ep x etp."""
        return self.work.model.moe is not None and res.ep * res.etp > 1

    def _reduction_s(self, cand: Candidate, res: Resolved, s: int, b_s: float, gb: int) -> float:
        """Exposed gradient reduction of stage ``s`` (ZeRO 0-2; ``b_s``: its backward time
        per micro-batch). Buckets fill layer by layer during the last backward and go out once
        they reach the bucket size (MiB), whole layers per bucket (as the engine does); without
        overlap, one bucket per model chunk (Megatron). The routed experts' buckets go over
        edp beside the dense ones over cp x dp (separate communicators): the longer counts."""
        sched = cand.pp_schedule
        t, v = self.work.training, chunks_per_rank(sched, res.virtual_stages)
        op = "all_reduce" if cand.zero == 0 else "reduce_scatter"
        dense, expert = self._stage_local(res, s, sched)
        per_layer = self._layer_grad_bytes(res, gb)
        h, sfx = holders(sched), (MIRROR if holders(sched) > 1 else "")
        if not self._split_experts(res):
            streams = [("dp" + sfx, (dense + expert) * gb, per_layer, _shard(res) * h)]
        else:
            e_layer = moe_sizes.layer_local_params(self.work.model,
                                                   moe_sizes.last_moe_layer(self.work.model),
                                                   tp=res.size("tp"), ep=res.ep,
                                                   etp=res.etp)[1] * gb  # fmt: skip
            streams = [("dp" + sfx, dense * gb, per_layer - e_layer, _shard(res) * h),
                       ("edp" + sfx, expert * gb, e_layer, res.edp * h)]  # fmt: skip
        exposed = 0.0
        for kind, grads, layer_b, group in streams:
            if group <= 1 or grads <= 0:
                continue
            if t.overlap_grad_reduce:
                k = max(1, math.ceil(t.grad_bucket_bytes / layer_b))
                size = min(k * layer_b, grads)
            else:
                size = grads / v
            n_b = max(1, math.ceil(grads / size))
            each = self._cost(op, kind, res, size)
            total = n_b * each
            window = b_s / v * (1 - 1 / n_b) if t.overlap_grad_reduce else 0.0
            # the buckets beside the backward run slower by the measured fraction
            total += self.slow(op, size, group) * min(total, window)
            exposed = max(exposed, each if t.overlap_grad_reduce else total, total - window)
        return exposed

    def _param_gather_s(self, res: Resolved, s: int, pb: float, sched: str = "1f1b") -> float:
        """ZeRO-1/2's all-gather of stage ``s``'s updated parameters after the optimizer: the
        dense part over cp x dp, the routed experts (where split) over edp, side by side;
        with ``overlap_param_gather`` only the first chunk's gather delays the step."""
        stages = rank_stages(sched, s, res.size("pp"), res.virtual_stages)
        v, h = len(stages), holders(sched)
        sfx = MIRROR if h > 1 else ""
        total = 0.0
        for vs in stages:
            dense, expert = self._vs_local(res, vs)
            if self._split_experts(res):
                parts = [("dp" + sfx, dense, _shard(res) * h), ("edp" + sfx, expert, res.edp * h)]
            else:
                parts = [("dp" + sfx, dense + expert, _shard(res) * h)]
            total += max((self._cost("all_gather", k, res, n * pb) for k, n, g in parts
                          if g > 1 and n > 0), default=0.0)  # fmt: skip
        return total / v if self.work.training.overlap_param_gather else total

    def _send_s(self, cand: Candidate, res: Resolved, src: int = 0, dst: int = 1) -> float:
        """One pipeline transfer (a micro-batch's activations or their gradients) from every
        rank of pipeline rank ``src`` to its counterpart on ``dst`` (default: stage 0 to 1),
        with the receiver's TP all-gather under scatter/gather."""
        work, tp = self.work, res.size("tp")
        d = tf.pp_stream_bytes(work.training.kernels, work.training.param_dtype)
        nbytes = tf.pp_activation_bytes(
            mc.cp_local(work.model, cand.cp), micro_batch=cand.micro_batch, tp=tp,
            sequence_parallel=cand.sequence_parallel,
            scatter_gather=work.parallelism.pp_scatter_gather, dtype_bytes=d,
        )  # fmt: skip
        if (src, dst) == (0, 1):
            send = self._cost("send", "pp", res, nbytes)
        else:
            key = ("send", src, dst, res.sizes, nbytes)
            send = self._coll.get(key)
            if send is None:
                lay = self._layout(res)
                pp, stride = res.size("pp"), lay.rank({"pp": 1})
                pairs = [(g, g + (dst - src) * stride) for g in range(lay.n_gpus)
                         if (g // stride) % pp == src]  # fmt: skip
                send = self._coll[key] = self.machine.collectives.p2p_cost(pairs, nbytes).time_s
        if tp > 1 and work.parallelism.pp_scatter_gather and not cand.sequence_parallel:
            # the receiver all-gathers the 1/tp pieces over its TP group (as the engine)
            send += self._cost("all_gather", "tp", res, tf.pp_activation_bytes(
                work.model, micro_batch=cand.micro_batch, tp=1, sequence_parallel=False,
                dtype_bytes=d))
        return send

    def estimate(self, cand: Candidate, res: Resolved) -> Estimate:
        """Memory and the analytic step time / tokens per second of ``cand``."""
        # Tensors plus the runtime's own reserve, as the simulator's fit verdict counts them.
        need = self.memory_bytes(cand, res) + self.reserved
        est = Estimate(cand, need / GiB, need <= self.capacity)
        if not est.fits:
            return est
        if is_dual(cand.pp_schedule):
            return estimate_dual(self, cand, res, est)
        work, t = self.work, self.work.training
        progs = self.programs(cand, res)
        pp, v, m, tp = res.size("pp"), res.virtual_stages, res.microbatches, res.size("tp")
        dp = _shard(res)  # ranks the gradients are reduced over, ZeRO shards over
        last = pp * v - 1
        # each kind of layer (an MoE model's dense layers, ...) runs its own programs
        kind_t = {k: tuple(program_time(x) for x in progs.kind_programs(k))
                  for k in range(1 + len(progs.variants))}  # fmt: skip
        ef, eb = program_time(progs.embed_fwd), program_time(progs.embed_bwd)
        hf, hb = program_time(progs.head_fwd), program_time(progs.head_bwd)

        pb, gb = weight_bytes(t, BYTES[t.param_dtype])[1], BYTES[t.grad_reduce_dtype]
        p_layer = self.lp / tp
        # ZeRO-3: every layer's parameters gathered before its forward and its backward, and
        # its gradients reduce-scattered, per micro-batch (prefetch one layer ahead).
        z3_gather = self._cost("all_gather", "dp", res, p_layer * pb) if cand.zero == 3 else 0.0
        z3_rs = self._cost("reduce_scatter", "dp", res, p_layer * gb) if cand.zero == 3 else 0.0
        # beside compute they run slower by the measured fraction of the overlap
        s_ag = self.slow("all_gather", p_layer * pb, dp) if cand.zero == 3 else 0.0
        z3_rs *= 1.0 + (self.slow("reduce_scatter", p_layer * gb, dp) if cand.zero == 3 else 0.0)

        def beside(t_comp: float) -> float:
            return max(t_comp, z3_gather + s_ag * min(z3_gather, t_comp))

        sync = group_sync_factor(sync_group_size(tp, res.size("cp"), res.ep, res.etp,
                                                 work.model.moe is not None),
                                 self.machine.gpu.sync_jitter)  # fmt: skip
        T, F, B, comp, tpc, gx = [], [], [], [], [], []
        for s in range(pp):
            f = b = c_ = g_ = 0.0
            x: dict[str, float] = {}
            for ch in range(v):
                vs = ch * pp + s
                for k, n in self._kind_counts(progs, res, vs).items():
                    lf, lb, lr = kind_t[k]
                    lf_t, lb_t = lf[0], lb[0] + lr[0]
                    if cand.zero == 3:
                        g_ += n * (beside(lf_t) - lf_t + beside(lb_t) - lb_t)
                        lf_t, lb_t = beside(lf_t), beside(lb_t)
                    f += n * lf_t
                    b += n * lb_t
                    c_ += n * (lf[1] + lb[1] + lr[1])
                    _add(x, n, lf, lb, lr)
                if vs == 0:
                    f, b = f + ef[0], b + eb[0]
                    c_ = c_ + ef[1] + eb[1]
                    _add(x, 1, ef, eb)
                if vs == last:
                    f, b = f + hf[0], b + hb[0]
                    c_ = c_ + hf[1] + hb[1]
                    _add(x, 1, hf, hb)
            if cand.zero == 3:
                f += z3_gather  # the first layer's gather is never hidden
                b += z3_gather
                g_ += 2 * z3_gather
            if sync > 1.0 and f + b > 0.0:  # compute at the group's expected slowest GPU
                extra = (sync - 1.0) * c_
                f, b, c_ = f + extra * f / (f + b), b + extra * b / (f + b), c_ * sync
            gx.append(g_)
            F.append(f)
            B.append(b)
            if self._combine(res):  # steady-state steps: forward beside backward
                f = sum(self._pair_s(progs, res, c * pp + s) for c in range(v)) - b
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
            pp_comm = 2 * (m + pp * v - 1) * self._send_s(cand, res)

        # Tail per stage: gradient reduction, optimizer, ZeRO-1/2 parameter all-gather. Stage s
        # finishes its last backward about s backward passes before stage 0 (1F1B drain).
        tail, parts = 0.0, (0.0, 0.0, 0.0)
        for s in range(pp):
            slack = s * (B[s] / v if pp > 1 else 0.0)
            if cand.zero == 3:
                # One reduce-scatter per layer and micro-batch, queued on the DP stream as
                # each layer's backward ends; the step waits for the queue to drain. Exposed:
                # what the last micro-batch's backward cannot hide, or the whole queue less
                # the backward compute (forward time is left out: the engine's forward
                # parameter gathers share the same links), whichever is larger.
                n_l = sum(res.stage_layers[c * pp + s] for c in range(v))
                drain = n_l * z3_rs - B[s] * (1 - 1 / n_l)
                whole = m * n_l * z3_rs - m * B[s]
                dp_exposed = max(z3_rs, drain, whole)
            else:
                dp_exposed = self._reduction_s(cand, res, s, B[s], gb)
            dense, expert = self._stage_local(res, s)
            z = cand.zero >= 1
            opt = self._optimizer_s(dense / (dp if z else 1) + expert / (self._edp(res) if z else 1))
            gather = 0.0
            if cand.zero in (1, 2):
                gather = self._param_gather_s(res, s, pb)
            end = dp_exposed + opt + gather - slack
            if end > tail or s == 0:
                tail, parts = max(end, 0.0), (dp_exposed + gather, opt, slack)
        step = pipe + pp_comm + tail
        est.step_time_s = step
        est.tokens_per_s = t.global_batch * work.model.seq_len / step
        s0 = max(range(pp), key=lambda s: T[s])
        comp_s, gather_s = m * comp[s0], m * gx[s0]
        exposed = {d: m * x for d, x in tpc[s0].items()}
        tp_s = sum(exposed.values())
        est.breakdown_s = {
            "compute": comp_s,
            "tp_comm": exposed.get("tp", 0.0),
            "cp_comm": exposed.get("cp", 0.0),
            "dp_comm": max(0.0, parts[0] - parts[2]) + gather_s,
            "pp_comm": pp_comm,
            "pp_bubble": bubble + max(0.0, busy - comp_s - tp_s - gather_s),
            "pp_imbalance": 0.0,  # charged from the heaviest stage: its compute is the step's
            "optimizer": parts[1],
            "other": 0.0,
        }
        return est
