"""Host-bound eager steps: the simulator against training steps measured at host-bound widths.

``benchmarks/device/steps.py --tiny`` ran steps of the development cases at hidden 256 and
128-token sequences on 4x H100 (data/measured/tiny-h100x4, tiny3-h100x4): the GPU work is negligible, so each
step is the time the host needs to run the eager PyTorch code. This script simulates the same tiny
configurations (``simulator.calibrate.host.simulate_tiny``, which the host-rate fit also uses) and
prints, per case, the measured step, the simulated step (with the host's time per kernel, per
collective call and per MoE count synchronisation, ``host_op_s`` / ``host_collective_s`` /
``host_sync_s`` in gpus.yaml, ``python -m simulator.calibrate host``), the kernels the
simulator's op list launches (and the real ones, from the profile where there is one) and the
measured host time per simulated kernel.
Run from the repository root: ``python benchmarks/host_bound.py``.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's package
from simulator.calibrate.host import DATA, DENSE, measured, simulate_tiny  # noqa: E402

MOE = {f"{c}_{r}": f"validation/{s}_{r}.yaml"
       for c, s in (("h2_moe_ep4_N", "heldout2/h2_moe_ep4_N"),
                    ("moe_ep4", "measured-moe/moe_ep4"),
                    ("h2_moe_ep2dp2_N", "heldout2/h2_moe_ep2dp2_N"),
                    ("h3_moe_ep4_P", "heldout3/h3_moe_ep4_P"))
       for r in ("uniform", "skewed")}
OTHER = {"h2_fsdp4_D": "validation/heldout2/h2_fsdp4_D.yaml"}  # FSDP2: hooks, not fitted


def main() -> int:
    meas = measured()
    kernels = {}
    for line in open(DATA[0].parent / "profile.jsonl"):
        r = json.loads(line)
        if r["rank"] == 0:
            kernels[r["case"]] = r["kernels"]
    tmp = tempfile.mkdtemp(prefix="host_bound_")
    print(f"{'case':24s} {'measured':>9s} {'simulated':>9s} {'error':>7s} {'sim ops':>8s} "
          f"{'comm':>5s} {'real kernels':>12s} {'us/sim op':>9s}  (fitted: dense cases)")
    for case, workload in {**DENSE, **MOE, **OTHER}.items():
        if case not in meas:
            continue
        extra = ("model.moe.ffn_hidden=512",) if case in MOE else ()
        sim, k, comm = simulate_tiny(workload, f"{tmp}/{case}", extra)
        m, n = meas[case], k + comm
        print(f"{case:24s} {m * 1e3:7.1f}ms {sim * 1e3:7.2f}ms {sim / m - 1:+7.1%} {n:8d} "
              f"{comm:5d} {kernels.get(case, '-'):>12} {m / n * 1e6:9.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
