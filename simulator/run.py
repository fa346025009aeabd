"""One simulated training step, end to end: configs -> plan -> engine -> tables and summary.

:func:`simulate` is the library entry point every command uses (``run``, ``compare``,
``sweep``, ``plan``, ``validate``); :func:`write_outputs` writes a run's files atomically.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
import pandas as pd

from simulator.config.checks import Resolved, resolve
from simulator.config.load import LoadedWorkload
from simulator.cost import cost_summary
from simulator.engine.build import Machine, build_plan, folded_link_bytes, make_job
from simulator.engine.records import MEMORY_COLUMNS
from simulator.engine.sim import CountingEnvironment, Engine
from simulator.errors import ConfigError
from simulator.extrapolate import (
    extend,
    extend_links,
    periodic,
    points,
    series,
    settle_pipeline_parts,
    steady,
)
from simulator.hardware.catalog import GPUSpec, gpu_names, load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.hardware.precision import pricing_dtype, split_dtype
from simulator.model import comm as mc
from simulator.model import moe as moe_math
from simulator.model import moe_routing
from simulator.model import transformer as tf
from simulator.network.collectives import CollectiveModel
from simulator.network.innetwork import in_network_constants, nvls_available
from simulator.network.topology import Topology, build_topology, load_fabrics
from simulator.reliability import reliability_summary
from simulator.report.events import EventRows
from simulator.report.io import first_non_finite
from simulator.report.links import LinkLoads
from simulator.report.summary import GiB, breakdown, imbalance_parts, memory_peak


@dataclass
class SimResult:
    """Everything a run produced: the summary dict and the three tables (the events and links
    tables made from ``rows`` and ``loads`` when first asked for)."""

    summary: dict
    rows: EventRows
    memory: pd.DataFrame
    loads: LinkLoads
    extras: dict = field(default_factory=dict)

    @cached_property
    def events(self) -> pd.DataFrame:
        """The events table (:meth:`~simulator.report.events.EventRows.table`)."""
        return self.rows.table()

    @cached_property
    def links(self) -> pd.DataFrame:
        """The links table (:meth:`~simulator.report.links.LinkLoads.table`)."""
        return self.loads.table()


def make_machine(loaded: LoadedWorkload) -> Machine:
    """GPU spec, topology graph and the compute/collective models of a loaded workload."""
    topo_cfg = loaded.topology
    gpu: GPUSpec = load_gpu(topo_cfg.gpu, file=str(loaded.topology_path), field="gpu")
    topology = build_topology(topo_cfg, gpu, loaded.workload.faults.links,
                              file=str(loaded.topology_path),
                              faults_file=str(loaded.workload_path))
    backend = loaded.workload.training.attention_backend
    if backend == "fa2" and gpu.attention_fa2 is None:
        raise ConfigError(
            f"no FlashAttention-2 kernel measurements for {gpu.name} (accepted: cudnn; fa2 on "
            f"{', '.join(n for n in gpu_names() if load_gpu(n).attention_fa2 is not None)})",
            file=str(loaded.workload_path), field="training.attention_backend")
    return Machine(gpu, topology, ComputeModel(gpu, backend), CollectiveModel(topology))


def resolve_loaded(loaded: LoadedWorkload) -> Resolved:
    return resolve(
        loaded.workload,
        loaded.topology,
        file=str(loaded.workload_path),
        topo_file=str(loaded.topology_path),
    )


def full_detail_units(res: Resolved, work) -> int:
    """The size of a full-detail simulation: GPUs x micro-batches per replica x layers (its
    SimPy events and memory grow in proportion, about 77 events a unit)."""
    return res.n_gpus * res.microbatches * work.model.layers


def check_full_detail(res: Resolved, work, file: str) -> None:
    """Refuse a ``--detail full`` run larger than :data:`FULL_DETAIL_MAX_UNITS`."""
    units = full_detail_units(res, work)
    if res.n_gpus > FULL_DETAIL_MAX_GPUS or units > FULL_DETAIL_MAX_UNITS:
        raise ConfigError(
            f"--detail full simulates every GPU and every collective step: {res.n_gpus} GPUs x "
            f"{res.microbatches} micro-batches x {work.model.layers} layers = {units:,} is above "
            f"its limit of {FULL_DETAIL_MAX_UNITS:,} (about 3 minutes and 2 GiB) or "
            f"{FULL_DETAIL_MAX_GPUS} GPUs; use fewer GPUs or a smaller global_batch, or the "
            "default folded detail, which agrees with it within 1 % (see README)",
            file=file,
        )


def simulate(
    loaded: LoadedWorkload,
    *,
    detail: str = "folded",
    machine: Machine | None = None,
    env: CountingEnvironment | None = None,
    extrapolate: bool = True,
) -> SimResult:
    """Simulate one optimizer step of ``loaded``; raises ConfigError / PlanError on bad input.

    ``env`` (a fresh :class:`CountingEnvironment`) lets a caller watch the simulation run
    (its ``now`` and ``n_events``) from another thread, for a progress bar. In folded detail a
    step of many micro-batches is extrapolated from two or three shorter ones where the pipeline
    reaches a periodic steady state (:mod:`simulator.extrapolate`; the summary's
    ``extrapolated`` says from which); ``extrapolate=False`` simulates every micro-batch."""
    if extrapolate and detail == "folded" and env is None:
        res = resolve_loaded(loaded)
        ms = points(res.microbatches, res.size("pp"), res.virtual_stages,
                    loaded.workload.parallelism.pp_schedule)  # fmt: skip
        if ms is not None:
            out = _simulate_extrapolated(loaded, res, ms, machine)
            if out is not None:
                return out
    return _simulate_every(loaded, detail=detail, machine=machine, env=env)


def _simulate_extrapolated(
    loaded: LoadedWorkload, res: Resolved, ms: tuple[int, ...], machine: Machine | None
) -> SimResult | None:
    """The step from simulations of ``ms`` micro-batches (:mod:`simulator.extrapolate`), or
    None when they are not in a periodic steady state."""
    t0 = time.perf_counter()
    work = loaded.workload
    machine = machine or make_machine(loaded)
    per_mb = work.training.global_batch // res.microbatches  # sequences per micro-batch slot
    runs = []
    for mi in ms:
        t = work.training.model_copy(update={"global_batch": mi * per_mb})
        short = replace(loaded, workload=work.model_copy(update={"training": t}))
        runs.append(_simulate_every(short, machine=machine))
    sums = [r.summary for r in runs]
    values = series(sums)
    if len(ms) == 2:  # one cycle inserted, record by record
        if not steady(*runs):
            return None
    elif len({s["critical_process"] for s in sums}) > 1 or not all(
        periodic(v) for v in values.values()
    ):
        return None
    m = res.microbatches
    s = copy.deepcopy(sums[-1])
    for key, vals in values.items():
        *path, last = key.split(".")
        d = s
        for k in path:
            d = d[k]
        d[last] = extend(vals, ms, m)
    step = s["step_time_s"]
    settle_pipeline_parts(s["breakdown_s"], step)
    why, imb = s.pop("pp_imbalance_from", None), s["breakdown_s"].get("pp_imbalance", 0.0)
    if why is not None and imb > 0:  # the last step's split, scaled to the extended imbalance
        scale = imb / sum(why["parts_s"].values())
        s["pp_imbalance_from"] = {**why, "parts_s": {k: v * scale for k, v in
                                                     why["parts_s"].items()}}  # fmt: skip
    s.update(_headline(work, res.n_gpus, machine, step, s["hardware_flops_per_step"]))
    s["layout"]["microbatches"] = m
    fits = s["memory_gib"]["total"] <= s["memory_gib"]["capacity"]
    s["fits"] = bool(fits)
    s["warnings"] = _warnings(machine, s["memory_gib"], runs[-1].extras.get("worst_proc", ""))
    links = extend_links([r.loads for r in runs], ms, m, step)
    s["busiest_links"] = links.busiest()
    for k in ("training", "reliability"):
        s.pop(k, None)
    _add_totals(s, loaded, machine)
    s["extrapolated"] = {"microbatches": m, "simulated_microbatches": list(ms)}
    s["events"] = int(sum(x["events"] for x in sums))
    s["sim_wall_s"] = time.perf_counter() - t0
    bad = first_non_finite(s)
    if bad:
        raise FloatingPointError(f"the summary's {bad} is not a finite number")
    last = runs[-1]
    return SimResult(s, last.rows, last.memory, links,
                     {**last.extras, "simulated_summary": last.summary})  # fmt: skip


def _headline(work, n: int, machine: Machine, step: float, hw_flops: float) -> dict:
    """The figures derived from the step time: throughput, MFU, HFU, TFLOP/s per GPU."""
    m, t = work.model, work.training
    model_flops = tf.model_flops_per_step(m, t.global_batch)
    peak = machine.gpu.peak_flops(t.precision)
    return {
        "tokens_per_s": t.global_batch * m.seq_len / step,
        "mfu": model_flops / (step * n * peak),
        "hfu": hw_flops / (step * n * peak),
        "tflops_per_gpu": model_flops / (step * n) / 1e12,
        "model_flops_per_step": model_flops,
    }


def _warnings(machine: Machine, mem_gib: dict, worst_proc: str) -> list[str]:
    """The fabric's warnings, and whether the step does not fit in memory."""
    warnings = list(machine.topology.warnings())
    if mem_gib["total"] > mem_gib["capacity"]:
        warnings.append(
            f"does not fit: {mem_gib['total']:.1f} GiB needed per GPU (worst: {worst_proc}), "
            f"{mem_gib['capacity']:.1f} GiB available"
        )
    return warnings


