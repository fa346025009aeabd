"""Global-norm gradient clipping (``training.grad_clip``, issue 12): ``torch.nn.utils.clip_grad_norm_``
reads every gradient once for the norm and multiplies every gradient in place (a read and a
write) whatever the coefficient; worked by hand in bytes."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.errors import ConfigError
from simulator.model import transformer as tf
from simulator.run import simulate
from tests.conftest import ROOT

AC = ROOT / "validation/heldout14/h14t_single_AC.yaml"  # steps_third.py, 1 GPU, bf16 grads, clip 1.0

KW = dict(param_dtype="bf16", grad_dtype="bf16", moments_dtype="bf16", master_weights="none")


def _ops(clip: str, n: float = 1000.0) -> dict[str, float]:
    return {op.name: op.bytes for op in tf.optimizer_ops(n, grad_clip=clip, **KW)}


def test_clip_bytes_by_hand():
    """1000 bf16 gradients: the norm reads 2000 bytes, the multiply reads and writes 4000; the
    fused AdamW in place over bf16 parameters and moments reads g, p, m, v and writes p, m, v:
    2 + 2 (2 + 4) = 14 bytes a parameter, whatever the clipping."""
    assert _ops("norm") == {"grad_norm": 2000.0, "adam": 14000.0}
    assert _ops("foreach") == {"grad_norm": 2000.0, "grad_clip_mul": 4000.0, "adam": 14000.0}
    assert _ops("none") == {"adam": 14000.0}
    # fp32 weights (AMP): the gradients are fp32, 4 + 8 bytes a parameter for the clip
    ops = tf.optimizer_ops(10.0, param_dtype="fp32", grad_dtype="bf16", grad_clip="foreach")
    assert [(o.name, o.bytes) for o in ops[:2]] == [("grad_norm", 40.0), ("grad_clip_mul", 80.0)]
    with pytest.raises(ConfigError, match="grad_clip"):
        tf.optimizer_ops(1.0, grad_clip="always", **KW)


def test_default_is_the_norm_only():
    """Fused (Megatron-Core) workloads and every workload without the key keep the norm alone."""
    assert [o.name for o in tf.optimizer_ops(1.0, **KW)] == ["grad_norm", "adam"]


def test_step_adds_twice_the_norm():
    """On one GPU (host ahead of the GPU in the optimizer), a two-layer AC step: dropping the
    clip removes the norm's read of the 2-byte gradients, the multiply adds twice that time
    (a read and a write of the same bytes at the same bandwidth) less one kernel's fixed
    latency (each memory-bound op is a latency plus its bytes over the bandwidth; a
    microsecond). Parameters by hand: per layer q = 3584, kv = 4 x 128 = 512: attention
    3584 (3584 + 1024) + 3584^2, MLP 3 x 3584 x 9728, two norms 2 x 3584; embedding and
    head 65536 x 3584 each, the final norm 3584."""
    t = {}
    for clip in ("none", "norm", "foreach"):
        w = load_workload(AC, [f"training.grad_clip={clip}", "model.layers=2"])
        t[clip] = simulate(w).summary["step_time_s"]
    m = w.workload.model
    assert (m.hidden, m.ffn, m.heads, m.n_kv_heads, m.vocab) == (3584, 9728, 28, 4, 65536)
    layer = 3584 * (3584 + 2 * 512) + 3584**2 + 3 * 3584 * 9728 + 2 * 3584
    assert tf.layer_params(m) == layer
    n = 2 * layer + 2 * 65536 * 3584 + 3584
    assert simulate(w).summary["model_params"] == pytest.approx(n, rel=1e-9)
    norm = t["norm"] - t["none"]
    assert norm > 0
    assert t["foreach"] - t["norm"] == pytest.approx(2 * norm, abs=2e-6)
    # the norm's time is 2n bytes at the H100's copy bandwidth (2.5-3.35 TB/s: HBM3 at a
    # fraction a memory-bound kernel reaches)
    assert 2.5e12 < 2 * n / norm < 3.35e12
