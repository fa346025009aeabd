"""Pre-register the simulator's predictions for the held-out cases, once, at a frozen tag.

    git worktree add /tmp/frozen heldout-freeze-1
    python validation/heldout/predict.py --checkout /tmp/frozen --tag heldout-freeze-1

runs ``python -m simulator run CASE --topology T --json --no-files`` inside the frozen checkout
for every ``ho_*.yaml`` beside this file and each 4-GPU box the device service may lend
(4x H100 and 4x H200 NVSwitch; the measurement is compared on the box it ran on), and writes
``predictions-<tag>.yaml`` here with the tag's commit id. Run it before measuring, never after.
``--dir``, ``--glob`` and ``--boxes`` point it at another case folder (e.g. the 8-GPU cases of
``validation/node8``: ``--dir validation/node8 --glob 'x8_*.yaml' --boxes
h100x8=topologies/h100x8-nvswitch.yaml,h200x8=topologies/h200x8-nvswitch.yaml``); the
topologies must exist in the frozen checkout. An existing predictions file is never rewritten.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
TOPOLOGIES = {"h100x4": "topologies/h100x4-nvswitch.yaml",
              "h200x4": "topologies/h200x4-nvswitch.yaml"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkout", required=True, help="worktree of the frozen tag")
    ap.add_argument("--tag", required=True)
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--dir", default=str(HERE), help="folder of the case YAMLs (and the output)")
    ap.add_argument("--glob", default="ho_*.yaml")
    ap.add_argument("--boxes", default=",".join(f"{k}={v}" for k, v in TOPOLOGIES.items()),
                    help="name=topology path in the checkout, comma-separated")
    ap.add_argument("--suffix", default="",
                    help="write predictions-<tag><suffix>.yaml (cases registered later; never "
                         "rewrite an earlier file)")
    args = ap.parse_args()
    co = Path(args.checkout).resolve()
    commit = subprocess.run(["git", "-C", str(co), "rev-parse", "HEAD"], check=True,
                            capture_output=True, text=True).stdout.strip()
    src = Path(args.dir).resolve()
    dest = co / "validation" / src.name
    boxes = dict(b.split("=", 1) for b in args.boxes.split(","))
    dest.mkdir(parents=True, exist_ok=True)
    out = {"tag": args.tag, "commit": commit,
           "predicted_utc": datetime.datetime.now(datetime.timezone.utc).strftime(
               "%Y-%m-%dT%H:%M:%SZ"),
           "command": "python -m simulator run CASE.yaml --topology T --json --no-files "
                      "(in a checkout of the tag)",
           "cases": {}}
    only = set(args.only.split(",")) if args.only else None
    for case in sorted(src.glob(args.glob)):
        if only is not None and case.stem not in only:
            continue
        shutil.copy(case, dest / case.name)
        row = {}
        for box, topo in boxes.items():
            p = subprocess.run([sys.executable, "-m", "simulator", "run",
                                f"validation/{src.name}/{case.name}", "--topology", topo, "--json",
                                "--no-files"], cwd=co, capture_output=True, text=True)
            if p.returncode != 0:
                row[box] = {"error": (p.stderr or p.stdout).strip().splitlines()[-1]}
                continue
            s = json.loads(p.stdout)
            row[box] = {"step_time_s": round(s["step_time_s"], 5),
                        "peak_memory_gib": round(s["memory_gib"]["allocated"], 3),
                        "fits": s.get("fits")}
        out["cases"][case.stem] = row
        print(case.stem, row, flush=True)
    path = src / f"predictions-{args.tag}{args.suffix}.yaml"
    if path.exists():
        print(f"error: {path} exists: predictions are made once", file=sys.stderr)
        return 2
    path.write_text("# Written once by predict.py at the frozen tag, before any measurement.\n"
                    + yaml.safe_dump(out, sort_keys=False))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
