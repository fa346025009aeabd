"""Pipeline schedules: every pass exactly once, dependencies satisfiable, memory bounds."""

import pytest

from simulator.parallel.schedules import TABLE2_MEMORY, max_in_flight, schedule, table2_bubble


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


def test_table2_bubbles_of_deepseek_v3():
    # arXiv:2412.19437 Table 2 at PP 16 with F = 1, B = 2, W = 1 and F&B = 2.5 (ms):
    # 1F1B 15 x 3 = 45; ZB1P 15 x (3 - 2) = 15; DualPipe 7 x (2.5 + 2 - 3) = 10.5
    assert table2_bubble("1f1b", 16, 1.0, 2.0) == 45.0
    assert table2_bubble("zb1p", 16, 1.0, 2.0, 1.0) == 15.0
    assert table2_bubble("dualpipe", 16, 1.0, 2.0, 1.0, 2.5) == 10.5
    # two ranks: DualPipe's two directions fill each other's bubble
    assert table2_bubble("dualpipe", 2, 1.0, 2.0, 0.5, 2.5) == 0.0
    assert TABLE2_MEMORY["dualpipe"](16) == (2, 17) and TABLE2_MEMORY["1f1b"](16) == (1, 16)
    with pytest.raises(ValueError, match="even"):
        table2_bubble("dualpipe", 3, 1.0, 2.0)
