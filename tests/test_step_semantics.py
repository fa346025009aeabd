"""Figures mean what their names say: regressions of the audit in issue 14.

Each test works its expectation out independently of the engine (Megatron-LM's documented
behaviour, a closed form, or a structural invariant).
"""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.model import transformer as tf
from simulator.run import simulate
from tests.conftest import SMALL_MODEL, small_topology, write_case


def _run(tmp_path, work: dict, topo: dict, detail: str = "folded"):
    return simulate(load_workload(write_case(tmp_path, work, topo)), detail=detail)


@pytest.mark.parametrize("detail", ["folded", "full"])
def test_no_overlap_reduces_in_one_bucket(tmp_path, detail):
    """``overlap_grad_reduce: false``: Megatron-LM sets the bucket size to None, so the whole
    gradient buffer is one bucket, reduced once after the backward pass (not 25 MB pieces)."""
    work = {"name": "dp16", "model": SMALL_MODEL,
            "training": {"global_batch": 16, "overlap_grad_reduce": False,
                         "grad_reduce_dtype": "fp32"},
            "parallelism": {"tp": 1, "pp": 1, "dp": 16, "zero": 0}}
    res = _run(tmp_path, work, small_topology(nodes=2), detail)
    dp = res.events[res.events["kind"] == "dp_comm"]
    per_gpu = dp.groupby("gpu").size()
    assert (per_gpu == 1).all(), per_gpu.to_dict()
    # The one bucket holds every parameter's fp32 gradient (tp = pp = 1).
    assert dp["bytes"].iloc[0] == pytest.approx(tf.total_params(load_workload(
        tmp_path / "work.yaml").workload.model) * 4, rel=1e-9)


LONG = {"layers": 2, "hidden": 4096, "ffn_hidden": 14336, "heads": 32, "kv_heads": 8,
        "vocab": 128256, "seq_len": 262_144, "activation": "swiglu"}


def test_mfu_counts_causal_attention_and_never_exceeds_one(tmp_path):
    """Model FLOPs count causal attention (Megatron-LM's counting); at 262,144 tokens a
    sequence attention is most of the work, and non-causal counting reported MFU > 1."""
    work = {"name": "long", "model": LONG, "training": {"global_batch": 1},
            "parallelism": {"tp": 8, "pp": 1, "dp": 1, "sequence_parallel": True}}
    s = _run(tmp_path, work, small_topology()).summary
    b, sq, L, h, V = 1, LONG["seq_len"], LONG["layers"], LONG["hidden"], LONG["vocab"]
    kv = h // LONG["heads"] * LONG["kv_heads"]
    gemm_fwd = 2 * b * sq * (L * (h * (h + 2 * kv) + h * h + 3 * h * LONG["ffn_hidden"]) + h * V)
    attn_fwd = L * 2 * b * sq * sq * h  # the lower triangle of QK^T, then PV
    assert s["model_flops_per_step"] == pytest.approx(3 * (gemm_fwd + attn_fwd), rel=1e-12)
    # Executed: backward GEMMs twice the forward, flash backward 2.5x its forward (FA-2).
    assert s["hardware_flops_per_step"] == pytest.approx(3 * gemm_fwd + 3.5 * attn_fwd, rel=1e-9)
    assert 0 < s["mfu"] <= s["hfu"] <= 1.0
    peak = s["tflops_per_gpu"] / s["mfu"]
    assert peak == pytest.approx(989.4, rel=1e-3)  # H100 SXM dense bf16 (catalog)


@pytest.mark.parametrize("detail", ["folded", "full"])
def test_full_recompute_holds_the_recomputed_layer(tmp_path, detail):
    """Full recompute keeps only each layer's input (2sbh) through the forward, but the
    backward of a layer first re-runs its forward: Korthikanti et al. 2022's sbh(34 + 5as/h)
    (GPT, dropout, no flash attention, no TP) is allocated again, beside the other layers'
    checkpoints, until that layer's backward ends."""
    model = {**SMALL_MODEL, "layers": 4, "vocab": 4096, "seq_len": 2048}
    work = {"name": "rc", "model": model,
            "training": {"global_batch": 2, "recompute": "full", "flash_attention": False},
            "parallelism": {"tp": 1, "pp": 1, "dp": 2}}
    res = _run(tmp_path, work, small_topology(nodes=1, gpus_per_node=2), detail)
    s, b, h, a, L = model["seq_len"], 1, model["hidden"], model["heads"], model["layers"]
    sbh = s * b * h
    layer_full = sbh * (34 + 5 * a * s / h)  # Korthikanti Sec. 4.1, bytes
    checkpoints = (L - 1) * 2 * sbh  # the other layers' inputs, still held
    peak = res.summary["memory_gib"]["activations"] * 1024**3
    assert peak >= checkpoints + layer_full
    # ... and released again: no activation outlives the step.
    mem = res.memory[res.memory["what"] == "activations"]
    assert mem.groupby("proc")["delta_bytes"].sum().abs().max() < 1.0


@pytest.mark.parametrize("detail", ["folded", "full"])
def test_pp_scatter_gather_gathers_at_the_receiver(tmp_path, detail):
    """Megatron's scatter/gather (Narayanan et al. 2021, Sec. 4.1) sends 1/tp of a stage
    boundary tensor per TP rank and all-gathers it over NVLink at the receiver, before the
    receiver can use it: one gather per received activation and per received gradient, each
    no faster than a ring all-gather at the NVLink rate."""
    model = {**SMALL_MODEL, "seq_len": 4096}
    tp, m = 4, 4
    work = {"name": "sg", "model": model, "training": {"global_batch": m},
            "parallelism": {"tp": tp, "pp": 2, "dp": 1, "sequence_parallel": False,
                            "pp_scatter_gather": True}}
    topo = small_topology(nvlink_bandwidth_GBps=450.0)
    res = _run(tmp_path, work, topo, detail)
    ev = res.events
    gathers = ev[(ev["kind"] == "pp_comm") & (ev["stream"] == "compute")]
    per_stage = gathers.groupby(["stage", "gpu"]).size()
    # stage 1 receives m activations, stage 0 m gradients; every TP rank (full) or the
    # group's process (folded) gathers each once
    assert set(per_stage.index.get_level_values("stage")) == {0, 1}
    assert (per_stage == m).all(), per_stage.to_dict()
    full_bytes = 4096 * model["hidden"] * 2  # b s h, bf16
    ring = (tp - 1) / tp * full_bytes / 450e9
    assert (gathers["end_s"] - gathers["start_s"]).min() >= ring
    assert res.summary["breakdown_s"]["pp_comm"] >= m * ring
