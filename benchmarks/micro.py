"""Speed of the simulator's inner pieces (printed, never asserted: wall time depends on the
machine and on what else runs on it, so it has no place in pytest).

    python benchmarks/micro.py

Prints the wall time of: 100,000 GEMM-time evaluations; pricing a 128-node ring all-reduce
for 8 concurrent groups, and asking for it again (memoised); building a 16,384-GPU fat tree,
listing its links, and 10,000 cached route look-ups; planning Llama-2-70B on 1,024 GPUs.
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from simulator.config.load import load_workload
from simulator.config.schema import TopologyConfig
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology
from simulator.plan import plan

ROOT = Path(__file__).resolve().parents[1]


def timed(label: str, fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    print(f"{label:<52} {time.perf_counter() - t0:9.4f} s")
    return out


def main() -> None:
    h100 = load_gpu("H100-SXM-80GB")
    cm = ComputeModel(load_gpu("H200-SXM-141GB"))
    timed("100,000 gemm_s calls", lambda: [cm.gemm_s(4096, 8192, 1024 + 128 * (i % 64))
                                          for i in range(100_000)])
    cfg = yaml.safe_load((ROOT / "topologies" / "dgx-h100-ndr-fattree.yaml").read_text())
    cfg.update(nodes=128, gpus_per_node=8)
    m = CollectiveModel(Topology(TopologyConfig(**cfg), h100))
    groups = [[n * 8 + r for n in range(128)] for r in range(8)]
    timed("ring all-reduce, 8 groups of 128 nodes, first", m.cost, "all_reduce", groups,
          2.0**30, "ring")
    timed("the same again (memoised)", m.cost, "all_reduce", groups, 2.0**30, "ring")
    big = {"name": "t", "gpu": "H100-SXM-80GB", "nodes": 2048, "gpus_per_node": 8,
           "nics_per_node": 8, "nodes_per_leaf": 32}
    t = timed("16,384-GPU fat tree built", lambda: Topology(TopologyConfig(**big), h100))
    timed("its graph's edges counted", lambda: t.graph.number_of_edges())
    t.route(5, 16383)
    timed("10,000 cached route look-ups", lambda: [t.route(5, 16383) for _ in range(10_000)])
    loaded = load_workload(ROOT / "workloads" / "llama70b.yaml")
    timed("plan llama70b on 1,024 GPUs (top 5)", lambda: plan(loaded, 1024, top=5))


if __name__ == "__main__":
    main()
