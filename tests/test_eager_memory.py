"""Eager-PyTorch memory (``kernels: eager``): what autograd saves, counted by hand for small
shapes, checked against PyTorch's own saved tensors and allocator peaks of a probe run
(data/measured/eager-memory-probe, benchmarks/device/eager_memory_probe.py), and wired into
the engine (the peak of a measured workload is the analytic sum)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from simulator.config.schema import ModelConfig
from simulator.errors import ConfigError
from simulator.model import memory as mem
from simulator.model import transformer as tf
from simulator.run import simulate
from simulator.validate import load_case, run_suite, summary_value

ROOT = Path(__file__).resolve().parents[1]
PROBE_DIR = ROOT / "data" / "measured" / "eager-memory-probe"

# benchmarks/device/eager_memory_probe.py PROBE: T = 2048 tokens, h = 2048, q = 16 x 128,
# kv = 4 x 128, ffn 5632 (gate_up 11264), vocab 16000
PROBE = ModelConfig(
    layers=4, hidden=2048, ffn_hidden=5632, heads=16, kv_heads=4, vocab=16000, seq_len=2048
)
T, H, Q, KV, F, V, HEADS, HD = 2048, 2048, 2048, 512, 5632, 16000, 16, 128
GEMM_WEIGHTS = H * (Q + 2 * KV) + Q * H + H * 2 * F + F * H  # qkv, o, gate_up, down


def eager(model=PROBE, tp=1, P="fp32", rc="none", flash=True, b=1, d=2):
    kw = dict(micro_batch=b, tp=tp, sequence_parallel=False, kernels="eager", param_dtype=P)
    return mem.activation_tensors_per_layer(
        model, recompute=rc, flash_attention=flash, dtype_bytes=d, **kw
    )


def hand_llama_layer(tp: int, fp32_params: bool) -> int:
    """One Llama layer of measure.py under bf16 autocast, tensor by tensor (bytes)."""
    t = tp
    n = 0
    for _ in range(2):  # attn_norm, mlp_norm: fp32 input, rsqrt per row, normalised y
        n += 4 * T * H + 4 * T + 4 * T * H
    n += 2 * T * H  # attn_norm(x).to(bf16): qkv's input
    n += 2 * T * (Q + 2 * KV) // t  # qkv output, kept whole by the V view
    n += 2 * (2 * T * HD)  # cos, sin cast to bf16 in every layer
    n += 2 * T * Q // t + 2 * T * KV // t  # rotated q, k
    n += 2 * T * Q // t + 4 * (HEADS // t) * T  # SDPA output (o's input is a view), fp32 lse
    n += 2 * T * H  # mlp_norm(x).to(bf16): gate_up's input
    n += 2 * T * 2 * F // t  # gate_up output (silu keeps g, mul keeps u)
    n += 2 * T * F // t + 2 * T * F // t  # silu(g), down's input silu(g)*u
    if fp32_params:
        n += 2 * GEMM_WEIGHTS // t  # bf16 weight casts saved by mm
    return n


def test_llama_layer_hand_count():
    assert sum(eager().values()) == hand_llama_layer(1, True) == 298_991_616
    assert sum(eager(tp=2).values()) == hand_llama_layer(2, True)
    assert sum(eager(P="bf16").values()) == hand_llama_layer(1, False)
    assert eager()["weight_casts"] == 2 * GEMM_WEIGHTS  # 104 MiB
    assert "weight_casts" not in eager(P="bf16")


def _saved_by_module(case: str) -> dict[str, int]:
    """Saved non-parameter bytes per top-level module (layers by index) in the probe."""
    r = json.loads((PROBE_DIR / f"probe_{case}.json").read_text())
    out: dict[str, int] = defaultdict(int)
    for s in r["saved"]:
        if s["param"]:
            continue
        parts = s["module"].replace("_fsdp_wrapped_module.", "").split(".")
        out[".".join(parts[:2]) if parts[0] == "layers" else parts[0]] += s["bytes"]
    return out


@pytest.mark.parametrize(
    ("case", "tp", "P"), [("single", 1, "fp32"), ("tp", 2, "fp32"), ("fsdp", 1, "bf16")]
)
def test_layer_matches_pytorchs_saved_tensors(case, tp, P):
    # Layer 1 (its input is layer 0's output): PyTorch saved the same bytes, plus the SDPA's
    # two int64 RNG scalars (philox seed and offset, 16 bytes)
    saved = _saved_by_module(case)["layers.1"]
    assert saved - sum(eager(tp=tp, P=P).values()) == 16


def test_head_and_embedding_match_pytorchs_saved_tensors():
    kw = dict(micro_batch=1, sequence_parallel=False, kernels="eager", param_dtype="fp32")
    for case, tp in (("single", 1), ("tp", 2)):
        s = _saved_by_module(case)
        head = mem.head_activation_bytes(PROBE, tp=tp, **kw)
        # the probe's "head" also lists the labels (the batch, not new memory) for tp = 1
        labels = 2 * T * 8 + 4 if tp == 1 else 0  # the labels' storage, nll's total weight
        assert s["norm"] + s["head"] - labels == head
        assert mem.embedding_activation_bytes(PROBE, tp=tp, **kw) == (0 if tp == 1 else s["embed"])
    t = mem.head_activation_tensors(PROBE, tp=1, **kw)
    assert t["log_softmax"] == 4 * T * V and t["head_weight_cast"] == 2 * H * V


def test_head_transient():
    kw = dict(micro_batch=1, sequence_parallel=False, kernels="eager")
    # tp = 1: backward holds nll_loss's and log_softmax's fp32 gradients (8 TV) beside the
    # kept log-softmax; forward only bf16 logits + fp32 copy (6 TV)
    assert mem.head_transient_bytes(PROBE, tp=1, **kw) == 8 * T * V
    # tp > 1: forward holds bf16 logits + fp32 copy while logits - max is written (6 TV/t)
    assert mem.head_transient_bytes(PROBE, tp=2, **kw) == 6 * T * V // 2
    assert mem.head_transient_bytes(PROBE, tp=1, dtype_bytes=4, **kw) == 8 * T * V
    assert mem.head_transient_bytes(PROBE, tp=2, dtype_bytes=4, **kw) == 4 * T * V // 2
    fused = mem.head_transient_bytes(PROBE, tp=2, micro_batch=1, sequence_parallel=False)
    assert fused == T * V // 2 * (2 + 4)


def _probe(case: str) -> dict:
    return json.loads((PROBE_DIR / f"probe_{case}.json").read_text())


@pytest.mark.parametrize("case", ["single", "ddp", "tp", "fsdp"])
def test_step_peak_matches_the_probe(case):
    """The whole step's peak, assembled from the formulas, against max_memory_allocated; the
    ~70 MB of buffers that exist before the step (RoPE tables, batch, cuBLAS workspaces) are
    read off the probe's baseline."""
    r = _probe(case)
    tp = 2 if case == "tp" else 1
    dp = 2 if case in ("ddp", "fsdp") else 1
    zero = 3 if case == "fsdp" else 0
    P = "bf16" if case == "fsdp" else "fp32"
    n = r["params_local"]
    kw = dict(micro_batch=1, tp=tp, sequence_parallel=False, kernels="eager", param_dtype=P)
    states = mem.model_state_bytes(
        n * dp if zero == 3 else n,
        zero=zero,
        dp=dp,
        param_dtype=P,
        grad_dtype="fp32",
        kernels="eager",
    )
    buckets = mem.ddp_bucket_bytes(
        n, kernels="eager", zero=zero, dp=dp, param_dtype=P, grad_dtype="fp32"
    )
    acts = PROBE.layers * mem.activation_bytes_per_layer(PROBE, recompute="none", **kw)
    acts += mem.head_activation_bytes(PROBE, include_transient=True, **kw)
    acts += mem.embedding_activation_bytes(PROBE, **kw)
    gathered = 0.0
    if zero == 3:  # the root unit (embedding + head) and the next layer unit, bf16, unsharded
        gathered = 2 * (tf.embedding_params(PROBE) + tf.head_params(PROBE))
        gathered += 2 * tf.layer_params(PROBE)
    # the probe's window holds the iteration that rebuilds the buckets (the second): the
    # constructor's set, live at its start, is still live at that iteration's peak
    first_set = buckets / mem.DDP_BUCKET_SETS
    rebuild = mem.DDP_REBUILD_EXTRA_SETS * first_set
    at_start = states.weights + first_set
    other = r["peak"]["baseline_bytes"] - at_start
    assert 0 < other < 80e6
    predicted = states.total + buckets + rebuild + acts + gathered + other
    assert predicted == pytest.approx(r["max_memory_allocated"], rel=0.005)


