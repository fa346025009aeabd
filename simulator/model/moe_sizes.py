"""Per-rank parameter and activation bytes of one layer of an MoE / MLA model.

Pure functions shared by the engine's memory accounting (:mod:`simulator.engine.build`) and
the layout search's pre-screen (:mod:`simulator.plan_estimate`), so that both count the same
bytes. A layer's parameters split in two parts (MoE Parallel Folding, Liu et al. 2025,
arXiv:2504.14960): the attention, norms, router and shared experts, split over ``tp`` and
replicated over ``cp x dp``; the routed experts, split over ``ep x etp`` and replicated over
``edp``.
"""

from __future__ import annotations

from simulator.config.schema import ModelConfig, TrainingConfig
from simulator.model import memory as mem
from simulator.model import mla
from simulator.model import moe as moe_math
from simulator.model import transformer as tf
from simulator.model.ops import DTYPE_BYTES as BYTES
from simulator.model.ops import local_dims

#: Precisions whose recipe caches a GEMM's input for the backward as its quantised copy
#: (1 byte: Transformer Engine keeps the FP8 input of a Linear for its weight gradient;
#: DeepSeek-V3 caches activations in FP8, arXiv:2412.19437, Section 3.3.3). Applied to the
#: GEMM inputs of MLA attention and MoE blocks; the dense layers' accounting keeps 2 bytes.
LOW_PRECISION_CACHE = ("fp8", "mxfp8", "nvfp4")


#: DeepSeek-V3's cached attention output (arXiv:2412.19437, Section 3.3.3: the input of the
#: Linear after the attention, also read by the attention's backward, in a customized 12-bit
#: E5M6 format, 1x128 tiles with a scale each; counted as an fp32 scale like the recipe's).
E5M6_TILED = 1.5 + 4 / 128


def gemm_in_bytes(t: TrainingConfig) -> int | None:
    """Bytes per element of a saved GEMM input: 1 under a low-precision recipe (Transformer
    Engine saves the quantised input for the weight gradient; DeepSeek-V3 caches its
    activations in FP8), None (the activations' dtype) otherwise."""
    return 1 if t.precision in LOW_PRECISION_CACHE else None


def activation_code(t: TrainingConfig) -> dict:
    """How the training code writes what the activation accounting depends on (keyword
    arguments of :func:`simulator.model.memory.activation_bytes_per_layer` and
    :func:`~simulator.model.memory.activation_tensors_per_layer`): its RMSNorm's gain, GQA's
    K/V repeat and the bytes of a saved GEMM input."""
    return dict(norm_gain=t.rmsnorm_gain, kv_repeat=t.kv_repeat, gemm_in_bytes=gemm_in_bytes(t))


def attention_output_bytes(t: TrainingConfig) -> float | None:
    """Bytes per element of the cached attention output: DeepSeek-V3's E5M6 under its
    blockwise FP8 recipe; otherwise None (the GEMM-input rule of the precision)."""
    if t.precision == "fp8" and t.fp8_recipe == "blockwise":
        return E5M6_TILED
    return None


def recompute_modules(t: TrainingConfig) -> frozenset[str]:
    """The modules selective recomputation re-runs (Megatron-Core's ``--recompute-modules``,
    default ``core_attn``); empty without selective recomputation."""
    if t.recompute != "selective":
        return frozenset()
    return frozenset(t.recompute_modules or ("core_attn",))


def ep_overlap(work) -> bool:
    """Whether the step runs combined 1F1B (``training.overlap_moe_expert_parallel_comm``
    with an all-to-all to hide: an MoE model with ep > 1; :mod:`simulator.engine.combined`)."""
    t = work.training
    return bool(t.overlap_moe_expert_parallel_comm and work.model.moe is not None
                and work.parallelism.ep > 1)  # fmt: skip


def is_moe_layer(model: ModelConfig, layer: int) -> bool:
    """Whether global layer ``layer`` has an MoE block (the first ``dense_layers`` do not, nor
    those ``moe.layer_freq`` leaves dense: :meth:`ModelConfig.is_moe_layer`)."""
    return model.is_moe_layer(layer)


def last_moe_layer(model: ModelConfig) -> int:
    """The last layer with an MoE block (the last layer where there is none): the layer the
    layout search takes as a model's per-layer gradient bucket."""
    return next((i for i in reversed(range(model.layers)) if model.is_moe_layer(i)),
                model.layers - 1)


