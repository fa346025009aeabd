"""Reduce the device call's per-rank files (sync_segments-w{world}-{label}-r{rank}.jsonl, written
by benchmarks/device/sync_segments.py) to what the calibration reads, in microseconds:
``segments.jsonl.gz``, one row per (world, label, round, mode, k, rank) with per step ``wall``,
``cpu``, ``issue`` (each segment's host time from its start to its count exchange issued) and
``wait`` (from then until the sizes' read returned: 0 without a read), and ``gpu_lag`` (the
GPU's lag behind the host at each segment's start, median of the step). Usage:
``python compact.py RAW_DIR`` (writes beside this file)."""

import glob
import gzip
import json
import os
import statistics
import sys

rows = []
for path in sorted(glob.glob(os.path.join(sys.argv[1], "sync_segments-w*-r*.jsonl"))):
    for line in open(path):
        d = json.loads(line)
        steps = []
        for s in d["steps"]:
            lag = [g - h for g, h in zip(s["g_start"], s["h_start"])]
            steps.append({
                "wall": round(s["wall_s"] * 1e6, 1), "cpu": round(s["cpu_s"] * 1e6, 1),
                "issue": [round((b - a) * 1e6, 1) for a, b in zip(s["h_start"], s["h_issue"])],
                "wait": [round((b - a) * 1e6, 1) for a, b in zip(s["h_issue"], s["h_ret"])],
                "gpu_lag": round(statistics.median(lag) * 1e6, 1) if lag else None})
        rows.append({k: d[k] for k in ("world", "label", "round", "mode", "k", "ops", "rank")}
                    | {"steps": steps})
rows.sort(key=lambda r: (r["world"], r["label"], r["round"], r["mode"], r["k"], r["rank"]))
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "segments.jsonl.gz")
with gzip.GzipFile(out, "wb", mtime=0) as f:
    f.write("".join(json.dumps(r) + "\n" for r in rows).encode())
print(out, len(rows))
