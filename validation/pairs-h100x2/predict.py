"""Pre-register the collective predictions for a pair of H100s (2x H100 NVSwitch box) before
measuring them (issue 12: "collectives between pairs of GPUs" were 11-14 % off; the network
constants were fitted on groups of 4 and 2 of a 4x H200 box).

    python validation/pairs-h100x2/predict.py

writes ``predictions.yaml`` beside this file (never rewrites it): the time the simulator gives
all-reduce, all-gather, reduce-scatter and all-to-all (uniform splits) over the 2 GPUs, bf16, for
every size ``benchmarks/device/comm.py`` measures (4 KiB - 1 GiB by x4), CUDA-event timing, on
``topologies/h100x2-nvswitch.yaml``, with the commit it was made at. After measuring,
``python validation/pairs-h100x2/predict.py --score DATA.jsonl`` prints the held-out result of
those frozen predictions (MAPE and bias per operation and size band).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import prereg  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = HERE / "predictions.yaml"
SIZES = prereg.SIZES
TOPOLOGY = "topologies/h100x2-nvswitch.yaml"
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def predict() -> int:
    coll = prereg.collective_model(TOPOLOGY)
    rows = []
    for op in OPS:
        for b in SIZES:
            rows.append({"op": op, "group": 2, "bytes": b,
                         "predicted_s": float(coll.cost(op, [[0, 1]], b).time_s)})
    return prereg.write(OUT, TOPOLOGY, rows)


def score(data: str) -> int:
    return prereg.score(OUT, data, lambda r: r["op"])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--score", metavar="DATA.jsonl")
    a = ap.parse_args()
    raise SystemExit(score(a.score) if a.score else predict())
