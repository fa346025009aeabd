"""DeepEP's normal kernels at the share of the modelled link rate its README's H800 figures give
(``simulator/engine/dispatch.py`` ``DEEPEP_RATE``, ``python -m simulator.calibrate deepep``)."""

from __future__ import annotations

import pytest

from simulator.calibrate import deepep
from simulator.engine import dispatch


def test_rate_is_a_rate_on_the_bytes():
    """At rate r the exchange costs what rate 1 costs for 1/r the bytes (closed form: a kernel
    moving bytes at that share of the links' rate), and less than rate 1 only never."""
    model, coll = deepep._setting()
    g = [list(range(32))]
    nb = 4096 * 7168 * 2.0
    slow = dispatch.routed_cost(coll, model.moe, g, nb, rate=0.5).time_s
    assert slow == pytest.approx(dispatch.routed_cost(coll, model.moe, g, 2 * nb, rate=1.0).time_s,
                                 rel=1e-12)  # fmt: skip
    assert dispatch.routed_cost(coll, model.moe, g, nb).time_s > dispatch.routed_cost(
        coll, model.moe, g, nb, rate=1.0).time_s


def test_the_readme_figures_at_the_shipped_rate():
    """With the shipped rate the model's time for each README figure but EP 16 is within 5 %
    of the README's (the spread of the six is 0.90-0.94 before the rate); EP 16 stays below
    (its figure is half the others' share: DeepEP V1 at 2 x 8 GPUs, which its V2 README nearly
    doubles on the same hardware)."""
    for r, t, readme in deepep.ratios():
        shipped = t / dispatch.DEEPEP_RATE
        if r["ep"] == 16:
            assert shipped < 0.65 * readme
        else:
            assert shipped == pytest.approx(readme, rel=0.05), r
