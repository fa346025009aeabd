"""DeepSeek-V3 with DualPipe: the report's Table 2 (arXiv:2412.19437, Section 3.2.1) applied
to the simulator's own chunk times, beside the engine's simulation of DualPipe
(``parallelism.pp_schedule: dualpipe``) and the step the report implies.

For every pipeline stage it prices, from the stage's programs as the engine runs them: ``F``
(a micro-batch's forward through the stage), ``B`` (its backward with the recomputation),
``W`` (the weight-gradient GEMMs inside ``B``) and ``F&B`` (a forward and a backward of two
micro-batches run together on the compute and EP communication streams,
:func:`simulator.engine.combined.pair_schedule`, as combined 1F1B runs its steady state). The
slowest stage sets the pace. Then, with ``m`` micro-batches per replica:

* 1F1B: ``m (F + B) + (PP - 1)(F + B)`` against the simulated 1F1B step;
* combined 1F1B: ``m F&B + (PP - 1)(F + B)`` against the simulated combined step;
* DualPipe: ``m F&B + (PP/2 - 1)(F&B + B - 3W)``, plus what the simulation of combined 1F1B
  adds to its own formula (gradient reduction, optimizer, stage imbalance);
* memory of the worst rank: 1F1B keeps ``PP - stage`` micro-batches (checked against the
  simulated peak), DualPipe ``PP + 1`` of a rank's two stages and both stages' weights and
  gradients (its "2x parameters"), the optimizer state of both sharded over twice the ranks.

Then the simulated DualPipe step (every micro-batch, both directions, the paired F&B chunks,
W deferred, the mirrored gradient reduction; printed with the simulator's wall time) and the
report's own figure: 180K H800 GPU-hours per trillion tokens (Section 1) on 2,048 GPUs at
15,360 x 4,096 tokens a step, 19.9 s.

Run from the repository root: ``python benchmarks/dualpipe_estimate.py [--set key=value ...]``
(e.g. ``--set topology.gpu=H100-SXM-80GB``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import simpy

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's package
from simulator.config.load import load_workload  # noqa: E402
from simulator.engine.build import build_plan, make_job  # noqa: E402
from simulator.engine.combined import chain_items, pair_schedule  # noqa: E402
from simulator.parallel.schedules import TABLE2_MEMORY, table2_bubble  # noqa: E402
from simulator.run import make_machine, resolve_loaded, simulate  # noqa: E402

#: DeepSeek-V3 report, Section 1: "180K H800 GPU hours" per trillion training tokens.
REPORT_GPU_HOURS_PER_T = 180e3

GiB = 2**30
WORKLOAD = "workloads/deepseek-v3.yaml"


def chunks(plan, p):
    """A stage's forward and backward segments (label, layer, program), as the engine runs a
    micro-batch through it."""
    progs, pp = p.programs, plan.pp
    layers = plan.layers_of(p.stage, 0)
    fwd = [(f"L{i} fwd", i, progs.layer(i)[0]) for i in layers]
    bwd = []
    for i in reversed(layers):
        _, b, rec = progs.layer(i)
        bwd += ([(f"L{i} recompute", i, rec)] if rec else []) + [(f"L{i} bwd", i, b)]
    if p.stage == 0:
        fwd.insert(0, ("embed", -1, progs.embed_fwd))
        bwd.append(("embed", -1, progs.embed_bwd))
    if p.stage == pp - 1:
        fwd.append(("head", -1, progs.head_fwd))
        bwd.insert(0, ("head", -1, progs.head_bwd))
    return fwd, bwd


def stage_times(plan, p) -> tuple[float, float, float, float]:
    """(F, B, W, F&B) of one micro-batch on ``p``'s stage, in seconds."""
    fwd, bwd = chunks(plan, p)
    i = plan.interference
    ce = plan.ep_comm_extra
    cf, cb = chain_items(fwd, 1.0, i, ce), chain_items(bwd, 1.0, i, ce)
    w = sum(part.dur for _, _, prog in bwd for part in prog if part.name.endswith("_wgrad"))
    return (sum(x.dur for x in cf), sum(x.dur for x in cb), w, pair_schedule(cf, cb, i).total)


def stage_states(plan, p) -> tuple[float, float]:
    """(weights + gradients, optimizer state) bytes of ``p``'s stage."""
    st = plan.static_mem(p)
    return st["weights"] + st["gradients"], st["optimizer"]


def stage_activation(plan, stage: int) -> float:
    """Activation bytes one micro-batch keeps on ``stage``."""
    act = sum(plan.layer_bytes(i)[0] for i in plan.layers_of(stage, 0))
    act += plan.act_bytes_embed if stage == 0 else 0.0
    return act + (plan.act_bytes_head if stage == plan.pp - 1 else 0.0)


