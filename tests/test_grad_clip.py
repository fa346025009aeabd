"""Global-norm gradient clipping (``training.grad_clip``, issue 12): ``torch.nn.utils.clip_grad_norm_``
reads every gradient once for the norm and multiplies every gradient in place (a read and a
write) whatever the coefficient; worked by hand in bytes."""

from __future__ import annotations

import re

import pytest
import yaml

from simulator.config.load import load_workload
from simulator.errors import ConfigError
from simulator.hardware.catalog import load_gpu
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
    clip removes the norm's read of the 2-byte gradients; clip_grad_norm_ adds the multiply,
    twice those bytes (a read and a write), and both at PyTorch's multi-tensor rate (each
    memory-bound op is a latency plus its bytes over the bandwidth; a microsecond). Parameters by hand: per layer q = 3584, kv = 4 x 128 = 512: attention
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
    # the norm's time is 2n bytes at the H100's copy bandwidth (2.5-3.35 TB/s: HBM3 at a
    # fraction a memory-bound kernel reaches)
    assert 2.5e12 < 2 * n / norm < 3.35e12
    # clip_grad_norm_'s two multi-tensor kernels over bf16 gradients run at the measured
    # ``foreach`` fraction r of the copy (data/measured/stepmech-h100x4): the norm's read and
    # the multiply's read and write, 3 x 2n bytes at r, one latency each (a microsecond)
    r = load_gpu("H100-SXM-80GB").memory_access["foreach"]
    assert 0.5 < r < 0.9
    assert t["foreach"] - t["none"] == pytest.approx(3 * norm / r, abs=4e-6)


SCRIPT = re.compile(r"\b(steps|steps_alt|steps_third|measure)\.py\b|data/measured/([\w-]+)/")


def _measuring_script(path) -> str | None:
    """The device script whose step a workload describes: the first one its header comments
    name, or the one that wrote the data file it names (the data directory's README says)."""
    head = "\n".join(ln for ln in path.read_text().splitlines() if ln.startswith("#"))
    m = SCRIPT.search(head)
    if m is None:
        return None
    if m.group(1):
        return m.group(1)
    readme = (ROOT / "data/measured" / m.group(2) / "README.md").read_text()
    return re.search(r"benchmarks/device/(\w+)\.py", readme).group(1)


def test_eager_workloads_clip_as_their_script_does():
    """Every workload of a step measured by steps.py, steps_alt.py, steps_third.py or measure.py
    says what its script does: foreach where the script's source calls clip_grad_norm_ (or its
    hand-written distributed clip), none where it never clips (no norm read either)."""
    clips = {s: bool(re.search(r"clip_grad_norm_|clip_distributed",
                               (ROOT / f"benchmarks/device/{s}.py").read_text()))
             for s in ("steps", "steps_alt", "steps_third", "measure")}
    assert clips == {"steps": False, "steps_alt": False, "steps_third": True, "measure": False}
    seen = {s: 0 for s in clips}
    for path in sorted((ROOT / "validation").rglob("*.yaml")):
        text = path.read_text()
        if not re.search(r"^training:", text, re.M):
            continue
        script = _measuring_script(path)
        if script is None:
            continue
        seen[script] += 1
        want = "foreach" if clips[script] else "none"
        assert yaml.safe_load(text)["training"].get("grad_clip") == want, path
    assert min(seen.values()) > 0, seen
