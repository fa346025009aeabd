"""DeepSeek-V3's memory and traffic savings (arXiv:2412.19437, Sections 3.3.2-3.3.3): Adam
moments in BF16 (master weights fp32), and dispatch in FP8 with the combine in BF16, against
closed forms and through the engine."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.model import memory as mem
from simulator.model import moe
from simulator.model import transformer as tf
from simulator.model.moe import Comm
from tests.conftest import small_topology, write_case
from tests.test_moe_engine import WORK
from tests.test_moe_model import DSV3

BLOCK = 1 + 4 / 128  # an FP8 byte per element plus an fp32 scale per 1x128 tile


@pytest.mark.parametrize("zero,dp", [(0, 1), (1, 8), (3, 4)])
def test_bf16_moments_hold_four_plus_two_plus_two_bytes(zero, dp):
    n = 1e9
    kw = dict(zero=zero, dp=dp, param_dtype="bf16", grad_dtype="fp32")
    fp32 = mem.model_state_bytes(n, **kw)
    bf16 = mem.model_state_bytes(n, moments_dtype="bf16", **kw)
    shard = dp if zero >= 1 else 1
    assert fp32.optimizer == n * (4 + 4 + 4) / shard
    assert bf16.optimizer == n * (4 + 2 + 2) / shard
    assert (bf16.weights, bf16.gradients) == (fp32.weights, fp32.gradients)
    # AMP (fp32 working weights): no master copy, only the moments
    amp = mem.model_state_bytes(n, zero=0, dp=1, param_dtype="fp32", moments_dtype="bf16")
    assert amp.optimizer == n * (2 + 2)


def test_adam_moves_the_moments_in_their_dtype():
    n = 1e6
    bytes_of = {op.name: op.bytes for op in tf.optimizer_ops(
        n, param_dtype="bf16", grad_dtype="fp32", moments_dtype="bf16")}  # fmt: skip
    # read g (4), master (4), m, v (2 + 2); write master, m, v (8) and the bf16 weights (2)
    assert bytes_of["adam"] == n * (4 + 8 + 8 + 2)
    fp32 = {op.name: op.bytes for op in tf.optimizer_ops(n, param_dtype="bf16", grad_dtype="fp32")}
    assert fp32["adam"] == n * (4 + 12 + 12 + 2)


def _a2a(ops):
    return {c.name: c.nbytes for c in ops if isinstance(c, Comm) and c.collective == "all_to_all"}


def test_fp8_dispatch_halves_the_bytes_towards_the_experts():
    ep = 64
    loc = moe.moe_local(DSV3, 1, 1, 1, ep, 1)
    t, k, h = 4096, 8, 7168
    kw = dict(tp=1, ep=ep, etp=1, d=2, dispatch_bytes=BLOCK)
    fwd = _a2a(moe.moe_forward_ops(DSV3, loc, **kw))
    bwd = _a2a(moe.moe_backward_ops(DSV3, loc, **kw))
    # forward: tokens out in FP8 with their scales, expert outputs back in BF16
    assert fwd["moe_dispatch"] == pytest.approx(t * k * h * BLOCK)
    assert fwd["moe_combine"] == pytest.approx(t * k * h * 2)
    # backward: output gradients to the experts (the combine's conjugate) in FP8, input
    # gradients back (the dispatch's conjugate) in BF16
    assert bwd["moe_combine"] == pytest.approx(t * k * h * BLOCK)
    assert bwd["moe_dispatch"] == pytest.approx(t * k * h * 2)
    # per rank and layer: 2 x 1.03 + 2 x 2 bytes per element instead of 4 x 2
    total = sum(v for d in (fwd, bwd) for n, v in d.items() if n in ("moe_dispatch", "moe_combine"))
    assert total == pytest.approx(t * k * h * (2 * BLOCK + 2 * 2))
    # the copies' routing probabilities (Megatron-Core's alltoall dispatcher) stay fp32
    assert fwd["moe_dispatch_probs"] == bwd["moe_dispatch_probs"] == pytest.approx(t * k * 4)


def _run(tmp_path, capsys, training: dict) -> dict:
    work = {**WORK, "training": {**WORK["training"], **training}}
    p = write_case(tmp_path, work, small_topology(2, 8))
    assert main(["run", str(p), "--json", "--no-files"]) == 0
    return json.loads(capsys.readouterr().out)


def test_engine_memory_and_step_follow_the_keys(tmp_path, capsys):
    fp8 = {"precision": "fp8", "fp8_recipe": "blockwise"}
    base = _run(tmp_path, capsys, fp8)
    lean = _run(tmp_path, capsys, {**fp8, "optimizer_moments_dtype": "bf16"})
    # ZeRO-1 state is master + m + v: 12 -> 8 bytes per parameter, the rest unchanged
    assert lean["memory_gib"]["optimizer"] == pytest.approx(
        base["memory_gib"]["optimizer"] * 8 / 12, rel=1e-12)  # fmt: skip
    assert lean["memory_gib"]["weights"] == base["memory_gib"]["weights"]
    fast = _run(tmp_path, capsys, {**fp8, "moe_dispatch_dtype": "fp8"})
    assert fast["breakdown_s"]["ep_comm"] < base["breakdown_s"]["ep_comm"]
    assert fast["memory_gib"] == base["memory_gib"]


def test_fp8_dispatch_needs_an_fp8_recipe(tmp_path, capsys):
    work = {**WORK, "training": {**WORK["training"], "moe_dispatch_dtype": "fp8"}}
    p = write_case(tmp_path, work, small_topology(2, 8))
    assert main(["run", str(p), "--json", "--no-files"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "training.moe_dispatch_dtype" in err
    assert "precision fp8 or mxfp8" in err
    assert "\n" not in err
