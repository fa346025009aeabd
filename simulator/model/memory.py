"""GPU memory of training: model states by ZeRO stage, activations by recompute mode.

Pure functions, bytes (not GiB). Model states follow ZeRO (Rajbhandari et al. 2020,
arXiv:1910.02054, Section 3.1 and Figure 1); activations follow the tensor-by-tensor accounting
of Korthikanti et al. 2022 (arXiv:2205.05198, Section 4, eq. 1-2 and Table 2), generalised to
GQA, SwiGLU, any ffn width, any dtype, models without dropout, and flash attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simulator.config.schema import ModelConfig
from simulator.errors import ConfigError
from simulator.model.transformer import DTYPE_BYTES, FP32, MASK, arch, dtype_bytes, local_dims

#: Bytes per element by dtype name.
BYTES = DTYPE_BYTES

RECOMPUTE = ("none", "selective", "full")


# --------------------------------------------------------------------------------------------
# Model states


@dataclass(frozen=True)
class ModelStateBytes:
    """Per-GPU bytes of weights, gradients and optimizer state."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def model_state_bytes(
    n_params: float,
    *,
    zero: int,
    dp: int,
    param_dtype: str = "bf16",
    grad_dtype: str = "bf16",
) -> ModelStateBytes:
    """Weights, gradients and Adam state of ``n_params`` parameters on one GPU.

    Mixed-precision Adam (Rajbhandari et al. 2020, Section 3.1): 2-byte working weights,
    gradients of ``grad_dtype`` (2, or 4 for an fp32 gradient buffer), and 12 bytes of fp32
    master weights, momentum and variance. ``param_dtype: fp32`` (AMP autocast): 4-byte
    weights, 4-byte gradients, no master copy (8 bytes of m and v).
    ZeRO shards over the ``dp`` data-parallel ranks: stage 1 the optimizer state, stage 2 also
    the gradients, stage 3 also the weights (ZeRO Figure 1: ``(2 + 2 + 12/N)`` bytes per
    parameter at stage 1, ``(2 + 14/N)`` at 2, ``16/N`` at 3).
    """
    if zero not in (0, 1, 2, 3):
        raise ConfigError(f"zero={zero!r} (accepted: 0, 1, 2, 3)", field="parallelism.zero")
    if dp < 1:
        raise ConfigError(f"dp={dp} must be >= 1", field="parallelism.dp")
    p = dtype_bytes(param_dtype, "training.param_dtype")
    g = dtype_bytes(grad_dtype, "training.grad_reduce_dtype")
    if p == FP32:
        w, g, o = FP32, FP32, 2 * FP32
    else:
        w, o = p, 3 * FP32
    return ModelStateBytes(
        weights=n_params * w / (dp if zero >= 3 else 1),
        gradients=n_params * g / (dp if zero >= 2 else 1),
        optimizer=n_params * o / (dp if zero >= 1 else 1),
    )


# --------------------------------------------------------------------------------------------
# Activations


def _check_recompute(recompute: str) -> None:
    if recompute not in RECOMPUTE:
        raise ConfigError(
            f"recompute={recompute!r} (accepted: {', '.join(RECOMPUTE)})",
            field="training.recompute",
        )


def activation_tensors_per_layer(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    recompute: str,
    flash_attention: bool = True,
    dtype_bytes: int = 2,
) -> dict[str, float]:
    """The tensors one layer keeps for its backward on one TP rank, name -> bytes.

    Korthikanti et al. 2022, Section 4.1, per layer (d = 2 bytes, masks 1 byte):
    attention ``11sbh + 5as^2b`` = norm-out/QKV input 2sbh, Q and K 4sbh, V 2sbh, softmax
    output 2as^2b, its dropout mask as^2b and output 2as^2b, out_proj input 2sbh, dropout
    mask sbh; MLP ``19sbh`` = fc1 input 2sbh, GELU input 8sbh, fc2 input 8sbh, dropout mask
    sbh; two norm inputs 4sbh. Total ``sbh(34 + 5as/h)``. With TP the tensors between the
    column- and row-parallel GEMMs are split ``1/t``; with SP the rest too (Section 4.2).

    Generalised here: Q is ``heads*hd`` wide and K, V ``kv_heads*hd`` (GQA); the activation
    input is ``2*ffn`` wide for SwiGLU (gate and up) and the fc2 input ``ffn``; masks exist
    only for models with dropout; widths use the dtype given. Flash attention keeps no s^2
    tensor, only its fp32 log-sum-exp (``b*heads*s``, Dao et al. 2022) beside Q, K, V and O.
    ``selective`` recomputes the attention core, dropping the s^2 tensors (and the
    log-sum-exp); ``full`` keeps only the layer input (``2sbh``, ``/t`` with SP; Korthikanti
    Table 2).
    """
    _check_recompute(recompute)
    return dict(
        _tensors(model, micro_batch, tp, sequence_parallel, recompute, flash_attention, dtype_bytes)
    )


