"""Sweep overhead at scale: a 67,200-point grid, stopped after a few points.

    python benchmarks/sweep_scale.py                  # 20 points, 2 workers
    python benchmarks/sweep_scale.py --limit 200 --workers 2
    python benchmarks/sweep_scale.py --code /path/to/other/checkout   # the same, other code

The grid varies Llama-3-8B on 64 H100 (``workloads/llama3-8b.yaml``) over 7 NIC bandwidths x
6 oversubscriptions x 8 gradient bucket sizes x 10 NIC latencies x 20 seeds = 67,200 points,
and runs the first ``--limit`` of them with the process pool into a fresh folder, in a fresh
subprocess (so that peak memory is the sweep's own). Prints the time from the call to the
first finished row (everything a sweep prepares before its first result shows here) and
the sweep process's CPU seconds until then (what a loaded machine does not distort), the
time to ``--limit`` rows, the sweep process's peak RSS and its pool workers' largest peak
RSS. Then it runs the sweep again with the same limit (a resume: every recorded point is
checked against its inputs, ``--limit`` new points run) and prints the same figures.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

GRID = {
    "topology.nic_bandwidth_Gbps": [50, 100, 200, 400, 800, 1600, 3200],
    "topology.oversubscription": [1.0, 1.5, 2.0, 3.0, 4.0, 6.0],
    "training.grad_bucket_MB": [5, 10, 25, 50, 100, 200, 400, 800],
    "topology.nic_latency_us": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0],
    "seed": list(range(20)),
}


def _child(code: str, sweep: str, out: str, limit: int, workers: int) -> None:
    """Run the sweep in this process and print its figures as JSON."""
    sys.path.insert(0, code)
    from simulator.sweep import run_sweep

    t0, c0 = time.perf_counter(), time.process_time()
    first: list[float] = []

    def on_row(index: int, row: dict) -> None:
        if not first:
            first.extend([time.perf_counter() - t0, time.process_time() - c0])

    outcome = run_sweep(sweep, workers=workers, out=out, limit=limit, on_row=on_row)
    wall = time.perf_counter() - t0
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(
        json.dumps(
            {
                "points": outcome.n_points,
                "run": outcome.n_run,
                "reused": outcome.n_skipped,
                "first_row_s": first[0] if first else None,
                "first_row_cpu_s": first[1] if first else None,
                "wall_s": wall,
                "rss_mib": self_kib / 1024,
                "worker_rss_mib": child_kib / 1024,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=20, help="new points per run (default 20)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--code", default=str(ROOT), help="checkout whose simulator to run")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        code, sweep, out, limit, workers = args.child
        _child(code, sweep, out, int(limit), int(workers))
        return
    n = 1
    for values in GRID.values():
        n *= len(values)
    print(f"grid: {' x '.join(str(len(v)) for v in GRID.values())} = {n:,} points; code: {args.code}")
    print(f"{'run':<8} {'points':>7} {'new':>5} {'reused':>6} {'first row s':>12} "
          f"{'(CPU s)':>8} {'wall s':>8} {'peak MiB':>9} {'worker MiB':>11}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "sweep.yaml"
        base = ROOT / "workloads" / "llama3-8b.yaml"
        spec = {"name": "scale", "base": str(base), "grid": GRID, "metric": "tokens_per_s"}
        sweep.write_text(json.dumps(spec))  # JSON is YAML
        for label in ("first", "resume"):
            cmd = [sys.executable, __file__, "--child", args.code, str(sweep),
                   str(Path(tmp) / "out"), str(args.limit), str(args.workers)]  # fmt: skip
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            r = json.loads(res.stdout.strip().splitlines()[-1])
            print(
                f"{label:<8} {r['points']:>7,} {r['run']:>5} {r['reused']:>6} "
                f"{r['first_row_s']:>12.2f} {r['first_row_cpu_s']:>8.2f} {r['wall_s']:>8.2f} "
                f"{r['rss_mib']:>9.0f} "
                f"{r['worker_rss_mib']:>11.0f}"
            )


if __name__ == "__main__":
    main()
