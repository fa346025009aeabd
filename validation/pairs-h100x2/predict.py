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
import json
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "predictions.yaml"
SIZES = [4096 * 4**i for i in range(11)]  # 4 KiB .. 4 GiB; comm.py stops at --max-bytes
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


def predict() -> int:
    if OUT.exists():
        print(f"{OUT} exists: predictions are made once, before measuring", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from simulator.config.load import load_topology
    from simulator.hardware.catalog import load_gpu
    from simulator.network.collectives import CollectiveModel
    from simulator.network.topology import Topology

    cfg = load_topology(ROOT / "topologies/h100x2-nvswitch.yaml")
    coll = CollectiveModel(Topology(cfg, load_gpu(cfg.gpu)))
    rows = []
    for op in OPS:
        for b in SIZES:
            rows.append({"op": op, "group": 2, "bytes": b,
                         "predicted_s": float(coll.cost(op, [[0, 1]], b).time_s)})
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    OUT.write_text(yaml.safe_dump({"commit": commit, "topology": "topologies/h100x2-nvswitch.yaml",
                                   "splits": "uniform", "timing": "events", "rows": rows},
                                  sort_keys=False))
    print(f"wrote {OUT} ({len(rows)} rows) at {commit}")
    return 0


def score(data: str) -> int:
    pred = {(r["op"], r["bytes"]): r["predicted_s"]
            for r in yaml.safe_load(OUT.read_text())["rows"]}
    errs: dict[tuple[str, str], list[float]] = {}
    for line in open(data):
        r = json.loads(line)
        if r.get("splits", "uniform") not in ("uniform", "-") or r.get("group") != 2:
            continue
        if r.get("timing", "events") != "events" or (r["op"], r["bytes"]) not in pred:
            continue
        b = r["bytes"]
        band = "<= 1 MiB" if b <= 2**20 else "4-64 MiB" if b <= 64 * 2**20 else ">= 256 MiB"
        e = pred[(r["op"], b)] / r["time_s"] - 1.0
        errs.setdefault((r["op"], band), []).append(e)
        print(f"{r['op']:14s} {b:>11d} B: predicted {pred[(r['op'], b)] * 1e6:9.1f} us, "
              f"measured {r['time_s'] * 1e6:9.1f} us, {e:+.1%}")
    every = [e for v in errs.values() for e in v]
    for (op, band), v in sorted(errs.items()):
        print(f"{op:14s} {band:10s}: {len(v)} sizes, MAPE {sum(map(abs, v)) / len(v):.1%}, "
              f"bias {sum(v) / len(v):+.1%}")
    if every:
        print(f"all: {len(every)} rows, MAPE {sum(map(abs, every)) / len(every):.1%}, "
              f"bias {sum(every) / len(every):+.1%}")
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--score", metavar="DATA.jsonl")
    a = ap.parse_args()
    raise SystemExit(score(a.score) if a.score else predict())