def test_ddp_buckets_and_fsdp_states():
    n = 1e9
    # DDP, AMP, steady state: one fp32 bucket set (4 bytes x 1e9) beside the fp32 gradients,
    # whatever the micro-batches; none for one GPU / fused / ZeRO
    assert mem.ddp_bucket_bytes(n, kernels="eager", zero=0, dp=4, param_dtype="fp32") == 4e9
    assert mem.ddp_bucket_bytes(n, kernels="eager", zero=0, dp=4, param_dtype="fp32",
                                micro_batches=1) == 4e9
    assert mem.ddp_bucket_bytes(n, kernels="eager", zero=0, dp=1, param_dtype="fp32") == 0
    assert mem.ddp_bucket_bytes(n, kernels="fused", zero=0, dp=4, param_dtype="fp32") == 0
    assert mem.ddp_bucket_bytes(n, kernels="eager", zero=3, dp=4, param_dtype="bf16") == 0
    # gradient_as_bucket_view=True: the gradients become the buckets; the no_sync micro-batch's
    # ordinary gradients live beside them into the last backward (4 GB), with one micro-batch
    # nothing does; a script reducing one transient flat bucket at a time holds none
    assert mem.ddp_bucket_bytes(n, kernels="eager", zero=0, dp=4, param_dtype="fp32",
                                buckets="view") == 4e9
    assert mem.ddp_bucket_bytes(n, kernels="eager", zero=0, dp=4, param_dtype="fp32",
                                buckets="view", micro_batches=1) == 0
    assert mem.ddp_bucket_bytes(n, kernels="eager", zero=0, dp=4, param_dtype="fp32",
                                buckets="none") == 0
    # FSDP mixed precision: fp32 shards + fp32 grads + m, v = 16/N; Megatron ZeRO-3 18/N
    s = mem.model_state_bytes(
        n, zero=3, dp=4, param_dtype="bf16", grad_dtype="fp32", kernels="eager"
    )
    assert (s.weights, s.gradients, s.optimizer) == (1e9, 1e9, 2e9)
    f = mem.model_state_bytes(n, zero=3, dp=4, param_dtype="bf16", grad_dtype="fp32")
    assert f.total == 18 * n / 4
    with pytest.raises(ConfigError):
        mem.model_state_bytes(n, zero=0, dp=1, kernels="jit")


