"""Host-bound eager steps: the simulator against training steps measured at host-bound widths.

``benchmarks/device/steps.py --tiny`` ran 13 steps of the development cases at hidden 256 and
128-token sequences on 4x H100 (data/measured/tiny-h100x4): the GPU work is negligible, so each
step is the time the host needs to run the eager PyTorch code. This script simulates the same
tiny configurations and prints, per case, the measured step, the simulated step (GPU work only:
the simulator has no model of the host for eager code beyond launches after a synchronisation),
the kernels the simulator's op list launches (and the real ones, from the profile) and the host
time per simulated kernel. Run from the repository root: ``python benchmarks/host_bound.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

DATA = Path("data/measured/tiny-h100x4")
CASES = {
    "h2_tp4sp_D": "heldout2/h2_tp4sp_D", "h2_moe_ep4_N_uniform": "heldout2/h2_moe_ep4_N_uniform",
    "h2_moe_ep4_N_skewed": "heldout2/h2_moe_ep4_N_skewed", "h2_ddp4_D": "heldout2/h2_ddp4_D",
    "h2_tp2dp2_D": "heldout2/h2_tp2dp2_D", "ho_tp4sp_B": "heldout/ho_tp4sp_B",
    "moe_ep4_uniform": "measured-moe/moe_ep4_uniform", "moe_ep4_skewed": "measured-moe/moe_ep4_skewed",
    "ho_tp4_B": "heldout/ho_tp4_B", "h2_fsdp4_D": "heldout2/h2_fsdp4_D",
    "h2_pp4_1f1b_D": "heldout2/h2_pp4_1f1b_D",
    "h2_moe_ep2dp2_N_uniform": "heldout2/h2_moe_ep2dp2_N_uniform",
    "h2_moe_ep2dp2_N_skewed": "heldout2/h2_moe_ep2dp2_N_skewed",
}
TINY = ["model.hidden=256", "model.ffn_hidden=512", "model.heads=8", "model.kv_heads=4",
        "model.vocab=1024", "model.seq_len=128"]
COMM = ("tp_", "~tp_", "ep_", "moe_dispatch", "moe_combine", "cp_")


def main() -> int:
    meas = {}
    for line in open(DATA / "steps.jsonl"):
        r = json.loads(line)
        meas[r["case"]] = r["step_time_s"]
    kernels = {}
    for line in open(DATA / "profile.jsonl"):
        r = json.loads(line)
        if r["rank"] == 0:
            kernels[r["case"]] = r["kernels"]
    tmp = tempfile.mkdtemp(prefix="host_bound_")
    print(f"{'case':24s} {'measured':>9s} {'simulated':>9s} {'error':>7s} {'sim ops':>8s} "
          f"{'comm':>5s} {'real kernels':>12s} {'us/sim op':>9s}")
    for case, suite in CASES.items():
        sets = TINY + (["model.moe.ffn_hidden=512"] if "moe" in case else [])
        cmd = [sys.executable, "-m", "simulator", "run", f"validation/{suite}.yaml",
               "--out", f"{tmp}/{case}", "--json"] + [a for s in sets for a in ("--set", s)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            print(case, r.stderr.strip()[-300:])
            continue
        sim = json.loads(r.stdout)["step_time_s"]
        ev = pd.read_parquet(f"{tmp}/{case}/events.parquet")
        parts = [x for p in ev[ev.gpu == 0].parts if p for x in p.split(";")
                 if not x.startswith(("host_bound_wait", "host_launch_wait"))]
        comm = sum(1 for x in parts if x.startswith(COMM))
        m = meas[case]
        print(f"{case:24s} {m * 1e3:7.1f}ms {sim * 1e3:7.2f}ms {sim / m - 1:+7.1%} {len(parts):8d} {comm:5d} "
              f"{kernels[case]:12d} {m / len(parts) * 1e6:9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
