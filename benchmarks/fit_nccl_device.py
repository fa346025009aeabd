"""How the network model's fixed cost per collective compares with device-bound timings, and
what a refit on those rows alone would give (issue 12; an analysis, nothing here is shipped).

    python -m benchmarks.fit_nccl_device [data/measured/h100x2-nccl-device/tuning.jsonl]

Data: ``data/measured/h100x2-nccl-device/`` (2x H100 NVSwitch, NCCL 2.28.9): all-gather,
reduce-scatter and all-to-all of 4 KiB - 256 MiB, ``timing: device`` rows only (the stream held
by a sleep kernel while the host enqueues, then the GPU runs the calls back to back; every row
``host_ahead``), on ``topologies/h100x2-nvswitch.yaml``. Printed per row and per size band
(<= 1 MiB, 4-64 MiB, >= 256 MiB) with MAPE and bias, for three variants of ``fabrics.yaml``:

* ``shipped``: as it is (since 2026-11-27 ``nccl.launch_us`` 8.2 us is fitted on these
  rows' all-gathers / reduce-scatters <= 1 MiB by ``calibrate network``, and NCCL's tuner picks
  the protocol; until then 25.6 us, set from host-synchronised and CUDA-event rows whose small
  sizes time the host's call rate);
* ``launch``: only ``launch_us`` refitted, on the all-gather / reduce-scatter rows <= 1 MiB
  (least squares in log time, 0.1 us grid);
* ``nccl-choice``: what NCCL's own log chose on this pair (``tuning-choices.jsonl``: ring/LL up
  to 512 KiB per rank, ring/Simple above, never LL128) with ``launch_us`` and the Simple
  intra-node ring step refitted together on all all-gather / reduce-scatter rows. The step
  stands for the Simple pipeline's fill (NCCL 2.28 ``enqueue.cc`` calcCollChunking: ring /
  Simple moves chunks of 4 buffer steps of 512 KiB, sliced in 2; nothing shrinks them for small
  messages), which the fluid model does not otherwise see.

All-to-all rows are printed with ``nccl.all_to_all.launch_extra_us`` set to 0 in the refitted
variants (its extra fixed cost was fitted beside the old launch).
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import numpy as np

from simulator.config.load import load_topology
from simulator.hardware.catalog import load_gpu
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology, load_fabrics

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data/measured/h100x2-nccl-device/tuning.jsonl"
TOPOLOGY = REPO / "topologies/h100x2-nvswitch.yaml"
RING_OPS = ("all_gather", "reduce_scatter")
BANDS = (("<= 1 MiB", 0, 2**20), ("4-64 MiB", 2**20 + 1, 2**26), (">= 256 MiB", 2**26 + 1, 2**40))


def variant(base: dict, launch_us: float, simple_step_us: float | None = None,
            ll128: bool = True, a2a_extra_us: float | None = None) -> dict:
    """``fabrics.yaml`` with the launch (and optionally the Simple ring step) replaced."""
    fab = copy.deepcopy(base)
    nccl = fab["nccl"]
    nccl["launch_us"] = launch_us
    if simple_step_us is not None:
        nccl["protocols"]["Simple"]["ring_step_us"]["intra"] = simple_step_us
    if not ll128:
        nccl["protocols"].pop("LL128")
    if a2a_extra_us is not None:
        nccl["all_to_all"]["launch_extra_us"] = a2a_extra_us
    return fab


def errors(topo: Topology, fab: dict, rows: list[dict]) -> list[tuple[dict, float, str]]:
    """(row, predicted / measured - 1, algorithm) per row, the pair as one group."""
    m = CollectiveModel(topo, fab)
    out = []
    for r in rows:
        c = m.cost(r["op"], [[0, 1]], float(r["bytes"]))
        out.append((r, c.time_s / r["time_s"] - 1.0, c.algorithm))
    return out


def loss(errs) -> float:
    return float(sum(np.log1p(e) ** 2 for _, e, _ in errs))


def fit(topo, base, rows, steps: tuple[float, ...] | None, ll128: bool, max_bytes: float):
    """Grid search: (launch_us, simple_step_us or None) minimising the squared log error of the
    ring rows up to ``max_bytes``."""
    sel = [r for r in rows if r["op"] in RING_OPS and r["bytes"] <= max_bytes]
    best = None
    for launch in np.arange(2.0, 30.01, 0.1):
        for step in steps or (None,):
            e = loss(errors(topo, variant(base, float(launch), step, ll128), sel))
            if best is None or e < best[0]:
                best = (e, round(float(launch), 1), step)
    return best[1], best[2]


def report(name: str, errs) -> None:
    print(f"\n{name}")
    for r, e, alg in errs:
        print(f"  {r['op']:<15} {r['bytes']:>10} B  measured {r['time_s'] * 1e6:7.1f} us  "
              f"{e * 100:+6.1f} %  {alg}")
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        for band, lo, hi in BANDS:
            es = [e for r, e, _ in errs if r["op"] == op and lo <= r["bytes"] <= hi]
            if es:
                print(f"  {op:<15} {band:<11} {len(es)} rows  MAPE {np.mean(np.abs(es)) * 100:5.1f} %"
                      f"  bias {np.mean(es) * 100:+6.1f} %")


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DATA
    rows = [r for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip())
            if r.get("timing") == "device" and r.get("host_ahead")]
    cfg = load_topology(TOPOLOGY)
    topo = Topology(cfg, load_gpu(cfg.gpu))
    base = dict(load_fabrics())
    report(f"shipped (launch_us {base['nccl']['launch_us']})", errors(topo, base, rows))
    launch, _ = fit(topo, base, rows, None, True, 2**20)
    report(f"launch: launch_us {launch} (rows <= 1 MiB), all_to_all extra 0",
           errors(topo, variant(base, launch, a2a_extra_us=0.0), rows))
    launch, step = fit(topo, base, rows, (2.8, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0), False, 2**40)
    report(f"nccl-choice: no LL128, launch_us {launch}, Simple ring step {step} us, "
           f"all_to_all extra 0",
           errors(topo, variant(base, launch, step, False, 0.0), rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
