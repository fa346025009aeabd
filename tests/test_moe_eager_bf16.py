"""An eager MoE layer whose residual stream is already bf16 (``param_dtype: bf16``, no dropout):
its backward has no residual cast to split the MLP and attention halves at; the layer is
still the dense layer's attention half around the MoE block (it used to stop the run)."""

from __future__ import annotations

import subprocess
import sys

from simulator.config.load import load_workload
from simulator.model import comm as mc
from simulator.model import moe_layer

CASE = "validation/heldout8/h8t_moe_ep2_B.yaml"


def _kw(w):
    return dict(micro_batch=w.training.micro_batch, tp=1, sequence_parallel=False,
                flash_attention=True, kernels="eager", param_dtype="bf16")


def test_backward_keeps_the_dense_attention_half_and_one_norm2():
    w = load_workload(CASE).workload
    dense = mc.layer_ops(w.model.model_copy(update={"moe": None}), backward=True, **_kw(w))
    ops = moe_layer.layer_ops(w.model, backward=True, moe_layer=True, ep=2, **_kw(w))
    names = [op.name for op in ops]
    cut = 1 + max(i for i, op in enumerate(dense) if op.name.startswith("norm2"))
    attn = [op.name for op in dense[cut:]]
    assert names[-len(attn):] == attn  # the attention half, unchanged, last
    assert not any(n.startswith(("fc1", "fc2")) for n in names)  # the dense MLP replaced
    assert any(n.startswith("expert_fc1") for n in names)
    assert sum(n.startswith("norm2") for n in names) == sum(
        op.name.startswith("norm2") for op in dense)


def test_the_case_runs():
    p = subprocess.run([sys.executable, "-m", "simulator", "run", CASE, "--no-files", "--json"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
