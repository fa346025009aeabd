"""benchmarks/route_model_counts.py: the counts it draws as the simulator assumes them are
well formed (structural invariants; the device experiment is data/measured/routerdiag-h100x4)."""

from benchmarks.route_model_counts import draw, params


def test_counts_sum_to_each_sources_copies_and_are_seeded():
    p = params("h15t_moe_ep4_AH")  # 12 experts top-3 at EP 4, tokens 4,096 a call
    tokens = 256
    out = draw(p, steps=2, n_mb=1, tokens=tokens, seed=5)
    assert len(out) == 2 and len(out[0]) == p["layers"]
    for step in out:
        for call in step:
            assert len(call) == p["ep"]
            for src in call:
                assert len(src) == p["experts"]
                assert sum(src) == tokens * p["top_k"]  # every token sends top_k copies
                assert max(src) <= tokens  # to distinct experts: at most one each
    assert draw(p, steps=2, n_mb=1, tokens=tokens, seed=5) == out


def test_collapsing_router_piles_copies():
    p = params("h14_moe_ep2_AF")  # steps_alt.py: route correlation 0.53, rank 0.21
    out = draw(p, steps=1, n_mb=1, tokens=512, seed=1)
    full = sum(1 for call in out[0] for src in call for c in src if c == 512)
    assert full > 0  # whole calls on one expert, as a collapsed router sends them
