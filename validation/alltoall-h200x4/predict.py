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
import json
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "predictions.yaml"
SIZES = [4096 * 4**i for i in range(11)]  # 4 KiB .. 4 GiB; comm.py stops at --max-bytes


def predict() -> int:
    if OUT.exists():
        print(f"{OUT} exists: predictions are made once, before measuring", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    from simulator.config.load import load_topology
    from simulator.hardware.catalog import load_gpu
    from simulator.network.collectives import CollectiveModel
    from simulator.network.topology import Topology

    cfg = load_topology(ROOT / "topologies/h200x4-nvswitch.yaml")
    coll = CollectiveModel(Topology(cfg, load_gpu(cfg.gpu)))
    rows = []
    for g in (4, 2):
        groups = [list(range(i, i + g)) for i in range(0, 4, g)]
        for b in SIZES:
            rows.append({"op": "all_to_all", "group": g, "bytes": b,
                         "predicted_s": float(coll.cost("all_to_all", groups, b).time_s)})
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    OUT.write_text(yaml.safe_dump({"commit": commit, "topology": "topologies/h200x4-nvswitch.yaml",
                                   "splits": "uniform", "timing": "events", "rows": rows},
                                  sort_keys=False))
    print(f"wrote {OUT} ({len(rows)} rows) at {commit}")
    return 0


def score(data: str) -> int:
    pred = {(r["group"], r["bytes"]): r["predicted_s"]
            for r in yaml.safe_load(OUT.read_text())["rows"]}
    errs: dict[tuple[int, str], list[float]] = {}
    for line in open(data):
        r = json.loads(line)
        if r.get("op") != "all_to_all" or r.get("splits", "uniform") != "uniform":
            continue
        if r.get("timing", "events") != "events" or (r["group"], r["bytes"]) not in pred:
            continue
        b = r["bytes"]
        band = "<= 1 MiB" if b <= 2**20 else "4-64 MiB" if b <= 64 * 2**20 else ">= 256 MiB"
        e = pred[(r["group"], b)] / r["time_s"] - 1.0
        errs.setdefault((r["group"], band), []).append(e)
        print(f"group {r['group']} {b:>11d} B: predicted {pred[(r['group'], b)] * 1e6:9.1f} us, "
              f"measured {r['time_s'] * 1e6:9.1f} us, {e:+.1%}")
    every = [e for v in errs.values() for e in v]
    for (g, band), v in sorted(errs.items()):
        print(f"group {g} {band:10s}: {len(v)} sizes, MAPE {sum(map(abs, v)) / len(v):.1%}, "
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