GPT_SMALL = ModelConfig(layers=2, hidden=256, heads=4, vocab=1000, seq_len=128, activation="gelu")


def test_gpt_eager_layer_hand_count():
    # nanoGPT block, b = 2, s = 128 (T = 256), h = 256, 4 heads, ffn 1024, bf16 autocast over
    # fp32 params: LayerNorm keeps its fp32 input and row mean + rstd; dropout masks 1 byte
    b, s, h, a, f = 2, 128, 256, 4, 1024
    t_ = b * s
    ln = 4 * t_ * h + 2 * 4 * t_
    flash = (
        2 * ln  # two LayerNorms
        + 2 * (2 * t_ * h)  # qkv input, fc1 input (bf16)
        + 2 * t_ * 3 * h  # qkv output (q, k, v views)
        + 2 * t_ * h
        + 4 * b * a * s  # SDPA output, log-sum-exp
        + 2 * t_ * h  # two dropout masks after the branches
        + 2 * t_ * f
        + 2 * t_ * f  # GELU input, fc2 input
        + 2 * (3 * h * h + h * h + 2 * h * f)  # weight casts
    )
    assert sum(eager(GPT_SMALL, b=b).values()) == flash
    sq = b * a * s * s
    math = flash - 4 * b * a * s + 4 * (2 * t_ * h)  # q, k, v copies and transposed output
    math += 4 * sq + sq + 2 * sq  # fp32 softmax, its dropout mask, bf16 probabilities
    math -= 2 * t_ * h  # the output copy replaces the SDPA output
    assert sum(eager(GPT_SMALL, b=b, flash=False).values()) == math
    assert sum(eager(GPT_SMALL, b=b, flash=False, rc="selective").values()) == (math - 7 * sq)
    full = eager(GPT_SMALL, b=b, rc="full")
    assert full == {"layer_input": 4 * t_ * h, "weight_casts": 2 * (4 * h * h + 2 * h * f)}


def test_fused_gets_weight_casts_only_with_fp32_params():
    kw = dict(micro_batch=1, tp=1, sequence_parallel=False, recompute="selective")
    base = mem.activation_bytes_per_layer(PROBE, **kw)
    assert mem.activation_bytes_per_layer(PROBE, param_dtype="bf16", **kw) == base
    assert mem.activation_bytes_per_layer(PROBE, param_dtype="fp32", **kw) == (
        base + 2 * GEMM_WEIGHTS
    )


