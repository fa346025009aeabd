"""NCCL's ring / Simple kernel inside one NVLink domain: the first chunk's unoverlapped share of a
step and a handshake per slice (``nccl.ring_simple_fill``, protocols.ProtocolCosts._ring_fill),
checked against the closed forms written from NCCL's chunking (2 MiB chunks over 24 channels,
two slices a primitive) and the link and copy rates of the catalog and fabrics.yaml."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulator.config.load import load_topology
from simulator.hardware.catalog import load_gpu
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology, load_fabrics

ROOT = Path(__file__).resolve().parents[1]
FAB = load_fabrics()
FILL = FAB["nccl"]["ring_simple_fill"]
MIB = 2.0**20


def _topo(name: str) -> Topology:
    cfg = load_topology(ROOT / "topologies" / f"{name}.yaml")
    return Topology(cfg, load_gpu(cfg.gpu))


def _pair(topo: Topology, frac: float, slice_us: float) -> tuple[CollectiveModel, CollectiveModel]:
    on, off = CollectiveModel(topo), CollectiveModel(topo)
    on.ring_fill = (24, 2 * MIB, frac, slice_us * 1e-6)
    off.ring_fill = (24, 2 * MIB, 0.0, 0.0)
    return on, off


def _step_s(topo: Topology, op: str, n: int, nbytes: float) -> float:
    """One ring step of a Simple ring within the node: a rank's S/n over its NVLink at the
    fitted efficiency, and its share of the local copies ((n+1) S / n over n-1 steps for
    all-gather and reduce-scatter), at copy_GBps."""
    rate = topo.nvlink_Bps * FAB["links"]["nvlink"]["efficiency"]
    steps = n - 1 if op != "all_reduce" else 2 * (n - 1)
    local = (n + 1) * nbytes / n if op != "all_reduce" else 2 * nbytes
    return nbytes / n / rate + local / steps / (FAB["nccl"]["copy_GBps"] * 1e9)


@pytest.mark.parametrize(("topo", "op", "n", "nbytes"), [
    ("h100x2-nvswitch", "all_gather", 2, 16 * MIB),   # a channel's piece: 1/3 of a chunk
    ("h100x2-nvswitch", "reduce_scatter", 2, 256 * MIB),  # 2.7 chunks
    ("h100x4-nvswitch", "all_gather", 4, 64 * MIB),
    ("h100x4-nvswitch", "all_reduce", 4, 1024 * MIB),
])
def test_fill_and_slices_are_their_closed_forms(topo, op, n, nbytes):
    t = _topo(topo)
    on, off = _pair(t, 0.3, 0.8)
    group = [list(range(n))]
    assert on.algorithm(op, group[0], nbytes) == "ring/Simple"
    piece = nbytes / n / 24  # a rank's bytes per step and channel
    chunks = math.ceil(piece / (2 * MIB))
    prims = (n if op != "all_reduce" else 2 * n - 1)  # primitives per chunk on a channel
    want = 0.3 * _step_s(t, op, n, nbytes) * min(1.0, 2 * MIB / piece) + 0.8e-6 * prims * 2 * chunks
    got = on.cost(op, group, nbytes).time_s - off.cost(op, group, nbytes).time_s
    assert got == pytest.approx(want, rel=1e-6)


def test_the_fill_grows_with_the_piece_up_to_a_chunk_then_stays():
    """Below NCCL's chunk a channel's piece is its only chunk (fill proportional to the size);
    from a chunk a channel on (2 x 24 x 2 MiB = 96 MiB between two GPUs) the fill is a chunk's."""
    on, off = _pair(_topo("h100x2-nvswitch"), 0.3, 0.0)

    def fill(s):
        return on.cost("all_gather", [[0, 1]], s).time_s - off.cost("all_gather", [[0, 1]], s).time_s

    assert fill(48 * MIB) == pytest.approx(fill(24 * MIB) * 2, rel=1e-9)
    assert fill(96 * MIB) == pytest.approx(fill(24 * MIB) * 4, rel=1e-9)
    assert fill(384 * MIB) == pytest.approx(fill(96 * MIB), rel=1e-9)
    assert fill(1536 * MIB) == pytest.approx(fill(96 * MIB), rel=1e-9)


def test_no_fill_where_nccl_does_not_run_ring_simple_in_one_domain():
    """LL (small calls), the all-to-all (p2p), and rings that cross the network pay nothing."""
    on, off = _pair(_topo("h100x2-nvswitch"), 0.3, 0.8)
    assert on.algorithm("all_gather", [0, 1], MIB) == "ring/LL"
    for op, s in (("all_gather", MIB), ("all_to_all", 256 * MIB)):
        assert on.cost(op, [[0, 1]], s).time_s == off.cost(op, [[0, 1]], s).time_s
    big = _topo("dgx-h100-ndr-8node")
    on, off = _pair(big, 0.3, 0.8)
    ring = [0, 8]  # two nodes
    assert on.cost("all_gather", [ring], 256 * MIB, "ring/Simple").time_s == \
        off.cost("all_gather", [ring], 256 * MIB, "ring/Simple").time_s


def test_shipped_fill_is_nccls_chunking():
    """The chunk and channel count are NCCL 2.28.9's on the H100 / H200 NVSwitch boxes: 4 MiB
    Simple buffer / NCCL_STEPS 8 x ALLGATHER_CHUNKSTEPS 4, and the 24 coll channels its logs
    show for every ring / Simple call (data/measured/ring-simple-h100x4/tuning-choices.jsonl)."""
    assert FILL["chunk_bytes"] == 4 * MIB // 8 * 4
    logged = [json.loads(x) for x in (ROOT / "data/measured/ring-simple-h100x4/"
                                      "tuning-choices.jsonl").read_text().splitlines()]
    assert {r["coll_channels"] for r in logged if r["kind"] == "init"} == {FILL["channels"]}
    assert {r["channels"] for r in logged
            if r["kind"] == "call" and r["protocol"] == "SIMPLE"} == {FILL["channels"]}
