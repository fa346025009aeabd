"""benchmarks/megatron_p2p.py: Megatron-LM's interleaved schedule with NCCL's point-to-point
semantics, checked against the schedule's closed form and the simulator's own order."""

import importlib.util
from pathlib import Path

import pytest

from simulator.parallel import schedules

_SPEC = importlib.util.spec_from_file_location(
    "megatron_p2p", Path(__file__).resolve().parents[1] / "benchmarks" / "megatron_p2p.py")
mp = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(mp)


def _uniform(r, c, phase):
    return 1.0 if phase == "F" else 2.0


@pytest.mark.parametrize("pp,v,m", [(4, 2, 8), (4, 2, 16), (8, 3, 16), (32, 3, 64)])
def test_free_transfers_give_the_interleaved_closed_form(pp, v, m):
    # Narayanan et al. SC21: with chunk passes F and B and instant transfers, interleaved
    # 1F1B takes (m v + pp - 1)(F + B); both semantics agree there
    for megatron in (False, True):
        step, busy = mp.step_time(pp, v, m, _uniform, 0.0, megatron=megatron)
        assert step == pytest.approx((m * v + pp - 1) * 3.0)
        assert max(busy) == pytest.approx(m * v * 3.0)


@pytest.mark.parametrize("r", [0, 1, 5, 7])
def test_passes_follow_the_simulators_interleaved_order(r):
    pp, v, m = 8, 3, 16
    prog = mp.rank_program(r, pp, v, m, megatron=True)
    passes = [(x[2], x[1]) for x in prog if x[0] == "C"]
    assert passes == [(w.phase, w.chunk) for w in schedules.interleaved(r, pp, m, v)]


def test_every_send_meets_one_receive():
    pp, v, m = 8, 3, 16
    sends, recvs = {}, {}
    for r in range(pp):
        for x in mp.rank_program(r, pp, v, m, megatron=True):
            if x[0] == "P":
                edge = (r, x[2]) if x[1] == "send" else (x[2], r)
                book = sends if x[1] == "send" else recvs
                book[edge] = book.get(edge, 0) + 1
    assert sends == recvs
    # every virtual stage but the last sends each micro-batch forward, and back but the first
    assert sum(sends.values()) == 2 * m * (pp * v - 1)


def test_megatron_semantics_cost_only_where_transfers_rival_passes():
    pp, v, m = 4, 2, 16
    short = [mp.step_time(pp, v, m, _uniform, 0.3, megatron=s)[0] for s in (False, True)]
    long = [mp.step_time(pp, v, m, _uniform, 3.0, megatron=s)[0] for s in (False, True)]
    assert short[1] == pytest.approx(short[0])
    assert long[1] > long[0]
