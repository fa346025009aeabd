"""NCCL's p2p layout of an all-to-all (simulator/network/p2p.py) against numbers worked out by
hand from NCCL 2.28's rules, and the refits of its warp rates and of the per-kind host interval
(gpus.yaml host_events_peer_s)."""

from __future__ import annotations

import pytest

from simulator.calibrate import network, p2p
from simulator.config.load import load_topology
from simulator.hardware.catalog import load_gpu
from simulator.network.collectives import CollectiveModel
from simulator.network.p2p import (
    P2pLayout,
    WarpRates,
    narrow_parts,
    part_bytes,
    parts,
    round_base,
    warp_time,
)
from simulator.network.topology import Topology

MiB = 2**20
H100 = P2pLayout(channels=32, per_peer=32, chunk_bytes=512 * 1024)
#: one GB/s a warp, linear in warps: a piece's time is bytes / (warps x 1e9)
UNIT = WarpRates(1.0, 1.0, 0.25, 1.0, 0.5, 1.0)


def _delta(units, u):
    n = len(units)
    return [[units[(j - s) % n] * u for j in range(n)] for s in range(n)]


def test_channel_counts_follow_nccl_rules():
    # kmin: 32 channels per peer halved until kmin x n <= 32 channels
    assert [H100.min_channels(n) for n in (2, 3, 4, 8)] == [16, 8, 8, 4]
    # a part is at least chunk / 8 = 64 KiB: 12 KiB and 100 KiB take 1 and 2 channels
    assert parts(12 * 1024, 8, H100) == 1 and parts(100 * 1024, 8, H100) == 2
    # doubling while a part is over 32 chunks = 16 MiB, up to the 32 channels per peer
    assert parts(128 * MiB, 8, H100) == 8
    assert parts(128 * MiB + 4096, 8, H100) == 16
    assert parts(600 * MiB, 8, H100) == 32  # 18.75 MiB a part, but no more channels
    assert parts(0, 8, H100) == 0
    # a part rounded up to 4 KiB
    assert part_bytes(100_000, 2) == 53248
    # round d starts at the bit reversal of d over 5 bits
    assert [round_base(d, H100) for d in range(4)] == [0, 16, 8, 24]


def test_uniform_exchange_two_rounds_a_channel():
    """1 GiB a rank in a group of 4: 256 MiB a peer in 16 parts of 16 MiB; rounds 0-3 start at
    channels 0, 16, 8, 24, so every channel holds two rounds, 10 warps each: 4 receive, 5 send
    (a rank's own part: a copy on the 4 + 5). A channel's thread block moves every side of
    its works one after the other at the rate of all its warps (9 + 9): channels 16-23 hold
    rounds 1 and 2, each sending 16 MiB and receiving 16 MiB, 64 MiB on 18 warps (channel 0,
    the own copy and round 3, 48 MiB)."""
    t = warp_time(_delta([1, 1, 1, 1], 256 * MiB), H100, UNIT)
    assert t == pytest.approx(64 * MiB / 18e9, rel=1e-12)


def test_uneven_exchange_three_rounds_share_channels():
    """Weights 4:3:2:1 by (j - s) of 80 MiB units: round 0 (own part, 320 MiB) on 32 channels,
    round 1 (240 MiB) 16 parts of 15 MiB on channels 16-31, round 2 (160 MiB) 16 of 10 MiB on
    8-23, round 3 (80 MiB) 8 of 10 MiB on 24-31. Channels 16-31 hold three rounds: 6 warps
    each, 2 receiving and 3 sending (5 of 6): the block moves the own copy's 10 MiB, round 1's
    15 MiB out and 15 in and round 2's (or 3's) 10 and 10, 60 MiB on its 15 warps."""
    t = warp_time(_delta([4, 3, 2, 1], 80 * MiB), H100, UNIT)
    assert t == pytest.approx(60 * MiB / 15e9, rel=1e-12)
    # the same bytes spread evenly are faster though each rank moves as much
    even = warp_time(_delta([1, 1, 1, 1], 200 * MiB), H100, UNIT)
    assert even < t


def test_a_side_alone_on_a_channel_keeps_its_works_warps():
    """A pair where rank 0 sends 32 MiB to rank 1 and nothing back: 16 parts (kmin for 2) of
    2 MiB; rank 0's round 1 sends alone, rank 1's round 1 receives alone, one work a channel:
    20 warps split 9 + 10 (sendrecv.h: (w-1)/2 receive, one more send), and the lone side runs
    on their sum, 19 (the twentieth idles): 2 MiB / 19 warps."""
    table = [[0.0, 32.0 * MiB], [0.0, 0.0]]
    assert warp_time(table, H100, UNIT) == pytest.approx(2 * MiB / 19e9, rel=1e-12)


