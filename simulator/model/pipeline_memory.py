"""What ``torch.distributed.pipelining``'s runtime holds beside the layers' saved tensors.

Pure functions, bytes (not GiB), for ``parallelism.pp_runtime: torch``. Read from the runtime's
source (PyTorch 2.11 as measured, ``torch/distributed/pipelining/stage.py`` and
``schedules.py``; the same in 2.13) and from autocast's weight-cast cache
(``aten/src/ATen/autocast_mode.cpp``, ``cached_cast``):

* **One weight cast per step, not per micro-batch.** ``schedule.step()`` runs every micro-batch
  of the step in one call, so a script's ``torch.autocast`` region (``with autocast:
  schedule.step(...)``) spans them all. Autocast caches the low-precision copy of each fp32
  leaf parameter that requires grad until the outermost autocast region exits; every
  micro-batch's forward reuses it and ``mm`` saves that one copy. So the bf16 copies of the
  stage's GEMM weights (and the LM head's) exist once, from the first forward until the step's
  schedule returns, however many micro-batches are in flight. (Code that enters autocast per
  micro-batch, as Megatron-style loops do, makes a copy per micro-batch forward, kept by each
  micro-batch's graph until its backward: :func:`simulator.model.memory.activation_tensors_per_layer`.)
* **Receive buffers for every micro-batch.** ``PipelineStage`` allocates, the first time the
  schedule runs, one activation receive buffer per micro-batch on every stage but the first
  (``_setup_forward_recv_info``, ``args_recv_info[chunk_id]``) and one gradient receive buffer
  per micro-batch on every stage but the last (``_create_grad_recv_info``), and keeps them
  for the schedule's lifetime. A received activation is its buffer (``requires_grad_`` on the
  buffer itself), so the first layer's saved input is that buffer, not a new tensor.
* **Stage outputs kept until the backward.** ``forward_one_chunk`` keeps each micro-batch's
  output in ``fwd_cache`` until ``backward_one_chunk`` pops it (the backward starts from it):
  on a stage that sends, the output (the residual stream) is a tensor no layer of the stage
  saves.
* **The last stage's outputs kept for the whole step.** With ``return_outputs=True`` (the
  default of ``step``) the last stage appends every micro-batch's output, the logits in the
  compute dtype, to ``output_chunks``; ``backward_one_chunk`` only detaches it, and
  ``clear_runtime_states`` drops the list at the start of the next step.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.config.schema import ModelConfig
from simulator.model.memory import weight_cast_bytes
from simulator.model.ops import local_dims
from simulator.model.transformer import pp_stream_bytes


@dataclass(frozen=True)
class TorchPipelineMemory:
    """Bytes ``torch.distributed.pipelining`` holds on one rank beside the saved activations.

    ``layer_cast`` / ``head_cast``: autocast's copies of one layer's / the LM head's GEMM
    weights (0 unless fp32 parameters run under autocast), held once per step;
    ``boundary``: one ``[b, s, h]`` tensor of the residual stream between stages (a receive
    buffer, a gradient buffer, a kept output); ``logits``: one micro-batch's output of the last
    stage, kept to the end of the step; ``microbatches``: the buffers a stage allocates."""

    layer_cast: float
    head_cast: float
    boundary: float
    logits: float
    microbatches: int

    def buffers(self, first: bool, last: bool) -> float:
        """Receive buffers of one stage, held for the whole step: a micro-batch's activation
        unless it is the first stage, its output's gradient unless it is the last."""
        return self.microbatches * self.boundary * ((not first) + (not last))

    def per_microbatch(self, first: bool, last: bool) -> float:
        """From a micro-batch's forward to its backward, beyond its saved activations: the
        output kept in ``fwd_cache`` (unless the last stage), less the input that the
        activation accounting counts but that is the receive buffer (unless the first)."""
        return self.boundary * ((not last) - (not first))

    def casts(self, layers: int, last: bool) -> float:
        """The weight copies a stage of ``layers`` layers (and the head if ``last``) holds."""
        return layers * self.layer_cast + (self.head_cast if last else 0.0)


def torch_pipeline_memory(
    model: ModelConfig,
    *,
    micro_batch: int,
    microbatches: int,
    tp: int,
    sequence_parallel: bool,
    kernels: str,
    param_dtype: str,
    dtype_bytes: int = 2,
) -> TorchPipelineMemory:
    """:class:`TorchPipelineMemory` of a model split into pipeline stages; a boundary tensor in
    the residual stream's dtype (:func:`simulator.model.transformer.pp_stream_bytes`)."""
    L = local_dims(model, micro_batch, tp, sequence_parallel)
    cast = weight_cast_bytes(model, micro_batch=micro_batch, tp=tp,
                             sequence_parallel=sequence_parallel, dtype_bytes=dtype_bytes,
                             param_dtype=param_dtype)  # fmt: skip
    head_cast = float(model.hidden * L.vocab * dtype_bytes) if cast else 0.0
    stream = pp_stream_bytes(kernels, param_dtype)
    return TorchPipelineMemory(
        layer_cast=cast,
        head_cast=head_cast,
        boundary=float(L.norm_tokens * model.hidden * stream),
        logits=float(L.tokens * L.vocab * dtype_bytes),
        microbatches=microbatches,
    )


def runtime_memory(
    model: ModelConfig,
    *,
    pp_runtime: str,
    pp: int,
    micro_batch: int,
    microbatches: int,
    tp: int,
    sequence_parallel: bool,
    kernels: str,
    param_dtype: str,
) -> TorchPipelineMemory | None:
    """:func:`torch_pipeline_memory` where that runtime's memory applies: ``pp_runtime: torch``
    with more than one stage, a dense model (MoE and MLA layers keep their per-micro-batch
    accounting); None otherwise. The engine and ``plan``'s estimate both ask here."""
    if pp_runtime != "torch" or pp == 1 or model.moe is not None or model.attention_kind == "mla":
        return None
    return torch_pipeline_memory(model, micro_batch=micro_batch, microbatches=microbatches, tp=tp,
                                 sequence_parallel=sequence_parallel, kernels=kernels,
                                 param_dtype=param_dtype)  # fmt: skip
