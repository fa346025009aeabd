"""Layout search: the best (tp, cp, pp, dp, ep, etp, micro-batch, ZeRO, recompute, schedule, SP)
for N GPUs.

:func:`plan` works in three passes, each cheaper than the next is accurate:

1. **Enumerate** (:func:`enumerate_layouts`): tp over the divisors of N up to
   ``min(nvlink_domain_gpus, 16)`` (TP stays inside the NVLink domain), cp over the powers of two
   dividing ``N / tp`` that leave each rank at least :data:`MIN_CP_TOKENS` tokens of a
   sequence (context parallelism pays only for long sequences), pp over the divisors of
   ``N / (tp * cp)`` up to the layer count, ``dp = N / (tp * cp * pp)``, micro-batch 1, 2, 4, 8 (dividing
   the per-replica batch), ZeRO 0-3 (ZeRO > 0 only with dp > 1; ZeRO-3 only without pipeline
   parallelism, as in DeepSpeed and PyTorch FSDP), recompute none / selective / full, schedule
   1F1B or interleaved 1F1B with 2..8 virtual stages (pp > 1), sequence parallelism on or off
   (tp > 1). For a mixture-of-experts model also ep and etp (:func:`expert_layouts`: MoE
   Parallel Folding's rules, ``etp`` 1 or ``tp``), with sequence parallelism wherever tp > 1
   and ZeRO up to 2, as Megatron-Core runs MoE models, and DeepSeek-V3's DualPipe and
   DualPipeV where their micro-batch rules hold (:func:`dual_schedules`). A pipeline whose stages cannot hold the same number of layers gets the most even
   uneven split, the lighter stages at the ends where the embedding and the LM head sit
   (:func:`uneven_split`: Llama 3 405B's 126 layers over 16 stages are ``[7, 8 x 14, 7]``, as
   Meta trained it; multi-token prediction modules count as layers of the last stage, so
   DeepSeek-V3's are ``[3, 4 x 14, 2]``, as its workload splits them). Everything else (global batch, dtypes, rank order) is the workload's. Divisibility is checked by :func:`simulator.config.checks.resolve`, the same
   function ``run`` uses, so a dropped layout has its reason.
2. **Memory pre-screen** (:meth:`~simulator.plan_estimate.Estimator.memory_bytes`): the
   engine's own accounting of model states and in-flight activations, never above its peak,
   so it never drops a layout the simulator would say fits.
3. **Throughput estimate** (:meth:`~simulator.plan_estimate.Estimator.estimate`): stage
   programs, pipeline closed forms and the collective model, in milliseconds per layout
   (see :mod:`simulator.plan_estimate` for the formulas and how close they come).

4. **Knobs** (:data:`KNOBS`): the best estimates are tried again with the parameter
   all-gather overlapped with the next step's forward (``overlap_param_gather``, ZeRO-1/2),
   with gradients reduced in bf16 (``grad_reduce_dtype``), and with ``cp > 1`` with each other
   ``parallelism.cp_comm`` Transformer Engine runs for the model (``p2p``, ``all_gather``,
   ``a2a``), and re-ranked. A ``cp > 1`` layout where TE refuses the workload's own mode (the
   default ``p2p`` under a sliding window, ``a2a`` where the heads do not divide) is searched
   with the first mode it runs (:func:`base_cp_comm`).

The best ``2 * top`` estimates (and the workload's own layout, scaled to N GPUs, as a
reference) are then simulated in full by :func:`simulator.run.simulate`, and the fitting ones
ranked by simulated tokens/s. A layout fits when its peak memory plus ``headroom_gib``
(default :data:`HEADROOM_GIB`: allocator fragmentation, framework buffers, the long tail of
real runs) is within the GPU's memory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from simulator.config.checks import Resolved, cp_comm_refusal, resolve
from simulator.config.load import LoadedWorkload
from simulator.config.schema import (
    MAX_GPUS,
    ParallelismConfig,
    TopologyConfig,
    TrainingConfig,
    WorkloadConfig,
)
from simulator.engine.build import Machine
from simulator.errors import ConfigError, SimulatorError
from simulator.model.context import CP_COMM
from simulator.plan_estimate import Estimate, Estimator
from simulator.sweep import process_pool

MICRO_BATCHES = (1, 2, 4, 8)
MAX_VIRTUAL_STAGES = 8
MAX_TP = 16
#: Fewest tokens of a sequence per context-parallel rank the search considers (Megatron-LM's
#: guidance: context parallelism for sequences of 8K tokens and more, i.e. >= 4K per rank at cp 2).
MIN_CP_TOKENS = 4096
RECOMPUTE = ("none", "selective", "full")
#: GiB per GPU a plan keeps free beyond the simulated peak (``plan --headroom-gib``).
HEADROOM_GIB = 3.0
#: Training knobs tried on the best estimates: (field, values).
KNOBS = (("overlap_param_gather", (False, True)), ("grad_reduce_dtype", ("fp32", "bf16")))


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
    stage_layers: tuple[int, ...] | None = None  # None: an even split
    overlap_param_gather: bool | None = None  # None: the workload's
    grad_reduce_dtype: str | None = None  # None: the workload's
    ep: int | None = None  # expert parallelism (None: a dense model)
    etp: int | None = None  # tensor parallelism inside the experts (None: a dense model)
    cp_comm: str | None = None  # None: the workload's

    def overrides(self) -> dict[str, Any]:
        """The ``--set`` overrides that give this layout (``stage_layers`` always: a
        workload's own uneven split does not fit another pipeline depth)."""
        knobs = {
            f"training.{k}": getattr(self, k)
            for k, _ in KNOBS
            if getattr(self, k) is not None
        }
        moe = {} if self.ep is None else {"parallelism.ep": self.ep, "parallelism.etp": self.etp}
        return {
            "parallelism.tp": self.tp,
            "parallelism.cp": self.cp,
            **({} if self.cp_comm is None else {"parallelism.cp_comm": self.cp_comm}),
            **moe,
            "parallelism.pp": self.pp,
            "parallelism.dp": self.dp,
            "parallelism.zero": self.zero,
            "parallelism.sequence_parallel": self.sequence_parallel,
            "parallelism.pp_schedule": self.pp_schedule,
            "parallelism.virtual_stages": self.virtual_stages,
            "parallelism.stage_layers": None if self.stage_layers is None else list(self.stage_layers),
            "training.micro_batch": self.micro_batch,
            "training.recompute": self.recompute,
            **knobs,
        }

    def set_args(self) -> str:
        """The overrides as ``--set`` arguments, quoted for a POSIX shell."""
        return " ".join(_shell(f"{k}={_yaml(v)}") for k, v in self.overrides().items())

    def label(self) -> str:
        sched = ""
        if self.pp > 1:
            sched = {"1f1b": " 1F1B", "gpipe": " GPipe", "dualpipe": " DualPipe",
                     "dualpipev": " DualPipeV"}.get(
                self.pp_schedule, f" interleaved v{self.virtual_stages}")
        split = f" layers {_runs(self.stage_layers)}" if self.stage_layers else ""
        # a knob shows where the candidate sets it (None: the workload's own value, unlabelled),
        # both ways, so that two rows differing only in it never read alike
        knobs = {True: " overlap-gather", False: " no-overlap-gather"}.get(
            self.overlap_param_gather, "")
        knobs += f" grad:{self.grad_reduce_dtype}" if self.grad_reduce_dtype else ""
        knobs += f" cp:{self.cp_comm}" if self.cp_comm else ""
        moe = "" if self.ep is None else f" EP{self.ep}" + (f" ETP{self.etp}" if self.etp > 1 else "")
        return (
            f"TP{self.tp}{f' CP{self.cp}' if self.cp > 1 else ''} PP{self.pp} DP{self.dp}{moe} mb{self.micro_batch} ZeRO-{self.zero} "
            f"rc:{self.recompute}{sched}{' SP' if self.sequence_parallel else ''}{split}{knobs}"
        )

    def apply(self, work: WorkloadConfig) -> WorkloadConfig:
        """``work`` with this layout (its own ``stage_layers``; None: layers split evenly)."""
        par = work.parallelism.model_dump()
        par.update(
            tp=self.tp, cp=self.cp, pp=self.pp, dp=self.dp, zero=self.zero,
            sequence_parallel=self.sequence_parallel, pp_schedule=self.pp_schedule,
            virtual_stages=self.virtual_stages, stage_layers=self.stage_layers,
        )  # fmt: skip
        if self.ep is not None:
            par.update(ep=self.ep, etp=self.etp)
        if self.cp_comm is not None:
            par["cp_comm"] = self.cp_comm
        tr = work.training.model_dump()
        tr.update(micro_batch=self.micro_batch, recompute=self.recompute)
        tr.update({k: getattr(self, k) for k, _ in KNOBS if getattr(self, k) is not None})
        return work.model_copy(
            update={
                "parallelism": ParallelismConfig.model_validate(par),
                "training": TrainingConfig.model_validate(tr),
            }
        )


def _yaml(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_yaml(x) for x in v) + "]"
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def _shell(arg: str) -> str:
    """``--set ARG``, the argument single-quoted when the shell would touch it."""
    return f"--set '{arg}'" if any(c in arg for c in "[]{}*?, ") else f"--set {arg}"


def _runs(values: tuple[int, ...]) -> str:
    """``(7, 8, 8, 8, 7)`` -> ``7,8x3,7``."""
    out: list[str] = []
    for v in values:
        if out and out[-1].split("x")[0] == str(v):
            n = int(out[-1].split("x")[1]) if "x" in out[-1] else 1
            out[-1] = f"{v}x{n + 1}"
        else:
            out.append(str(v))
    return ",".join(out)


def uneven_split(layers: int, stages: int, last_extra: int = 0) -> tuple[int, ...] | None:
    """Layers per stage, the most even split with the lighter stages at the ends (embedding,
    LM head): every stage gets ``(layers + last_extra) // stages`` and the remainder goes one
    layer each to the middle stages. ``last_extra`` layers' worth of work already sits on the
    last stage (DeepSeek-V3's multi-token prediction modules, ``model.mtp_depth``: a layer
    each), so they count in the split and the last stage takes that many fewer: DeepSeek-V3's
    61 layers and one MTP module over 16 stages are ``[3, 4 x 14, 2]``, Llama 3 405B's 126
    layers over 16 ``[7, 8 x 14, 7]``. None when the split is even or a stage would get no
    layer (the last one may hold only its MTP modules)."""
    units = layers + last_extra
    base, extra = divmod(units, stages)
    if base == 0 or (extra == 0 and last_extra == 0):
        return None
    order = sorted(range(stages), key=lambda s: (-min(s, stages - 1 - s), s))
    heavy = set(order[:extra])
    split = [base + (1 if s in heavy else 0) for s in range(stages)]
    split[-1] -= last_extra
    if split[-1] < 0:  # more MTP modules than a stage's share: split the layers alone
        return uneven_split(layers, stages)
    return tuple(split)


def candidate_of(work: WorkloadConfig, res: Resolved) -> Candidate:
    """The candidate describing a workload's own (resolved) layout."""
    p, t = work.parallelism, work.training
    return Candidate(
        res.size("tp"), res.size("pp"), res.size("dp"), t.micro_batch, p.zero, t.recompute,
        p.pp_schedule, res.virtual_stages, bool(p.sequence_parallel and res.size("tp") > 1),
        res.size("cp"), None if p.stage_layers is None else tuple(p.stage_layers),
        ep=res.ep if work.model.moe is not None else None,
        etp=res.etp if work.model.moe is not None else None,
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
            mode = base_cp_comm(work, tp, cp)
            for cand in _layouts_of(work, n_gpus, tp, cp):
                yield cand if mode is None else replace(cand, cp_comm=mode)


def _cp_comm_runs(m, tp: int, cp: int, mode: str) -> bool:
    """Whether Transformer Engine runs ``mode`` for the model at ``tp`` x ``cp``
    (:func:`cp_comm_refusal`, the check a workload passes)."""
    return cp_comm_refusal(m, tp, cp, mode) is None


def base_cp_comm(work: WorkloadConfig, tp: int, cp: int) -> str | None:
    """The ``cp_comm`` a ``cp > 1`` layout is searched with: None (the workload's) where
    Transformer Engine runs the workload's mode for the model, else the first of
    :data:`CP_COMM` it runs (a sliding window with the default ``p2p``; ``a2a`` where the heads
    per TP rank do not divide by ``cp``), so such layouts are searched, not all refused; None
    where no mode runs (a chunked window: refused with its reason)."""
    m, own = work.model, work.parallelism.cp_comm
    if cp == 1 or _cp_comm_runs(m, tp, cp, own):
        return None
    return next((mode for mode in CP_COMM if _cp_comm_runs(m, tp, cp, mode)), None)


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
            experts: list[tuple[int | None, int | None]] = [(None, None)]
            if m.moe is not None:
                zeros = [z for z in zeros if z < 3]  # Megatron-Core MoE: no ZeRO-3
                sps = [tp > 1]  # Megatron-Core's rule: SP with TP in an MoE model
                experts = list(expert_layouts(m, tp, tp * cp * dp))
                scheds += dual_schedules(pp, n_micro, m.layers)
            for zero in zeros:
                for rc in RECOMPUTE:
                    for sched, v in scheds:
                        # interleaved: an even split only; the others the most even one
                        split = None if sched == "interleaved" else \
                            uneven_split(m.layers, pp * v, m.mtp_depth)
                        for sp in sps:
                            for ep, etp in experts:
                                yield Candidate(tp, pp, dp, mb, zero, rc, sched, v, sp, cp,
                                                split, ep=ep, etp=etp)


def dual_schedules(pp: int, n_micro: int, layers: int) -> list[tuple[str, int]]:
    """DeepSeek-V3's DualPipe and DualPipeV as (schedule, virtual stages) where their rules
    hold (as DeepSeek's ``dualpipe.py`` / ``dualpipev.py`` assert them, and ``run`` checks):
    DualPipe needs an even ``pp`` and an even number of micro-batches per replica of at least
    ``2 pp`` (half enter at each end); DualPipeV ``pp >= 2``, at least ``2 pp`` micro-batches
    and a layer for each of its ``2 pp`` stages. Searched for MoE models, where the forward
    and backward chunks they run side by side hide the expert-parallel all-to-all."""
    out = []
    if pp >= 2 and pp % 2 == 0 and n_micro % 2 == 0 and n_micro >= 2 * pp:
        out.append(("dualpipe", 1))
    if pp >= 2 and n_micro >= 2 * pp and layers >= 2 * pp:
        out.append(("dualpipev", 2))
    return out


def expert_layouts(model, tp: int, width: int) -> Iterator[tuple[int, int]]:
    """The (ep, etp) pairs of an MoE model on a pipeline stage of ``width = tp*cp*dp`` GPUs
    (MoE Parallel Folding, Liu et al. 2025, arXiv:2504.14960, Section 3: the MoE layers regroup
    the same GPUs as ``etp x ep x edp``): ``etp`` is 1 (the folded choice) or the attention's
    ``tp`` (Megatron-Core's default without folding); ``ep`` any divisor of the expert count
    with ``ep * etp`` dividing ``width``; ``etp`` divides the expert width."""
    moe = model.moe
    for etp in sorted({1, tp}):
        if moe.ffn_hidden % etp or width % etp:
            continue
        for ep in divisors(moe.experts):
            if (width // etp) % ep == 0:
                yield ep, etp


def plan_topology(topo: TopologyConfig, n_gpus: int, *, file: str = "--gpus") -> TopologyConfig:
    """The topology resized to ``n_gpus``: ``n_gpus / gpus_per_node`` nodes (or one node of
    ``n_gpus`` GPUs when fewer than a node)."""
    gpn = topo.gpus_per_node
    if n_gpus < 1 or n_gpus > MAX_GPUS:
        raise ConfigError(f"must be in 1..{MAX_GPUS:,}, got {n_gpus:,}", file=file)
    if n_gpus < gpn:
        return topo.model_copy(update={"nodes": 1, "gpus_per_node": n_gpus})
    if n_gpus % gpn:
        raise ConfigError(
            f"{n_gpus} GPUs is not a whole number of {gpn}-GPU nodes of '{topo.name}' "
            f"(try {n_gpus // gpn * gpn} or {(n_gpus // gpn + 1) * gpn})",
            file=file,
        )
    return topo.model_copy(update={"nodes": n_gpus // gpn})


def knob_variants(cand: Candidate, work: WorkloadConfig) -> list[Candidate]:
    """``cand`` with each training knob of :data:`KNOBS` changed from the workload's value
    where it matters: parameter all-gather overlap with ZeRO-1/2 over more than one rank,
    the gradient reduction's dtype over more than one rank, and with ``cp > 1`` the other
    context-parallel communications (:data:`simulator.model.context.CP_COMM`) that
    Transformer Engine runs for the model (``a2a``: heads per TP rank dividing by cp; a sliding
    window: not ``p2p``)."""
    t, m = work.training, work.model
    sharded = cand.dp * cand.cp > 1
    own = work.parallelism.cp_comm
    out = [
        replace(cand, cp_comm=None if mode == own else mode) for mode in CP_COMM
        if cand.cp > 1 and mode != (cand.cp_comm or own)
        and _cp_comm_runs(m, cand.tp, cand.cp, mode)
    ]  # fmt: skip
    if sharded and cand.zero in (1, 2):
        out.append(replace(cand, overlap_param_gather=not t.overlap_param_gather))
    if sharded:
        other = "bf16" if t.grad_reduce_dtype != "bf16" else "fp32"
        out.append(replace(cand, grad_reduce_dtype=other))
        if cand.zero in (1, 2):
            out.append(replace(cand, overlap_param_gather=not t.overlap_param_gather,
                               grad_reduce_dtype=other))
    return out


def fits_with(summary: dict, headroom_gib: float) -> bool:
    """Whether a simulated layout fits with ``headroom_gib`` GiB per GPU to spare."""
    mem = summary.get("memory_gib") or {}
    total, cap = mem.get("total"), mem.get("capacity")
    if total is None or cap is None:
        return bool(summary.get("fits"))
    return total + headroom_gib <= cap


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
    headroom_gib: float = HEADROOM_GIB
    #: the most frequent reason a layout was refused: (layouts refused so, field, message)
    refusal: tuple[int, str, str] | None = None


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
    headroom_gib: float = HEADROOM_GIB,
    progress: Callable[[str, int, int], None] | None = None,
) -> PlanResult:
    """Search the layouts of ``loaded``'s workload on ``n_gpus`` GPUs (module docstring).

    ``n_simulate`` (default ``2 * top``) layouts with the best estimates are simulated in
    full, besides the workload's own layout; ``workers`` processes run them (default: one per
    core, at most the number of simulations). A layout fits with ``headroom_gib`` GiB per
    GPU to spare. ``progress(phase, done, total)`` is called as layouts are estimated and
    simulated.
    """
    report = progress or (lambda phase, done, total: None)
    t0 = time.perf_counter()
    if top < 1:
        raise ConfigError(f"must be >= 1, got {top}", file="--top")
    if not headroom_gib >= 0:
        raise ConfigError(f"must be >= 0, got {headroom_gib}", file="--headroom-gib")
    topo = plan_topology(loaded.topology, n_gpus)
    base = LoadedWorkload(loaded.workload, topo, loaded.workload_path, loaded.topology_path)
    if machine is None:
        from simulator.run import make_machine

        machine = make_machine(base)
    est = Estimator(loaded.workload, topo, machine)
    est.capacity -= headroom_gib * 2**30  # the pre-screen keeps the headroom free too
    counts = {"enumerated": 0, "invalid": 0, "does_not_fit": 0, "estimated": 0}
    estimates: list[Estimate] = []
    works: dict[Candidate, WorkloadConfig] = {}
    refusals: dict[str, tuple[int, str]] = {}  # field -> (layouts refused, first message)

    def consider(cand: Candidate) -> None:
        counts["enumerated"] += 1
        try:
            work, res = est.resolve(cand)
        except ConfigError as err:
            counts["invalid"] += 1
            n, detail = refusals.get(err.field or "", (0, err.detail))
            refusals[err.field or ""] = (n + 1, detail)
            return
        e = est.estimate(cand, res)
        if not e.fits:
            counts["does_not_fit"] += 1
            return
        counts["estimated"] += 1
        estimates.append(e)
        works[cand] = work

    # TP stays inside the NVLink domain: a node of an HGX board, a whole NVL72 rack.
    domain = getattr(topo, "nvlink_domain_gpus", None) or topo.gpus_per_node
    space = list(enumerate_layouts(loaded.workload, est.n_gpus, domain))
    for i, cand in enumerate(space):
        consider(cand)
        if i % 64 == 0:
            report("estimating layouts", i, len(space))
    order = lambda e: (-e.tokens_per_s, e.memory_gib, repr(e.candidate))  # noqa: E731
    estimates.sort(key=order)
    n_sim = 2 * top if n_simulate is None else n_simulate
    for e in list(estimates[: max(2 * n_sim, 10)]):
        for variant in knob_variants(e.candidate, loaded.workload):
            if variant not in works:
                consider(variant)
    estimates.sort(key=order)
    t_est = time.perf_counter() - t0

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
    report("simulating the best", 0, len(jobs))
    summaries = []
    if n_workers > 1:
        with process_pool(n_workers, _init_worker, (base,)) as pool:
            for summary in pool.map(_simulate_candidate, [j[1] for j in jobs]):
                summaries.append(summary)
                report("simulating the best", len(summaries), len(jobs))
    else:
        _WORKER["machine"], _WORKER["loaded"] = machine, base
        for j in jobs:
            summaries.append(_simulate_candidate(j[1]))
            report("simulating the best", len(summaries), len(jobs))
    t_sim = time.perf_counter() - t1
    simulated = [
        Planned(c, s, e, is_ref) for (c, _, e, is_ref), s in zip(jobs, summaries, strict=True)
    ]
    ok = [p for p in simulated if "error" not in p.summary and fits_with(p.summary, headroom_gib)]
    ok.sort(key=lambda p: (-p.summary["tokens_per_s"], repr(p.candidate)))
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
        headroom_gib=headroom_gib,
        refusal=max(((n, f, d) for f, (n, d) in refusals.items()), default=None,
                    key=lambda r: (r[0], r[1])),
    )