def test_engine_peak_is_the_analytic_sum():
    """a_1gpu (one GPU, AMP, 4 micro-batches): the simulated allocated peak = model states +
    8 layers + the head with its loss working set (the peak is in the loss's backward)."""
    suite = ROOT / "validation" / "measured-memory" / "suite.yaml"
    data = yaml.safe_load(suite.read_text())
    loaded = load_case(suite, {}, data["cases"][0], 0)
    w = loaded.workload
    m = w.model
    kw = dict(micro_batch=1, tp=1, sequence_parallel=False, kernels="eager", param_dtype="fp32")
    n = tf.total_params(m)
    expect = 16 * n + m.layers * mem.activation_bytes_per_layer(m, recompute="none", **kw)
    expect += mem.head_activation_bytes(m, include_transient=True, **kw)
    s = simulate(loaded).summary
    got = summary_value(s, "memory_gib.allocated")
    assert got * 2**30 == pytest.approx(expect, rel=1e-9)
    assert got == pytest.approx(s["memory_gib"]["total"] - s["memory_gib"]["reserved"])
    assert summary_value(s, "memory_gib.nothing") is None


def test_memory_suite_runs_with_a_dotted_metric():
    res = run_suite(ROOT / "validation" / "measured-memory" / "suite.yaml")
    assert res.cases and all(c.metric == "memory_gib.allocated_first_steps" for c in res.cases)
    assert res.role == "development"


def _gpipe_last_stage_peak(tmp_path, m: int) -> float:
    from simulator.config.load import load_workload
    from simulator.run import simulate
    from tests.conftest import SMALL_MODEL, small_topology, write_case

    work = {"name": "t", "model": {**SMALL_MODEL, "tied_embeddings": False},
            "training": {"global_batch": m, "micro_batch": 1, "kernels": "eager",
                         "param_dtype": "fp32"},
            "parallelism": {"tp": 1, "pp": 2, "dp": 1, "pp_schedule": "gpipe"}}
    d = tmp_path / f"m{m}"
    d.mkdir()
    res = simulate(load_workload(write_case(d, work, small_topology(1, 2))))
    mem_t = res.memory
    last = mem_t[(mem_t["what"] == "activations") & (mem_t["gpu"] == 1)]
    last = last.sort_values(["t_s", "delta_bytes"], kind="stable")
    return float(last["delta_bytes"].cumsum().max())


def test_the_loss_working_set_is_held_once_not_per_micro_batch_in_flight(tmp_path):
    """GPipe keeps every micro-batch's activations on the last stage until the backward; the
    loss's working set (fp32 logit gradients) exists for one micro-batch at a time. So the
    peak grows by the kept bytes per micro-batch, and what is left at zero micro-batches is
    the working set once."""
    from simulator.config.schema import ModelConfig
    from tests.conftest import SMALL_MODEL

    p2, p4, p6 = (_gpipe_last_stage_peak(tmp_path, m) for m in (2, 4, 6))
    per_mb = (p4 - p2) / 2
    assert p6 - p4 == pytest.approx(2 * per_mb)
    model = ModelConfig(**{**SMALL_MODEL, "tied_embeddings": False})
    transient = mem.head_transient_bytes(model, micro_batch=1, tp=1, sequence_parallel=False,
                                         kernels="eager")
    assert transient > 0
    assert p2 - 2 * per_mb == pytest.approx(transient, rel=1e-9)


def test_ddp_steady_state_holds_one_bucket_set_as_measured():
    """heldout6 (steps_alt.py, DDP gradient_as_bucket_view=False, peak after 3 warm-up steps):
    the DDP step's peak exceeds the same model's single-GPU peak (same micro-batch) by one fp32
    copy of the parameters, 4 bytes x 863,152,640 = 3.216 GiB (measured +3.227 GiB); the
    simulator's difference is that set, the activations being the same."""
    rows = {}
    for line in (ROOT / "data/measured/heldout6-h100x2/steps.jsonl").read_text().splitlines():
        r = json.loads(line)
        rows[r["case"]] = r
    single, ddp = rows["h6_single_U"], rows["h6_ddp2_U"]
    assert single["micro_batch"] == ddp["micro_batch"]
    n = ddp["params_per_rank"][0]
    one_set = 4 * n / 2**30
    measured = ddp["peak_memory_gib"] - single["peak_memory_gib"]
    assert measured == pytest.approx(one_set, rel=0.01)
    pred = {}
    for case in ("h6_single_U", "h6_ddp2_U"):
        from simulator.config.load import load_workload

        loaded = load_workload(ROOT / "validation" / "heldout6" / f"{case}.yaml")
        pred[case] = summary_value(simulate(loaded).summary, "memory_gib.allocated")
    assert pred["h6_ddp2_U"] - pred["h6_single_U"] == pytest.approx(one_set, rel=1e-3)


