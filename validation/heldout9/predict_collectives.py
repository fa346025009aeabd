"""Pre-register the ninth batch's collective predictions (4x H100 NVSwitch) before measuring.

    python validation/heldout9/predict_collectives.py

writes ``predictions-collectives.yaml`` beside this file once (never rewrites it): the time the
simulator gives all-reduce, all-gather, reduce-scatter and all-to-all (uniform splits), bf16,
CUDA-event timing (the GPU's time or the host's interval between back-to-back calls,
whichever is longer, as ``validate`` prices event-timed suites), for what
``benchmarks/device/call_heldout9.sh`` measures: a group of 3 GPUs at 4 KiB x 4^k, and a group
of 4 and two pairs at once at 6 KiB x 4^k (up to 1 GiB), on
``topologies/h100x4-nvswitch.yaml``, with the commit it was made at. After measuring,
``--score DATA.jsonl`` prints the held-out result (MAPE and bias per operation, group and band).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import prereg  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = HERE / "predictions-collectives.yaml"
TOPOLOGY = "topologies/h100x4-nvswitch.yaml"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
#: (group size, the groups running at once, sizes): what call_heldout9.sh measures
PLAN = ((3, [[0, 1, 2]], [4096 * 4**i for i in range(10)]),
        (4, [[0, 1, 2, 3]], [6144 * 4**i for i in range(9)]),
        (2, [[0, 1], [2, 3]], [6144 * 4**i for i in range(9)]))


def predict() -> int:
    coll = prereg.collective_model(TOPOLOGY)
    from simulator.validate import timed_collective_s  # importable once prereg set the path

    rows = []
    for g, groups, sizes in PLAN:
        for op in OPS:
            for b in sizes:
                t = float(timed_collective_s(coll, op, groups, b, "events"))
                rows.append({"op": op, "group": g, "bytes": b, "predicted_s": t})
    return prereg.write(OUT, TOPOLOGY, rows)


def score(data: str) -> int:
    return prereg.score(OUT, data, lambda r: f"{r['op']} g{r['group']}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--score", metavar="DATA.jsonl")
    a = ap.parse_args()
    raise SystemExit(score(a.score) if a.score else predict())
