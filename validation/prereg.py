"""Shared by the pre-registered collective predictions (``validation/*/predict.py``): write the
frozen predictions once, with the commit they were made at, and score a measurement against
them (MAPE and bias per label and size band, the way the suites report them)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
SIZES = [4096 * 4**i for i in range(11)]  # 4 KiB .. 4 GiB; comm.py stops at --max-bytes


def collective_model(topology: str):
    """The simulator's collective model of the topology file ``topology`` (relative to the
    repository): ``.cost(op, groups, nbytes).time_s``."""
    sys.path.insert(0, str(ROOT))
    from simulator.config.load import load_topology
    from simulator.hardware.catalog import load_gpu
    from simulator.network.collectives import CollectiveModel
    from simulator.network.topology import Topology

    cfg = load_topology(ROOT / topology)
    return CollectiveModel(Topology(cfg, load_gpu(cfg.gpu)))


def band(nbytes: int) -> str:
    """The size band of a collective (as the collectives suites group them)."""
    return "<= 1 MiB" if nbytes <= 2**20 else "4-64 MiB" if nbytes <= 64 * 2**20 else ">= 256 MiB"


def write(out: Path, topology: str, rows: list[dict]) -> int:
    """Write ``rows`` (op, group, bytes, predicted_s) to ``out`` once; never rewrite it."""
    if out.exists():
        print(f"{out} exists: predictions are made once, before measuring", file=sys.stderr)
        return 2
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    splits = sorted({_splits(r) for r in rows})
    out.write_text(yaml.safe_dump({"commit": commit, "topology": topology,
                                   "splits": splits[0] if len(splits) == 1 else splits,
                                   "timing": "events", "rows": rows}, sort_keys=False))
    print(f"wrote {out} ({len(rows)} rows) at {commit}")
    return 0


def _splits(r: dict) -> str:
    """A row's all-to-all splits; ``uniform`` for every other operation (comm.py writes '-')."""
    return "uniform" if r.get("splits") in (None, "-") else r["splits"]


def score(out: Path, data: str, label: Callable[[dict], str], timing: str = "events") -> int:
    """Print each measured row of ``data`` (comm.py JSON lines timed as ``timing``: CUDA events
    after every call, or ``loop``) that has a frozen prediction in ``out`` (same operation,
    group, bytes and splits), then MAPE and bias per (label, size band)."""
    pred = {(r["op"], r["group"], r["bytes"], _splits(r)): r["predicted_s"]
            for r in yaml.safe_load(out.read_text())["rows"]}
    errs: dict[tuple[str, str], list[float]] = {}
    for line in open(data):
        r = json.loads(line)
        key = (r.get("op"), r.get("group"), r.get("bytes"), _splits(r))
        if key not in pred:
            continue
        if r.get("timing", "events") != timing:
            continue
        e = pred[key] / r["time_s"] - 1.0
        errs.setdefault((label(r), band(r["bytes"])), []).append(e)
        print(f"{label(r):14s} {r['bytes']:>11d} B: predicted {pred[key] * 1e6:9.1f} us, "
              f"measured {r['time_s'] * 1e6:9.1f} us, {e:+.1%}")
    every = [e for v in errs.values() for e in v]
    for (name, b), v in sorted(errs.items()):
        print(f"{name:14s} {b:10s}: {len(v)} sizes, MAPE {sum(map(abs, v)) / len(v):.1%}, "
              f"bias {sum(v) / len(v):+.1%}")
    if every:
        print(f"all: {len(every)} rows, MAPE {sum(map(abs, every)) / len(every):.1%}, "
              f"bias {sum(every) / len(every):+.1%}")
    return 0
