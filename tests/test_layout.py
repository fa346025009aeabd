"""Rank layout: groups partition the GPUs, TP stays inside a node, order is configurable, any
named dimensions work."""

import itertools

import pytest

from simulator.parallel.layout import Layout


def lay3(tp, dp, pp, order=("tp", "dp", "pp"), **kw) -> Layout:
    return Layout.of({"tp": tp, "dp": dp, "pp": pp}, order, **kw)


@pytest.mark.parametrize(
    "sizes",
    [
        {"tp": 8, "dp": 4, "pp": 2},
        {"tp": 2, "dp": 3, "pp": 5},
        {"tp": 1, "dp": 16, "pp": 1},
        {"tp": 2, "cp": 4, "dp": 3, "pp": 2},
        {"etp": 2, "ep": 4, "edp": 2, "pp": 2},  # an MoE layout over the same kind of ranks
    ],
)
def test_rank_coords_roundtrip_and_groups_partition(sizes):
    lay = Layout.of(sizes, tuple(sizes))
    n = lay.n_gpus
    seen = set()
    for idx in itertools.product(*(range(v) for v in sizes.values())):
        c = dict(zip(sizes, idx, strict=True))
        g = lay.rank(c)
        assert lay.coords(g) == c
        seen.add(g)
    assert seen == set(range(n))
    for dim, size in sizes.items():
        groups = lay.groups(dim)
        flat = [g for grp in groups for g in grp]
        assert len(flat) == len(set(flat)) == n
        assert all(len(grp) == size for grp in groups)
        # every member of a group differs from the others in ``dim`` only
        for grp in groups:
            cs = [lay.coords(g) for g in grp]
            assert [c[dim] for c in cs] == list(range(size))
            assert all({k: v for k, v in c.items() if k != dim} ==
                       {k: v for k, v in cs[0].items() if k != dim} for c in cs)  # fmt: skip


def test_tp_innermost_is_contiguous_inside_a_node():
    lay = lay3(8, 4, 4)
    for d in range(4):
        for p in range(4):
            grp = lay.group("tp", {"dp": d, "pp": p})
            assert grp == tuple(range(grp[0], grp[0] + 8))
            assert grp[0] % 8 == 0  # one 8-GPU node


def test_megatron_order_strides():
    lay = lay3(8, 32, 4)  # r = t + 8 * (d + 32 * p)
    assert lay.rank({"tp": 3, "dp": 5, "pp": 2}) == 3 + 8 * (5 + 32 * 2)
    assert lay.group("dp", {})[:3] == (0, 8, 16)
    assert lay.group("pp", {})[:2] == (0, 256)


def test_context_parallel_follows_tp_and_joint_groups():
    """Megatron's tp-cp-dp-pp: a CP group strides by tp; the gradient group is cp x dp."""
    lay = Layout.of({"tp": 2, "cp": 4, "dp": 2, "pp": 2})
    assert lay.group("cp", {"tp": 1, "dp": 1, "pp": 0}) == (9, 11, 13, 15)
    grad = lay.group(("cp", "dp"), {"tp": 0, "pp": 1})
    assert grad == (16, 18, 20, 22, 24, 26, 28, 30)
    assert lay.group(("tp", "cp"), {"dp": 1, "pp": 0}) == tuple(range(8, 16))
    assert lay.size("ep") == 1 and lay.group("ep", {"tp": 1}) == (1,)


def test_other_order_permutes_strides():
    lay = lay3(2, 3, 4, order=("dp", "tp", "pp"))
    assert lay.rank({"dp": 1}) == 1
    assert lay.rank({"tp": 1}) == 3
    assert lay.rank({"pp": 1}) == 6


def test_stage_layers_and_interleaved_chunks():
    lay = lay3(1, 1, 4, virtual_stages=2, stage_layers=(1, 2, 2, 2, 2, 2, 2, 1))
    assert list(lay.layers_of(0, 0)) == [0]
    assert list(lay.layers_of(1, 0)) == [1, 2]
    assert list(lay.layers_of(0, 1)) == [7, 8]  # virtual stage 4
    assert list(lay.layers_of(3, 1)) == [13]
    assert lay.virtual_stage(2, 1) == 6
