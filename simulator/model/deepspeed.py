"""DeepSpeed's ZeRO stage 3: which tensors it gathers, in which calls, and what it keeps whole.

Pure functions of the model and the data-parallel degree (elements, not bytes). What is
modelled, from DeepSpeed's source (microsoft/DeepSpeed at 38327e07, 2025-02-21):

- **Partitioning per tensor.** Every parameter tensor is split over the data-parallel ranks on
  its own, padded to a multiple of the world size (``partition_parameters.py``,
  ``_padding_size``: ``world - numel % world``), so a gather moves ``world x ceil(numel/world)``
  elements.
- **Persistent tensors.** A tensor of at most ``stage3_param_persistence_threshold`` elements
  (default 1e5) is kept whole on every rank and never gathered (``parameter_offload.py``,
  ``mark_persistent_parameters``: ``ds_numel <= param_threshold``): norms and biases.
- **One all-gather per module fetch.** The coordinator fetches a submodule's own parameters
  in one ``all_gather_coalesced`` call, one flat ``all_gather_into_tensor`` over the
  concatenated padded partitions (``partitioned_param_coordinator.py``, ``fetch_sub_module``
  and ``__all_gather_params_``). Its trace-based prefetch issues further calls ahead of use
  while the gathered elements stay under ``stage3_max_live_parameters`` (default 1e9); in the
  steady state each call refills what the last module released, about one module.
- **Gradients.** Each parameter's gradient joins a bucket of ``reduce_bucket_size`` elements
  (default 5e8); a bucket is reduce-scattered (``reduce_scatter_coalesced``: one
  reduce-scatter of the interleaved padded partitions) when the next gradient would overflow
  it, and at the end of each backward (``stage3.py``,
  ``reduce_independent_p_g_buckets_and_remove_grads``). With ``contiguous_gradients`` (the
  default) a flat buffer of ``reduce_bucket_size`` elements in the working dtype lives for the
  whole run (``stage3.py``: ``__ipg_bucket_flat_buffer``).

Modules are those of a Hugging Face decoder layer (the usual DeepSpeed ZeRO-3 model): Q, K, V
and O projections, the MLP's linear layers (SwiGLU gate, up, down; GELU fc1, fc2) and the two
norms, each a module whose weight and bias are fetched together; the embedding and the LM head
(with the final norm) are modules of their own.
"""

from __future__ import annotations

import math

from simulator.config.schema import ModelConfig
from simulator.model import transformer as tf

#: A module: the element counts of its parameter tensors on one tensor-parallel rank.
Module = tuple[int, ...]


def layer_modules(model: ModelConfig, tp: int = 1) -> tuple[Module, ...]:
    """The parameter-holding modules of one dense transformer layer, in forward order, with
    each tensor's elements on one of ``tp`` tensor-parallel ranks (column-parallel Q/K/V and
    MLP inputs split by output, row-parallel O and MLP output by input; their output biases and
    the norms whole)."""
    h, hd = model.hidden, model.head_dim
    q, kv, f = model.heads * hd, model.n_kv_heads * hd, model.ffn
    bias = tf.arch(model).biases
    norm = (h, h) if model.norm_kind == "layernorm" else (h,)

    def col(n_in: int, n_out: int) -> Module:
        return (n_in * n_out // tp, n_out // tp) if bias else (n_in * n_out // tp,)

    def row(n_in: int, n_out: int) -> Module:
        return (n_in // tp * n_out, n_out) if bias else (n_in // tp * n_out,)

    kv_split = max(1, min(tp, model.n_kv_heads))  # (KV heads replicated when tp > kv_heads)
    kv_mod = (h * kv // kv_split, kv // kv_split) if bias else (h * kv // kv_split,)
    attn = (norm, col(h, q), kv_mod, kv_mod, row(q, h))
    if model.activation == "swiglu":
        mlp = (norm, col(h, f), col(h, f), row(f, h))
    else:
        mlp = (norm, col(h, f), row(f, h))
    return attn + mlp


def embedding_modules(model: ModelConfig, tp: int = 1) -> tuple[Module, ...]:
    """The word embedding (vocabulary-parallel over ``tp``) and, for the GPT family, the
    learned positions, one module each."""
    h = model.hidden
    mods: tuple[Module, ...] = ((model.vocab // tp * h),),
    if tf.arch(model).learned_positions:
        mods += ((model.seq_len * h,),)
    return mods


def head_modules(model: ModelConfig, tp: int = 1) -> tuple[Module, ...]:
    """The final norm and the LM head (none when tied to the embedding)."""
    h = model.hidden
    norm = (h, h) if model.norm_kind == "layernorm" else (h,)
    return (norm,) if model.tied_embeddings else (norm, (model.vocab // tp * h,))


def padded(numel: int, world: int) -> int:
    """Elements a gather of one tensor moves: ``numel`` padded to a multiple of ``world``."""
    return world * math.ceil(numel / world)


def persistent(numel: int, threshold: float) -> bool:
    """Whether DeepSpeed keeps a tensor of ``numel`` elements whole on every rank."""
    return numel <= threshold


def fetches(modules: tuple[Module, ...], world: int, threshold: float) -> tuple[int, ...]:
    """Elements each module fetch all-gathers (its tensors above the persistence threshold,
    each padded to a multiple of ``world``), one entry per module that gathers anything."""
    out = []
    for mod in modules:
        n = sum(padded(t, world) for t in mod if not persistent(t, threshold))
        if n:
            out.append(n)
    return tuple(out)


def persistent_elements(modules: tuple[Module, ...], threshold: float) -> int:
    """Elements of the tensors kept whole on every rank."""
    return sum(t for mod in modules for t in mod if persistent(t, threshold))


def grad_buckets(tensors: list[int], bucket: float, start: float = 0.0) -> tuple[list[int], int]:
    """DeepSpeed's gradient buckets: gradients of ``tensors`` (elements, in the order the
    backward completes them) added to a bucket holding ``start`` elements, which is reduced
    when the next gradient would overflow ``bucket`` elements (and holds any). Returns the
    element counts of the buckets reduced, and what the open bucket holds after the last."""
    out, cur = [], int(start)
    for n in tensors:
        if cur and cur + n > bucket:
            out.append(cur)
            cur = 0
        cur += n
    return out, cur


def unit_modules(model: ModelConfig, unit: int | str, tp: int = 1) -> tuple[Module, ...]:
    """The modules of a ZeRO-3 unit: a global layer, ``"embed"`` or ``"head"``."""
    if unit == "embed":
        return embedding_modules(model, tp)
    if unit == "head":
        return head_modules(model, tp)
    return layer_modules(model, tp)


def model_modules(model: ModelConfig, tp: int = 1) -> tuple[Module, ...]:
    """Every parameter-holding module of the model on one tensor-parallel rank."""
    return (embedding_modules(model, tp) + model.layers * layer_modules(model, tp)
            + head_modules(model, tp))


def extra_state_bytes(model: ModelConfig, *, tp: int, world: int, threshold: float,
                      bucket: float, work_bytes: int) -> tuple[float, float]:
    """Bytes one rank holds beyond ZeRO-3's ``16/N`` per parameter: (weights, gradients).
    Weights: the persistent tensors whole instead of ``1/world`` of them. Gradients: the
    ``contiguous_gradients`` flat buffer of ``bucket`` elements in the working dtype."""
    keep = persistent_elements(model_modules(model, tp), threshold)
    return keep * work_bytes * (1.0 - 1.0 / world), bucket * work_bytes
