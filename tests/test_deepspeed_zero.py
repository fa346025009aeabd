"""DeepSpeed's ZeRO stage 3 (``training.zero_impl: deepspeed``): the gathers per module, the
persistent tensors, the gradient buckets, and a latency-bound step at large data-parallel
degree. Counts and sizes worked out by hand from the toy models' shapes and DeepSpeed's rules
(simulator/model/deepspeed.py cites the source)."""

from __future__ import annotations

import pytest

from simulator.config.load import load_topology, load_workload
from simulator.config.schema import ModelConfig
from simulator.errors import ConfigError
from simulator.hardware.catalog import load_gpu
from simulator.model import deepspeed as ds
from simulator.model import transformer as tf
from simulator.network.collectives import collective_summary
from simulator.network.topology import Topology
from simulator.run import simulate
from tests.conftest import ROOT

GPT = ModelConfig(layers=2, hidden=1024, heads=16, seq_len=1024, vocab=50000, activation="gelu")
LLAMA = ModelConfig(layers=2, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                    seq_len=4096, vocab=32000, activation="swiglu")


def test_gpt_layer_gathers_its_four_linears_in_six_modules_padded():
    """A GPT layer (h 1,024): Q, K, V, O of h^2 = 1,048,576 elements each, fc1 and fc2 of
    4h^2 = 4,194,304; the biases (at most 4h = 4,096) and the LayerNorms (h) are at most 1e5
    elements, so persistent. Over 1,000 ranks each weight pads to the next multiple of 1,000."""
    got = ds.fetches(ds.layer_modules(GPT), 1000, 1e5)
    assert got == (1_049_000,) * 4 + (4_195_000,) * 2
    # persistent: 2 LayerNorms x (gain, bias) + biases q, k, v, o (4h) + fc1 (4h) + fc2 (h)
    assert ds.persistent_elements(ds.layer_modules(GPT), 1e5) == 4 * 1024 + 9 * 1024
    # the modules hold every parameter of the layer
    assert sum(map(sum, ds.layer_modules(GPT))) == tf.layer_params(GPT)


def test_threshold_above_a_tensor_keeps_it_whole():
    """With the threshold at h^2 the GPT layer's Q, K, V and O stay whole: only fc1 and fc2
    are gathered; at 0 every tensor, biases and norms too, is gathered."""
    assert ds.fetches(ds.layer_modules(GPT), 8, 1024 * 1024) == (4 * 1024 * 1024,) * 2
    every = ds.fetches(ds.layer_modules(GPT), 1, 0)
    assert len(every) == 8 and sum(every) == tf.layer_params(GPT)


def test_llama_layer_has_seven_gathers_of_its_matrices():
    """Llama (GQA, SwiGLU, no biases): Q and O are h x h, K and V h x 1,024, gate, up and
    down h x 14,336; the two RMSNorm gains (4,096) are persistent."""
    h = 4096
    got = ds.fetches(ds.layer_modules(LLAMA), 1, 1e5)
    assert got == (h * h, h * 1024, h * 1024, h * h, h * 14336, h * 14336, 14336 * h)
    assert ds.fetches(ds.layer_modules(LLAMA, tp=2), 1, 1e5)[0] == h * h // 2


def test_persistent_parameters_cost_their_whole_size_on_every_rank():
    """Weights beyond 2/N a parameter: the persistent tensors (2 layers x 13h + the final
    LayerNorm 2h for GPT) in bf16, less the 1/N share already counted; gradients: the
    contiguous-gradient buffer of reduce_bucket_size bf16 elements."""
    w, g = ds.extra_state_bytes(GPT, tp=1, world=4, threshold=1e5, bucket=5e8, work_bytes=2)
    assert w == pytest.approx((2 * 13 * 1024 + 2 * 1024) * 2 * (1 - 1 / 4))
    assert g == 5e8 * 2


def test_gradient_buckets_close_before_overflowing():
    """Gradients of 3, 3 and 3 elements into buckets of 5: each closes when the next would
    overflow it; the open one carries over to the next unit."""
    assert ds.grad_buckets([3, 3, 3], 5) == ([3, 3], 3)
    assert ds.grad_buckets([3], 5, start=3) == ([3], 3)
    assert ds.grad_buckets([7], 5) == ([], 7)  # a tensor larger than the bucket: alone