@lru_cache(maxsize=1024)
def _tensors(
    model: ModelConfig, b: int, tp: int, sp: bool, recompute: str, flash_attention: bool, d: int
) -> tuple[tuple[str, float], ...]:
    L = local_dims(model, b, tp, sp)
    drop = arch(model).dropout
    h = model.hidden
    NT, T = L.norm_tokens, L.tokens  # tokens of the replicated (or SP-split) part / of GEMMs
    if recompute == "full":
        return (("layer_input", float(NT * h * d)),)
    q_w, kv_w = L.heads * L.head_dim, L.kv_heads * L.head_dim
    t = {
        "norm1_input": NT * h * d,
        "qkv_input": NT * h * d,  # with SP Megatron keeps the scattered input, re-gathered in bwd
        "q_k": T * (q_w + kv_w) * d,
        "v": T * kv_w * d,
    }
    if recompute == "none":
        sq = L.b * L.heads * L.s * L.s
        if flash_attention:
            t["softmax_lse"] = L.b * L.heads * L.s * FP32
        else:
            t["softmax_output"] = sq * d
            if drop:
                t["softmax_dropout_mask"] = sq * MASK
                t["softmax_dropout_output"] = sq * d
    t["out_proj_input"] = T * q_w * d
    if drop:
        t["attn_dropout_mask"] = NT * h * MASK
    t["norm2_input"] = NT * h * d
    t["fc1_input"] = NT * h * d
    t["act_input"] = T * L.fc1_out * d
    t["fc2_input"] = T * L.ffn * d
    if drop:
        t["mlp_dropout_mask"] = NT * h * MASK
    return tuple((k, float(v)) for k, v in t.items())


def activation_bytes_per_layer(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    recompute: str,
    flash_attention: bool = True,
    dtype_bytes: int = 2,
) -> float:
    """Bytes one layer keeps per micro-batch on one TP rank (sum of
    :func:`activation_tensors_per_layer`). For GPT with dropout, d = 2 and no flash this is
    Korthikanti's ``sbh(34 + 5as/h)`` (no parallelism), ``sbh(10 + 24/t + 5as/(ht))`` (TP),
    ``sbh/t (34 + 5as/h)`` (TP+SP), without the ``5as/h`` term for selective recompute."""
    return sum(
        activation_tensors_per_layer(
            model,
            micro_batch=micro_batch,
            tp=tp,
            sequence_parallel=sequence_parallel,
            recompute=recompute,
            flash_attention=flash_attention,
            dtype_bytes=dtype_bytes,
        ).values()
    )


def embedding_activation_bytes(
    model: ModelConfig, *, micro_batch: int, tp: int, sequence_parallel: bool, dtype_bytes: int = 2
) -> float:
    """The embedding's dropout mask, ``sbh/t`` with SP (Korthikanti et al. 2022, Section 4.3;
    per micro-batch, the ``p`` there counts micro-batches in flight); 0 without dropout. The
    embedding output is the first layer's input and is counted there."""
    if not arch(model).dropout:
        return 0.0
    L = local_dims(model, micro_batch, tp, sequence_parallel)
    return float(L.norm_tokens * model.hidden * MASK)


def head_activation_bytes(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    dtype_bytes: int = 2,
    include_transient: bool = False,
) -> float:
    """What the last stage keeps for the head's backward per micro-batch: final-norm input,
    LM-head input (``sbh/t`` each with SP, Megatron keeps the scattered input) and the fp32
    softmax of the vocab-parallel cross-entropy (``4sbV/t``): ``4sbh/t (1 + V/h)`` for d = 2
    with SP (Korthikanti et al. 2022, Section 4.3). ``include_transient`` adds the forward's
    peak: the ``d``-byte logits and one fp32 temporary alive while the loss is computed."""
    L = local_dims(model, micro_batch, tp, sequence_parallel)
    h, d = model.hidden, dtype_bytes
    kept = 2 * L.norm_tokens * h * d + L.tokens * L.vocab * FP32
    if include_transient:
        kept += L.tokens * L.vocab * (d + FP32)
    return float(kept)
