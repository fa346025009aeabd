"""``torch.optim.AdamW(foreach=True)``'s own allocation during its step
(``_multi_tensor_adam``: ``exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)``, a new list as
large as the second moments), worked by hand in bytes per parameter."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.model import transformer as tf
from simulator.run import simulate
from tests.conftest import ROOT

P4 = ROOT / "validation/heldout11/h11_tp4sp_P.yaml"  # DTensor TP 4 + SP, fp32 weights, AdamW foreach


def _memory(impl: str, sets: tuple[str, ...] = ()) -> dict:
    w = load_workload(P4, [f"training.optimizer_impl={impl}", "model.seq_len=128", *sets])
    return simulate(w).summary["memory_gib"], w.workload.model


@pytest.mark.parametrize("moments, b", [("fp32", 4), ("bf16", 2)])
def test_step_peak_is_the_states_and_the_sqrt_list(moments, b):
    """With 128-token sequences the activations are negligible and the step peaks in the
    optimizer, every gradient alive: fp32 weights (4) + gradients (4) + two moments (2b),
    and with foreach the square-root list of the second moments (b) beside them; the fused
    step allocates nothing. Parameters: the model's, split over TP 4."""
    sets = (f"training.optimizer_moments_dtype={moments}",)
    (fe, m), (fu, _) = _memory("foreach", sets), _memory("fused", sets)
    n = (m.layers * tf.layer_params(m) + tf.embedding_params(m) + tf.head_params(m)
         + tf.final_norm_params(m)) / 4
    assert fu["allocated"] * 2**30 == pytest.approx(n * (4 + 4 + 2 * b), rel=1e-3)
    assert (fe["allocated"] - fu["allocated"]) * 2**30 == pytest.approx(n * b)
