"""What a sweep costs after its last point: the terminal table, ``sweep.png`` and ``sweep.html``.

    python benchmarks/sweep_report.py                  # the 67,200-point grid of sweep_scale.py
    python benchmarks/sweep_report.py --code /path/to/other/checkout   # the same, other code

Simulating 67,200 points takes hours, and what is measured here does not depend on the values,
so the table is made, not simulated: one point of the grid of ``benchmarks/sweep_scale.py``
(Llama-3-8B on 64 H100) is simulated for real, and its row is given to every point of the
grid with ``tokens_per_s`` and ``step_time_s`` scaled by a smooth made-up function of the keys
(so that plots are not flat) and one point in 97 marked ``does_not_fit``. The CLI's
``sweep`` command then runs with ``run_sweep`` replaced by one that returns this table, in a
fresh subprocess, and the script prints the wall and CPU seconds of the command after the
sweep (table, plots, page), the lines and bytes it printed, and the sizes of ``sweep.png``
and ``sweep.html``.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.sweep_scale import GRID  # noqa: E402


def _big_outcome(code: str, sweep: Path, out: Path):
    """The sweep's outcome with every point of GRID (one simulated, the rest derived)."""
    import numpy as np
    import pandas as pd

    from simulator.sweep import run_sweep

    one = run_sweep(sweep, workers=1, out=out, limit=1)
    row = one.table.iloc[0].to_dict()
    keys = list(GRID)
    combos = pd.DataFrame(list(itertools.product(*GRID.values())), columns=keys)
    n = len(combos)
    table = pd.DataFrame({c: [row[c]] * n for c in one.table.columns if c not in keys})
    for k in keys:
        table[k] = combos[k].to_numpy()
    table["point_index"] = np.arange(n)
    # made up: more NIC bandwidth helps, oversubscription and latency hurt, seeds jitter
    f = (
        1.0
        + 0.05 * np.log2(combos[keys[0]].to_numpy() / 50.0)
        - 0.02 * combos[keys[1]].to_numpy()
        - 0.003 * combos[keys[3]].to_numpy()
        + 0.001 * (combos["seed"].to_numpy() % 7)
    )
    table["tokens_per_s"] = float(row["tokens_per_s"]) * f
    table["step_time_s"] = float(row["step_time_s"]) / f
    bad = np.arange(n) % 97 == 5
    table.loc[bad, "status"] = "does_not_fit"
    table.loc[bad, "reason"] = "needs more memory than the GPU has"
    table = table[one.table.columns]
    one.table, one.n_points, one.n_run, one.n_skipped = table, n, n, 0
    one.keys = keys
    return one


def _child(code: str, sweep: str, out: str) -> None:
    sys.path.insert(0, code)
    from simulator.cli import main
    from simulator.commands import sweep_cmd

    outcome = _big_outcome(code, Path(sweep), Path(out))
    sweep_cmd.run_sweep = lambda *a, **k: outcome
    buf = io.StringIO()
    t0, c0 = time.perf_counter(), time.process_time()
    with redirect_stdout(buf):
        rc = main(["sweep", sweep, "--out", out, "--no-progress"])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    text = buf.getvalue()
    sizes = {p: (Path(out) / p).stat().st_size for p in ("sweep.png", "sweep.html")
             if (Path(out) / p).exists()}  # fmt: skip
    print(json.dumps({"rc": rc, "rows": len(outcome.table), "wall_s": wall, "cpu_s": cpu,
                      "lines": text.count("\n"), "bytes": len(text.encode()), **sizes}))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", default=str(ROOT), help="checkout whose simulator to run")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "sweep.yaml"
        base = ROOT / "workloads" / "llama3-8b.yaml"
        spec = {"name": "report", "base": str(base), "grid": GRID, "metric": "tokens_per_s"}
        sweep.write_text(json.dumps(spec))  # JSON is YAML
        cmd = [sys.executable, __file__, "--child", args.code, str(sweep), str(Path(tmp) / "o")]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=args.code)
        if res.returncode:
            sys.exit(res.stderr[-3000:])
        r = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"code: {args.code}")
    print(
        f"{r['rows']:,} rows: after the sweep {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU; "
        f"printed {r['lines']:,} lines ({r['bytes']:,} bytes); sweep.png "
        f"{r.get('sweep.png', 0):,} bytes, sweep.html {r.get('sweep.html', 0):,} bytes"
    )


if __name__ == "__main__":
    main()
