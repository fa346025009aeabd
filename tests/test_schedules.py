"""Pipeline schedules: every pass exactly once, dependencies satisfiable, memory bounds."""

import pytest

from simulator.parallel.schedules import max_in_flight, schedule


@pytest.mark.parametrize("name,pp,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1),
                                         ("1f1b", 8, 3, 1), ("interleaved", 4, 8, 2),
                                         ("interleaved", 4, 4, 3), ("interleaved", 2, 6, 2)])
def test_each_pass_once_and_backward_after_forward(name, pp, m, v):
    for s in range(pp):
        order = schedule(name, s, pp, m, v)
        fwd = [(w.microbatch, w.chunk) for w in order if w.phase == "F"]
        bwd = [(w.microbatch, w.chunk) for w in order if w.phase == "B"]
        expected = {(i, c) for i in range(m) for c in range(v)}
        assert set(fwd) == expected and len(fwd) == m * v
        assert set(bwd) == expected and len(bwd) == m * v
        pos = {(w.phase, w.microbatch, w.chunk): i for i, w in enumerate(order)}
        for i, c in expected:
            assert pos[("F", i, c)] < pos[("B", i, c)]


def test_1f1b_holds_at_most_p_minus_s_microbatches():
    pp, m = 4, 16
    for s in range(pp):
        assert max_in_flight(schedule("1f1b", s, pp, m)) == pp - s
    # GPipe holds them all.
    assert max_in_flight(schedule("gpipe", 0, pp, m)) == m


def test_interleaved_warmup_matches_megatron():
    pp, m, v = 4, 8, 2
    order = schedule("interleaved", 0, pp, m, v)
    warm = 0
    for w in order:
        if w.phase == "B":
            break
        warm += 1
    # (pp - s - 1) * 2 + (v - 1) * pp warm-up passes, then the first steady-state forward.
    assert warm == (pp - 1) * 2 + (v - 1) * pp + 1
    # The first chunk of micro-batches 0..pp-1 runs before chunk 1.
    assert [(w.microbatch, w.chunk) for w in order[:pp + 1]] == [
        (0, 0), (1, 0), (2, 0), (3, 0), (0, 1)]