def layer_local_params(
    model: ModelConfig, layer: int, *, tp: int, ep: int, etp: int
) -> tuple[float, float]:
    """Parameters of global layer ``layer`` on one rank: (the part split over TP and
    replicated over cp x dp, the routed experts split over ep x etp)."""
    moe = is_moe_layer(model, layer)
    full = tf.layer_params(model, moe)
    expert = moe_math.routed_expert_params(model) if moe else 0
    return (full - expert) / tp, expert / (ep * etp)


def layer_activation_bytes(
    local: ModelConfig,
    t: TrainingConfig,
    layer: int,
    *,
    tp: int,
    sp: bool,
    ep: int,
    etp: int,
) -> float:
    """Bytes a micro-batch keeps for global layer ``layer`` of an MoE or MLA model (``local``:
    the model one context-parallel rank sees): the dense layer's attention tensors (MLA:
    :func:`mla.mla_activation_bytes`), its norm2 tensors, and the MoE block's
    (:func:`moe.moe_activation_bytes`) or the dense MLP's. Full recomputation keeps only what
    the dense accounting keeps (the layer input)."""
    dense_rc = t.recompute
    if t.recompute == "selective" and "core_attn" not in recompute_modules(t):
        dense_rc = "none"
    tensors = mem.activation_tensors_per_layer(
        local, micro_batch=t.micro_batch, tp=tp, sequence_parallel=sp,
        recompute=dense_rc, flash_attention=t.flash_attention, kernels=t.kernels,
        param_dtype=t.param_dtype, **activation_code(t),
    )  # fmt: skip
    if t.recompute == "full":
        return sum(tensors.values())
    mlp_keys = ("fc1", "fc2", "act", "silu", "mlp")
    attn = sum(v for k, v in tensors.items() if not k.startswith((*mlp_keys, "norm2")))
    norm2 = sum(v for k, v in tensors.items() if k.startswith("norm2"))
    mlp = sum(v for k, v in tensors.items() if k.startswith(mlp_keys))
    d = BYTES[t.precision] if t.precision in ("bf16", "fp16", "fp32") else 2
    mods = recompute_modules(t)
    g = gemm_in_bytes(t)
    if local.attention_kind == "mla":
        attn = mla.mla_activation_bytes(local, t.micro_batch, tp, sp, d, recompute=mods,
                                        gemm_in=g, attn_out=attention_output_bytes(t))  # fmt: skip
    if is_moe_layer(local, layer):
        # a learned router's busiest rank over the micro-batch's MoE layers (their
        # activations are held together; simulator/model/route_skew.py), not per call
        calls = max(1, local.moe_layers)
        loc = moe_math.moe_local(local, t.micro_batch, tp, 1, ep, etp,
                                  moe_math.load_spec(t, calls))
        mlp = moe_math.moe_activation_bytes(local, loc, tp=tp, d=d, modules=mods, gemm_in=g,
                                            grouped=t.kernels == "fused")  # fmt: skip
        if tensors.get("weight_casts"):
            attn += _moe_cast_change(local, loc, t.micro_batch, tp, sp, d)
    elif "mlp" in mods:
        # a dense MLP checkpointed on its input (the norm2 input, kept): nothing inside it
        # is kept (simulator.engine.program._dense_mlp)
        mlp = 0.0
    return attn + norm2 + mlp


def _moe_cast_change(local: ModelConfig, loc, b: int, tp: int, sp: bool, d: int) -> float:
    """What autocast's weight casts (:func:`simulator.model.memory._weight_cast_bytes`, kept
    until the layer's backward) change in an MoE layer: the dense MLP's casts are not made,
    the router's, the rank's local experts' (each one a module whose weights autocast casts
    once per forward) and the shared experts' are."""
    L = local_dims(local, b, tp, sp)
    moe = local.moe
    dense = local.hidden * L.fc1_out + L.ffn * local.hidden
    experts = loc.local_experts * moe_math.expert_params(local, loc.ffn)
    shared = moe.shared_experts * moe_math.expert_params(local, moe.shared_ffn) // tp
    return float((moe_math.router_params(local) + experts + shared - dense) * d)
