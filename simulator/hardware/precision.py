"""Low-precision training recipes: what a GEMM's operands cost to quantise, and what the
cached low-precision copies of the weights hold.

``training.precision`` picks the tensor-core format of the linear layers (attention and
everything else stays bf16, as in Transformer Engine); ``training.fp8_recipe`` picks how FP8
scales are computed. Each recipe is priced from first principles, with no fitted constant:

* the GEMM runs at the catalog's dense peak for its format (``peak_tflops``: fp8, mxfp8,
  nvfp4) with the same efficiency model as bf16 and operands of :attr:`Recipe.operand_bytes`
  per element (scales included). Per-tensor FP8 has its own efficiency where one was
  measured or published (``gemm.eta_fp8``: H100 measured here; B200 fitted on published
  per-shape timings, ``calibrate blackwell_gemm``); MXFP8 runs at per-tensor FP8's efficiency
  (its block scales are applied inside Blackwell's MMA at the FP8 rate; published per-shape
  B200 timings, data/published/mxfp8-gemm-b200, :data:`simulator.hardware.catalog.
  FP8_RATE_DTYPES`); NVFP4 is *assumed* to run at bf16's efficiency (not found per shape).
* quantising a bf16 tensor is a memory-bound kernel at the GPU's streaming bandwidth moving
  :attr:`Recipe.quant_bytes` per element: reading the bf16 input (2 B), once more for a
  separate amax pass where the scale needs the whole tensor first (current scaling), and
  writing each low-precision copy with its scales (row-wise for the forward/dgrad operand,
  column-wise for the wgrad operand where the format is scaled along K), in
  :attr:`Recipe.quant_kernels` kernels per tensor, one tensor per expert in a grouped GEMM
  (:func:`quantize_kernels`).
* the weights are quantised once a step, in the first micro-batch's forward (Transformer
  Engine caches the copies while Megatron-Core's schedule flags the other micro-batches
  ``is_first_microbatch=False``): :func:`weight_quantize_bytes` per parameter.

Recipes (sources per entry): per-tensor FP8 with delayed scaling (Transformer Engine's
``DelayedScaling``; Micikevicius et al. 2022, arXiv 2209.05433), per-tensor FP8 with current
scaling (NeMo's default on Blackwell: "scaling factors computed in the current step"),
blockwise FP8 (DeepSeek-V3, arXiv 2412.19437 sec. 3.3.2: 1x128 tiles for activations, 128x128
blocks for weights, fp32 scales), MXFP8 (OCP Microscaling Formats v1.0: 32-element blocks
with an E8M0 scale; TE's ``MXFP8BlockScaling`` writes row- and column-wise copies) and NVFP4
(NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv 2509.25149: E2M1 values,
an E4M3 scale per 16 elements and an fp32 per-tensor scale, 16x16 blocks for weights, random
Hadamard transforms on the wgrad inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.errors import ConfigError

#: training.precision values that run the linear layers' GEMMs in a low-precision format
LOW_PRECISION = ("fp8", "mxfp8", "nvfp4")
FP8_RECIPES = ("delayed", "current", "blockwise")


@dataclass(frozen=True)
class Recipe:
    """How one low-precision format is produced and stored.

    gemm_dtype: the catalog peak the GEMM runs at. operand_bytes: bytes per operand element,
    scales included. quant_bytes: HBM bytes moved to quantise one bf16 element (all copies a
    GEMM pass needs). wgrad_extra_bytes: further bytes per element of a wgrad operand (a
    transposed re-quantisation, a Hadamard transform). weight_bytes: bytes per parameter of
    the low-precision weight copies kept across micro-batches (beside the bf16 weights).
    """

    name: str
    gemm_dtype: str
    operand_bytes: float
    quant_bytes: float
    wgrad_extra_bytes: float
    weight_bytes: float
    source: str
    #: scale bytes per operand element that Transformer Engine swizzles into cuBLAS's layout
    #: before each GEMM (:func:`swizzle_bytes`); 0: none
    swizzle_scale_bytes: float = 0.0
    #: bytes per element of the transposed copy inside ``quant_bytes`` and ``weight_bytes``
    #: that only a GPU whose FP8 GEMMs take TN layouts alone needs (:func:`non_tn_fp8`)
    transpose_bytes: float = 0.0
    #: kernels Transformer Engine runs to quantise one tensor (v2.3 ``extensions/cast.cpp``,
    #: v2.4-v2.16 ``quantizer.cpp``): one cast (delayed scaling takes its scale from the amax
    #: history and updates the amax in the cast; MXFP8 and blockwise FP8 find each block's
    #: amax inside the cast, writing both orientations in the one kernel); current scaling
    #: three: ``nvte_compute_amax``,
    #: ``nvte_compute_scale_from_amax`` and the cast (``Float8CurrentScalingQuantizer::
    #: quantize_impl``)
    quant_kernels: int = 1
    #: bytes per element of a separate whole-tensor amax read inside ``quant_bytes`` (current
    #: scaling; NVFP4's per-tensor second-level scale)
    amax_bytes: float = 0.0
    #: the quantisation kernel's memory access class (gpus.yaml ``memory_access``): ``stream``
    #: (a copy's rate), or ``mx_cast`` for Transformer Engine's MXFP8 cast writing both
    #: orientations (published B200 timing, ``python -m simulator.calibrate mx_cast``)
    cast_access: str = "stream"


RECIPES: dict[str, Recipe] = {
    "fp8/delayed": Recipe(
        "fp8/delayed", "fp8", 1.0, 2 + 1 + 1, 0.0, 2.0,
        "TE DelayedScaling: the scale comes from an amax history, so one cast-transpose pass "
        "reads bf16 and writes the fp8 copy and its transpose (for wgrad); the weight is "
        "cached as fp8 and fp8-transposed (2 B/param)",
        transpose_bytes=1.0,
    ),
    "fp8/current": Recipe(
        "fp8/current", "fp8", 1.0, 2 + 2 + 1 + 1, 0.0, 2.0,
        "TE Float8CurrentScaling: an amax pass over the whole tensor before the cast-transpose "
        "(read bf16 twice, write fp8 and its transpose)",
        transpose_bytes=1.0, quant_kernels=3, amax_bytes=2.0,
    ),
    "fp8/blockwise": Recipe(
        "fp8/blockwise", "fp8", 1 + 4 / 128, 2 + 2 * (1 + 4 / 128), 0.0,
        2 * (1 + 4 / (128 * 128)),
        "DeepSeek-V3 sec. 3.3.2: per-tile (1x128) amax fused in the cast, an fp32 scale per "
        "128 elements, row-wise and column-wise (for wgrad) tiles written in one pass; weights "
        "in 128x128 blocks (two orientations)",
    ),
    "mxfp8": Recipe(
        "mxfp8", "mxfp8", 1 + 1 / 32, 2 + 2 * (1 + 1 / 32), 0.0, 2 * (1 + 1 / 32),
        "OCP MX v1.0: an E8M0 scale per 32 elements along K; TE writes the row-wise and the "
        "column-wise (wgrad) copy in one pass",
        1 / 32, cast_access="mx_cast",
    ),
    "nvfp4": Recipe(
        "nvfp4", "nvfp4", 0.5 + 1 / 16, 2 + 2 + (0.5 + 1 / 16), 2 + (0.5 + 1 / 16),
        2 * (0.5 + 1 / 256),
        "arXiv 2509.25149: a per-tensor amax pass (the fp32 second-level scale), then the "
        "row-wise E2M1 copy with an E4M3 scale per 16 elements; the wgrad inputs are read "
        "again, passed through a random Hadamard transform and written column-wise; weights "
        "in 16x16 blocks (two orientations)",
        1 / 16, amax_bytes=2.0,
    ),
}


#: GPUs of the GH100 die (Hopper), whose tensor cores take no block scales: a block-scaled FP8
#: GEMM multiplies each 128-deep K block's partial sums by their scales on CUDA cores before
#: accumulating (NVIDIA, "Optimizing DeepSeek-V3 Training Performance on GB200 NVL72",
#: Megatron-LM docs/discussions, Section 1), so it runs below a per-tensor GEMM of its shape.
HOPPER_GPUS = ("H100", "H800", "H200", "GH200")

#: Hopper's DeepSeek-style block-scaled FP8 GEMMs against per-tensor FP8 at the same shapes,
#: sustained (cuBLAS through ``torch._scaled_mm``): ``fwd`` 1x128 activations by 128x128 weight
#: blocks (forward and dgrad), ``wgrad`` 1x128 by 1x128 (both operands scaled along the tokens);
#: the medians over DeepSeek-V3's shapes, ``python -m simulator.calibrate blockwise`` from
#: ``data/measured/dsv3-fp8-h100x1/fp8_shapes.jsonl``.
BLOCKWISE_RATE_HOPPER = {"fwd": 0.916, "wgrad": 0.74}


#: GEMMs that stay in bf16 when the linear layers run low precision, in fused (Megatron-Core /
#: Transformer Engine) code: the LM head is Megatron-Core's own ``tensor_parallel.
#: ColumnParallelLinear`` (``GPTModel.output_layer``, models/gpt/gpt_model.py; the multi-token
#: prediction heads share it), and the MoE router's logits are ``torch.nn.functional.linear``
#: (``TopKRouter``, transformer/moe/router.py): neither is a Transformer Engine module, so
#: TE's ``fp8_autocast`` does not quantise them (it only reaches TE modules; FP8, MXFP8 and
#: NVFP4 alike), and they run cuBLAS bf16 GEMMs with no quantisation kernels.
BF16_GEMMS_FUSED = ("lm_head", "router")


def keeps_bf16(op_name: str, kernels: str) -> bool:
    """Whether GEMM ``op_name`` (a forward GEMM or its ``_dgrad`` / ``_wgrad``) runs in bf16
    under a low-precision recipe (:data:`BF16_GEMMS_FUSED`; fused kernels only)."""
    if kernels != "fused":
        return False
    base = op_name.removesuffix("_dgrad").removesuffix("_wgrad")
    return base in BF16_GEMMS_FUSED


def gemm_rate(rec: Recipe | None, gpu_name: str, wgrad: bool) -> float:
    """A low-precision GEMM's rate relative to the per-tensor FP8 (or the format's own) model:
    :data:`BLOCKWISE_RATE_HOPPER` for blockwise FP8 on a Hopper GPU, else 1 (Blackwell's
    block-scaled formats scale inside the tensor core; not measured here)."""
    if rec is None or rec.name != "fp8/blockwise" or not gpu_name.startswith(HOPPER_GPUS):
        return 1.0
    return BLOCKWISE_RATE_HOPPER["wgrad" if wgrad else "fwd"]


def recipe(precision: str, fp8_recipe: str = "delayed") -> Recipe | None:
    """The recipe of ``training.precision`` (None for bf16/fp16: no quantisation)."""
    if precision not in LOW_PRECISION:
        return None
    if precision != "fp8":
        return RECIPES[precision]
    if fp8_recipe not in FP8_RECIPES:
        raise ConfigError(
            f"unknown FP8 recipe {fp8_recipe!r} (accepted: {', '.join(FP8_RECIPES)})",
            field="training.fp8_recipe",
        )
    return RECIPES[f"fp8/{fp8_recipe}"]


def non_tn_fp8(gpu) -> bool:
    """Whether ``gpu``'s per-tensor FP8 GEMMs take any operand layout, so Transformer Engine
    writes no transposed FP8 copy of an activation, gradient or weight: Blackwell (sm_100 /
    sm_103), the GPUs whose tensor cores also take block-scaled formats (a catalog ``mxfp8``
    peak). TE 2.0-2.3 ``non_tn_fp8_gemm_supported()`` (compute capability major >= 10) and
    2.4 on ``nvte_is_non_tn_fp8_gemm_supported()`` (sm 100-119 and 130 on) gate the
    quantizers' ``create_transpose`` (``pytorch/csrc/extensions/quantizer.cpp``) on it; Hopper
    FP8 GEMMs are TN only, so its wgrad reads the transposed copies."""
    return "mxfp8" in getattr(gpu, "peak_tflops", {})


def quantize_bytes(rec: Recipe, m: int, k: int, n: int, wgrad: bool,
                   non_tn: bool = False, gathered: int = 0) -> float:
    """HBM bytes of quantising a GEMM's operands from bf16.

    Forward and dgrad GEMMs quantise their left ``[m, k]`` operand (activation or output
    gradient; the weight's copy is cached across micro-batches), writing every copy the
    backward needs: per-tensor FP8 the row-wise copy and, where the GPU's FP8 GEMMs are TN
    only (``non_tn`` false, :func:`non_tn_fp8`), its transpose. A wgrad GEMM (``[m, k] @
    [k, n]``, both operands from the forward/dgrad passes) pays only the recipe's extra wgrad
    work on both operands. ``gathered`` > 1 (:func:`sp_gather_bytes`): the operand reached the
    GEMM through a sequence-parallel all-gather over that many ranks and each rank quantised
    its own ``m / gathered`` rows first, without the transpose, which a TN-only GPU makes
    after the gather from the gathered copy (a separate kernel: read and write 1 B).
    """
    if wgrad:
        return rec.wgrad_extra_bytes * (m * k + k * n)
    if gathered > 1:
        t = rec.transpose_bytes
        return (rec.quant_bytes - t) * m * k / gathered + (0.0 if non_tn else 2.0 * t * m * k)
    return (rec.quant_bytes - (rec.transpose_bytes if non_tn else 0.0)) * m * k


def sp_gather_bytes(rec: Recipe) -> tuple[float, float] | None:
    """Bytes per element of Transformer Engine's sequence-parallel all-gathers under ``rec``:
    (forward input and its backward re-gather, output gradient), each rank's share quantised
    before the gather (:class:`simulator.model.comm.LowPrecisionGather`, TE 2.x
    ``gather_along_first_dim(..., quantizer=...)``). Per-tensor FP8 gathers its row-wise copy
    (``supports_only_rowwise_all_gather``); MXFP8 the copy each use wants: row-wise forward,
    column-wise re-gather, both for the output gradient (``_all_gather_mxfp8`` gathers each
    usage's data and scales). None: not modelled (blockwise FP8, NVFP4 keep the 16-bit
    gather)."""
    if rec.name in ("fp8/delayed", "fp8/current"):
        return rec.operand_bytes, rec.operand_bytes
    if rec.name == "mxfp8":
        return rec.operand_bytes, 2.0 * rec.operand_bytes
    return None


def quantize_kernels(rec: Recipe, experts: int = 1, non_tn: bool = False) -> int:
    """Kernels that quantise one GEMM operand of ``experts`` experts (a grouped GEMM's round;
    1: an ordinary GEMM). Transformer Engine's ``GroupedLinear`` quantises the experts' slices
    with ``split_quantize`` (v2.5-v2.16 ``pytorch/csrc/extensions/cast.cpp``; v2.0-v2.4
    ``fused_multi_quantize``), whose ``multi_tensor_quantize_impl`` has one fused kernel,
    ``nvte_multi_cast_transpose``, only for delayed scaling with a transposed copy (Hopper);
    every other case runs each expert's quantizer in turn: :attr:`Recipe.quant_kernels` per
    expert (current scaling's amax, scale and cast; MXFP8's, blockwise's and, on Blackwell,
    delayed scaling's one cast)."""
    experts = max(1, experts)
    if experts > 1 and rec.name == "fp8/delayed" and not non_tn:
        return 1
    return rec.quant_kernels * experts


def gathered_kernels(rec: Recipe, non_tn: bool = False) -> int:
    """Kernels that quantise an operand gathered under sequence parallelism
    (:func:`quantize_bytes` ``gathered``): the recipe's on the rank's share, and a TN-only
    GPU's transpose of the gathered per-tensor copy."""
    return rec.quant_kernels + (1 if rec.transpose_bytes and not non_tn else 0)


def weight_quantize_bytes(rec: Recipe, non_tn: bool = False) -> float:
    """HBM bytes per parameter of quantising a bf16 weight into its cached low-precision
    copies, once a step: read the weight (2 B; twice where a separate amax pass comes first,
    :attr:`Recipe.amax_bytes`) and write every orientation the forward and dgrad GEMMs take
    (:attr:`Recipe.weight_bytes`, less the transpose a non-TN GPU skips)."""
    return 2.0 + rec.amax_bytes + rec.weight_bytes - (rec.transpose_bytes if non_tn else 0.0)


def swizzle_bytes(rec: Recipe, m: int, k: int, n: int, experts: int = 1) -> float:
    """HBM bytes of the two kernels Transformer Engine runs before a block-scaled GEMM
    ``[m, k] @ [k, n]`` to swizzle each operand's scales into cuBLAS's layout (v2.5-v2.11
    ``pytorch/csrc/extensions/gemm.cpp`` ``swizzle_scaling_factors``, one kernel per operand,
    for MXFP8 and NVFP4 1-D scaling; a grouped GEMM's ``multi_tensor_swizzle_scaling_factors``
    does all experts' in one kernel per operand, ``experts`` weights of ``[k, n]``): each
    reads and writes the scales (:attr:`Recipe.swizzle_scale_bytes` per element). 0 for
    per-tensor and blockwise FP8 (one scale, or scales cuBLAS takes as they are)."""
    if rec.swizzle_scale_bytes <= 0:
        return 0.0
    return 2.0 * rec.swizzle_scale_bytes * (m * k + k * n * max(1, experts))


def pricing_dtype(training) -> str:
    """The dtype string the kernel pricer takes: ``bf16``/``fp16``, or ``<precision>`` with
    the FP8 recipe appended (``fp8/current``)."""
    if training.precision == "fp8":
        return f"fp8/{training.fp8_recipe}"
    return training.precision


def split_dtype(dtype: str) -> tuple[str, Recipe | None]:
    """(GEMM peak dtype, recipe) of a :func:`pricing_dtype` string."""
    name, _, fp8 = dtype.partition("/")
    rec = recipe(name, fp8 or "delayed")
    return (rec.gemm_dtype if rec else name), rec


def weight_bytes(training, param_bytes: int, non_tn: bool = False) -> tuple[float | None, float]:
    """(bytes per parameter of the working weights with their low-precision copies, bytes per
    parameter a ZeRO parameter all-gather moves).

    bf16/fp16: None (the working weights as ``param_dtype`` says), gathered as they are. Low precision: the cached copies
    beside the bf16 weights (:attr:`Recipe.weight_bytes`); with ``fp8_param_gather`` the
    weights are kept only in the low-precision format (its two orientations) and gathered as
    one orientation (``operand_bytes``), except MXFP8 (:data:`GATHERED_16BIT`). ``non_tn``
    (:func:`non_tn_fp8`): per-tensor FP8 keeps no transposed weight copy.
    """
    rec = recipe(training.precision, training.fp8_recipe)
    if rec is None:
        return None, float(param_bytes)
    cached = rec.weight_bytes - (rec.transpose_bytes if non_tn else 0.0)
    if training.fp8_param_gather:
        return cached, float(param_bytes) if rec.name in GATHERED_16BIT else rec.operand_bytes
    return param_bytes + cached, float(param_bytes)


#: recipes whose ``fp8_param_gather`` all-gathers 16-bit weights and quantises the gathered
#: copies every step. MXFP8: Megatron-Core's distributed optimizer copies its fp32 main shard
#: into the (bf16) parameter buffer, which shares the gradient buffer, all-gathers it and
#: casts each gathered weight into its MXFP8 parameter (both orientations) by ``copy_``
#: ("param buffer is not mapped to model params for MXFP8 case. The parameters are cast from
#: bf16 to MXFP8 during copy": ``_copy_main_params_to_param_buffer``,
#: ``DistributedDataParallel.start_param_sync`` with ``reuse_grad_buf_for_mxfp8_param_ag``,
#: which Megatron-Bridge's ``bf16_with_mxfp8_mixed`` sets beside ``fp8_param_gather``). The
#: MXFP8 copies are the only weights held (the bf16 ones live in the gradient buffer).
GATHERED_16BIT = ("mxfp8",)


def moe_dispatch_bytes(training) -> float | None:
    """Bytes per element of the tokens an MoE all-to-all sends towards the experts
    (``training.moe_dispatch_dtype``): None for bf16 (the activations' own dtype); for fp8 the
    recipe's operand with its scales (:attr:`Recipe.operand_bytes`: 1 + 4/128 for DeepSeek-V3's
    1x128 tiles with an fp32 scale each, arXiv:2412.19437 Sec. 3.3.3; 1 + 1/32 for MXFP8; 1
    for per-tensor scaling, whose one scale per tensor is negligible). The tokens are quantised
    before the dispatch instead of before the expert GEMM, so no kernel is added."""
    if training.moe_dispatch_dtype != "fp8":
        return None
    return recipe(training.precision, training.fp8_recipe).operand_bytes
