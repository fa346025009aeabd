"""Pre-register the all-to-all predictions for 4x H200 NVSwitch before measuring them (issue 10:
"validate on a second box kind"; the all-to-all constants were fitted on 4x H100 only).

    python validation/alltoall-h200x4/predict.py

writes ``predictions.yaml`` beside this file (never rewrites it): the time the simulator gives
``all_to_all_single`` with uniform splits, bf16, for every size ``benchmarks/device/comm.py``
measures (4 KiB - 1 GiB by x4), group 4 and group 2 (both pairs at once), CUDA-event timing, on
``topologies/h200x4-nvswitch.yaml``, with the commit it was made at. After measuring,
``python validation/alltoall-h200x4/predict.py --score DATA.jsonl`` prints the held-out result of
those frozen predictions (MAPE and bias per group and size band).
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
TOPOLOGY = "topologies/h200x4-nvswitch.yaml"


def predict() -> int:
    coll = prereg.collective_model(TOPOLOGY)
    rows = []
    for g in (4, 2):
        groups = [list(range(i, i + g)) for i in range(0, 4, g)]
        for b in SIZES:
            rows.append({"op": "all_to_all", "group": g, "bytes": b,
                         "predicted_s": float(coll.cost("all_to_all", groups, b).time_s)})
    return prereg.write(OUT, TOPOLOGY, rows)


def score(data: str) -> int:
    return prereg.score(OUT, data, lambda r: f"group {r['group']}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--score", metavar="DATA.jsonl")
    a = ap.parse_args()
    raise SystemExit(score(a.score) if a.score else predict())
