"""Folded against full detail on seeded random layouts: the distribution of the error.

    python benchmarks/folding.py                  # seeds 0..199, up to 128 GPUs
    python benchmarks/folding.py --seeds 1000:1100 --max-gpus 256 --workers 2

Each case (``tests/folding_cases.py``: TP up to 16, PP with every schedule, ZeRO 0-3, SP,
overlap on/off, oversubscription, leaf size, NICs per node, stragglers) is simulated folded and
with ``--detail full``. Printed per case: the signed error of the folded step time and the
largest error of a breakdown part (as a fraction of the full step), then the median, 95th
percentile and worst of both over the set, and how many cases are within 1 %.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.config.load import load_workload  # noqa: E402
from simulator.run import simulate  # noqa: E402
from tests.conftest import write_case  # noqa: E402
from tests.folding_cases import describe, random_case  # noqa: E402


def compare(seed: int, max_gpus: int) -> dict:
    """Folded and full summaries of one seeded case, and their differences."""
    _, work, topo = random_case(seed, max_gpus)
    with tempfile.TemporaryDirectory() as d:
        loaded = load_workload(write_case(Path(d), work, topo))
        t0 = time.perf_counter()
        folded = simulate(loaded, detail="folded").summary
        t1 = time.perf_counter()
        full = simulate(loaded, detail="full").summary
        t2 = time.perf_counter()
    step = full["step_time_s"]
    parts = {k: (folded["breakdown_s"][k] - v) / step for k, v in full["breakdown_s"].items()}
    worst_part = max(parts, key=lambda k: abs(parts[k]))
    return {"seed": seed, "case": describe(work, topo), "gpus": full["n_gpus"],
            "step_err": folded["step_time_s"] / step - 1.0, "part": worst_part,
            "part_err": parts[worst_part], "folded_s": t1 - t0, "full_s": t2 - t1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0:200", help="a range start:stop")
    ap.add_argument("--max-gpus", type=int, default=128)
    ap.add_argument("--workers", type=int, default=1)
    a = ap.parse_args()
    lo, hi = (int(x) for x in a.seeds.split(":"))
    seeds = range(lo, hi)
    print(f"{'seed':>5} {'GPUs':>4} {'step err':>9} {'worst part':>17} {'fold s':>7} "
          f"{'full s':>7}  case")
    rows = []
    with ProcessPoolExecutor(a.workers) as ex:
        for r in ex.map(compare, seeds, [a.max_gpus] * len(seeds)):
            rows.append(r)
            print(f"{r['seed']:>5} {r['gpus']:>4} {r['step_err']:>+9.2%} "
                  f"{r['part']:>9} {r['part_err']:>+7.2%} {r['folded_s']:>7.2f} "
                  f"{r['full_s']:>7.2f}  {r['case']}", flush=True)
    step = np.abs([r["step_err"] for r in rows])
    part = np.abs([r["part_err"] for r in rows])
    print(f"\n{len(rows)} cases, |error| of the folded step time: median {np.median(step):.3%}, "
          f"p95 {np.percentile(step, 95):.3%}, worst {step.max():.3%}; "
          f"within 1 %: {(step <= 0.01).sum()}")
    print(f"worst breakdown part (fraction of the step): median {np.median(part):.3%}, "
          f"p95 {np.percentile(part, 95):.3%}, worst {part.max():.3%}; "
          f"within 1 %: {(part <= 0.01).sum()}")
    signed = np.array([r["step_err"] for r in rows])
    print(f"bias (mean signed step error): {signed.mean():+.3%}")


if __name__ == "__main__":
    main()
