"""Refit the host's time per kernel of eager model code and per collective call
(``host_op_s``, ``host_collective_s`` in gpus.yaml).

Data: ``data/measured/tiny-h100x4/steps.jsonl``, training steps of ``benchmarks/device/steps.py``
run with ``--tiny`` on 4x H100: each case's layers, scheme, micro-batches and layout at hidden
256 and 128-token sequences, where the GPU work is negligible and the step time is the host's
time to run the eager code (see that folder's README). The fit uses the dense cases (DDP, TP with
and without sequence parallelism, TP x DP, 1F1B pipeline); MoE steps synchronise on their token
counts (milliseconds each, more with skewed routing) and FSDP2 runs per-unit hooks: both cost
host time that is not per kernel, and are left out. Each case is simulated at the same tiny
configuration; its kernels (one part each in the events table of GPU 0, host waits excluded) and
its collective calls (tensor-parallel collectives) are counted, and
``step = host_op_s x kernels + host_collective_s x collectives`` is fitted by least squares on
relative error. The counts are the simulator's op lists (``simulator/model/eager.py``), so a
change to them changes the refit: ``tests/test_calibration.py`` then asks for a new one.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile

import numpy as np
import pandas as pd

from simulator.calibrate import REPO
from simulator.hardware.catalog import default_kernel_params

DATA = REPO / "data/measured/tiny-h100x4/steps.jsonl"
# measured case -> its workload (the full-size validation case the tiny run shrinks)
DENSE = {
    "h2_tp4sp_D": "validation/heldout2/h2_tp4sp_D.yaml",
    "h2_ddp4_D": "validation/heldout2/h2_ddp4_D.yaml",
    "h2_tp2dp2_D": "validation/heldout2/h2_tp2dp2_D.yaml",
    "ho_tp4sp_B": "validation/heldout/ho_tp4sp_B.yaml",
    "ho_tp4_B": "validation/heldout/ho_tp4_B.yaml",
    "h2_pp4_1f1b_D": "validation/heldout2/h2_pp4_1f1b_D.yaml",
}
# steps.py --tiny: hidden 256, FFN 512, 8 heads (4 KV heads), vocabulary 1,024, 128 tokens
TINY = ("model.hidden=256", "model.ffn_hidden=512", "model.heads=8", "model.kv_heads=4",
        "model.vocab=1024", "model.seq_len=128")
COMM = ("tp_", "~tp_", "ep_", "moe_dispatch", "moe_combine", "cp_")
WAITS = ("host_bound_wait", "host_launch_wait")


def simulate_tiny(workload: str, out_dir: str, extra: tuple[str, ...] = ()
                  ) -> tuple[float, int, int]:
    """(simulated step time, kernels, collective calls) of GPU 0 in one step of ``workload``
    at the tiny widths (``extra``: more ``--set`` overrides, e.g. the MoE expert FFN)."""
    cmd = [sys.executable, "-m", "simulator", "run", str(REPO / workload), "--out", out_dir,
           "--json"]
    for s in TINY + extra:
        cmd += ["--set", s]
    p = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
    ev = pd.read_parquet(f"{out_dir}/events.parquet", columns=["gpu", "parts"])
    names = [x.rsplit(":", 1)[0] for p in ev[ev.gpu == 0].parts if p for x in p.split(";")]
    names = [n for n in names if n not in WAITS]
    comm = sum(1 for n in names if n.startswith(COMM))
    return json.loads(p.stdout)["step_time_s"], len(names) - comm, comm


def measured() -> dict[str, float]:
    """{case: measured step time} of the tiny steps."""
    return {r["case"]: r["step_time_s"]
            for r in (json.loads(x) for x in DATA.read_text().splitlines() if x.strip())}


@functools.lru_cache(maxsize=1)
def fit() -> tuple[float, float, dict[str, tuple[float, int, int]]]:
    """(host_op_s, host_collective_s, {case: (measured step, kernels, collectives)})."""
    meas = measured()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="calibrate_host_") as tmp:
        for case, workload in DENSE.items():
            _, k, c = simulate_tiny(workload, f"{tmp}/{case}")
            rows[case] = (meas[case], k, c)
    a = np.array([[k / m, c / m] for m, k, c in rows.values()])
    x, *_ = np.linalg.lstsq(a, np.ones(len(rows)), rcond=None)
    return float(x[0]), float(x[1]), rows


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}, the refit rounded as shipped (0.01 us, 0.1 us)."""
    op_s, coll_s, _ = fit()
    d = default_kernel_params()
    return {"defaults.host_op_s": (round(op_s * 1e8) / 1e8, d["host_op_s"]),
            "defaults.host_collective_s": (round(coll_s * 1e7) / 1e7, d["host_collective_s"])}
