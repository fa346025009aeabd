"""bf16 parameters stepped in place (``training.master_weights: none``) or with 16-bit master
remainders (``remainder``), Meta-style RMSNorm
(``training.rmsnorm_gain: input_dtype``) and repeated K/V heads (``training.kv_repeat``):
closed forms worked out by hand, and the model states of a measured run against the parameter
count the measuring script printed (data/measured/heldout8-h100x4/steps_third.jsonl)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.config.load import load_workload
from simulator.config.schema import ModelConfig
from simulator.model import memory as mem
from simulator.model import transformer as tf
from simulator.run import simulate
from simulator.validate import load_case

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
N = 1_000_000


def test_bf16_adamw_without_master_is_eight_bytes_per_parameter():
    # model.to(bfloat16) + AdamW: 2 (weights) + 2 (grads) + 2 + 2 (m, v) = 8 bytes
    s = mem.model_state_bytes(
        N, zero=0, dp=1, param_dtype="bf16", grad_dtype="bf16", moments_dtype="bf16",
        master_weights="none",
    )  # fmt: skip
    assert (s.weights, s.gradients, s.optimizer) == (2 * N, 2 * N, 4 * N)
    # with the fp32 master copy the same keys give 2 + 2 + (4 + 2 + 2) = 12
    kept = mem.model_state_bytes(
        N, zero=0, dp=1, param_dtype="bf16", grad_dtype="bf16", moments_dtype="bf16"
    )
    assert kept.total == 12 * N


@pytest.mark.parametrize("zero, per", [(1, 2 + 2 + 4 / 4), (2, 2 + (2 + 4) / 4), (3, 8 / 4)])
def test_no_master_zero_shards(zero, per):
    s = mem.model_state_bytes(
        N, zero=zero, dp=4, param_dtype="bf16", grad_dtype="bf16", moments_dtype="bf16",
        master_weights="none", kernels="eager",
    )  # fmt: skip
    assert s.total == pytest.approx(per * N)


def test_remainders_keep_two_bytes_of_master_weight():
    # Apex DistributedFusedAdam(store_param_remainders=True) under ZeRO-1 over 4:
    # 2 (bf16 weights) + 4 (fp32 grads) + (2 + 4 + 4) / 4
    s = mem.model_state_bytes(
        N, zero=1, dp=4, param_dtype="bf16", grad_dtype="fp32", master_weights="remainder"
    )
    assert (s.weights, s.gradients, s.optimizer) == (2 * N, 4 * N, 2.5 * N)
    ops = tf.optimizer_ops(N, param_dtype="bf16", grad_dtype="fp32", master_weights="remainder")
    # read g, the bf16 half and the remainder, m, v; write both halves, m, v: 4 + 2 (4 + 8)
    assert {o.name: o.bytes / N for o in ops}["adam"] == 28


def test_remainder_needs_bf16_and_a_fused_optimizer(tmp_path):
    work = yaml.safe_load((ROOT / "validation/heldout8/h8t_single_A.yaml").read_text())
    work["cluster"]["topology"] = str(ROOT / "validation/heldout6/h100x1.yaml")
    work["training"].update(master_weights="remainder", optimizer_impl="foreach")
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump(work))
    p = subprocess.run([sys.executable, "-m", "simulator", "run", str(f), "--no-files"],
                       capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert p.returncode == 2
    assert p.stderr.startswith("error: ") and "training.master_weights" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_fp32_params_ignore_master_weights():
    a = mem.model_state_bytes(N, zero=0, dp=1, param_dtype="fp32", master_weights="none")
    b = mem.model_state_bytes(N, zero=0, dp=1, param_dtype="fp32")
    assert a == b and a.total == 16 * N


def test_in_place_adam_bytes():
    def per(**kw):
        ops = tf.optimizer_ops(N, param_dtype="bf16", grad_dtype="bf16", moments_dtype="bf16",
                               master_weights="none", **kw)  # fmt: skip
        return {o.name: o.bytes / N for o in ops}

    # fused: read g, p, m, v and write p, m, v, all 2 bytes: 2 + 2 (2 + 4) = 14
    assert per() == {"grad_norm": 2, "adam": 14}
    # foreach: 4p + 2g + 14m at p = g = m = 2
    assert per(impl="foreach")["adam"] == 40


T, H, Q, KV, F = 2048, 2048, 2048, 512, 5632
LLAMA = ModelConfig(layers=2, hidden=H, ffn_hidden=F, heads=16, kv_heads=4, vocab=32000,
                    seq_len=T)  # fmt: skip


def _layer(P="bf16", **kw):
    return mem.activation_tensors_per_layer(
        LLAMA, micro_batch=1, tp=1, sequence_parallel=False, recompute="none",
        kernels="eager", param_dtype=P, **kw,
    )  # fmt: skip


def test_rmsnorm_gain_in_the_stream_dtype():
    fp32_gain, meta = _layer(), _layer(norm_gain="input_dtype")
    # two norms, each keeps y at 2 bytes instead of 4 on a bf16 stream
    assert sum(fp32_gain.values()) - sum(meta.values()) == 2 * (4 - 2) * T * H
    assert meta["norm1_normalized"] == 2 * T * H
    # an fp32 stream (autocast over fp32 parameters): y.type_as(x) is fp32 either way
    assert sum(_layer("fp32").values()) == sum(_layer("fp32", norm_gain="input_dtype").values())
    head = mem.head_activation_tensors(
        LLAMA, micro_batch=1, tp=1, sequence_parallel=False, kernels="eager",
        param_dtype="bf16", norm_gain="input_dtype",
    )  # fmt: skip
    assert head["final_norm_normalized"] == 2 * T * H


def test_repeated_kv_heads():
    fused, rep = _layer(), _layer(kv_repeat=True)
    # fused QKV: its output (q + 2kv), rotated q and k; repeated: q, and k, v at q's width
    assert sum(rep.values()) - sum(fused.values()) == 2 * T * (3 * Q - (Q + 2 * KV) - Q - KV)
    assert rep["k_repeated"] == rep["v_repeated"] == 2 * T * Q
    mha = LLAMA.model_copy(update={"kv_heads": 16})
    a, b = (mem.activation_bytes_per_layer(
        mha, micro_batch=1, tp=1, sequence_parallel=False, recompute="none", kernels="eager",
        kv_repeat=k) for k in (False, True))  # fmt: skip
    # MHA: nothing to repeat, but the separate projections' Q, K are freed after the rotation
    # and V is kept as it is: 3 T x q tensors instead of the fused output (3) plus q, k rotated
    assert a - b == 2 * T * (5 * Q - 3 * Q)


def test_measured_run_states_are_eight_bytes_per_counted_parameter():
    """steps_third.py's single-GPU case: the simulator's weights + gradients + optimizer equal
    8 bytes per parameter the script counted on its GPU."""
    rows = [json.loads(x) for x in
            (ROOT / "data/measured/heldout8-h100x4/steps_third.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if r["case"] == "h8t_single_A"]
    work = load_workload(ROOT / "validation/heldout8/h8t_single_A.yaml")
    m = simulate(work).summary["memory_gib"]
    states = (m["weights"] + m["gradients"] + m["optimizer"]) * GiB
    assert states == pytest.approx(8 * row["params_per_rank"][0], rel=1e-6)


def test_nemo_2403_llama2_7b_4k_row_states_and_fit():
    """NeMo 24.03's Llama 2 7B on 4 GPUs (DP 4, ZeRO-1, FP8): Apex's distributed Adam with
    parameter remainders and bf16 gradient sync (the suite's stated sources) keep
    2 (bf16) + 2 (cached FP8 weight and its transpose) + 2 (bf16 gradients) + (2 + 4 + 4) / 4
    bytes per parameter; with the activations of one 4K micro-batch the row fits in 80 GB."""
    suite = ROOT / "validation/nemo-long-sequence.yaml"
    raw = yaml.safe_load(suite.read_text())
    (case,) = [c for c in raw["cases"] if c["name"].endswith("seq4k-4gpu")]
    loaded = load_case(suite, raw["defaults"], case, 0)
    s = simulate(loaded).summary
    n = tf.total_params(loaded.workload.model)
    m = s["memory_gib"]
    assert m["weights"] * GiB == pytest.approx(4 * n, rel=1e-6)
    assert m["gradients"] * GiB == pytest.approx(2 * n, rel=1e-6)
    assert m["optimizer"] * GiB == pytest.approx(10 / 4 * n, rel=1e-6)
    assert s["fits"] and m["total"] < m["capacity"]


def test_llama3_405b_8k_gpu_row_fits_with_one_layer_per_chunk():
    """The Llama 3 paper's 8,192-GPU row (DP 64, 32 micro-batches, no recompute) with its one
    layer per chunk (8 chunks a stage, the first only the embedding): stage 1 holds Megatron's
    interleaved warm-up, (p - 2) 2 + (v - 1) p = 140 chunk-micro-batches, plus the one in its
    steady state, of one layer each; the row fits in 80 GB."""
    loaded = load_workload(
        ROOT / "workloads/llama3-405b.yaml",
        overrides={"parallelism.dp": 64, "topology.nodes": 1024},
    )
    w = loaded.workload
    p, v = w.parallelism.pp, w.parallelism.virtual_stages
    assert (p, v, w.parallelism.stage_layers[0]) == (16, 8, 0)
    layer = mem.activation_bytes_per_layer(
        w.model, micro_batch=1, tp=8, sequence_parallel=True, recompute="none"
    )
    m = simulate(loaded).summary["memory_gib"]
    assert m["activations"] * GiB == pytest.approx(((p - 2) * 2 + (v - 1) * p + 1) * layer)
    assert m["total"] < m["capacity"]
