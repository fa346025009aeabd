"""Print NCCL all-to-all's fit (``simulator/network/fabrics.yaml`` ``nccl.all_to_all``) against
every measured ``all_to_all_single`` timing of the fit set, the held-back rows included.

    python benchmarks/fit_alltoall.py [data/calibration/h100x4-nvswitch/alltoall.jsonl]

Data: CUDA-event timing, bf16, 4 KiB - 1 GiB, groups of 4 and of 2 (two pairs at once), uniform
and uneven splits (``data/calibration/h100x4-nvswitch/README.md`` says how it was measured).

The constants are fitted by ``python -m simulator.calibrate alltoall``
(:mod:`simulator.calibrate.alltoall`: ten together since 2026-11-27 night, on rows the device
bounds, the uniform ones here >= 16 MiB; the rows <= 256 KiB time the host's call interval);
this script prints that fit against every row (the uneven ones by ``all_to_all_v``, parts on
16 bytes: the misaligned rows' narrow copies are ``validate``'s, ``all_to_all_table``).

The uneven (``rotated``, ``hot``) rows are printed as a check of the busiest-receiver rule
(:meth:`CollectiveModel.all_to_all_v`, with 16-byte copies), with whether every split's
offset in the send and receive buffers is a multiple of 16 bytes (``aligned``); the misaligned
ones >= 64 MiB fit the narrow copies' rate (``python -m simulator.calibrate unaligned``,
:mod:`simulator.network.alignment`).

What makes the uneven rows slow (found on this data, 2026-11-26): **misaligned split
offsets**, not the uneven split itself. ``benchmarks/device/comm.py`` cuts ``elems`` bf16
elements in proportions 7:3, 55:15:15:15 or 4:3:2:1, so the chunk boundaries fall on
2-byte multiples; NCCL's copy primitives move 16-byte vectors only when source and
destination share that alignment and fall back to narrower loads otherwise. Exactly the rows
with misaligned offsets (group 4 rotated and hot, group 2 hot) run 1.5-2.8x slower than the
uniform rows of the same size at >= 64 MiB, while group 2 rotated (3:1, every offset a
multiple of 16 B) takes no longer than uniform. An MoE dispatch splits whole tokens of
``hidden`` x 2 bytes (a multiple of 16 B for every shipped model), so its offsets are always
aligned: the misaligned rows say nothing about MoE steps and the model keeps the busiest
receiver. What the aligned group-2 rotated row does show: at 1 GiB the exchange takes as long
as the uniform one although it moves half the bytes over NVLink, because each rank's share
for itself (3/4 of the buffer) is copied through the same NCCL channels (about 525 GB/s);
the model counted that copy in the exchange's local work from 2026-11-26 (NCCL copies a
rank's own share on the same kernel, src/device/sendrecv.h; the aligned uneven rows >= 64 MiB,
not fitted, went from -17 % to -1.5 % on average), and since 2026-11-27 night as one of the
kernel's pieces of work on its channels (:mod:`simulator.network.p2p`).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import yaml

from simulator.calibrate import alltoall as calibrate_alltoall
from simulator.config.schema import TopologyConfig
from simulator.hardware.catalog import load_gpu
from simulator.network.alignment import HOT, split_table
from simulator.network.alignment import ROTATED as ROT
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data/calibration/h100x4-nvswitch/alltoall.jsonl"
TOPO = ROOT / "topologies/h100x4-nvswitch.yaml"


def groups_of(n: int) -> list[list[int]]:
    return [[0, 1, 2, 3]] if n == 4 else [[0, 1], [2, 3]]


def predict(cm: CollectiveModel, row: dict) -> float:
    """Predicted time of one measured row (the slowest rank's)."""
    n, S, kind = row["group"], float(row["bytes"]), row["splits"]
    if kind == "uniform":
        return cm.cost("all_to_all", groups_of(n), S).time_s
    if kind == "hot":
        return cm.all_to_all_v(groups_of(n), S, [x / sum(HOT[n]) for x in HOT[n]]).time_s
    # rotated: rank i sends W[(j - i) mod n] / sum(W) to rank j
    W = ROT[n]
    share = [[W[(j - i) % n] / sum(W) for j in range(n)] for i in range(n)]
    return cm.all_to_all_v(groups_of(n), S, share).time_s


def aligned(row: dict, quantum: int = 16) -> bool:
    """Whether every split offset of the row's send and receive buffers (as
    ``benchmarks/device/comm.py`` cuts them: ``simulator.calibrate.unaligned.split_table``) is a
    multiple of ``quantum`` bytes."""
    n = row["group"]
    table = split_table(row["splits"], n, row["bytes"])
    for r in range(n):
        for sizes in (table[r], [table[s][r] for s in range(n)]):
            off = 0.0
            for x in sizes:
                if off % quantum:
                    return False
                off += x
    return True


def fit() -> tuple[float, float]:
    """(launch_extra_s, bandwidth_fraction) as ``python -m simulator.calibrate alltoall`` fits them."""
    new = calibrate_alltoall.fit()
    return new["launch_extra_us"] * 1e-6, new["bandwidth_fraction"]


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DATA
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    cfg = TopologyConfig(**yaml.safe_load(TOPO.read_text()))
    topo = Topology(cfg, load_gpu(cfg.gpu))
    extra, frac = fit()
    print(f"launch_extra_us: {extra * 1e6:.1f}\nbandwidth_fraction: {frac:.3f}")
    cm = CollectiveModel(topo)
    cm.a2a_launch_extra_s, cm.a2a_bw_fraction = extra, frac
    print(f"{'n':>2} {'splits':8} {'bytes':>11} {'measured us':>12} {'predicted us':>12} "
          f"{'error':>7} aligned")  # fmt: skip
    big: dict[bool, list[float]] = {True: [], False: []}
    for r in rows:
        p = predict(cm, r)
        print(f"{r['group']:>2} {r['splits']:8} {r['bytes']:>11} {r['time_s'] * 1e6:12.1f} "
              f"{p * 1e6:12.1f} {p / r['time_s'] - 1:+7.1%} {aligned(r)}")  # fmt: skip
        if r["splits"] != "uniform" and r["bytes"] >= 64 * 2**20:
            big[aligned(r)].append(p / r["time_s"] - 1)
    for ok, errs in big.items():
        if errs:
            print(f"uneven >= 64 MiB, offsets {'aligned' if ok else 'misaligned'}: {len(errs)} "
                  f"rows, mean error {statistics.mean(errs):+.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