def test_dropout_key_and_layernorm_in_the_streams_dtype():
    """GPT block without dropout (model.dropout: false, nanoGPT with p = 0): the two 1-byte
    masks go; with bf16 parameters and no autocast (FSDP2 MixedPrecisionPolicy) nn.LayerNorm
    saves its bf16 input (2 bytes, not 4) beside the fp32 row mean and rstd."""
    b, s_, h = 2, 128, 256
    t_ = b * s_
    nodrop = GPT_SMALL.model_copy(update={"dropout": False})
    with_drop = sum(eager(GPT_SMALL, b=b).values())
    assert sum(eager(nodrop, b=b).values()) == with_drop - 2 * t_ * h
    bf16 = eager(nodrop, b=b, P="bf16")
    assert bf16["norm1_input"] == bf16["norm2_input"] == 2 * t_ * h
    assert bf16["norm1_mean_rstd"] == 2 * 4 * t_
    fp32 = eager(nodrop, b=b)
    # fp32 params: the LayerNorm inputs at 4 bytes, and autocast's weight casts
    assert sum(fp32.values()) - sum(bf16.values()) == 2 * (2 * t_ * h) + fp32["weight_casts"]
    # a Llama model keeps no dropout unless asked
    from simulator.model.ops import arch

    assert not arch(PROBE).dropout
    assert arch(PROBE.model_copy(update={"dropout": True})).dropout


def _one_gpu_eager_peak(tmp_path, micro_batches: int) -> tuple[float, float]:
    from simulator.config.load import load_workload
    from tests.conftest import SMALL_MODEL, small_topology, write_case

    work = {"name": "t", "model": dict(SMALL_MODEL),
            "training": {"global_batch": micro_batches, "micro_batch": 1, "kernels": "eager",
                         "param_dtype": "fp32"},
            "parallelism": {"tp": 1, "pp": 1, "dp": 1}}
    d = tmp_path / f"m{micro_batches}"
    d.mkdir()
    loaded = load_workload(write_case(d, work, small_topology(1, 1)))
    s = simulate(loaded).summary
    return summary_value(s, "memory_gib.allocated") * 2**30, tf.total_params(loaded.workload.model)


def test_eager_gradients_exist_from_the_first_backward(tmp_path):
    """zero_grad(set_to_none=True): with one micro-batch the forward and the loss run before
    any .grad exists; with two the second micro-batch's loss runs beside the first's fp32
    gradients. The peaks differ by exactly the gradients, 4 bytes a parameter."""
    one, n = _one_gpu_eager_peak(tmp_path, 1)
    two, _ = _one_gpu_eager_peak(tmp_path, 2)
    assert two - one == pytest.approx(4 * n, rel=1e-9)


def test_fsdp2_block_backward_holds_what_fsdp2_keeps():
    """FSDP2 with checkpointing (h13t_fsdp4_I_ac: 12 blocks of width 4096, GQA 32/8, SwiGLU
    11008, vocabulary 32000, bf16 everywhere, 4-way sharded). Wide blocks and a 4K-token
    micro-batch put the peak in a block's backward, where FSDP2 holds (torch's
    ``_fully_shard``): the root unit (embedding, final norm, head) gathered since the forward
    (the root does not reshard after forward) and the head's gradients waiting for the
    root's reduce-scatter after the embedding; the block's gathered parameters, the next
    block's prefetch, the block's unsharded gradients and the previous block's reduce-scatter
    input (one kept in flight); the sharded gradients of the ten blocks reduced before
    (L11..L2: the peak is in L1's backward). Sizes by hand from the shape, 2 bytes each."""
    suite = ROOT / "validation" / "heldout13" / "memory.yaml"
    data = yaml.safe_load(suite.read_text())
    case = next(c for c in data["cases"] if "h13t_fsdp4_I_ac" in str(c))
    loaded = load_case(suite, {}, case, 0)
    h, kv, f, V = 4096, 1024, 11008, 32000
    block = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h  # wq, wo, wk, wv, w1-w3, two norms
    root = 2 * V * h + h  # embedding, head, final norm
    total = 12 * block + root
    s = simulate(loaded).summary["memory_gib"]
    gathered = 2 * root + 2 * (2 * block)  # the root; block k and its prefetch k - 1
    assert s["weights"] * 2**30 == pytest.approx(2 * total / 4 + gathered, rel=1e-9)
    grads = 2 * (V * h + h) + 2 * (2 * block) + 10 * 2 * block / 4
    assert s["gradients"] * 2**30 == pytest.approx(grads, rel=1e-9)
