"""Simulator speed: the shipped workloads and a GPU-count ladder for one model.

    python benchmarks/scale.py            # everything
    python benchmarks/scale.py --ladder   # only the ladder
    python benchmarks/scale.py --big      # only benchmarks/workloads: 405B on 131,072 GPUs,
                                          # GPT-530B with 1,120 micro-batches per replica
    python benchmarks/scale.py --imports  # only the command line's start-up (python -X importtime)
    python benchmarks/scale.py --plan     # only `plan` of Llama 3.1 405B on 16,384 GPUs
    python benchmarks/scale.py --overlap  # only gradient reduction overlapped or not (events)
    python benchmarks/scale.py --schedules  # only DeepSeek-V3 under 1F1B, combined 1F1B, DualPipe

Each case runs in a fresh subprocess so that its peak memory (max RSS) is its own. Prints, per
case: GPUs, simulated processes, simulator wall and CPU time, peak memory, SimPy events,
events/s, and the micro-batches per replica with those simulated where the step was
extrapolated from the pipeline's steady state (``--all-microbatches``: simulate every one).
The ladder keeps the work per data-parallel replica fixed (Llama-2-70B, TP 8, PP 4, 16
micro-batches per replica) and grows the number of replicas, so a simulator whose cost follows
the distinct ranks, not the GPUs, shows a flat wall time.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LADDER = [  # (GPUs, tp, pp, dp, nodes)
    (8, 8, 1, 1, 1),
    (64, 8, 4, 2, 8),
    (512, 8, 4, 16, 64),
    (4096, 8, 4, 128, 512),
    (16384, 8, 4, 512, 2048),
]


def _child(args: list[str]) -> None:
    """Run one simulation in this process and print its figures as JSON."""
    sys.path.insert(0, str(ROOT))  # this checkout's package, not an installed copy
    from simulator.config.load import load_workload
    from simulator.run import simulate

    every = args[0] == "--all-microbatches"
    workload, *overrides = args[1:] if every else args
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(load_workload(workload, overrides), extrapolate=not every)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = res.summary
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"n_gpus": s["n_gpus"], "procs": s["simulated_processes"], "wall_s": wall,
                      "cpu_s": cpu,
                      "peak_MiB": peak_mib, "events": s["events"], "step_time_s": s["step_time_s"],
                      "mfu": s["mfu"], "microbatches": s["layout"]["microbatches"],
                      "simulated": (s["extrapolated"] or {}).get("simulated_microbatches")}))


def run_case(workload: str, overrides: list[str], every: bool = False) -> dict:
    flag = ["--all-microbatches"] if every else []
    out = subprocess.run([sys.executable, __file__, "--child", *flag, workload, *overrides],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


IMPORT_CASES = [  # command lines whose start-up is measured
    ["--help"],
    ["run", "--help"],
    ["run", "workloads/llama3-8b.yaml", "--no-files", "--json"],
    ["run", "workloads/llama3-8b.yaml", "--out", "{tmp}/run"],
    # a whole run of a Llama 3 405B paper case (issue 11: against an analytical model's ~1 s)
    ["run", "workloads/llama3-405b.yaml", "--no-files", "--json"],
]

OVERLAP_CASES = [  # (name, workload, overrides): one layout, gradient reduction overlapped or not
    (f"{w} overlap {o}", f"workloads/{w}.yaml", [f"training.overlap_grad_reduce={o}"])
    for w in ("llama3-405b", "llama70b") for o in ("true", "false")
]
SCHEDULE_CASES = [  # (name, workload, overrides): one MoE job under each pipeline schedule
    ("deepseek-v3 1f1b", "workloads/deepseek-v3.yaml", ["parallelism.pp_schedule=1f1b"]),
    ("deepseek-v3 combined 1f1b", "workloads/deepseek-v3.yaml",
     ["parallelism.pp_schedule=1f1b", "training.overlap_moe_expert_parallel_comm=true"]),
    ("deepseek-v3 dualpipe", "workloads/deepseek-v3.yaml", ["parallelism.pp_schedule=dualpipe"]),
]
HEAVY = ("matplotlib", "pandas", "pyarrow", "ray", "networkx")


def import_figures(argv: list[str]) -> dict:
    """CPU seconds of ``python -X importtime -m simulator ARGV`` (the whole process), the
    seconds its imports took (importtime's top-level cumulative figures) and the heavy
    libraries it imported."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "simulator", *argv],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    imports_us, heavy = 0, set()
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cum, name = line.split("|")
        if cum.strip().isdigit() and not name.startswith("  "):  # a top-level import
            imports_us += int(cum)
        heavy |= {h for h in HEAVY if name.strip() == h}
    return {"cpu_s": cpu, "imports_s": imports_us / 1e6, "heavy": sorted(heavy)}


def print_imports() -> None:
    """The start-up table: one line per command line of IMPORT_CASES (cpu s: the whole
    process; imports s: importtime's wall time of the imports)."""
    import tempfile

    print(f"{'command':<58}{'cpu s':>7}{'imports s':>11}  heavy libraries imported")
    with tempfile.TemporaryDirectory() as tmp:
        for argv in IMPORT_CASES:
            argv = [a.replace("{tmp}", tmp) for a in argv]
            r = import_figures(argv)
            shown = " ".join(a if not a.startswith(tmp) else "DIR" + a[len(tmp):] for a in argv)
            print(f"{shown:<58}{r['cpu_s']:>7.2f}{r['imports_s']:>11.2f}  "
                  f"{', '.join(r['heavy']) or '-'}", flush=True)


PLAN_CASES = [  # (workload, --gpus): issue 11's planning case
    ("workloads/llama3-405b.yaml", 16384),
]


def plan_figures(workload: str, gpus: int) -> dict:
    """``python -m simulator plan WORKLOAD --gpus N --json`` in a fresh process: its wall time,
    the CPU time of it and its worker processes, the peak memory of the largest of them, and
    the plan's own split (estimating every layout, simulating the best)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "simulator", "plan", workload, "--gpus",
                          str(gpus), "--json"], capture_output=True, text=True, cwd=ROOT,
                         check=True)  # fmt: skip
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    res = json.loads(out.stdout)
    return {"wall_s": wall, "peak_MiB": after.ru_maxrss / 1024,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            **{k: res["timings"][k] for k in ("estimate_s", "simulate_s", "workers")},
            **{k: res["counts"][k] for k in ("enumerated", "estimated", "simulated")}}


def print_plans() -> None:
    """The planning table: one line per case of PLAN_CASES (cpu s: the plan process and its
    workers; estimate s / simulate s: the plan's wall time in each phase)."""
    head = (f"{'plan':<34}{'GPUs':>7}{'wall s':>8}{'cpu s':>8}{'peak MiB':>10}{'estimate s':>12}"
            f"{'simulate s':>12}{'workers':>9}  layouts (estimated, simulated)")
    print(head)
    print("-" * len(head))
    for workload, gpus in PLAN_CASES:
        r = plan_figures(workload, gpus)
        print(f"{Path(workload).stem:<34}{gpus:>7}{r['wall_s']:>8.1f}{r['cpu_s']:>8.1f}"
              f"{r['peak_MiB']:>10.0f}{r['estimate_s']:>12.1f}{r['simulate_s']:>12.1f}"
              f"{r['workers']:>9}  {r['enumerated']:,} ({r['estimated']:,}, {r['simulated']})",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ladder", action="store_true", help="only the GPU-count ladder")
    ap.add_argument("--big", action="store_true",
                    help="only benchmarks/workloads (Llama 3.1 405B on 131,072 GPUs, three tiers; "
                    "GPT-530B with 1,120 micro-batches per replica)")
    ap.add_argument("--imports", action="store_true", help="only the start-up of the CLI")
    ap.add_argument("--plan", action="store_true",
                    help="only `plan` of Llama 3.1 405B on 16,384 GPUs (every layout)")
    ap.add_argument("--overlap", action="store_true",
                    help="only one layout with overlap_grad_reduce true and false")
    ap.add_argument("--schedules", action="store_true",
                    help="only DeepSeek-V3 under 1F1B, combined 1F1B and DualPipe")
    ap.add_argument("--all-microbatches", action="store_true",
                    help="simulate every micro-batch (no steady-state extrapolation)")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _child(a.child)
        return
    if a.imports:
        print_imports()
        return
    if a.plan:
        print_plans()
        return
    cases: list[tuple[str, str, list[str]]] = []
    if a.overlap or a.schedules:
        cases = list(OVERLAP_CASES if a.overlap else SCHEDULE_CASES)
    elif not a.ladder and not a.big:
        for w in sorted((ROOT / "workloads").glob("*.yaml")):
            cases.append((w.stem, str(w), []))
    if not a.ladder and not a.overlap and not a.schedules:  # too large for the test suite
        for w in sorted((ROOT / "benchmarks" / "workloads").glob("*.yaml")):
            cases.append((w.stem, str(w), []))
    for n, tp, pp, dp, nodes in [] if a.big or a.overlap or a.schedules else LADDER:
        cases.append((f"ladder {n}", str(ROOT / "workloads/llama70b.yaml"), [
            f"parallelism.tp={tp}", f"parallelism.pp={pp}", f"parallelism.dp={dp}",
            f"training.global_batch={dp * 16}", f"topology.nodes={nodes}",
            "topology.nodes_per_leaf=32"]))
    head = f"{'case':<30}{'GPUs':>7}{'procs':>7}{'wall s':>9}{'cpu s':>8}{'peak MiB':>10}{'events':>9}" \
           f"{'events/s':>10}{'step s':>9}{'MFU':>7}  micro-batches (simulated)"
    print(head)
    print("-" * len(head))
    for name, w, ov in cases:
        r = run_case(w, ov, a.all_microbatches)
        sim = "+".join(map(str, r["simulated"])) if r["simulated"] else "all"
        print(f"{name:<30}{r['n_gpus']:>7}{r['procs']:>7}{r['wall_s']:>9.2f}{r['cpu_s']:>8.2f}"
              f"{r['peak_MiB']:>10.0f}"
              f"{r['events']:>9}{r['events'] / r['wall_s']:>10.0f}{r['step_time_s']:>9.3f}"
              f"{r['mfu']:>7.1%}  {r['microbatches']} ({sim})", flush=True)


if __name__ == "__main__":
    main()
