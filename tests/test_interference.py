"""A collective's slowdown beside compute (simulator/network/interference.py) against the
measured points it comes from, and its interpolation between them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulator.engine.program import Part, beside_time, program_time
from simulator.network.interference import MIB, extra_fraction, slowdown_fn, table_for
from simulator.network.topology import load_fabrics

DATA = Path(__file__).resolve().parents[1] / "data/measured"


def _measured_h100() -> dict[tuple, list[float]]:
    out: dict[tuple, list[float]] = {}
    for tag in ("auto", "ring"):
        for line in (DATA / f"h100x4/comm_beside_compute-{tag}.jsonl").read_text().splitlines():
            r = json.loads(line)
            if r["neighbour"] == "gemm":
                key = (r["op"], r["bytes"], r["group"])
                out.setdefault(key, []).append(r["comm_beside_s"] / r["comm_alone_s"])
    return out


NCCL = load_fabrics()["nccl"]


def test_h100_function_passes_through_every_measured_point():
    f = slowdown_fn(NCCL, "H100-SXM-80GB")
    points = _measured_h100()
    assert len(points) == 18  # 3 operations x 3 sizes x groups of 2 and 4
    for (op, nbytes, group), ratios in points.items():
        want = max(0.0, sum(ratios) / len(ratios) - 1.0)
        assert f(op, nbytes, group) == pytest.approx(want, abs=6e-4), (op, nbytes, group)


def test_large_messages_over_four_h100_are_slowed_most():
    """The data's shape: at most +11 % up to 32 MiB, over +50 % at 256 MiB over 4 GPUs."""
    f = slowdown_fn(NCCL, "H100-SXM-80GB")
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        assert max(f(op, s * MIB, g) for s in (4, 32) for g in (2, 4)) < 0.11
        assert f(op, 256 * MIB, 4) > 0.5


def test_h200_keeps_its_own_measured_point():
    f = slowdown_fn(NCCL, "H200-SXM-141GB")
    for line in (DATA / "h200x4/interference.jsonl").read_text().splitlines():
        r = json.loads(line)
        want = r["comm_with_gemm_s"] / r["comm_alone_s"] - 1.0
        assert f(r["comm"], r["comm_bytes"], r["group"]) == pytest.approx(want, abs=6e-4)


def test_log_linear_between_sizes_and_flat_beyond():
    table = {"all_reduce": {2: [[4, 0.1], [256, 0.7]], 4: [[4, 0.2], [64, 0.6]]}}
    mid = math.sqrt(4 * 256) * MIB  # halfway in log size
    assert extra_fraction(table, "all_reduce", mid, 2) == pytest.approx(0.4)
    assert extra_fraction(table, "all_reduce", 1 * MIB, 2) == pytest.approx(0.1)
    assert extra_fraction(table, "all_reduce", 4096 * MIB, 2) == pytest.approx(0.7)
    # 16 MiB is half-way from 4 to 64 MiB in log size
    assert extra_fraction(table, "all_reduce", 16 * MIB, 4) == pytest.approx(0.4)
    # groups: 3 uses the pairs' curve, 8 the largest measured (4), 1 the smallest
    assert extra_fraction(table, "all_reduce", 4 * MIB, 3) == pytest.approx(0.1)
    assert extra_fraction(table, "all_reduce", 4 * MIB, 8) == pytest.approx(0.2)
    assert extra_fraction(table, "all_reduce", 4 * MIB, 1) == pytest.approx(0.1)
    assert extra_fraction(table, "all_to_all", 4 * MIB, 4) == 0.0


def test_unmeasured_gpus_inherit_the_h100_table():
    assert table_for(NCCL, "B200") == table_for(NCCL, "H100-SXM-80GB")
    assert table_for(NCCL, "custom-gpu") == table_for(NCCL, "H100-SXM-80GB")
    assert table_for(NCCL, "H200-SXM-141GB") != table_for(NCCL, "H100-SXM-80GB")


@pytest.mark.parametrize("i", [0.0, 0.144, 1.0])
def test_kernel_is_slowed_only_while_the_collective_runs(i):
    """A kernel of d seconds beside a collective of c seconds: all of it slowed when c covers
    it (d (1 + i)), none without a collective (d), and in between the work done beside the
    collective, c / (1 + i), at the slow rate and the rest alone: c + d - c / (1 + i)."""
    d = 2.0
    assert beside_time(d, 0.0, i) == d
    assert beside_time(d, 10.0, i) == pytest.approx(d * (1 + i), rel=1e-15)
    assert beside_time(d, d * (1 + i), i) == pytest.approx(d * (1 + i), rel=1e-15)
    for c in (0.3, 1.0, d):
        assert beside_time(d, c, i) == pytest.approx(c + d - c / (1 + i), rel=1e-15)
    # as the engine prices a program: a kernel after an overlapping collective
    prog = (Part("ag", "comm", 1.0, op="all_gather", overlap_next=True, dim="tp"),
            Part("gemm", "compute", d))  # fmt: skip
    total, comp, exposed = program_time(prog, interference=i)
    assert total == comp == pytest.approx(1.0 + d - 1.0 / (1 + i), rel=1e-15)
    assert dict(exposed).get("tp", 0.0) == 0.0
