"""``training.grad_accumulation_fusion: false``: Megatron-LM without its fused wgrad
accumulation (before commit 83b1e42f, or with fp16 gradients) adds each fresh weight gradient
into the step's accumulated one after the wgrad GEMM. Bytes and times worked out by hand from
the layer's weight shapes (Megatron's column/row-parallel split over ``tp``)."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.model import transformer as tf
from simulator.model.ops import local_dims
from simulator.run import simulate
from tests.conftest import ROOT

LLAMA = ROOT / "workloads/llama70b.yaml"
H, FFN, HEADS, KV, V, LAYERS, M = 1024, 2816, 16, 4, 32000, 4, 4
SMALL = (f"model.layers={LAYERS}", f"model.hidden={H}", f"model.ffn_hidden={FFN}",
         f"model.heads={HEADS}", f"model.kv_heads={KV}", "model.seq_len=1024",
         f"training.global_batch={M}", "training.micro_batch=1", "parallelism.tp=1",
         "parallelism.pp=1", "parallelism.dp=1", "parallelism.zero=0",
         "parallelism.sequence_parallel=false", "topology.nodes=1",
         "topology.gpus_per_node=1")  # fmt: skip


def _weights(tp: int) -> list[int]:
    """Weight elements of a Llama layer's GEMMs on one TP rank: QKV (h x (h + 2 kv_w)),
    out_proj (h x h), fc1 (h x 2 ffn: gate and up), fc2 (ffn x h), each split over tp."""
    kv_w = KV * (H // HEADS)
    return [H * (H + 2 * kv_w) // tp, H * H // tp, H * 2 * FFN // tp, FFN * H // tp]


def test_bytes_per_weight_gemm():
    """fp16 buffer, 4 micro-batches (autograd's .grad: 3 of 4 add): (2 + 2 x 2) x 3/4 bytes a
    weight element, one addition after each of the four weight GEMMs and none after the
    attention kernel."""
    wl = load_workload(LLAMA, SMALL).workload
    for tp in (1, 2):
        ops = tf.layer_backward_ops(wl.model, micro_batch=1, tp=tp, sequence_parallel=False)
        out = tf.unfused_grad_accumulation(ops, 2, 2, 0.75)
        added = [op for op in out if op.name.endswith("_gacc")]
        assert [op.name for op in added] == ["fc2_gacc", "fc1_gacc", "out_proj_gacc", "qkv_gacc"]
        assert sorted(op.bytes for op in added) == sorted(6 * 0.75 * w for w in _weights(tp))
        assert len(out) - len(ops) == 4
    # unfused attention's batched products carry no weight
    L = local_dims(wl.model, 1, 1, False)
    ops = tf.layer_backward_ops(wl.model, micro_batch=1, tp=1, sequence_parallel=False,
                                flash_attention=False)  # fmt: skip
    added = [op for op in tf.unfused_grad_accumulation(ops, 2, 4, 1.0) if op.kind == "memory"
             and op.name.endswith("_gacc")]  # fmt: skip
    assert len(added) == 4 and L.heads == HEADS
    assert sum(op.bytes for op in added) == pytest.approx(10 * sum(_weights(1)))


@pytest.mark.parametrize(
    "grad_dtype, per_elem, share", [("fp16", 6, (M - 1) / M), ("fp32", 10, 1.0)]
)
def test_step_pays_every_addition(grad_dtype, per_elem, share):
    """One GPU, M micro-batches run back to back: the step grows by M x (LAYERS x the four
    layer additions + the LM head's, h x V), each an HBM stream of its bytes plus a kernel
    launch (fp16 buffer: 2 + 2 x 2 bytes for M - 1 of M micro-batches; fp32: 2 + 2 x 4, all)."""
    sets = (*SMALL, f"training.grad_reduce_dtype={grad_dtype}")
    on = simulate(load_workload(LLAMA, sets)).summary
    off = simulate(load_workload(LLAMA, (*sets, "training.grad_accumulation_fusion=false")))
    cm = ComputeModel(load_gpu(on["gpu"]))
    launch = cm.gpu.kernel_launch_s
    per_mb = sum(LAYERS * (cm.memory_s(per_elem * share * w) + launch) for w in _weights(1))
    per_mb += cm.memory_s(per_elem * share * H * V) + launch
    assert off.summary["step_time_s"] - on["step_time_s"] == pytest.approx(M * per_mb, rel=1e-3)


def test_ignored_where_code_already_accumulates():
    """Eager code and fp32 master weights add into .grad already: the switch changes nothing."""
    for extra in (("training.kernels=eager",), ("training.param_dtype=fp32",)):
        a = simulate(load_workload(LLAMA, (*SMALL, *extra))).summary["step_time_s"]
        b = simulate(load_workload(LLAMA, (*SMALL, *extra,
                                           "training.grad_accumulation_fusion=false")))  # fmt: skip
        assert b.summary["step_time_s"] == a
