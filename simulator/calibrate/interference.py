"""Refit ``nccl.compute_slowdown_beside_comm``, ``nccl.comm_slowdown_beside_compute`` and
``nccl.ep_pair_beside_experts`` (fabrics.yaml): how much slower a GEMM runs while an NCCL
kernel shares the GPU, and the collective beside compute, by GPU, operation, group and
message size; and both sides of an all-to-all beside expert GEMMs (combined 1F1B's pair).

Data:

* ``data/measured/h200x4/interference.jsonl`` (benchmarks/device/measure.py, part
  interference): an 8192^3 bf16 GEMM loop on the default stream, alone and beside a 256 MiB
  all-reduce / all-gather / reduce-scatter loop on a side stream, 4x H200. The compute
  constant is the mean GEMM slowdown over the three collectives, less one.
* ``data/measured/h100x4/comm_beside_compute-{auto,ring}.jsonl``
  (benchmarks/device/comm_beside_compute.py), 4x H100: each collective at 4, 32 and 256 MiB
  over groups of 4 and 2, alone and beside the same GEMM loop, once with NCCL's own algorithm
  and once with ``NCCL_ALGO=Ring``. The H100 table: per operation, group and size, the mean of
  the two runs' slowdown beside the GEMM, less one, floored at 0 (a collective does not run
  faster beside compute: the three points below 1, all at 4 MiB on pairs, are timing noise).
* ``data/measured/a2a-beside-compute-h100x4/*.jsonl`` (benchmarks/device/a2a_beside_compute.py),
  4x H100: NCCL ``all_to_all_single`` beside loops of expert-shaped GEMMs (every neighbour
  named ``expert*``; measured: DeepSeek-V3's expert fc1 at 4,096 rows in FP8), groups of 4
  and 2: ``ep_pair_beside_experts``, per group and size the mean over those neighbours of the
  all-to-all's slowdown and the GEMMs', less one, floored at 0.
* The H200 table: the H200 has one measured size (256 MiB, group 4). Its size and group
  dependence is the H100's (same GH100 die, 132 SMs, the same NCCL kernels), scaled per
  operation so that the 256 MiB group-4 point is the H200's own measurement.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict

from simulator.calibrate import REPO
from simulator.network.topology import load_fabrics

DATA = REPO / "data/measured/h200x4/interference.jsonl"
#: the all-to-all beside the MoE layers' expert GEMMs (benchmarks/device/a2a_beside_compute.py)
A2A_DATA = sorted((REPO / "data/measured/a2a-beside-compute-h100x4").glob("*.jsonl"))
H100_DATA = [REPO / f"data/measured/h100x4/comm_beside_compute-{t}.jsonl" for t in ("auto", "ring")]
MIB = 2**20


def rows() -> list[dict]:
    return [json.loads(x) for x in DATA.read_text().splitlines() if x.strip()]


def h100_rows() -> list[dict]:
    """The H100 measurements beside the GEMM loop (both runs)."""
    out = []
    for path in H100_DATA:
        out += [r for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip())
                if r["neighbour"] == "gemm"]
    return out


def tables() -> dict[str, dict[str, dict[int, list[list[float]]]]]:
    """{gpu: {op: {group: [[MiB, extra], ...]}}} as fabrics.yaml ships them (3 decimals)."""
    acc: dict[tuple, list[float]] = defaultdict(list)
    for r in h100_rows():
        acc[(r["op"], r["group"], r["bytes"] // MIB)].append(r["comm_slowdown"])
    h100: dict[str, dict[int, list[list[float]]]] = {}
    for (op, g, mib), v in sorted(acc.items()):
        extra = max(0.0, statistics.mean(v) - 1.0)
        h100.setdefault(op, {}).setdefault(g, []).append([mib, round(extra, 3)])
    h200: dict[str, dict[int, list[list[float]]]] = {}
    for r in rows():
        op = r["comm"]
        ref = dict((s, e) for s, e in h100[op][r["group"]])[r["comm_bytes"] // MIB]
        scale = (r["comm_slowdown"] - 1.0) / ref
        h200[op] = {g: [[s, round(e * scale, 3)] for s, e in pts] for g, pts in h100[op].items()}
    return {"H100-SXM-80GB": h100, "H200-SXM-141GB": h200}


def a2a_rows() -> list[dict]:
    """The all-to-all measured beside an expert-shaped GEMM loop (every neighbour whose name
    holds ``expert``, every file)."""
    out = []
    for path in A2A_DATA:
        out += [r for r in (json.loads(x) for x in path.read_text().splitlines() if x.strip())
                if "expert" in r.get("neighbour", "") and "comm_slowdown" in r]
    return out


def ep_pair_table() -> dict[str, dict[int, list[list[float]]]]:
    """``nccl.ep_pair_beside_experts`` of the H100 as fabrics.yaml ships it: per group and
    size (MiB a rank sends), the mean over the expert GEMM neighbours of the all-to-all's
    extra fraction (``all_to_all``) and the GEMMs' (``experts``), less one, floored at 0
    (3 decimals)."""
    acc: dict[tuple, list[dict]] = defaultdict(list)
    for r in a2a_rows():
        acc[(r["group"], r["bytes"] // MIB)].append(r)
    out: dict[str, dict[int, list[list[float]]]] = {"all_to_all": {}, "experts": {}}
    for (g, mib), rr in sorted(acc.items()):
        for key, field in (("all_to_all", "comm_slowdown"), ("experts", "neighbour_slowdown")):
            extra = max(0.0, statistics.mean(r[field] for r in rr) - 1.0)
            out[key].setdefault(g, []).append([mib, round(extra, 3)])
    return out


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}, rounded to 3 decimals as shipped: the GEMM's mean
    slowdown, and every point of each GPU's collective table."""
    nccl = load_fabrics()["nccl"]
    slow = statistics.mean(r["gemm_with_comm_s"] / r["gemm_alone_s"] for r in rows())
    out = {"compute_slowdown_beside_comm": (round(slow - 1.0, 3),
                                            float(nccl["compute_slowdown_beside_comm"]))}
    shipped = nccl["comm_slowdown_beside_compute"]
    for gpu, by_op in tables().items():
        for op, by_group in by_op.items():
            for g, pts in by_group.items():
                have = dict((s, e) for s, e in shipped[gpu][op][g])
                for s, e in pts:
                    out[f"{gpu}.{op}.g{g}.{s}MiB"] = (e, float(have.get(s, float("nan"))))
    pair = nccl["ep_pair_beside_experts"]["H100-SXM-80GB"]
    for key, by_group in ep_pair_table().items():
        for g, pts in by_group.items():
            have = dict((s, e) for s, e in pair[key][g])
            for s, e in pts:
                out[f"ep_pair.{key}.g{g}.{s}MiB"] = (e, float(have.get(s, float("nan"))))
    return out


if __name__ == "__main__":
    import yaml

    print(yaml.safe_dump(tables(), default_flow_style=None, sort_keys=False))
    print(yaml.safe_dump({"ep_pair_beside_experts": {"H100-SXM-80GB": ep_pair_table()}},
                         default_flow_style=None, sort_keys=False))