def test_a_pairs_work_moves_its_two_sides_one_after_the_other():
    """A pair with receiver-skewed splits (comm.py's hot: every rank sends 0.7 of 320 MiB to
    rank 0): rank 1 sends 224 MiB to rank 0 in 16 parts of 14 MiB and rank 0 sends 96 MiB back
    in 16 of 6 MiB, round 1 on channels 16-31, one work a channel (20 warps: 9 receive, 10
    send). Rank 0's work there receives 14 MiB and sends 6 MiB: its block's 19 warps move the
    20 MiB one side after the other, so the lightly loaded sending side's warps do not idle the
    receiving side's bound (14 MiB on 9 warps alone would be 1.48x longer), and the skewed
    pair's warps take what an even pair's of the same buffers take (10 + 10 MiB a work)."""
    hot = [[224.0 * MiB, 96.0 * MiB], [224.0 * MiB, 96.0 * MiB]]
    t = warp_time(hot, H100, UNIT)
    assert t == pytest.approx(20 * MiB / 19e9, rel=1e-12)
    even = [[160.0 * MiB, 160.0 * MiB], [160.0 * MiB, 160.0 * MiB]]
    assert warp_time(even, H100, UNIT) == pytest.approx(t, rel=1e-12)


def test_parts_off_sixteen_bytes_run_at_the_narrow_rates():
    table = [[16.0, 6.0], [6.0, 10.0]]
    # rank 0 sends 16 B to itself at 0 and 6 B to rank 1 at 16; rank 1 sends 6 B to rank 0
    # at 0 and 10 B to itself at 6; rank 0 receives its own at 0, rank 1's at 16; rank 1
    # receives rank 0's at 0, its own at 6
    assert narrow_parts(table) == [[(False, False), (False, False)],
                                   [(False, False), (True, True)]]
    big = [[MiB * 16.0, MiB * 16.0], [MiB * 16.0 + 2, MiB * 16.0]]
    flags = narrow_parts(big)
    # rank 1's own part starts at 16 MiB + 2 in its send buffer, at 16 MiB in its receive one
    assert flags[1][1] == (True, False) and flags[0][1] == (False, False)
    # one round a channel (rounds 0 and 1 on channels 0-15 and 16-31, 20 warps each): rank 1's
    # own copy (16 MiB: 16 parts of 1 MiB) is narrow (an offset off on either side), at the
    # slower narrow side (0.25 GB/s a warp) on 19 warps (a copy runs on the 9 + 10 of its 20);
    # the aligned pieces of 1 MiB (rank 0 -> 1) and of 16 MiB + 2 in 16 parts (1 -> 0,
    # 1,052,672 B: rounded up to 4 KiB) at 1 GB/s
    t = warp_time(big, H100, UNIT, flags)
    assert t == pytest.approx(MiB / (19 * 0.25e9), rel=1e-12)


def _h100x4() -> CollectiveModel:
    cfg = load_topology("topologies/h100x4-nvswitch.yaml")
    return CollectiveModel(Topology(cfg, load_gpu(cfg.gpu)))


def test_uniform_exchanges_are_priced_alike_on_every_path():
    """A uniform exchange is one NCCL layout whichever way it reaches the model: as a table
    of bytes (parts laid out in rank order, all on 16 bytes), as split shares, and as the
    uniform call training issues."""
    m = _h100x4()
    for g, groups in ((4, [[0, 1, 2, 3]]), (2, [[0, 1], [2, 3]])):
        for rank_bytes in (16 * MiB, 256 * MiB, 1024 * MiB):
            table = _delta([1] * g, rank_bytes / g)
            links = m.all_to_all_v(groups, rank_bytes, [[1 / g] * g for _ in range(g)])
            assert m.all_to_all_table(groups, table).time_s == links.time_s
            assert m.cost("all_to_all", groups, rank_bytes).time_s == pytest.approx(
                links.time_s, rel=1e-12)


def test_an_all_to_all_adds_its_host_time_per_peer():
    """An all-to-all's interval is the box's all-to-all figure (gpus.yaml host_events_a2a_s,
    not the other collectives') plus its kind's part per peer."""
    m = _h100x4()
    gpu = m.topology.gpu
    peer = dict(gpu.host_events_peer_s)
    base, a2a = m.events_call_s, gpu.host_events_a2a_s
    assert base == gpu.host_events_call_s and a2a > 0 and a2a != base
    assert m.events_interval_s("all_reduce", 4) == base
    assert m.events_interval_s("all_to_all", 4) == pytest.approx(a2a + 3 * peer["all_to_all"])
    assert m.events_interval_s("all_to_all", 2, "hot") == pytest.approx(
        a2a + peer["all_to_all_splits"])


def test_host_peer_extra_equals_its_refit():
    assert network.events_peer_us() == network.shipped_events_peer_us()


def test_warp_rates_equal_their_refit():
    for name, (refit, shipped) in p2p.refit().items():
        assert refit == shipped, name


def test_warp_fit_reads_both_probes():
    """The refit reads the second probe's 60 rows (32 MiB-1 GiB, rotated and hot splits) beside
    the first probe's 60 rows >= 32 MiB and the calibration file's 12 uneven rows."""
    rows = p2p.rows()
    assert sum(r.get("pattern") == "rot4321" for r, _ in rows) == 12
    assert len(rows) == 60 + 60 + 12
