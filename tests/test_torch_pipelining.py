"""``parallelism.pp_runtime: torch``: where torch.distributed.pipelining's interleaved runtime
posts its transfers, and the one NCCL stream they share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.parallel.schedules import interleaved
from simulator.parallel.torch_posts import posting_order

ROOT = Path(__file__).resolve().parents[1]
INT4 = ROOT / "validation" / "heldout6" / "h6_pp4_int2_V.yaml"
INT2 = ROOT / "validation" / "heldout6" / "h6_pp2_int2_V.yaml"

#: PyTorch 2.13's own ``_add_send_recv(...)`` for ``ScheduleInterleaved1F1B`` with 2 ranks, 2
#: stages each and 4 micro-batches (``<stage><action><micro-batch>``), as it printed them
TORCH_2_2_4 = {
    0: "0F0 0SEND_F0 2RECV_F0 0F1 0SEND_F1 2RECV_F1 2F0 2SEND_F0 2F1 2SEND_F1 2RECV_B0 0F2 "
       "0SEND_F2 2B0 2SEND_B0 2RECV_B1 0F3 0SEND_F3 2RECV_F2 2B1 2SEND_B1 0RECV_B0 2F2 2SEND_F2 "
       "2RECV_F3 0B0 0RECV_B1 2F3 2SEND_F3 0B1 2RECV_B2 2B2 2SEND_B2 2RECV_B3 2B3 2SEND_B3 "
       "0RECV_B2 0B2 0RECV_B3 0B3",
    1: "1RECV_F0 1F0 1SEND_F0 1RECV_F1 1F1 1SEND_F1 3RECV_F0 3F0 3RECV_F1 3B0 3SEND_B0 1RECV_F2 "
       "3F1 1RECV_B0 3B1 3SEND_B1 1RECV_F3 1F2 1SEND_F2 1RECV_B1 1B0 1SEND_B0 3RECV_F2 1F3 "
       "1SEND_F3 1B1 1SEND_B1 3RECV_F3 3F2 3B2 3SEND_B2 1RECV_B2 3F3 3B3 3SEND_B3 1RECV_B3 1B2 "
       "1SEND_B2 1B3 1SEND_B3",
}


def _text(post) -> str:
    kind = {"C": "", "S": "SEND_", "R": "RECV_"}[post.kind]
    return f"{post.vs}{kind}{post.phase}{post.mb}"


def test_posting_order_is_torchs():
    got = posting_order({r: interleaved(r, 2, 4, 2) for r in range(2)}, 2, 2)
    for r, want in TORCH_2_2_4.items():
        assert " ".join(_text(q) for q in got[r]) == want


@pytest.mark.parametrize("pp,v,m", [(4, 2, 8), (4, 2, 16), (4, 3, 8), (8, 2, 16), (2, 4, 6)])
def test_posting_order_invariants(pp, v, m):
    """Each rank runs its passes in its compute order; every send has one receive, on the
    rank of the next (forward) or previous (backward) virtual stage; every receive is posted
    before the pass that consumes it."""
    orders = {r: interleaved(r, pp, m, v) for r in range(pp)}
    posts = posting_order(orders, pp, v)
    sends, recvs = set(), {}
    for r, lst in posts.items():
        assert [q.work for q in lst if q.kind == "C"] == orders[r]
        for i, q in enumerate(lst):
            if q.kind == "S":
                dst_vs = q.vs + 1 if q.phase == "F" else q.vs - 1
                sends.add((q.phase, dst_vs, q.mb, dst_vs % pp))
            elif q.kind == "R":
                recvs[(q.phase, q.vs, q.mb, r)] = i
    assert sends == set(recvs)
    for r, lst in posts.items():
        for i, q in enumerate(lst):
            if q.kind == "C" and (q.phase, q.vs, q.mb, r) in recvs:
                assert recvs[(q.phase, q.vs, q.mb, r)] < i


def _step(workload: Path, runtime: str, *extra: str) -> float:
    cmd = [sys.executable, "-m", "simulator", "run", str(workload), "--json", "--no-files",
           "--set", f"parallelism.pp_runtime={runtime}", *extra]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True,
                                     text=True).stdout)["step_time_s"]


def test_one_stream_holds_sends_behind_early_receives():
    """Over 4 stages a rank's gradient sends wait behind activation receives of later
    micro-batches: the step is longer than with a stream per transfer (h6_pp4_int2_V: +8.4 %
    by a separate play of torch's own action lists, DESIGN_NOTES); over 2 stages a rank has
    one peer, and the same order costs next to nothing; full detail agrees with folded."""
    # the same autocast region on both, a micro-batch's (the compute times of the separate
    # play; torch's runtime alone would cast each weight once a step:
    # tests/test_torch_pipeline_memory.py), so that only the streams differ
    region = ("--set", "training.autocast_region=microbatch")
    mega, torch = _step(INT4, "megatron", *region), _step(INT4, "torch", *region)
    assert torch / mega - 1 == pytest.approx(0.084, abs=0.01)
    assert _step(INT4, "torch", "--detail", "full", *region) == pytest.approx(torch, rel=1e-9)
    assert _step(INT2, "torch", *region) / _step(INT2, "megatron", *region) - 1 < 0.002
    gpipe = ["--set", "parallelism.pp_schedule=gpipe", "--set", "parallelism.virtual_stages=1"]
    assert _step(INT4, "torch", *gpipe, *region) == _step(INT4, "megatron", *gpipe, *region)