def _add_totals(summary: dict, loaded: LoadedWorkload, machine: Machine) -> None:
    """Cost and energy per million tokens; time, energy and money to train the whole run
    (when training.tokens is given); failures over the run (when faults.reliability is)."""
    work = loaded.workload
    summary.update(cost_summary(summary, machine.gpu, loaded.topology, work.training.tokens))
    try:
        rel = reliability_summary(summary, work.faults.reliability, work.training)
    except ConfigError as e:
        raise ConfigError(e.detail, file=str(loaded.workload_path), field=e.field) from None
    if rel:
        summary["reliability"] = rel


def _simulate_every(
    loaded: LoadedWorkload,
    *,
    detail: str = "folded",
    machine: Machine | None = None,
    env: CountingEnvironment | None = None,
) -> SimResult:
    """:func:`simulate`, every micro-batch."""
    t0 = time.perf_counter()
    work = loaded.workload
    res = resolve_loaded(loaded)
    if detail == "full":
        check_full_detail(res, work, str(loaded.workload_path))
    machine = machine or make_machine(loaded)
    gemm_dtype = split_dtype(pricing_dtype(work.training))[0]
    peaks = getattr(machine.gpu, "peak_tflops", None)  # (a test's stub GPU has none)
    if peaks is not None and gemm_dtype not in peaks:
        raise ConfigError(
            f"{machine.gpu.name} has no {gemm_dtype} tensor cores (it has: "
            f"{', '.join(machine.gpu.peak_tflops)})",
            file=str(loaded.workload_path),
            field="training.precision",
        )
    if work.parallelism.tp_impl == "dtensor" and res.size("tp") > 1 and not getattr(
            machine.gpu, "host_dtensor", True):
        raise ConfigError(
            f"{machine.gpu.name} has no host_dtensor rates in gpus.yaml (DTensor's host time "
            "per unit: not measured)", file=str(loaded.workload_path), field="parallelism.tp_impl")
    env = env if env is not None else CountingEnvironment()
    job = make_job(work, loaded.topology, res, machine)
    plan, net = build_plan(job, detail=detail, env=env)
    if net is not None and machine.topology.n_links <= LINK_SERIES_MAX_LINKS:
        net.record()
    engine = Engine(plan, env)
    engine.run()

    procs = plan.procs
    step = max(p.end_s for p in procs)
    # The critical GPU finishes last; among GPUs that finish together (a collective ends the
    # step for all), the slowest -- a straggler, whose breakdown shows why -- then the first.
    crit = max(procs, key=lambda p: (p.end_s, p.slowdown, -p.pid))
    # The critical process's pipeline: its other stages (same replica class; in full detail
    # the same coordinates but for pp).
    pipeline = [
        p for p in procs
        if p.replica_class == crit.replica_class and (p.coords is None or all(
            v == crit.coords.get(d) for d, v in p.coords.items() if d != "pp"))
    ]  # fmt: skip
    bd = breakdown(crit, step, res.size("pp") > 1, pipeline)

    events = EventRows(engine.rows)
    memory = _memory_table(engine.mem, procs)
    mem_gib, worst_proc = memory_peak(
        memory, machine.gpu.hbm_GiB * GiB, getattr(machine.gpu, "runtime_reserved_GiB", 0.0) * GiB
    )
    # the warning names the worst GPU as a person does, not by the engine's label (c0.s0)
    worst_proc = next((f"GPU {p.gpu}, stage {p.stage}" for p in procs if p.label == worst_proc),
                      worst_proc)
    first = max((plan.first_steps_mem(p) for p in procs), default=0.0) if (
        plan.first_steps_mem is not None) else 0.0
    mem_gib["allocated_first_steps"] = mem_gib["allocated"] + first / GiB
    links = _link_loads(engine, machine, net, step)

    m, t = work.model, work.training
    n = res.n_gpus
    hw_flops = executed_flops(events, procs, res.n_gpus // (res.size("dp") * res.size("pp")))
    fits = mem_gib["total"] <= mem_gib["capacity"]
    head = _headline(work, n, machine, step, hw_flops)
    summary = {
        "name": work.name,
        "step_time_s": step,
        **{k: head[k] for k in ("tokens_per_s", "mfu", "hfu", "tflops_per_gpu")},
        "breakdown_s": bd,
        "memory_gib": mem_gib,
        "fits": bool(fits),
        "n_gpus": n,
        "gpu": machine.gpu.name,
        "topology": loaded.topology.name,
        "fabric": _fabric_figures(machine.topology),
        "layout": {
            **{d: res.size(d) for d in ("tp", "cp", "pp", "dp")},
            "zero": work.parallelism.zero,
            "sequence_parallel": work.parallelism.sequence_parallel,
            "pp_schedule": work.parallelism.pp_schedule,
            "virtual_stages": res.virtual_stages,
            "micro_batch": t.micro_batch,
            "microbatches": res.microbatches,
            "recompute": t.recompute,
        },
        "model_params": tf.total_params(m),
        "active_params": tf.active_params(m),
        "model_flops_per_step": head["model_flops_per_step"],
        "hardware_flops_per_step": hw_flops,
        "detail": detail,
        "simulated_processes": len(procs),
        "critical_process": crit.label,
        "busiest_links": links.busiest(),
        "warnings": _warnings(machine, mem_gib, worst_proc),
        "extrapolated": None,
    }
    why = imbalance_parts(crit, pipeline, bd["pp_imbalance"])
    if why is not None:  # what makes the heaviest stage heavier (its all-to-all, its compute)
        summary["pp_imbalance_from"] = why
    if m.moe is not None:
        summary["moe"] = moe_summary(job, machine, res)
        if t.moe_expert_load is not None:
            # what the uneven load costs: the same step with every expert equally loaded (not
            # for random routes, whose few per cent would double every MoE validation run;
            # moe.imbalance reports their busiest rank)
            even = work.model_copy(
                update={"training": t.model_copy(update={"moe_expert_load": None})}
            )
            ref = simulate(replace(loaded, workload=even), detail=detail, machine=machine)
            summary["moe"]["uniform_step_time_s"] = ref.summary["step_time_s"]
            summary["moe"]["imbalance_cost_s"] = step - ref.summary["step_time_s"]
    _add_totals(summary, loaded, machine)
    summary["events"] = int(env.n_events)
    summary["trace_rows"] = len(events)
    summary["sim_wall_s"] = time.perf_counter() - t0
    bad = first_non_finite(summary)
    if bad:  # inputs are bounded and finite, so this is a defect, never a result to print
        raise FloatingPointError(f"the summary's {bad} is not a finite number")
    extras = {"link_series": _link_series(net, links), "worst_proc": worst_proc}
    return SimResult(summary, events, memory, links, extras)


def executed_flops(events: EventRows, procs, inner: int) -> float:
    """FLOPs the simulated kernels executed in the step, over every GPU (the numerator of
    ``hfu``): each event row's ``flops`` (one GPU's kernels, recomputation included) times the
    GPUs its process stands for (a folded process: the ``inner`` GPUs of a replica's stage,
    its TP x CP group, in each of its replicas)."""
    gpus = {p.label: len(p.replicas) * (inner if p.coords is None else 1) for p in procs}
    flops = pd.Series(events.column("flops"), dtype=float)  # by process, in table order
    per_proc = flops.groupby(events.column("proc"), sort=False).sum()
    return float(sum(f * gpus[label] for label, f in per_proc.items()))


def _fabric_figures(topo: Topology) -> dict:
    """The fabric figures in use, each with where it came from (topology file or --set,
    the GPU catalog, or a generic default)."""
    out = {k: {"value": v, "from": src} for k, (v, src) in topo.figures.items()}
    if not out:
        return out
    out["nvlink_domain_gpus"] = {
        "value": topo.gpus_per_node,
        "from": "topology" if topo.cfg.nvlink_domain_gpus else "default (gpus_per_node)",
    }
    if topo.gpu.nvlink_generation:
        out["nvlink_generation"] = {
            "value": topo.gpu.nvlink_generation,
            "from": f"catalog {topo.gpu.name}.nvlink_generation",
        }
    nvls = nvls_available(topo, in_network_constants(load_fabrics()))
    out["nvls"] = {"value": nvls, "from": "topology" if topo.cfg.nvls is not None
                   else "default (on where the NVSwitch supports it)"}
    out["ib_sharp"] = {"value": bool(topo.cfg.ib_sharp) and topo.nodes > 1,
                       "from": "topology" if "ib_sharp" in topo.cfg.model_fields_set
                       else "default (off)"}
    return out


def moe_summary(job, machine: Machine, res: Resolved) -> dict:
    """The MoE part of the summary: the expert layout (ep, etp, edp, experts per rank),
    whether every EP group stays inside one NVLink domain, the busiest EP rank's share
    (``imbalance``: its routed copies over the mean rank's), the fraction of copies dropped by
    ``capacity_factor``, the all-to-all bytes one rank sends per MoE layer and direction, the
    expected distinct GPUs and NVLink domains a token's experts sit on (uniform routing,
    :mod:`simulator.model.moe_routing`) and the bytes one rank sends across the network per
    MoE layer and direction with the workload's dispatcher (bf16)."""
    m, t = job.work.model, job.work.training
    moe_lay = job.layout_of("ep")
    ep, etp = moe_lay.size("ep"), job.layout_of("etp").size("etp")
    topo = machine.topology
    domain = int(getattr(topo.cfg, "nvlink_domain_gpus", None) or topo.gpus_per_node)
    groups = moe_lay.groups("ep") if ep > 1 else []
    inside = all(len({g // domain for g in grp}) == 1 for grp in groups)
    local = mc.cp_local(m, res.size("cp"))
    loc = moe_math.moe_local(local, t.micro_batch, res.size("tp"), 1, ep, etp,
                             moe_math.load_spec(t))  # fmt: skip
    # where a token's experts live (uniform routing; moe_routing): distinct GPUs and NVLink
    # domains, and the token vectors a rank sends across the network per token
    units = tuple(topo.node_of(g) for g in groups[0]) if groups else (0,)
    gpus, domains = moe_routing.expected_distinct(m.moe, ep, units) if groups else (1.0, 1.0)
    if t.moe_dispatcher == "deepep" and groups:
        crossing = moe_routing.inter_node_tokens_per_rank(m.moe, ep, units)
    elif t.moe_dispatcher == "alltoall":  # every copy to a rank of another domain crosses
        crossing = m.moe.top_k * sum(u != units[0] for u in units) / len(units)
    else:  # all-gather: every rank's tokens to every other rank of the group
        crossing = sum(u != units[0] for u in units)
    return {
        "ep": ep,
        "etp": etp,
        "edp": job.layout_of("edp").size("edp") if ep * etp > 1 else res.size("dp"),
        "experts_per_rank": loc.local_experts,
        "ep_inside_nvlink_domain": bool(inside),
        "nvlink_domain_gpus": domain,
        "imbalance": loc.imbalance,
        "dropped_fraction": loc.dropped,
        "alltoall_bytes_per_rank_per_layer": moe_math.alltoall_bytes_per_rank(
            loc.tokens, m.moe.top_k, m.hidden, 2, ep  # tokens dispatched in bf16
        ),
        "dispatcher": t.moe_dispatcher,
        "gpus_per_token": gpus,
        "nvlink_domains_per_token": domains,
        "network_bytes_per_rank_per_layer": crossing * loc.tokens * m.hidden * 2,  # bf16
    }


def _memory_table(mem_rows, procs) -> pd.DataFrame:
    df = pd.DataFrame.from_records(mem_rows, columns=["t_s", "pid", "delta_bytes", "what"])
    pid = df["pid"].to_numpy()
    df["proc"] = np.array([p.label for p in procs], dtype=object)[pid].tolist()
    df["gpu"] = np.array([p.gpu for p in procs], dtype=np.int64)[pid]
    df = df.sort_values(["pid", "t_s", "delta_bytes"], kind="stable").reset_index(drop=True)
    df["total_bytes"] = df.groupby("pid")["delta_bytes"].cumsum()
    return df[list(MEMORY_COLUMNS)]


def _link_loads(engine: Engine, machine: Machine, net, step: float) -> LinkLoads:
    topo = machine.topology
    if not topo.n_links:
        nbytes = busy = np.zeros(0)
    elif engine.plan.detail == "full":
        nbytes = np.asarray(net.link_bytes, dtype=float)
        busy = np.asarray(net.link_busy_s, dtype=float)
    else:
        # Statically priced traffic (TP, pipeline sends) counts as busy at the link's rate.
        static = folded_link_bytes(engine, machine.collectives, topo.n_links)
        nbytes = static + (net.link_bytes if net is not None else 0.0)
        busy = static / np.maximum(topo.capacity, 1e-30) + (
            net.link_busy_s if net is not None else 0.0
        )
    return LinkLoads.of(topo, nbytes, busy, step)


#: Largest cluster --detail full accepts.
FULL_DETAIL_MAX_GPUS = 512
#: Largest full-detail simulation (:func:`full_detail_units`). Measured on the 2-core
#: development machine (2026-11-26): Llama-3-8B on 64 GPUs, 16 micro-batches, 32 layers
#: (32,768 units) took 73 s of CPU and 1.0 GiB peak (2.5 M events); twice that is the limit.
FULL_DETAIL_MAX_UNITS = 65_536

#: Record link-load time series (for the Perfetto trace) only on fabrics up to this size.
LINK_SERIES_MAX_LINKS = 20_000


def _link_series(net, links: LinkLoads, k: int = 8) -> pd.DataFrame | None:
    """Utilisation over time of the ``k`` links that carried the most bytes through the flow
    network (columns link, t_s, utilization), from its re-share history. In folded mode that
    is the data-parallel / ZeRO traffic; TP collectives and pipeline sends are priced
    statically and appear in ``links`` only."""
    if net is None or not net.history or not len(links.ids):
        return None
    order = np.argsort(-np.asarray(net.link_bytes), kind="stable")
    top = [int(i) for i in order[:k] if net.link_bytes[i] > 0]
    cap = net.capacity
    rows = []
    for t, used, load in net.history:
        pos = {int(u): j for j, u in enumerate(used)}
        for lid in top:
            j = pos.get(lid)
            u = float(load[j] / cap[lid]) if j is not None and cap[lid] > 0 else 0.0
            rows.append((net.topology.link_names[lid], t, u))
    df = pd.DataFrame(rows, columns=["link", "t_s", "utilization"])
    # Keep a point only where a link's utilisation changes.
    df = df[df.groupby("link")["utilization"].diff().fillna(1.0) != 0.0]
    return df.reset_index(drop=True)
