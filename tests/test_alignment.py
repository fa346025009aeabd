"""NCCL's narrow copies (simulator/network/alignment.py): which stores go narrow, worked out by
hand from NCCL's ring and send/receive steps, and how validate prices them."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.calibrate import unaligned
from simulator.config.load import load_topology
from simulator.hardware.catalog import load_gpu
from simulator.network.alignment import (
    a2a_stores,
    comm_share_elems,
    measured_stores,
    narrow_time,
    ring_stores,
    split_table,
)
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology
from simulator.validate import timed_collective_s

ROOT = Path(__file__).resolve().parents[1]


def _model(name: str) -> CollectiveModel:
    cfg = load_topology(ROOT / "topologies" / f"{name}.yaml")
    return CollectiveModel(Topology(cfg, load_gpu(cfg.gpu)))


def test_ring_blocks_off_the_boundary_in_a_group_of_three():
    c = 16 * 1000 + 4  # a share 4 bytes off: blocks 1 and 2 start off the boundary, block 0 on
    # all-gather, rank 2: own block 2 (2 stores, narrow), block 1 (2, narrow), block 0 (1, wide)
    assert ring_stores("all_gather", 3, c) == (4 * c, c)
    # reduce-scatter, rank 1: block 0 (wide), block 2 (narrow), own block 1 (narrow)
    assert ring_stores("reduce_scatter", 3, c) == (2 * c, c)


def test_ring_blocks_in_a_group_of_four_eight_bytes_off():
    c = 16 * 1000 + 8  # blocks 1 and 3 off, 0 and 2 on
    # rank 1: own block 1 (2, narrow), block 0 (2, wide), block 3 (2, narrow), block 2 (1, wide)
    assert ring_stores("all_gather", 4, c) == (4 * c, 3 * c)


def test_aligned_shares_store_everything_wide():
    for n in (2, 3, 4, 8):
        c = 16 * 4096
        assert ring_stores("all_gather", n, c) == (0, (2 * n - 1) * c)
        assert ring_stores("reduce_scatter", n, c) == (0, n * c)
        assert a2a_stores([[c] * n for _ in range(n)]) == (0, (2 * n - 1) * c)
    with pytest.raises(ValueError):
        ring_stores("all_reduce", 3, 100)


def test_uniform_all_to_all_of_three():
    c = 16 * 1000 + 4
    # rank 0: its own share at offset 0 in both buffers (wide), two sends and two receives at
    # offsets c and 2c (narrow)
    assert a2a_stores([[c] * 3 for _ in range(3)]) == (4 * c, c)


def test_measured_layout_follows_the_measuring_script():
    # comm.py: el = 2^29 bf16 elements less el % 3, el // 3 a rank
    assert comm_share_elems(2**30, 3) == (2**29 - 2**29 % 3) // 3
    share = comm_share_elems(2**30, 3) * 2
    assert share % 16 == 4
    assert measured_stores("all_gather", 3, 2**30) == ring_stores("all_gather", 3, share)
    # powers of two in groups of 2 and 4, and every all-reduce: nothing narrow
    for n in (2, 4):
        for op in ("all_gather", "reduce_scatter", "all_to_all"):
            assert measured_stores(op, n, 6144 * 4**3)[0] == 0
    assert measured_stores("all_reduce", 3, 2**30) == (0.0, 0.0)


def test_narrow_time_closed_form_and_validate_uses_it():
    m = _model("h200x4-nvswitch")
    cost = m.cost("all_gather", [[0, 1, 2]], 2.0**30)
    narrow, wide = measured_stores("all_gather", 3, 2**30)
    expected = (
        cost.launch_s
        + (cost.time_s - cost.launch_s) * wide / (narrow + wide)
        + narrow / m.unaligned_Bps
    )
    assert narrow_time(cost, (narrow, wide), m.unaligned_Bps) == pytest.approx(expected)
    assert timed_collective_s(m, "all_gather", [[0, 1, 2]], 2.0**30, "device") == pytest.approx(
        expected
    )
    assert expected > cost.time_s  # the narrow path is slower than the wide one here
    # aligned rows and all-reduce are priced as before
    for op, groups in (("all_gather", [[0, 1, 2, 3]]), ("all_reduce", [[0, 1, 2]])):
        assert (
            timed_collective_s(m, op, groups, 2.0**28, "device")
            == m.cost(op, groups, 2.0**28).time_s
        )
    assert narrow_time(cost, (0.0, wide), m.unaligned_Bps) == cost.time_s


def test_unaligned_rate_is_fitted_on_the_fit_sets_misaligned_rows_only():
    data = unaligned.rows()
    # group 4 rotated and hot, group 2 hot at 64 MiB, 256 MiB and 1 GiB
    assert sorted((r["group"], r["splits"]) for r, *_ in data) == sorted(
        [(4, "rotated")] * 3 + [(4, "hot")] * 3 + [(2, "hot")] * 3
    )
    # the 3:1 split of a pair keeps every offset on the boundary: comm.py's aligned uneven rows
    assert a2a_stores(split_table("rotated", 2, 2**26))[0] == 0
    refit, shipped = unaligned.refit()["unaligned_copy_GBps"]
    assert refit == shipped
