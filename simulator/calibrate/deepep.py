"""Refit ``DEEPEP_RATE`` (``simulator/engine/dispatch.py``): the share of the modelled link
rate DeepEP's normal dispatch and combine kernels reach.

Data: ``data/published/deepep-v1-h800/normal.jsonl``, DeepEP's README figures for its V1
normal kernels (deepseek-ai/DeepEP ``docs/legacy.md``): H800 (NVLink ~160 GB/s achievable),
one CX7 InfiniBand 400 Gb/s NIC a GPU, DeepSeek-V3's pretraining setting (4,096 tokens a rank,
hidden 7,168, top-8 of 256 experts in 4 of 8 groups, FP8 dispatch with a 4-byte scale per 128
values, BF16 combine), a "bottleneck bandwidth" per kernel: intranode EP 8 over NVLink, the
bytes each GPU receives (its own tokens included); internode EP 16, 32, 64 over RDMA, the
token vectors sent per destination node (the source's own node included: "logical
bandwidth", as DeepEP's V2 README says of its own figures).

For each figure, the README's time is those bytes over its bandwidth, with the token counts
in expectation under the simulator's routing model (:mod:`simulator.model.moe_routing`:
distinct GPUs or nodes a token reaches); the model's time is :func:`routed_cost` at rate 1 on
``workloads/deepseek-v3.yaml``'s H800 topology for EP groups of consecutive GPUs. The rate is
the median over the eight of model / README (a median: the EP 16 figures are half the others'
share, and DeepEP's V2 README reaches 90 GB/s on the same 2 x 8 layout).
No validation suite is read here.
"""

from __future__ import annotations

import statistics
from functools import lru_cache

from simulator.calibrate import REPO, jsonl
from simulator.engine import dispatch
from simulator.model.moe_routing import hit_probabilities

DATA = REPO / "data/published/deepep-v1-h800/normal.jsonl"
WORKLOAD = REPO / "workloads/deepseek-v3.yaml"
TOKENS = 4096
#: bytes a value: FP8 with one fp32 scale per 128 values (DeepEP's test), BF16
BYTES = {"fp8": 1 + 4 / 128, "bf16": 2.0}


@lru_cache(maxsize=1)
def _setting():
    from simulator.config.load import load_workload
    from simulator.run import make_machine

    loaded = load_workload(WORKLOAD)
    return loaded.workload.model, make_machine(loaded).collectives


def ratios() -> list[tuple[dict, float, float]]:
    """(figure, model seconds at rate 1, README seconds) for every figure of the file."""
    model, coll = _setting()
    h = model.hidden
    out = []
    for r in jsonl(DATA):
        ep, b = r["ep"], BYTES[r["dtype"]]
        group = list(range(ep))
        units = tuple(coll.topology.node_of(g) for g in group)
        ranks, nodes = hit_probabilities(model.moe, ep, units)
        if r["bottleneck"] == "nvlink":  # bytes a GPU receives, its own tokens included
            vectors = ep * ranks[0]
        else:  # token vectors sent per destination node, its own node included
            vectors = sum(nodes.values())
        readme = TOKENS * vectors * h * b / (r["logical_GBps"] * 1e9)
        t = dispatch.routed_cost(coll, model.moe, [group], TOKENS * h * b, rate=1.0).time_s
        out.append((r, t, readme))
    return out


def fit() -> float:
    return statistics.median(t / readme for _, t, readme in ratios())


def refit() -> dict[str, tuple[float, float]]:
    return {"DEEPEP_RATE": (round(fit(), 4), dispatch.DEEPEP_RATE)}
