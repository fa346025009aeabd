"""Rank layout: groups partition the GPUs, TP stays inside a node, order is configurable."""

import itertools

import pytest

from simulator.parallel.layout import Layout


@pytest.mark.parametrize("tp,dp,pp", [(8, 4, 2), (2, 3, 5), (1, 16, 1), (4, 1, 4)])
def test_rank_coords_roundtrip_and_groups_partition(tp, dp, pp):
    lay = Layout(tp, dp, pp)
    seen = set()
    for t, d, p in itertools.product(range(tp), range(dp), range(pp)):
        g = lay.rank(t, d, p)
        assert lay.coords(g) == (t, d, p)
        seen.add(g)
    assert seen == set(range(tp * dp * pp))
    tp_groups = {lay.tp_group(d, p) for d in range(dp) for p in range(pp)}
    dp_groups = {lay.dp_group(t, p) for t in range(tp) for p in range(pp)}
    pp_groups = {lay.pp_group(t, d) for t in range(tp) for d in range(dp)}
    for groups, size in ((tp_groups, tp), (dp_groups, dp), (pp_groups, pp)):
        flat = [g for grp in groups for g in grp]
        assert len(flat) == len(set(flat)) == tp * dp * pp
        assert all(len(grp) == size for grp in groups)


def test_tp_innermost_is_contiguous_inside_a_node():
    lay = Layout(8, 4, 4)
    for d in range(4):
        for p in range(4):
            grp = lay.tp_group(d, p)
            assert grp == tuple(range(grp[0], grp[0] + 8))
            assert grp[0] % 8 == 0  # one 8-GPU node


def test_megatron_order_strides():
    lay = Layout(8, 32, 4)  # r = t + 8 * (d + 32 * p)
    assert lay.rank(3, 5, 2) == 3 + 8 * (5 + 32 * 2)
    assert lay.dp_group(0, 0)[:3] == (0, 8, 16)
    assert lay.pp_group(0, 0)[:2] == (0, 256)


def test_other_order_permutes_strides():
    lay = Layout(2, 3, 4, order=("dp", "tp", "pp"))
    assert lay.rank(0, 1, 0) == 1
    assert lay.rank(1, 0, 0) == 3
    assert lay.rank(0, 0, 1) == 6


def test_stage_layers_and_interleaved_chunks():
    lay = Layout(1, 1, 4, virtual_stages=2, stage_layers=(1, 2, 2, 2, 2, 2, 2, 1))
    assert list(lay.layers_of(0, 0)) == [0]
    assert list(lay.layers_of(1, 0)) == [1, 2]
    assert list(lay.layers_of(0, 1)) == [7, 8]  # virtual stage 4
    assert list(lay.layers_of(3, 1)) == [13]
    assert lay.virtual_stage(2, 1) == 6
