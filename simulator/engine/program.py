"""Per-stage programs: the timed parts a GPU runs for one layer, embedding, head or optimizer.

A *part* is one kernel-level op (a GEMM, an attention kernel, a memory-bound kernel) or one
collective of a parallel dimension. The model emits both (:mod:`simulator.model.comm`); here
they are priced once per pipeline stage with the calibrated compute model and the collective
model, then replayed by the engine for every layer and micro-batch. A collective the model
marks ``overlap`` runs beside the next kernel instead of before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from simulator.config.schema import ModelConfig
from simulator.hardware.compute import ComputeModel
from simulator.hardware.precision import (
    GATHERED_16BIT,
    LOW_PRECISION,
    gathered_kernels,
    gemm_rate,
    keeps_bf16,
    non_tn_fp8,
    pricing_dtype,
    quantize_bytes,
    quantize_kernels,
    sp_gather_bytes,
    split_dtype,
    swizzle_bytes,
    weight_quantize_bytes,
)
from simulator.model import comm as mc
from simulator.model import moe_layer as ml
from simulator.model import mtp
from simulator.model import transformer as tf
from simulator.model.ops import DTYPE_BYTES as BYTES
from simulator.model.ops import HOST_SYNC, mem_op
from simulator.model.transformer import Op


@dataclass(frozen=True)
class Part:
    """One timed piece of a program.

    ``kind`` is ``"compute"`` (duration at nominal speed, scaled by a straggler's slowdown) or
    ``"comm"`` (a collective ``op`` of ``nbytes`` over the groups of parallel dimension
    ``dim``; ``dur`` is its folded cost). A ``comm`` part with ``overlap_next`` runs beside the
    next compute part instead of before it.
    """

    name: str
    kind: str
    dur: float
    flops: float = 0.0
    op: str = ""
    nbytes: float = 0.0
    overlap_next: bool = False
    dim: str = ""
    block: str = ""  # the model block the op belongs to (``moe``: an MoE layer's expert block)


Program = tuple[Part, ...]


@dataclass(frozen=True)
class StagePrograms:
    """Everything one pipeline stage runs, priced for its GPUs and TP group."""

    layer_fwd: Program
    layer_bwd: Program
    layer_recompute: Program  # extra forward work before a layer's backward (recompute)
    embed_fwd: Program
    embed_bwd: Program
    head_fwd: Program
    head_bwd: Program
    # the receiver's TP all-gather of a pipeline transfer sent split 1/tp (scatter/gather)
    pp_gather: Program = ()
    #: per global layer, which programs it runs: 0 the ``layer_*`` ones, k > 0 ``variants[k-1]``
    #: (an MoE model's dense layers, local-attention layers); empty: every layer runs 0
    layer_kinds: tuple[int, ...] = ()
    variants: tuple[tuple[Program, Program, Program], ...] = ()

    def kind(self, index: int) -> int:
        """Which programs global layer ``index`` runs (0: ``layer_*``; past the model's
        layers, e.g. an MTP module's, 0)."""
        return self.layer_kinds[index] if 0 <= index < len(self.layer_kinds) else 0

    def layer(self, index: int) -> tuple[Program, Program, Program]:
        """(forward, backward, recompute) programs of global layer ``index``."""
        k = self.kind(index)
        if k:
            return self.variants[k - 1]
        return self.layer_fwd, self.layer_bwd, self.layer_recompute

    def kind_programs(self, k: int) -> tuple[Program, Program, Program]:
        """(forward, backward, recompute) programs of kind ``k``."""
        return self.variants[k - 1] if k else (self.layer_fwd, self.layer_bwd,
                                               self.layer_recompute)

    @cached_property
    def moe_passes(self) -> tuple[frozenset[int], frozenset[int]]:
        """The ids of the forward and of the backward programs of the kinds of layer with an
        MoE block (a part of block ``moe``)."""
        fwd, bwd = set(), set()
        for k in range(1 + len(self.variants)):
            f, b, _ = self.kind_programs(k)
            if any(part.block == "moe" for part in b):
                fwd.add(id(f))
                bwd.add(id(b))
        return frozenset(fwd), frozenset(bwd)

    def all_programs(self) -> list[Program]:
        """Every program of the stage (the variants' included)."""
        main = [v for v in vars(self).values() if isinstance(v, tuple) and v
                and isinstance(v[0], Part)]
        return main + [p for var in self.variants for p in var]


#: the row-indexed bf16 kernels of Megatron-Core's PyTorch permutation and their access class
#: (gpus.yaml ``memory_access``; measured, data/measured/moe-permute-h100x1)
ROW_INDEXED = {"permute_gather_index_add": "index_add", "unpermute_scatter_add": "scatter_add",
               "unpermute_scatter_add_grad": "index_gather"}


def memory_access(name: str, kernels: str = "fused", param_dtype: str = "bf16") -> str:
    """The access class of a memory-bound kernel, by what the kernel does (see
    ``memory_access`` in the hardware catalog): the measured bandwidth of fused norms,
    softmax, broadcasts, strided views, up-casts, mixed-dtype adds, concatenation and dropout
    differs from a streaming copy."""
    if name in ("norm1", "norm2", "final_norm") or name.endswith("_ln"):
        return "norm"
    if name == "softmax":
        return "softmax"
    if "dropout" in name:
        return "dropout"
    if name.endswith("_cat") or name == "cat":
        return "cat"
    if "upcast" in name or name.endswith("_gcast") or name.endswith("_bgcast"):
        return "upcast"
    if name in ROW_INDEXED:  # Megatron-Core's PyTorch permutation (simulator/model/moe.py)
        return ROW_INDEXED[name]
    if kernels == "eager":
        if name.endswith("_gain") or name.endswith("_scale") or name.endswith(("_cos", "_sin")):
            return "broadcast"
        if name in ("act_silu", "act_mul"):
            return "strided"
        if name in ("residual1", "residual2") and param_dtype == "fp32":
            return "mixed"
    return "stream"


def _op_time(
    cm: ComputeModel, op: Op, dtype: str, kernels: str = "fused", param_dtype: str = "bf16",
    access: str | None = None, gemm_scale: float = 1.0,
) -> float:
    gemm_dtype, rec = split_dtype(dtype)
    if op.kind == "gemm" and rec is not None and keeps_bf16(op.name, kernels):
        gemm_dtype, rec = "bf16", None  # the LM head and router: outside TE's autocast
    if op.kind == "gemm":
        # A batched GEMM (unfused attention: one product per head) fills the GPU like one
        # GEMM with the batch folded into m.
        m = op.m * max(op.batch, 1)
        if op.serial > 1:
            # GEMMs one after another (a grouped GEMM's per-expert kernels), each with its gap
            per = max(1, round(m / op.serial))
            t = op.serial * cm.gemm_s(per, op.k, op.n, gemm_dtype, op.acc_bytes) \
                + (op.serial - 1) * cm.gpu.kernel_launch_s
        else:
            # a GEMM adding into a buffer in place (ComputeModel.gemm_s's acc_bytes)
            t = (cm.gemm_s(m, op.k, op.n, gemm_dtype, op.acc_bytes) if op.acc_bytes
                 else cm.gemm_s(m, op.k, op.n, gemm_dtype))
        if gemm_dtype in ("bf16", "fp16") and rec is None:
            # the SM clock of the step's kernel mix against the GEMM calibration's
            # (simulator.hardware.power; measured on bf16 GEMMs)
            t *= gemm_scale
        if rec is not None:
            # block-scaled FP8 on Hopper: the scales applied on CUDA cores (measured rate)
            t /= gemm_rate(rec, cm.gpu.name, op.name.endswith("_wgrad"))
        if rec is not None and not op.batch:
            # Transformer Engine's low-precision GEMMs take quantised operands: the
            # activation-side operands are quantised from bf16 first (a memory-bound kernel,
            # bytes per recipe in simulator/hardware/precision.py); weights are quantised once
            # per step (cached across micro-batches) and amax/scale updates are negligible.
            non_tn = non_tn_fp8(cm.gpu)
            q = quantize_bytes(rec, op.m, op.k, op.n, op.name.endswith("_wgrad"), non_tn,
                               op.gathered)
            if q:
                # its kernels: per expert in a grouped GEMM, three under current scaling
                kernels = (gathered_kernels(rec, non_tn) if op.gathered > 1
                           else quantize_kernels(rec, op.serial, non_tn))
                t += cm.memory_s(q, rec.cast_access) + kernels * cm.gpu.kernel_launch_s
            # block-scaled formats: the two operands' scales swizzled first (two kernels)
            sw = swizzle_bytes(rec, m, op.k, op.n, op.serial)
            if sw:
                t += cm.memory_s(sw) + 2 * cm.gpu.kernel_launch_s
    elif op.kind == "attention":
        t = cm.attention_s(
            op.batch,
            op.heads,
            op.seq,
            op.head_dim,
            kv_heads=op.kv_heads or None,
            causal=op.causal,
            backward=op.backward,
            dtype="bf16" if rec is not None else gemm_dtype,
            kv_seq=op.kv_seq or None,
            window=op.window or None,
        )
    else:
        t = cm.memory_s(op.bytes, access or memory_access(op.name, kernels, param_dtype))
    # kernel_launch_s: the measured gap between back-to-back kernels on one stream.
    return t + cm.gpu.kernel_launch_s


#: name suffix of the part that quantises a forward GEMM's weight (:func:`weight_quant_part`)
WQUANT = "_wquant"


def weight_quant_part(cm: ComputeModel, op: Op, dtype: str, kernels: str,
                      share: float) -> Part | None:
    """The once-a-step quantisation of forward GEMM ``op``'s weight (every expert's of a
    grouped round) into its cached low-precision copies, as its share of one micro-batch's
    forward (``share``: 1 / micro-batches; :func:`weight_quant_share`); None where the GEMM
    has no weight to quantise (bf16, a batched attention product, the bf16 LM head and
    router, a backward GEMM). Transformer Engine quantises a weight in the first
    micro-batch's forward and reuses the copies (``get_weight_workspace`` with
    ``update_workspace = is_first_microbatch``; Megatron-Core's schedules call
    ``set_is_first_microbatch()`` on the first micro-batch of a step)."""
    _, rec = split_dtype(dtype)
    if (share <= 0 or rec is None or op.kind != "gemm" or op.batch or op.backward
            or op.name.endswith(("_dgrad", "_wgrad")) or keeps_bf16(op.name, kernels)):
        return None
    non_tn = non_tn_fp8(cm.gpu)
    experts = max(1, op.serial)
    dur = (cm.memory_s(weight_quantize_bytes(rec, non_tn) * op.k * op.n * experts, rec.cast_access)
           + rec.quant_kernels * experts * cm.gpu.kernel_launch_s)
    return Part(op.name + WQUANT, "compute", dur * share, block=op.block)


def weight_quant_share(training, microbatches: int) -> float:
    """The share of a step's micro-batches whose forward quantises the weights under a
    low-precision recipe with fused (Transformer Engine) kernels: ``1 / microbatches``; 0 for
    bf16, eager code, and ``fp8_param_gather`` with a per-tensor or blockwise recipe (the
    weights are kept only in the low-precision format: the distributed optimizer casts its
    1/dp shard after the step, and Hopper transposes the gathered copy; neither is priced).
    MXFP8's ``fp8_param_gather`` gathers bf16 weights and casts every gathered weight into
    its MXFP8 copies once a step (:data:`simulator.hardware.precision.GATHERED_16BIT`): the
    same cast, priced the same way."""
    if training.kernels != "fused" or training.precision not in LOW_PRECISION or microbatches < 1:
        return 0.0
    if training.fp8_param_gather and training.precision not in GATHERED_16BIT:
        return 0.0
    return 1.0 / microbatches


def optimizer_access(t, name: str) -> str | None:
    """The access class of an optimizer-step kernel (None: by its name). PyTorch's
    multi-tensor kernels over 16-bit tensors -- ``AdamW(fused=True)`` stepping bf16 parameters
    and moments in place, ``clip_grad_norm_``'s ``_foreach_norm`` and ``_foreach_mul_`` of bf16
    gradients -- run slower than a streaming copy (``adam_fused`` and ``foreach`` in gpus.yaml,
    measured: data/measured/stepmech-h100x4, simulator/calibrate/memory.py). Other optimizers (fp32 master weights, foreach AdamW,
    Megatron's) are not measured here and keep the copy's rate."""
    if t.param_dtype == "fp32" or t.kernels != "eager":
        return None
    if name == "adam" and t.optimizer_impl == "fused" and t.master_weights == "none":
        return "adam_fused"
    if name in ("grad_norm", "grad_clip_mul") and t.grad_clip == "foreach":
        return "foreach"
    return None


@dataclass(frozen=True)
class Pricer:
    """Prices kernels: the compute model, the compute dtype and how the kernels are written."""

    cm: ComputeModel
    dtype: str
    kernels: str = "fused"
    param_dtype: str = "bf16"
    #: GEMM time relative to the calibration (the power-limited SM clock of the step's kernel
    #: mix, :func:`simulator.hardware.power.gemm_clock_factor`)
    gemm_scale: float = 1.0
    #: share of micro-batches whose forward quantises the GEMM weights
    #: (:func:`weight_quant_share`; 0: none)
    weight_quant_share: float = 0.0

    def time(self, op: Op, access: str | None = None) -> float:
        return _op_time(self.cm, op, self.dtype, self.kernels, self.param_dtype, access,
                        self.gemm_scale)

    def part(self, op: Op, access: str | None = None) -> Part:
        """``access``: the memory-bound op's access class, instead of the one its name gives."""
        return Part(op.name, "compute", self.time(op, access), op.flops, block=op.block)


def optimizer_parts(cm: ComputeModel, t, params: float) -> tuple[Part, ...]:
    """The optimizer step of ``params`` parameters (``training`` ``t``), kernel by kernel
    (:func:`simulator.model.transformer.optimizer_ops`), each memory-bound kernel at its
    access class (:func:`optimizer_access`): the engine's program and plan's estimate."""
    ops = tf.optimizer_ops(params, param_dtype=t.param_dtype, grad_dtype=t.grad_reduce_dtype,
                           moments_dtype=t.optimizer_moments_dtype, impl=t.optimizer_impl,
                           master_weights=t.master_weights, grad_clip=t.grad_clip)
    pr = Pricer(cm, pricing_dtype(t), t.kernels, t.param_dtype)
    return tuple(pr.part(op, optimizer_access(t, op.name)) for op in ops)


#: ``comm_cost(dim, collective, nbytes)``: seconds of a collective on a stage's groups of ``dim``.
CommCost = Callable[[str, str, float], float]


def price(ops: Sequence[Op], pr: Pricer, comm_cost: CommCost | None) -> Program:
    """Parts of an op list: kernels priced by ``pr``, collectives by ``comm_cost``."""
    parts = []
    for op in ops:
        if op.kind == HOST_SYNC:
            parts.append(Part(op.name, HOST_SYNC, 0.0, block=op.block))
        elif op.kind == "comm":
            dur = comm_cost(op.dim, op.collective, op.bytes) if comm_cost else 0.0
            parts.append(Part(op.name, "comm", dur, 0.0, op.collective, op.bytes, op.overlap, op.dim,
                              op.block))
        else:
            parts.append(pr.part(op))
            wq = weight_quant_part(pr.cm, op, pr.dtype, pr.kernels, pr.weight_quant_share)
            if wq is not None:
                parts.append(wq)
    return tuple(parts)


#: Kernels that selective recomputation runs again before a layer's backward (Korthikanti et
#: al. 2022: the core attention, QK^T, softmax, AV; with context parallelism its blocks, and
#: with ``cp_comm: a2a`` the layout copies and all-to-alls inside Transformer Engine's
#: attention, which Megatron-Core's checkpointed core attention runs again).
SELECTIVE = ("attn", "attn_scores", "softmax", "attn_dropout", "attn_context", "attn_merge",
             "cp_a2a_copy")
#: Collectives the checkpointed core attention issues again: Megatron-Core's
#: ``_checkpointed_attention_forward`` wraps Transformer Engine's whole attention, CP
#: communication included, in ``tensor_parallel.checkpoint``, whose backward runs the forward
#: again (``cp_comm: a2a``'s Q, K, V, O all-to-alls; ``p2p``'s ring hops of K/V, each beside
#: its block's kernel as in the forward; ``all_gather``'s gather of K/V).
SELECTIVE_COMM = ("cp_a2a_q", "cp_a2a_k", "cp_a2a_v", "cp_a2a_o", "cp_send_recv", "cp_all_gather")


#: Kernels each selective recompute module (Megatron-Core's ``--recompute-modules``) runs again
#: before a layer's backward, by name (the attention core by kind too).
RECOMPUTE_MODULES = {
    "core_attn": SELECTIVE,
    "layernorm": ("norm1", "norm2", "q_norm", "kv_norm"),
    "mla_up_proj": ("q_up", "kv_up", "rope"),
    "moe_act": ("expert_act", "shared_act"),
}


def _reruns(op: Op, modules: frozenset[str]) -> bool:
    """Whether selective recomputation of ``modules`` re-runs ``op``."""
    if "core_attn" in modules and op.kind == "attention":
        return True
    base = "expert_act" if op.name.startswith("expert_act") else op.name
    return any(base in RECOMPUTE_MODULES.get(m, ()) for m in modules)


def _rerun(parts: Sequence[Part]) -> Program:
    """Parts run again as recomputation (``re_`` names; collectives as they ran, a ring hop
    beside the kernel it ran beside; the weights' quantisation not: the recomputed forward
    reuses the cached copies)."""
    return tuple(
        Part(f"re_{p.name}", p.kind, p.dur, p.flops, p.op, p.nbytes, p.overlap_next, p.dim,
             p.block)
        for p in parts if not p.name.endswith(WQUANT)
    )


def _dense_mlp(layer_fwd: Program) -> Program:
    """A dense layer's MLP module as the ``mlp`` recompute module re-runs it: from its norm
    to the MLP's output, before the residual add. Megatron-Core's ``TransformerLayer`` sets
    ``recompute_mlp`` only where ``self.mlp`` is not an ``MoELayer`` ("mlp": "recompute the
    dense MLP submodule", ``transformer_config.py``) and checkpoints ``self.mlp`` on the
    pre-MLP norm's output; Transformer Engine's layer spec has no separate pre-MLP norm in a
    dense layer (``IdentityOp``) but fuses it into ``linear_fc1``
    (``TELayerNormColumnParallelLinear``), so the norm, the sequence-parallel all-gather,
    fc1, the activation, fc2 and its reduce-scatter run again (``megatron/core/transformer/
    transformer_layer.py``, ``megatron/core/models/gpt/gpt_layer_specs.py``, Megatron-LM
    98b6f0e816, 2025-09-26). An MoE layer's program (no ``fc1``) re-runs nothing."""
    names = [p.name for p in layer_fwd]
    if "fc1" not in names:
        return ()
    start = next(i for i, n in enumerate(names) if n.startswith("norm2"))
    end = next(i for i, n in enumerate(names) if i > start and n.startswith("residual2"))
    return tuple(layer_fwd[start:end])


def _recompute(fwd_ops: Sequence[Op], layer_fwd: Program, recompute: str, pr: Pricer,
               modules: frozenset[str] = frozenset({"core_attn"})) -> Program:  # fmt: skip
    if recompute == "full":
        return _rerun(layer_fwd)
    if recompute == "selective":
        mlp = _dense_mlp(layer_fwd) if "mlp" in modules else ()
        comm = {p.name: p for p in layer_fwd if p.kind == "comm" and p.name in SELECTIVE_COMM}
        return tuple(
            _rerun([comm[op.name]])[0] if op.name in comm and "core_attn" in modules else
            Part(f"re_{op.name}", "compute", pr.time(op), op.flops, block=op.block)
            for op in fwd_ops
            if (op.name in comm and "core_attn" in modules)
            or (op.kind != "comm" and _reruns(op, modules)
                and not (mlp and op.name.startswith("norm2")))
        ) + _rerun(mlp)  # fmt: skip
    return ()


def weight_cast_share(parallelism, training, model, pp: int, microbatches: int) -> float:
    """The share of a step's micro-batches whose forward casts each fp32 GEMM weight to the
    compute dtype (``training.autocast_region``). Autocast caches the cast of a leaf tensor
    that requires grad until its outermost region exits (PyTorch AMP docs,
    ``torch.autocast(cache_enabled=True)``): code that runs every micro-batch inside one region
    casts each weight in the first micro-batch's forward only (``1 / m``), as a script running
    ``schedule.step()`` of torch.distributed.pipelining inside one region does (``auto`` under
    ``parallelism.pp_runtime: torch``, benchmarks/device/steps_alt.py: the cases whose weight
    copies' memory :func:`simulator.model.pipeline_memory.torch_pipeline_memory` holds once a
    step); code that enters autocast per micro-batch casts every time (1)."""
    if training.param_dtype != "fp32" or training.kernels != "eager" or microbatches < 2:
        return 1.0
    region = training.autocast_region
    if region == "auto":
        torch_pp = parallelism.pp_runtime == "torch" and pp > 1
        dense = model.moe is None and model.attention_kind != "mla"
        region = "step" if torch_pp and dense else "microbatch"
    return 1.0 / microbatches if region == "step" else 1.0


def _share_weight_casts(prog: Program, share: float) -> Program:
    """A forward program with each weight (and bias) cast's time scaled by ``share``: the
    kernel runs in one micro-batch of ``1 / share``, none in the others (on average)."""
    if share == 1.0:
        return prog
    return tuple(replace(p, dur=p.dur * share)
                 if p.kind == "compute" and p.name.endswith(("_wcast", "_bcast")) else p
                 for p in prog)


def embed_grad(training, model, pp: int) -> dict:
    """Where the word embedding's dense gradient goes with fused kernels (``embed_grad`` of
    :func:`build_stage_programs`; :func:`simulator.model.transformer.embedding_weight_grad_ops`):
    Megatron-Core's DDP hook adds it into ``main_grad`` (``grad_reduce_dtype``) with 16-bit
    weights; with tied embeddings and one pipeline stage the LM head on the same rank hands
    autograd a zero-filled dummy gradient of the shared weight (``zero_out_wgrad``)."""
    t = training
    if t.kernels != "fused":
        return {}
    acc = tf.DTYPE_BYTES[t.grad_reduce_dtype] if t.param_dtype == "bf16" else 0
    return dict(main_grad_bytes=acc, tied_head=bool(model.tied_embeddings) and pp == 1)


def embed_tp(parallelism, tp: int) -> int:
    """The word embedding's TP split: 1 where ``parallelism.tp_embedding: replicated`` keeps
    it whole on every rank (eager code that never splits its ``nn.Embedding``), else ``tp``."""
    return 1 if parallelism.tp_embedding == "replicated" else tp


def build_stage_programs(
    *,
    model,
    micro_batch: int,
    tp: int,
    sp: bool,
    recompute: str,
    dtype: str,
    cm: ComputeModel,
    comm_cost: CommCost | None,
    flash_attention: bool = True,
    kernels: str = "fused",
    param_dtype: str = "bf16",
    cp: int = 1,
    cp_comm: str = "p2p",
    moe_kw: dict | None = None,
    recompute_modules: frozenset[str] = frozenset({"core_attn"}),
    tp_input_dtype: str = "residual",
    tp_impl: str = "megatron",
    grad_accumulation: tuple[int, float] | None = None,
    tp_loss: str = "vocab_parallel",
    embed_grad: dict | None = None,
    embed_tp: int | None = None,
    gemm_scale: float = 1.0,
    weight_cast_share: float = 1.0,
    weight_quant_share: float = 0.0,
) -> StagePrograms:
    """Price every program of one stage.

    ``comm_cost(dim, collective, nbytes)`` returns the folded cost of a collective on this
    stage's groups of ``dim`` (``None``: collectives cost nothing, e.g. one rank). ``kernels``
    and ``param_dtype`` select the op lists of :mod:`simulator.model.transformer` (fused or
    eager kernels; fp32 master weights add per-micro-batch weight casts and gradient
    accumulation); ``cp`` and ``cp_comm`` the context-parallel attention. For an MoE or MLA
    model (``moe_kw``: ``ep``, ``etp``, ``expert_load``, ``dispatcher``, ``dispatch_bytes``) the
    layers come from :func:`simulator.model.moe_layer.layer_ops`: ``layer_*`` are the MoE
    layers' programs and ``first_*`` those of the leading dense layers. ``grad_accumulation``
    ``(acc_bytes, share)`` adds an unfused gradient accumulation after every weight-gradient
    GEMM of the backward programs (:func:`simulator.model.transformer.unfused_grad_accumulation`).
    ``embed_grad`` (``main_grad_bytes``, ``tied_head``): where the word embedding's dense
    gradient goes (:func:`simulator.model.transformer.embedding_weight_grad_ops`); an MTP
    module's embedding adds its own dense gradient into ``main_grad`` likewise.
    ``embed_tp``: the word embedding's TP split (``tp`` unless ``parallelism.tp_embedding:
    replicated``: 1, a whole ``nn.Embedding`` looked up without collective, its dense
    gradient over the whole vocabulary, the output whole on every rank). ``gemm_scale``: the
    GEMMs' time relative to their calibration (:class:`Pricer`). ``weight_cast_share``: the
    share of micro-batches whose forward casts the fp32 weights under autocast (1; ``1 / m``
    where one autocast region spans the step's ``m`` micro-batches and its cache makes each
    cast once: :func:`weight_cast_share`). ``weight_quant_share``: the share of micro-batches
    whose forward quantises the GEMM weights under a low-precision recipe (0; ``1 / m`` with
    Transformer Engine's weight cache: :func:`weight_quant_share`), priced as a ``_wquant``
    part after each forward GEMM.
    """
    pr = Pricer(cm, dtype, kernels, param_dtype, gemm_scale, weight_quant_share)
    _, rec = split_dtype(dtype)
    lowp = None
    if rec is not None and kernels == "fused" and sp and tp > 1 and sp_gather_bytes(rec):
        # Transformer Engine quantises each rank's share before the SP all-gathers
        fwd_b, grad_b = sp_gather_bytes(rec)
        lowp = mc.LowPrecisionGather(fwd_b, grad_b, tp, amax=rec.name == "fp8/current")

    def fwd_casts(prog: Program) -> Program:
        return _share_weight_casts(prog, weight_cast_share)

    def bwd(ops: list[Op]) -> list[Op]:
        if grad_accumulation is None:
            return ops
        d = 4 if dtype == "fp32" else 2  # wgrad GEMMs write 16-bit gradients (fp8 recipes too)
        return tf.unfused_grad_accumulation(ops, d, *grad_accumulation)

    kw = dict(
        micro_batch=micro_batch, tp=tp, sequence_parallel=sp, kernels=kernels,
        param_dtype=param_dtype, cp=cp,
    )  # fmt: skip
    lkw = dict(kw, flash_attention=flash_attention, cp_comm=cp_comm, tp_input_dtype=tp_input_dtype,
               tp_impl=tp_impl, lowp_gather=lowp)
    ekw = kw if embed_tp in (None, tp) else dict(kw, tp=embed_tp, sequence_parallel=False)
    first: dict = {}
    if model.moe is not None or model.attention_kind == "mla":
        # activations stay 16-bit under the low-precision recipes (their GEMMs are priced in
        # the recipe's format by the pricer)
        mkw = dict(lkw, precision_bytes=BYTES.get(dtype, 2), **(moe_kw or {}))

        def programs(m: ModelConfig, moe_layer: bool) -> tuple[Program, Program, Program]:
            f = ml.layer_ops(m, backward=False, moe_layer=moe_layer, **mkw)
            fp = fwd_casts(price(f, pr, comm_cost))
            b = bwd(ml.layer_ops(m, backward=True, moe_layer=moe_layer, **mkw))
            return fp, price(b, pr, comm_cost), _recompute(
                f, fp, recompute, pr, recompute_modules)  # fmt: skip

    else:

        def programs(m: ModelConfig, moe_layer: bool) -> tuple[Program, Program, Program]:
            f = mc.layer_ops(m, backward=False, **lkw)
            fp = fwd_casts(price(f, pr, comm_cost))
            b = price(bwd(mc.layer_ops(m, backward=True, **lkw)), pr, comm_cost)
            return fp, b, _recompute(f, fp, recompute, pr, recompute_modules)

    # one program set per kind of layer, (MoE?, local attention?): the last layer's kind is
    # the main one (``layer_*``), the others variants (an MoE model's dense layers, ...)
    kinds = model.layer_kinds
    order = [kinds[-1], *dict.fromkeys(k for k in kinds if k != kinds[-1])]
    built = [programs(model.layer_variant(local), moe_layer) for moe_layer, local in order]
    layer_fwd, layer_bwd, layer_re = built[0]
    if len(order) > 1:
        first = dict(layer_kinds=tuple(order.index(k) for k in kinds), variants=tuple(built[1:]))
    hkw = dict(kw, tp_input_dtype=tp_input_dtype, tp_impl=tp_impl, tp_loss=tp_loss)
    head_f = mc.head_ops(model, backward=False, **hkw)
    head_b = bwd(mc.head_ops(model, backward=True, **hkw))
    egrad = dict(embed_grad or {})
    mtp_grad = {k: v for k, v in egrad.items() if k != "tied_head"}
    if model.mtp_depth:  # MTP modules after the main head (simulator.model.mtp)
        d = BYTES.get(dtype, 2)

        def mtp_layer(backward: bool) -> list[Op]:
            # one more layer of the model's last kind
            moe_last, local_last = model.layer_kinds[-1]
            last = model.layer_variant(local_last)
            if model.moe is not None or model.attention_kind == "mla":
                return ml.layer_ops(last, backward=backward, moe_layer=moe_last, **mkw)
            return mc.layer_ops(last, backward=backward, **lkw)

        one_f = [*mc.embedding_ops(model, backward=False, **kw),
                 *mtp.proj_ops(model, backward=False, d=d, **_proj_kw(kw)),
                 *mtp_layer(False), *head_f]  # fmt: skip
        one_b = bwd([*mc.head_ops(model, backward=True, **hkw), *mtp_layer(True),
                     *mtp.proj_ops(model, backward=True, d=d, **_proj_kw(kw)),
                     *mc.embedding_ops(model, backward=True, **kw, **mtp_grad)])  # fmt: skip
        head_f = head_f + one_f * model.mtp_depth
        head_b = one_b * model.mtp_depth + head_b
    embed_b = mc.embedding_ops(model, backward=True, **ekw, **egrad)
    if grad_accumulation is not None and kernels == "eager":
        # eager code: the word embedding's dense gradient is added into ``.grad`` like a
        # weight's (``.grad += g`` after the first micro-batch)
        acc, share = grad_accumulation
        rows = -(-model.vocab // ekw["tp"])
        d = 4 if dtype == "fp32" else 2
        embed_b = [*embed_b, mem_op("embed_gacc", "embed", rows * model.hidden * (d + 2 * acc)
                                    * share, True)]
    return StagePrograms(
        layer_fwd,
        layer_bwd,
        layer_re,
        price(mc.embedding_ops(model, backward=False, **ekw), pr, comm_cost),
        price(embed_b, pr, comm_cost),
        fwd_casts(price(head_f, pr, comm_cost)),
        price(head_b, pr, comm_cost),
        **first,
    )


def _proj_kw(kw: dict) -> dict:
    """The keys of :func:`simulator.model.mtp.proj_ops` among the stage's op arguments."""
    return {k: kw[k] for k in ("micro_batch", "tp", "sequence_parallel", "cp")}


def beside_time(d: float, comm: float, interference: float) -> float:
    """Time of a kernel of ``d`` seconds alone that starts together with a collective of
    ``comm`` seconds: it runs ``1 + interference`` times slower while the collective runs,
    then at full speed, ``d + min(comm, d (1 + i)) i / (1 + i)`` (the measured slowdown is of
    kernels sharing the GPU with an NCCL kernel, not of the kernel's whole run)."""
    return d + min(comm, d * (1.0 + interference)) * interference / (1.0 + interference)


def program_time(
    prog: Program, slowdown: float = 1.0, interference: float = 0.0
) -> tuple[float, float, tuple[tuple[str, float], ...]]:
    """(total, compute, exposed communication per dimension) seconds of a program run back to
    back on one GPU; the last is ``((dim, seconds), ...)`` for the dimensions with any.

    A compute part that runs beside an overlapping collective is slowed by ``interference``
    (the measured cost of sharing the GPU with an NCCL kernel) for as long as the two run
    together (:func:`beside_time`)."""
    total = comp = 0.0
    exposed: dict[str, float] = {}
    pending, pdim = 0.0, ""  # an overlapping collective waiting for the next compute part
    for p in prog:
        if p.kind == "comm":
            if p.overlap_next:
                if p.dur >= pending:
                    pending, pdim = p.dur, p.dim
            else:
                total += p.dur
                exposed[p.dim] = exposed.get(p.dim, 0.0) + p.dur
        else:
            d = p.dur * slowdown
            if pending:
                d = beside_time(d, pending, interference)
                over = max(0.0, pending - d)
                total += d + over
                exposed[pdim] = exposed.get(pdim, 0.0) + over
                pending = 0.0
            else:
                total += d
            comp += d
    if pending:
        total += pending
        exposed[pdim] = exposed.get(pdim, 0.0) + pending
    return total, comp, tuple(exposed.items())