# A step at large DP whose compute is negligible: the gathers, one after another on the
# data-parallel communicator, set it.
TINY = ["model.layers=2", "model.hidden=1024", "model.ffn_hidden=4096", "model.heads=16",
        "model.kv_heads=16", "model.seq_len=128", "model.vocab=50000", "model.activation=gelu",
        "training.micro_batch=1", "training.global_batch=1024", "parallelism.tp=1",
        "parallelism.pp=1", "parallelism.dp=1024", "parallelism.zero=3",
        "parallelism.sequence_parallel=false", "topology.nodes=128",
        "training.zero_impl=deepspeed", "training.grad_reduce_dtype=bf16",
        "training.deepspeed={reduce_bucket_size: 1e12}"]
TOPO = ROOT / "topologies/dgx-h100-ndr-fattree-16k.yaml"


def _tiny(extra=()):
    return load_workload(ROOT / "workloads/llama3-8b.yaml", [*TINY, *extra], topology=str(TOPO))


def _topology() -> Topology:
    cfg = load_topology(str(TOPO), ["topology.nodes=128"])
    return Topology(cfg, load_gpu(cfg.gpu, file=str(TOPO), field="gpu"))


def test_latency_bound_step_is_its_gathers_one_after_another():
    """GPT h 1,024, 2 layers, 1,024 ranks, one micro-batch: each layer gathers 6 modules, the
    embedding 2 (words, positions), the head 1 (its V x h matrix; the final LayerNorm is
    persistent); forward and backward each gather them all: 2 x (2 x 6 + 2 + 1) = 30
    all-gathers, each taking what the collective model gives a ring of 1,024 ranks (mostly
    1,023 steps of latency), one after another on the data-parallel communicator; the step is
    at least their sum."""
    out = simulate(_tiny())
    ev = out.events
    gathers = ev[ev["kind"] == "zero_gather"]
    assert len(gathers) == 30
    sizes = ds.fetches(ds.layer_modules(GPT), 1024, 1e5)
    embed, pos = ds.padded(50000 * 1024, 1024), ds.padded(128 * 1024, 1024)  # seq 128
    expect = 2 * (2 * sum(sizes) + embed + pos + embed)
    assert float(gathers["bytes"].sum()) == pytest.approx(2.0 * expect)
    topo = _topology()
    alone = 2 * sum(collective_summary(topo, "all_gather", 2.0 * n, 1024)["time_s"]
                    for n in (*sizes, *sizes, embed, pos, embed))
    busy = float((gathers["end_s"] - gathers["start_s"]).sum())
    assert busy >= alone * 0.999
    assert out.summary["step_time_s"] >= alone
    assert out.summary["breakdown_s"]["dp_comm"] > 0.5 * out.summary["step_time_s"]


def test_unit_zero3_gathers_once_per_layer():
    """The same step with ``zero_impl: unit``: one gather per unit (2 layers, embedding,
    head) in each pass, 8 in all."""
    out = simulate(_tiny(["training.zero_impl=unit"]))
    assert (out.events["kind"] == "zero_gather").sum() == 8


def test_deepspeed_refuses_what_it_cannot_run():
    """ZeRO stage 3 only, no pipeline stages (DeepSpeed's pipeline engine refuses ZeRO-2/3)."""
    with pytest.raises(ConfigError, match="zero: 3"):
        simulate(_tiny(["parallelism.zero=1"]))
    with pytest.raises(ConfigError, match="pipeline"):
        simulate(_tiny(["parallelism.pp=2", "parallelism.dp=512"]))


def test_ring_latency_sets_a_small_gather_at_large_dp():
    """A ring all-gather of a small message over 1,024 ranks costs about 1,023 steps of
    latency: 32 KiB takes over a hundred times its bytes at 50 GB/s."""
    small = collective_summary(_topology(), "all_gather", 32 * 1024, 1024)
    assert small["time_s"] > 100 * 32 * 1024 / 50e9
