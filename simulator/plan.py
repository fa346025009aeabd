"""Layout search: the best (tp, cp, pp, dp, micro-batch, ZeRO, recompute, schedule, SP) for N GPUs.

:func:`plan` works in three passes, each cheaper than the next is accurate:

1. **Enumerate** (:func:`enumerate_layouts`): tp over the divisors of N up to
   ``min(gpus_per_node, 16)`` (TP stays inside the NVLink domain), cp over the powers of two
   dividing ``N / tp`` that leave each rank at least :data:`MIN_CP_TOKENS` tokens of a
   sequence (context parallelism pays only for long sequences), pp over the divisors of
   ``N / (tp * cp)`` up to the layer count, ``dp = N / (tp * cp * pp)``, micro-batch 1, 2, 4, 8 (dividing
   the per-replica batch), ZeRO 0-3 (ZeRO > 0 only with dp > 1; ZeRO-3 only without pipeline
   parallelism, as in DeepSpeed and PyTorch FSDP), recompute none / selective / full, schedule
   1F1B or interleaved 1F1B with 2..8 virtual stages (pp > 1), sequence parallelism on or off
   (tp > 1). Everything else (global batch, dtypes, overlap flags, rank order) is the
   workload's. Divisibility is checked by :func:`simulator.config.checks.resolve`, the same
   function ``run`` uses, so a dropped layout has its reason.
2. **Memory pre-screen** (:meth:`~simulator.plan_estimate.Estimator.memory_bytes`): the
   engine's own accounting of model states and in-flight activations, never above its peak,
   so it never drops a layout the simulator would say fits.
3. **Throughput estimate** (:meth:`~simulator.plan_estimate.Estimator.estimate`): stage
   programs, pipeline closed forms and the collective model, in milliseconds per layout
   (see :mod:`simulator.plan_estimate` for the formulas and how close they come).

The best ``2 * top`` estimates (and the workload's own layout, scaled to N GPUs, as a
reference) are then simulated in full by :func:`simulator.run.simulate`, and the fitting ones
ranked by simulated tokens/s.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
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
from simulator.errors import ConfigError, SimulatorError
from simulator.plan_estimate import Estimate, Estimator
from simulator.sweep import process_pool

MICRO_BATCHES = (1, 2, 4, 8)
MAX_VIRTUAL_STAGES = 8
MAX_TP = 16
#: Fewest tokens of a sequence per context-parallel rank the search considers (Megatron-LM's
#: guidance: context parallelism for sequences of 8K tokens and more, i.e. >= 4K per rank at cp 2).
MIN_CP_TOKENS = 4096
RECOMPUTE = ("none", "selective", "full")


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
    cp: int = 1

    def overrides(self) -> dict[str, Any]:
        """The ``--set`` overrides that give this layout."""
        return {
            "parallelism.tp": self.tp,
            "parallelism.cp": self.cp,
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
            f"TP{self.tp}{f' CP{self.cp}' if self.cp > 1 else ''} PP{self.pp} DP{self.dp} mb{self.micro_batch} ZeRO-{self.zero} "
            f"rc:{self.recompute}{sched}{' SP' if self.sequence_parallel else ''}"
        )

    def apply(self, work: WorkloadConfig) -> WorkloadConfig:
        """``work`` with this layout (stage_layers dropped: layers split evenly)."""
        par = work.parallelism.model_dump()
        par.update(
            tp=self.tp, cp=self.cp, pp=self.pp, dp=self.dp, zero=self.zero,
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
        res.size("tp"), res.size("pp"), res.size("dp"), t.micro_batch, p.zero, t.recompute,
        p.pp_schedule, res.virtual_stages, bool(p.sequence_parallel and res.size("tp") > 1),
        res.size("cp"),
    )  # fmt: skip


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(work: WorkloadConfig, n_gpus: int, gpus_per_node: int) -> Iterator[Candidate]:
    """Every layout of the search space (see the module docstring), before any check."""
    m = work.model
    for tp in divisors(n_gpus):
        if tp > min(gpus_per_node, MAX_TP):
            break
        cps = [c for c in divisors(n_gpus // tp) if c & (c - 1) == 0]
        for cp in [c for c in cps if c == 1 or m.seq_len // c >= MIN_CP_TOKENS]:
            yield from _layouts_of(work, n_gpus, tp, cp)


def _layouts_of(work: WorkloadConfig, n_gpus: int, tp: int, cp: int) -> Iterator[Candidate]:
    """The layouts with ``tp`` and ``cp`` fixed."""
    m, gb = work.model, work.training.global_batch
    for pp in divisors(n_gpus // (tp * cp)):
        if pp > m.layers:
            break
        dp = n_gpus // (tp * cp * pp)
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
            zeros = [0] if dp * cp == 1 else ([0, 1, 2, 3] if pp == 1 else [0, 1, 2])
            sps = [False, True] if tp > 1 else [False]
            for zero in zeros:
                for rc in RECOMPUTE:
                    for sched, v in scheds:
                        for sp in sps:
                            yield Candidate(tp, pp, dp, mb, zero, rc, sched, v, sp, cp)


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
