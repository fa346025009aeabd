"""Pre-register the thirteenth batch's collective predictions before measuring.

    python validation/heldout13/predict_collectives.py --box h100x4
    python validation/heldout13/predict_collectives.py --box h200x4

writes ``predictions-collectives-<box>.yaml`` beside this file once (never rewrites it): the time
the simulator gives all-reduce, all-gather, reduce-scatter and all-to-all, bf16, CUDA-event
timing (``validate.timed_collective_s``, the rule ``validate`` prices event-timed suites with),
for what ``benchmarks/device/call_heldout13.sh B`` measures: a group of 4 and two pairs at once
at 28 KiB x 4^k (up to 1.75 GiB) and a group of 3 at 42 KiB x 4^k (every rank's share 16-byte
aligned). The all-to-all is predicted for the three splits ``comm.py`` runs: uniform, and the
uneven ``rotated`` and ``hot`` (priced part by part, as ``validate`` prices such rows), the
first pre-registered test of uneven all-to-all.
After measuring, ``--box B --score DATA.jsonl`` prints the held-out result.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import prereg  # noqa: E402

HERE = Path(__file__).resolve().parent
TOPOLOGY = {"h100x4": "topologies/h100x4-nvswitch.yaml",
            "h200x4": "topologies/h200x4-nvswitch.yaml"}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SPLITS = ("uniform", "rotated", "hot")
#: (label, group size, the groups running at once, sizes): what call_heldout13.sh B measures
PLAN = (("g4", 4, [[0, 1, 2, 3]], [28672 * 4**i for i in range(9)]),
        ("g2", 2, [[0, 1], [2, 3]], [28672 * 4**i for i in range(9)]),
        ("g3", 3, [[0, 1, 2]], [43008 * 4**i for i in range(8)]))


def out(box: str) -> Path:
    return HERE / f"predictions-collectives-{box}.yaml"


def predict(box: str) -> int:
    coll = prereg.collective_model(TOPOLOGY[box])
    from simulator.validate import timed_collective_s  # importable once prereg set the path

    rows = []
    for label, g, groups, sizes in PLAN:
        for op in OPS:
            for sp in (SPLITS if op == "all_to_all" else ("-",)):
                for b in sizes:
                    t = float(timed_collective_s(coll, op, groups, b, "events",
                                                 "uniform" if sp == "-" else sp))
                    rows.append({"op": op, "group": g, "set": label, "splits": sp, "bytes": b,
                                 "predicted_s": t})
    return prereg.write(out(box), TOPOLOGY[box], rows)


def score(box: str, data: str) -> int:
    return prereg.score(out(box), data, lambda r: f"{r['op']} g{r['group']} {r.get('splits', '-')}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--box", choices=sorted(TOPOLOGY), required=True)
    ap.add_argument("--score", metavar="DATA.jsonl")
    a = ap.parse_args()
    raise SystemExit(score(a.box, a.score) if a.score else predict(a.box))
