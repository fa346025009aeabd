"""``parallelism.pp_runtime: torch``: where torch.distributed.pipelining's interleaved runtime
posts its transfers, and the one NCCL stream they share."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simulator.parallel import torch_posts
from simulator.parallel.schedules import interleaved
from simulator.parallel.torch_posts import ACTIVE_STAGES, TURN, _lowered, posting_order

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


#: The last rank's list for 4 ranks, 2 stages each, 8 micro-batches, as PyTorch 2.13's whole
#: lowering (``ScheduleInterleaved1F1B``'s ``_prepare_schedule_with_comms``: unshard /
#: reshard, gradient reduction, then ``_add_send_recv``) printed it, its six non-compute
#: actions (``3UNSHARD 7UNSHARD`` first, ``7REDUCE_GRAD 7RESHARD`` after ``7B7``,
#: ``3REDUCE_GRAD 3RESHARD`` last) left out: ``3RECV_B7`` lands before ``3B4``, so the
#: gradient sends ``3SEND_B4`` .. ``3SEND_B6`` wait behind it on the rank's one stream
TORCH_4_2_8_RANK3 = (
    "3RECV_F0 3F0 3SEND_F0 3RECV_F1 3F1 3SEND_F1 3RECV_F2 3F2 3SEND_F2 3RECV_F3 3F3 3SEND_F3 "
    "7RECV_F0 7F0 7RECV_F1 7B0 7SEND_B0 7RECV_F2 7F1 7B1 7SEND_B1 7RECV_F3 7F2 7B2 7SEND_B2 "
    "3RECV_F4 7F3 3RECV_B0 7B3 7SEND_B3 3RECV_F5 3F4 3SEND_F4 3RECV_B1 3B0 3SEND_B0 3RECV_F6 "
    "3F5 3SEND_F5 3RECV_B2 3B1 3SEND_B1 3RECV_F7 3F6 3SEND_F6 3RECV_B3 3B2 3SEND_B2 7RECV_F4 "
    "3F7 3SEND_F7 3B3 3SEND_B3 7RECV_F5 7F4 7B4 7SEND_B4 7RECV_F6 7F5 7B5 7SEND_B5 7RECV_F7 "
    "7F6 3RECV_B4 7B6 7SEND_B6 7F7 3RECV_B5 7B7 7SEND_B7 3RECV_B6 3RECV_B7 3B4 3SEND_B4 3B5 "
    "3SEND_B5 3B6 3SEND_B6 3B7 3SEND_B7"
)


def _text(post) -> str:
    kind = {"C": "", "S": "SEND_", "R": "RECV_"}[post.kind]
    return f"{post.vs}{kind}{post.phase}{post.mb}"


def test_posting_order_is_torchs():
    got = posting_order({r: interleaved(r, 2, 4, 2) for r in range(2)}, 2, 2)
    for r, want in TORCH_2_2_4.items():
        assert " ".join(_text(q) for q in got[r]) == want


def test_posting_order_is_torchs_whole_lowering():
    """The runtime's unshard / reshard and gradient-reduction actions take turns of the
    lock-step pass: on 4 ranks the last rank's receives land where torch's lowering puts them
    (the compute order alone would post ``3RECV_B7`` after ``3B5``)."""
    got = posting_order({r: interleaved(r, 4, 8, 2) for r in range(4)}, 4, 2)
    assert " ".join(_text(q) for q in got[3]) == TORCH_4_2_8_RANK3


@pytest.mark.parametrize("pp,v,m", [(4, 2, 8), (2, 3, 6), (4, 4, 8)])
def test_lowered_turns(pp, v, m):
    """Per rank: an unshard and a reshard of each of its ``v`` stages (a window of 3 stages
    holds them all for v <= 3; for v = 4 each stage leaves and re-enters it as the order
    moves on) and one gradient reduction per stage, right after its m-th backward."""
    for r in range(pp):
        ws = interleaved(r, pp, m, v)
        low = _lowered(ws, m)
        assert [x for x in low if not isinstance(x, str)] == ws
        turns = sum(isinstance(x, str) for x in low)
        assert turns >= 3 * v and (v > ACTIVE_STAGES or turns == 3 * v)
        for c in range(v):
            last_b = max(i for i, x in enumerate(low)
                         if not isinstance(x, str) and x.phase == "B" and x.chunk == c)
            assert low[last_b + 1] == TURN


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


def _step_in_process(workload: Path, runtime: str, region: str, turns: bool = True) -> float:
    """The step in this process; ``turns=False``: the posting pass over the compute order
    alone (the runtime's non-compute actions left out)."""
    from simulator.config.load import load_workload
    from simulator.run import simulate

    lw = load_workload(workload, [f"parallelism.pp_runtime={runtime}",
                                  f"training.autocast_region={region}"])
    if turns:
        return simulate(lw).summary["step_time_s"]
    mp = pytest.MonkeyPatch()
    mp.setattr(torch_posts, "_lowered", lambda ws, m: list(ws))
    try:
        return simulate(lw).summary["step_time_s"]
    finally:
        mp.undo()


def test_one_stream_holds_sends_behind_early_receives():
    """Over 4 stages a rank's gradient sends wait behind activation receives of later
    micro-batches: the step is longer than with a stream per transfer (h6_pp4_int2_V: +8.4 %
    by a separate play of ``_add_send_recv`` over the compute actions, DESIGN_NOTES; more with
    the lowering's non-compute turns); over 2 stages a rank has
    one peer, and the same order costs next to nothing; full detail agrees with folded."""
    # the same autocast region on both, a micro-batch's (the compute times of the separate
    # play; torch's runtime alone would cast each weight once a step:
    # tests/test_torch_pipeline_memory.py), so that only the streams differ
    region = ("--set", "training.autocast_region=microbatch")
    mega = _step(INT4, "megatron", *region)
    # the separate play posted by ``_add_send_recv`` over the compute actions alone: so does
    # the engine with the lowering's turns taken out
    assert _step_in_process(INT4, "torch", "microbatch", turns=False) / mega - 1 == \
        pytest.approx(0.084, abs=0.01)
    # the whole lowering holds the last rank's cool-down gradient sends behind the receive of
    # its last micro-batch's gradient: longer still
    torch = _step(INT4, "torch", *region)
    assert torch / mega - 1 > 0.084 + 0.02
    assert _step(INT4, "torch", "--detail", "full", *region) == pytest.approx(torch, rel=1e-9)
    assert _step(INT2, "torch", *region) / _step(INT2, "megatron", *region) - 1 < 0.002
    gpipe = ["--set", "parallelism.pp_schedule=gpipe", "--set", "parallelism.virtual_stages=1"]
    assert _step(INT4, "torch", *gpipe, *region) == _step(INT4, "megatron", *gpipe, *region)