def main(argv: list[str]) -> int:
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    loaded = load_workload(WORKLOAD, [*sets, "training.overlap_moe_expert_parallel_comm=false",
                                       "parallelism.pp_schedule=1f1b"])  # the chunk times of 1F1B
    machine = make_machine(loaded)
    res = resolve_loaded(loaded)
    job = make_job(loaded.workload, loaded.topology, res, machine)
    plan, _ = build_plan(job, env=simpy.Environment())
    pp, m = plan.pp, plan.microbatches
    procs = {p.stage: p for p in plan.procs if p.replica_class == 0}
    times = {s: stage_times(plan, p) for s, p in procs.items()}
    pace = max(times, key=lambda s: times[s][0] + times[s][1])
    f, b, w, fb = times[pace]
    print(f"{loaded.workload.name} on {loaded.topology.gpu}: PP {pp}, {m} micro-batches a "
          f"replica; slowest stage {pace}: F {f * 1e3:.1f} ms, B {b * 1e3:.1f} ms, "
          f"W {w * 1e3:.1f} ms, F&B {fb * 1e3:.1f} ms (F + B {(f + b) * 1e3:.1f})")  # fmt: skip
    plain = simulate(loaded).summary
    comb = simulate(load_workload(WORKLOAD, [*sets, "parallelism.pp_schedule=1f1b",
                    "training.overlap_moe_expert_parallel_comm=true"])).summary  # fmt: skip
    est_1f1b = m * (f + b) + table2_bubble("1f1b", pp, f, b)
    est_comb = m * fb + table2_bubble("1f1b", pp, f, b)
    est_dual = m * fb + table2_bubble("dualpipe", pp, f, b, w, fb)
    tail = comb["step_time_s"] - est_comb
    print(f"{'schedule':16s} {'formula s':>10s} {'simulated s':>12s} {'bubble s':>9s}")
    print(f"{'1F1B':16s} {est_1f1b:10.2f} {plain['step_time_s']:12.2f} "
          f"{table2_bubble('1f1b', pp, f, b):9.2f}")
    print(f"{'combined 1F1B':16s} {est_comb:10.2f} {comb['step_time_s']:12.2f} "
          f"{table2_bubble('1f1b', pp, f, b):9.2f}")
    print(f"{'DualPipe':16s} {est_dual:10.2f} {est_dual + tail:>12.2f}* "
          f"{table2_bubble('dualpipe', pp, f, b, w, fb):8.2f}")
    print("* estimate: the formula plus what the simulation adds to combined 1F1B's formula "
          f"({tail:+.2f} s)")
    t0 = time.perf_counter()
    dsim = simulate(load_workload(WORKLOAD, [*sets, "parallelism.pp_schedule=dualpipe"])).summary
    wall = time.perf_counter() - t0
    bd = dsim["breakdown_s"]
    print(f"{'DualPipe (sim)':16s} {'':10s} {dsim['step_time_s']:12.2f} "
          f"{bd['pp_bubble'] + bd['pp_imbalance']:9.2f}  (critical {dsim['critical_process']}: "
          f"bubble {bd['pp_bubble']:.2f} s, imbalance {bd['pp_imbalance']:.2f} s, EP "
          f"{bd['ep_comm']:.2f} s, DP {bd['dp_comm']:.2f} s, PP {bd['pp_comm']:.2f} s exposed; "
          f"simulated in {wall:.1f} s, {dsim['events']} events)")  # fmt: skip
    tokens = loaded.workload.training.global_batch * loaded.workload.model.seq_len
    n_gpus = dsim["n_gpus"]
    report = REPORT_GPU_HOURS_PER_T * 3600 / n_gpus / (1e12 / tokens)
    print(f"report: {REPORT_GPU_HOURS_PER_T / 1e3:.0f}K GPU-hours per 10^12 tokens on {n_gpus} "
          f"GPUs -> {report:.1f} s a step")
    # memory: 1F1B as simulated (check of the accounting), DualPipe from Table 2
    reserve = plain["memory_gib"]["reserved"]
    best_1f1b = best_dual = 0.0
    copies, inflight = TABLE2_MEMORY["dualpipe"](pp)
    for s, p in procs.items():
        (wg, opt), act = stage_states(plan, p), stage_activation(plan, s)
        best_1f1b = max(best_1f1b, wg + opt + (pp - s) * act + plan.act_bytes_recompute)
        (wg2, opt2), act2 = stage_states(plan, procs[pp - 1 - s]), stage_activation(plan, pp - 1 - s)
        dual = wg + wg2 + (opt + opt2) / copies + inflight * (act + act2) / 2
        best_dual = max(best_dual, dual + plan.act_bytes_recompute)
    print(f"memory, worst rank: 1F1B {best_1f1b / GiB + reserve:.1f} GiB by this accounting "
          f"(simulated {plain['memory_gib']['total']:.1f}); combined 1F1B simulated "
          f"{comb['memory_gib']['total']:.1f}; DualPipe {best_dual / GiB + reserve:.1f} GiB "
          f"by Table 2's count, simulated {dsim['memory_gib']['total']:.1f} "
          f"(of {plain['memory_gib']['capacity']:.1f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
