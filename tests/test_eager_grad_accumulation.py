"""Eager code with bf16 parameters accumulates gradients over micro-batches in ``.grad``:
autograd's AccumulateGrad adds each fresh weight gradient into it (read both, write the sum:
3 x 2 bytes an element) on every micro-batch after the first (issue 12; the profiled step of
data/measured/acgemm-h100x1 has one such add per weight, in the second micro-batch only).
Worked by hand in bytes on steps_third.py's shape AC."""

from __future__ import annotations

import pytest
import simpy

from simulator.config.load import load_workload
from simulator.engine.build import _Builder, make_job
from simulator.run import make_machine, resolve_loaded
from tests.conftest import ROOT

AC = ROOT / "validation/heldout14/h14t_single_AC.yaml"  # 1 GPU, 2 micro-batches, bf16 weights


def _builder(*sets: str) -> _Builder:
    loaded = load_workload(AC, ["model.layers=2", *sets])
    res = resolve_loaded(loaded)
    machine = make_machine(loaded)
    return _Builder(make_job(loaded.workload, loaded.topology, res, machine), "folded",
                    simpy.Environment())


def test_accumulation_bytes_by_hand():
    """Two micro-batches: every weight's gradient is added once a step, half of it priced in
    each micro-batch's backward. Weights by hand: per layer wq/wk/wv 3584 x (3584 + 2 x 512),
    wo 3584^2, w1/w3/w2 3 x 3584 x 9728; the LM head and the embedding 65536 x 3584 each."""
    b = _builder()
    assert b.grad_accumulation() == (2, 0.5)
    sp = b.programs_for(b.procs[0])
    cm = b.job.machine.compute
    launch = cm.gpu.kernel_launch_s
    layer = 3584 * (3584 + 2 * 512) + 3584**2 + 3 * 3584 * 9728
    for prog, weights in ((sp.layer_bwd, layer), (sp.head_bwd, 65536 * 3584),
                          (sp.embed_bwd, 65536 * 3584)):
        acc = [p for p in prog if p.name.endswith("_gacc")]
        assert acc, prog
        got = sum(p.dur - launch for p in acc)
        assert got == pytest.approx(cm.memory_s(6 * weights * 0.5), rel=1e-9)
    # no add in the forward programs
    assert not [p for p in sp.layer_fwd if p.name.endswith("_gacc")]


def test_no_accumulation_where_none_happens():
    """One micro-batch (nothing to add into), fp32 parameters (the eager op list adds every
    micro-batch already), sharded gradients (FSDP: not this add)."""
    assert _builder("training.global_batch=1").grad_accumulation() is None
    assert _builder("training.param_dtype=fp32").grad_accumulation() is None
