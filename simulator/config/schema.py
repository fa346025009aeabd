"""Typed, immutable input models (pydantic v2) for workloads, topologies and sweeps.

Units live in field names (``bandwidth_GBps``, ``latency_us``, ``hbm_GiB``) and are converted to
SI (seconds, bytes, bytes/s) once, by the consumers. Every model forbids unknown keys so a typo
is an error, not a silently ignored setting; :mod:`simulator.config.load` turns pydantic's
errors into one-line :class:`~simulator.errors.ConfigError` messages with a did-you-mean.

Cross-field rules that need more than one file (tp*pp*dp against the cluster's GPU count,
heads divisible by tp, ...) live in :mod:`simulator.config.checks`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    model_validator,
)

# Strict scalar types: YAML gives ints, floats, booleans and strings, and a value of the wrong
# kind is refused instead of coerced into a different meaning (``zero: true`` is not ZeRO-1,
# ``tp: 2.0`` and ``tp: "2"`` are not 2). A float field takes an int (``hbm_GiB: 80``) but
# never a boolean or a string; infinities and NaN are refused everywhere (``allow_inf_nan``).
Int = Annotated[int, Strict()]
PositiveInt = Annotated[int, Strict(), Field(gt=0)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]
Float = Annotated[float, Strict()]
PositiveFloat = Annotated[float, Strict(), Field(gt=0)]
Bool = StrictBool


def _layer_pattern(v: Any) -> Any:
    """A per-layer pattern: a positive int N (every N-th layer) or a list of 0/1, one per
    layer (the length is checked against ``model.layers`` by the model)."""
    if v is None:
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 1:
            raise ValueError("an int pattern must be >= 1 (every N-th layer)")
        return v
    if isinstance(v, (list, tuple)) and all(x in (0, 1) and not isinstance(x, bool) for x in v):
        return tuple(v)
    raise ValueError("expected an int N >= 1 or a list of 0/1 (one per layer)")


def _short_list(v: Any) -> str:
    """A list value shortened for a one-line error."""
    if not isinstance(v, (list, tuple)) or len(v) <= 8:
        return str(list(v) if isinstance(v, tuple) else v).replace(" ", "")
    return "[" + ",".join(map(str, v[:6])) + ",...]"


#: which layers have a feature: every N-th (an int) or a 0/1 list, one per layer
LayerPattern = Annotated[int | tuple[int, ...], BeforeValidator(_layer_pattern)]


def _integer_choice(value: Any) -> Any:
    """Before-validator of an integer ``Literal``: refuse booleans and floats (pydantic's
    Literal would take ``True`` for 1 and ``2.0`` for 2)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"a {type(value).__name__} is not an integer choice")
    return value


# Bounds checked at load time (README "Limits"): beyond them a step would take minutes or
# gigabytes to simulate, or the value is no real model or cluster.
MAX_LAYERS = 1024  # the largest published dense models have 96-126 layers
MAX_HIDDEN = 131_072  # model width; GPT-3 / PaLM: 12,288 / 18,432
MAX_HEADS = 4096
MAX_VOCAB = 4_194_304
MAX_SEQ_LEN = 4_194_304  # tokens per sequence (4 Mi)
MAX_GLOBAL_BATCH = 16_777_216  # sequences per step
MAX_GPUS = 131_072  # nodes * gpus_per_node (issue 11: a 131,072-GPU step; benchmarks/scale.py --big)
MAX_GPUS_PER_NODE = 1024  # an NVL576 rack is 576
MAX_SLOWDOWN = 1e9  # a straggler's compute slowdown factor (1e9: a GPU that all but stopped)
MIN_BANDWIDTH_FACTOR = 1e-9  # a degraded link keeps at least this share (0 = failed)
#: training.moe_route_correlation's default: a stable learning router's first step, measured
#: (simulator/calibrate/routes.py refits it from data/measured/diagnosis9-h100x4,
#: expert-rows-h100x4 and expert-rows2-h100x4)
ROUTE_CORRELATION_DEFAULT = 1.5e-4
#: training.moe_rank_correlation's default: the same stable router's, per EP rank
#: (simulator/calibrate/routes.py refits it from data/measured/diagnosis9-h100x4)
RANK_CORRELATION_DEFAULT = 8.4e-5
#: training.moe_route_widening's default: a stable router's per-sequence correlation grows by
#: this x (hidden x (step - 1))^2 / global_batch (AdamW at lr 3e-4; simulator/calibrate/routes.py
#: refits it from data/measured/diagnosis9-h100x4, expert-rows-h100x4 and expert-rows2-h100x4;
#: simulator/model/moe.py route_widening)
ROUTE_WIDENING_PER_HIDDEN2 = 1.8e-10
MAX_LATENCY_US = 1e6  # one second per hop
MAX_BUCKET_MB = 1e6

#: A workload's or sweep's ``name`` is a label that also names its output folder
#: (``results/<name>/``): one path component of safe characters, so no name can point outside
#: the results folder (``../x``, ``/``, ``.``) or make odd folders (newlines, NUL, spaces).
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
NAME_RULE = (
    "a name is a label that also names the output folder: 1-100 letters, digits, '.', '_', '-' "
    "or '+', starting with a letter or digit"
)


def _safe_name(value: str) -> str:
    if not NAME_PATTERN.fullmatch(value):
        raise ValueError(NAME_RULE)
    return value


#: A label that is safe as a single path component (see :data:`NAME_PATTERN`).
SafeName = Annotated[str, AfterValidator(_safe_name)]


class Frozen(BaseModel):
    """Base: immutable, unknown keys rejected, infinities and NaN refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# --------------------------------------------------------------------------------------------
# Workload


class MLAConfig(Frozen):
    """DeepSeek multi-head latent attention (DeepSeek-V2, arXiv:2405.04434, Section 2.1):
    queries through a rank-``q_lora_rank`` bottleneck (none when null), keys and values
    through a shared rank-``kv_lora_rank`` latent, each head's query/key split into a
    ``qk_nope_head_dim`` part from the latent and a ``qk_rope_head_dim`` rotary part (the key's
    rotary part is one head shared by all heads), values ``v_head_dim`` wide."""

    q_lora_rank: PositiveInt | None = Field(1536, description="query low rank; null: full Wq")
    kv_lora_rank: PositiveInt = 512
    qk_nope_head_dim: PositiveInt = 128
    qk_rope_head_dim: PositiveInt = 64
    v_head_dim: PositiveInt = 128


class MoEConfig(Frozen):
    """Mixture-of-experts MLP (names as Megatron-Core's ``--num-experts``, ``--moe-router-topk``,
    ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size``)."""

    experts: PositiveInt = Field(description="routed experts per MoE layer")
    top_k: PositiveInt = Field(description="routed experts each token goes to")
    ffn_hidden: PositiveInt = Field(description="inner width of each routed expert")
    shared_experts: NonNegativeInt = Field(0, description="always-active experts")
    shared_ffn_hidden: PositiveInt | None = Field(
        None, description="inner width of each shared expert; default ffn_hidden"
    )
    dense_layers: NonNegativeInt = Field(
        0, description="the first layers keep a dense MLP of model.ffn_hidden"
    )
    layer_freq: LayerPattern | None = Field(
        None,
        description="which layers after dense_layers are MoE: null every one; an int N every "
        "N-th (layers N-1, 2N-1, ... counted from 0, as Hugging Face's Llama 4 "
        "interleave_moe_layer_step: Maverick 2); a list of 0/1, one per layer (Megatron-Core's "
        "--moe-layer-freq list). The other layers keep a dense MLP of model.ffn_hidden",
    )
    capacity_factor: PositiveFloat | None = Field(
        None, description="null: dropless; a number: tokens above that capacity are dropped"
    )
    pad_to_capacity: Bool = Field(
        False,
        description="with capacity_factor: every expert computes exactly its capacity, the "
        "rows it was not sent padded (Megatron-Core's --moe-pad-expert-input-to-capacity, "
        "what NeMo 2.x's MegatronTokenDropCallback sets): fixed shapes, so the token counts "
        "are neither exchanged nor read on the host",
    )
    router: Literal["softmax", "sigmoid"] = Field(
        "softmax", description="softmax top-k (Mixtral, Qwen) or sigmoid scores (DeepSeek-V3)"
    )
    router_groups: PositiveInt = Field(
        1, description="group-limited routing: experts in this many groups (DeepSeek-V3: 8)"
    )
    router_group_top_k: PositiveInt | None = Field(
        None, description="groups a token may use (DeepSeek-V3: 4); default all"
    )

    @model_validator(mode="after")
    def _routing(self) -> MoEConfig:
        if self.pad_to_capacity and self.capacity_factor is None:
            raise ValueError("pad_to_capacity needs a capacity_factor (it pads to capacity)")
        if self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} exceeds experts={self.experts}")
        if self.experts % self.router_groups:
            raise ValueError(
                f"router_groups={self.router_groups} must divide experts={self.experts}"
            )
        if self.router_group_top_k is not None and self.router_group_top_k > self.router_groups:
            raise ValueError(
                f"router_group_top_k={self.router_group_top_k} exceeds "
                f"router_groups={self.router_groups}"
            )
        pool = (self.router_group_top_k or self.router_groups) * self.experts // self.router_groups
        if self.top_k > pool:
            raise ValueError(
                f"top_k={self.top_k} exceeds the {pool} experts of the "
                f"{self.router_group_top_k} groups a token may use"
            )
        return self

    @property
    def shared_ffn(self) -> int:
        """Inner width of each shared expert."""
        return self.shared_ffn_hidden or self.ffn_hidden


class ModelConfig(Frozen):
    """A decoder-only transformer (GPT: GELU MLP and MHA; Llama: SwiGLU MLP and GQA), dense or
    mixture-of-experts (``moe``), with MHA/GQA or DeepSeek's MLA attention."""

    layers: PositiveInt = Field(description="number of transformer layers", le=MAX_LAYERS)
    hidden: PositiveInt = Field(description="model width h", le=MAX_HIDDEN)
    ffn_hidden: PositiveInt | None = Field(
        None,
        description="MLP inner width; default 4*hidden (gelu) or the Llama rule (swiglu)",
        le=8 * MAX_HIDDEN,
    )
    heads: PositiveInt = Field(description="attention (query) heads", le=MAX_HEADS)
    kv_heads: PositiveInt | None = Field(None, description="key/value heads (GQA); default heads")
    vocab: PositiveInt = Field(description="vocabulary size", le=MAX_VOCAB)
    seq_len: PositiveInt = Field(description="tokens per sequence", le=MAX_SEQ_LEN)
    activation: Literal["swiglu", "gelu"] = "swiglu"
    norm: Literal["rmsnorm", "layernorm"] | None = Field(
        None, description="default: rmsnorm for swiglu models, layernorm for gelu models"
    )
    tied_embeddings: Bool = Field(False, description="LM head shares the embedding matrix")
    dropout: Bool | None = Field(
        None,
        description="whether the model applies dropout (attention probabilities, both residual "
        "branches, the embeddings); default: yes for gelu (GPT) models, no for swiglu (Llama). "
        "false for dropout probability 0: PyTorch's dropout with p = 0 returns its input "
        "without a kernel or mask (nanoGPT's pretraining default, dropout = 0.0)",
    )
    kv_channels: PositiveInt | None = Field(
        None,
        description="width of one attention head (Megatron's --kv-channels); default "
        "hidden/heads (Qwen3-235B: 128 with hidden 4096 and 64 heads)",
    )
    attention: Literal["mha", "gqa", "mla"] | None = Field(
        None, description="default: mha when kv_heads = heads, else gqa; mla needs model.mla"
    )
    qk_layernorm: Bool = Field(
        False,
        description="a norm over each query and key head after the QKV projection, before "
        "the rotary embedding (Qwen3, OLMo 2; Megatron-Core's --qk-layernorm: "
        "q_layernorm and k_layernorm, one kernel each way per tensor); fused kernels only",
    )
    mla: MLAConfig | None = Field(None, description="multi-head latent attention dimensions")
    moe: MoEConfig | None = Field(None, description="mixture-of-experts MLP; null: dense")
    attention_window: PositiveInt | None = Field(
        None,
        description="tokens of a local attention window (GPT-OSS: 128, sliding; Llama 4: "
        "8192, chunked); null: every layer full causal",
    )
    attention_window_kind: Literal["sliding", "chunked"] = Field(
        "sliding",
        description="sliding: each query sees the last attention_window keys (itself "
        "included); chunked: the sequence is cut into chunks of attention_window tokens, each "
        "causal on its own (Llama 4's attention_chunk_size)",
    )
    attention_window_pattern: LayerPattern | None = Field(
        None,
        description="which layers use the window: null every one; an int N: every N-th layer "
        "(layers N-1, 2N-1, ... counted from 0) keeps full causal attention and the others "
        "are local (GPT-OSS: 2, Llama 4: 4); a list of 0/1, one per layer, 1 = local",
    )
    mtp_depth: NonNegativeInt = Field(
        0, le=8,
        description="multi-token prediction modules after the last layer (DeepSeek-V3, "
        "arXiv:2412.19437 Section 2.2; Megatron-Core's --mtp-num-layers): each is a "
        "projection of the normalised hidden state and next token's embedding (2h -> h), one "
        "more layer of the model's last kind and the shared LM head with its loss, all on the "
        "last pipeline stage",
    )

    @model_validator(mode="after")
    def _kv_heads_divide_heads(self) -> ModelConfig:
        kv = self.kv_heads or self.heads
        if kv > self.heads or self.heads % kv:
            raise ValueError(f"kv_heads={kv} must divide heads={self.heads}")
        if self.kv_channels is None and self.hidden % self.heads:
            raise ValueError(
                f"hidden={self.hidden} must be divisible by heads={self.heads} "
                "(or give model.kv_channels)"
            )
        if self.attention == "mla" and self.mla is None:
            raise ValueError("attention: mla needs the model.mla dimensions")
        if self.mla is not None and self.attention not in (None, "mla"):
            raise ValueError(f"model.mla is given but attention is {self.attention!r} (use mla)")
        if self.moe is not None and self.moe.dense_layers > self.layers:
            raise ValueError(
                f"moe.dense_layers={self.moe.dense_layers} exceeds layers={self.layers}"
            )
        freq = None if self.moe is None else self.moe.layer_freq
        if isinstance(freq, tuple) and len(freq) != self.layers:
            raise ValueError(
                f"moe.layer_freq={_short_list(freq)} has {len(freq)} entries, not one per "
                f"layer (layers={self.layers})"
            )
        if freq is not None and self.moe_layers == 0:
            raise ValueError(f"moe.layer_freq={_short_list(freq)} leaves no MoE layer")
        pat = self.attention_window_pattern
        if isinstance(pat, tuple) and len(pat) != self.layers:
            raise ValueError(
                f"attention_window_pattern={_short_list(pat)} has {len(pat)} entries, not one "
                f"per layer (layers={self.layers})"
            )
        w = self.attention_window
        if w is None and pat is not None:
            raise ValueError(
                f"attention_window_pattern={_short_list(pat)} needs an attention_window (tokens)"
            )
        if w is None and self.attention_window_kind != "sliding":
            raise ValueError(
                f"attention_window_kind={self.attention_window_kind} needs an attention_window "
                "(tokens)"
            )
        if w is not None and w > self.seq_len:
            raise ValueError(
                f"attention_window={w} exceeds seq_len={self.seq_len} (a window longer than "
                "the sequence is full causal attention: leave the window out)"
            )
        if w is not None and self.attention_window_kind == "chunked" and self.seq_len % w:
            raise ValueError(
                f"attention_window={w} must divide seq_len={self.seq_len} for chunked "
                "attention (whole chunks)"
            )
        return self

    def is_moe_layer(self, layer: int) -> bool:
        """Whether global layer ``layer`` (from 0) has an MoE block: not one of the first
        ``moe.dense_layers``, and picked by ``moe.layer_freq``."""
        moe = self.moe
        if moe is None or layer < moe.dense_layers:
            return False
        f = moe.layer_freq
        if f is None:
            return True
        if isinstance(f, int):
            return (layer + 1) % f == 0
        return bool(f[layer]) if layer < len(f) else True

    def is_local_layer(self, layer: int) -> bool:
        """Whether global layer ``layer`` (from 0) attends within ``attention_window``."""
        if self.attention_window is None:
            return False
        p = self.attention_window_pattern
        if p is None:
            return True
        if isinstance(p, int):
            return (layer + 1) % p != 0
        return bool(p[layer]) if layer < len(p) else True

    @property
    def layer_kinds(self) -> tuple[tuple[bool, bool], ...]:
        """``(moe, local)`` of every layer, in order."""
        return _layer_kinds(self)

    def layer_variant(self, local: bool) -> ModelConfig:
        """This model with every layer's attention full (``local`` false) or every layer's
        within the window: what one kind of layer's programs are built from."""
        if self.attention_window is None or (local and self.attention_window_pattern is None):
            return self
        window = self.attention_window if local else None
        return self.model_copy(
            update={"attention_window": window, "attention_window_pattern": None}
        )

    @property
    def attention_kind(self) -> str:
        """``mha``, ``gqa`` or ``mla`` (the default follows kv_heads and model.mla)."""
        if self.attention:
            return self.attention
        if self.mla is not None:
            return "mla"
        return "mha" if self.n_kv_heads == self.heads else "gqa"

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (0 for a dense model)."""
        return sum(moe for moe, _ in self.layer_kinds)

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden // self.heads

    @property
    def ffn(self) -> int:
        """The MLP inner width actually used."""
        if self.ffn_hidden:
            return self.ffn_hidden
        if self.activation == "gelu":
            return 4 * self.hidden
        # Llama rule: 2/3 * 4h rounded up to a multiple of 256 (Touvron et al. 2023).
        f = int(2 * 4 * self.hidden / 3)
        return 256 * ((f + 255) // 256)

    @property
    def norm_kind(self) -> str:
        return self.norm or ("rmsnorm" if self.activation == "swiglu" else "layernorm")


@lru_cache(maxsize=256)
def _layer_kinds(model: ModelConfig) -> tuple[tuple[bool, bool], ...]:
    """:attr:`ModelConfig.layer_kinds`, once per model (a frozen, hashable config)."""
    return tuple((model.is_moe_layer(i), model.is_local_layer(i)) for i in range(model.layers))


class DeepSpeedZeroConfig(Frozen):
    """DeepSpeed's ZeRO stage 3 settings (``zero_optimization`` in its JSON config; defaults
    as deepspeed/runtime/zero/config.py ships them, DeepSpeed at 38327e07, 2025-02). Counts
    are elements, as DeepSpeed counts them (``1e5`` is accepted, as in DeepSpeed's JSON)."""

    param_persistence_threshold: Float = Field(
        1e5, ge=0, le=1e12,
        description="stage3_param_persistence_threshold: a parameter tensor of at most this "
        "many elements is kept whole on every rank (never gathered nor released)",
    )
    max_live_parameters: PositiveFloat = Field(
        1e9, le=1e13,
        description="stage3_max_live_parameters: gathered elements a rank may hold at once "
        "(bounds how far ahead the trace-based prefetch runs)",
    )
    reduce_bucket_size: PositiveFloat = Field(
        5e8, le=1e12,
        description="reduce_bucket_size: gradient elements per reduce-scatter (the "
        "contiguous_gradients buffer of this many elements in the working dtype)",
    )


class TrainingConfig(Frozen):
    """What one optimizer step does."""

    global_batch: PositiveInt = Field(
        description="sequences per optimizer step", le=MAX_GLOBAL_BATCH
    )
    micro_batch: PositiveInt = Field(
        1, description="sequences per micro-batch per DP rank", le=MAX_GLOBAL_BATCH
    )
    precision: Literal["bf16", "fp16", "fp8", "mxfp8", "nvfp4"] = Field(
        "bf16",
        description="GEMM format of the linear layers: bf16, fp16, fp8 (per-tensor or blockwise "
        "scales, fp8_recipe), mxfp8 (MX 32-element blocks) or nvfp4 (16-element blocks; "
        "mxfp8/nvfp4 need Blackwell); attention and everything else stays bf16",
    )
    fp8_recipe: Literal["delayed", "current", "blockwise"] = Field(
        "delayed",
        description="precision fp8: per-tensor delayed scaling (Transformer Engine's default), "
        "per-tensor current scaling (NeMo on Blackwell) or blockwise 1x128/128x128 (DeepSeek-V3)",
    )
    fp8_param_gather: Bool = Field(
        False,
        description="low-precision working weights (Megatron --fp8-param-gather): no bf16 copy, "
        "and the ZeRO parameter all-gather moves the low-precision bytes",
    )
    param_dtype: Literal["bf16", "fp32"] = Field(
        "bf16", description="stored working weights; fp32 = AMP autocast (no bf16 copy)"
    )
    autocast_region: Literal["auto", "microbatch", "step"] = Field(
        "auto",
        description="param_dtype fp32 with eager kernels: how long one torch.autocast region "
        "lasts, which sets how often each fp32 GEMM weight is cast to the compute dtype "
        "(autocast caches the cast of a leaf tensor that requires grad until its outermost "
        "region exits: PyTorch AMP docs). microbatch: a region per forward, every micro-batch "
        "casts every weight. step: one region around all the step's micro-batches, each "
        "weight cast once a step. auto: step under parallelism.pp_runtime torch with pp > 1 "
        "(schedule.step() inside one region, benchmarks/device/steps_alt.py; dense models), "
        "else microbatch",
    )
    grad_reduce_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    grad_accumulation_fusion: Bool = Field(
        True,
        description="fused kernels with 16-bit weights: the wgrad GEMM adds into the "
        "accumulated gradient (Megatron --gradient-accumulation-fusion); off: a separate "
        "addition after each weight-gradient GEMM (Megatron before 2022-02, or with fp16 "
        "gradients), in a grad_reduce_dtype buffer",
    )
    recompute: Literal["none", "selective", "full"] = "none"
    recompute_modules: tuple[Literal["core_attn", "layernorm", "mla_up_proj", "mlp", "moe_act"], ...] | None = (
        Field(
            None,
            description="with recompute: selective, the modules recomputed in backward "
            "(ignored with none or full, as Megatron-Core does) "
            "(Megatron-Core's --recompute-modules; default [core_attn]): core_attn (the "
            "attention core), layernorm (norm outputs), mla_up_proj (MLA's Q/K/V "
            "up-projections, DeepSeek-V3 Sec. 3.2.3), mlp (a dense layer's whole MLP with its "
            "norm and TP collectives; MoE layers are left alone, as Megatron-Core does), moe_act "
            "(the experts' activation)",
        )
    )
    overlap_grad_reduce: Bool = Field(
        True,
        description="reduce gradients in grad_bucket_MB buckets during the last backward; "
        "off: one bucket per model chunk after backward (Megatron-LM's behaviour)",
    )
    overlap_param_gather: Bool = Field(
        False, description="ZeRO-1/2: overlap the post-step parameter all-gather with compute"
    )
    grad_bucket_MB: PositiveFloat = Field(
        25.0,
        le=MAX_BUCKET_MB,
        description="gradient bucket size in MiB (2^20 bytes of reduced gradients), as "
        "PyTorch DDP's bucket_cap_mb (default 25 MiB), which the key is named after: "
        "'MB' here means MiB; grad_bucket_MiB is the same key under its exact name",
    )
    grad_bucket_MiB: PositiveFloat | None = Field(
        None, le=MAX_BUCKET_MB, description="grad_bucket_MB under its exact unit (give one)"
    )
    ddp_buckets: Literal["separate", "view", "none"] = Field(
        "separate",
        description="eager code with dp > 1 and ZeRO 0, how gradients reach the all-reduce: "
        "separate: PyTorch DDP's default, flat buckets beside .grad (copied in and out; one "
        "bucket set, the one rebuilt in the second iteration, live in the steady state); view: "
        "DDP(gradient_as_bucket_view=True), the gradients become views of the bucket set (no "
        "copies; no_sync micro-batches' gradients live beside it until the last backward); "
        "none: no DDP reducer, the script all-reduces one transient flat bucket at a time",
    )
    zero_impl: Literal["unit", "deepspeed"] = Field(
        "unit",
        description="how ZeRO-3 is run. unit: one all-gather and one reduce-scatter per layer "
        "(Megatron-Core's distributed optimizer units, PyTorch FSDP2's per-block units), "
        "prefetched one layer ahead. deepspeed: DeepSpeed's ZeRO stage 3 (training.deepspeed): "
        "each tensor partitioned over the data-parallel ranks, one all-gather per module "
        "fetch (each linear layer, the embedding, the head), tensors of at most "
        "param_persistence_threshold elements kept whole, prefetch up to max_live_parameters "
        "ahead, gradients reduce-scattered in reduce_bucket_size buckets",
    )
    fsdp_reshard_after_forward: Literal["default", "all", "none"] = Field(
        "default",
        description="eager ZeRO-3 (PyTorch FSDP2 fully_shard per block, then on the root: "
        "the embedding, final norm and head): which units free their gathered parameters "
        "after the forward. default: fully_shard without the argument (or FSDP1 FULL_SHARD, "
        "or any setting before PyTorch 2.8): every block, and the root stays gathered to the "
        "end of the backward (no all-gather of it in backward). all: "
        "reshard_after_forward=True passed to every call, the root's too (respected on the root "
        "since PyTorch 2.8): the root is freed after the forward and all-gathered again after "
        "the loss's backward. none: reshard_after_forward=False on every unit (ZeRO-2-like, "
        "FSDP1 SHARD_GRAD_OP): each unit gathered once in the forward, kept to the end of its "
        "backward, no all-gathers in backward",
    )
    fsdp_version: Annotated[Literal[1, 2], BeforeValidator(_integer_choice)] = Field(
        2,
        description="eager ZeRO-3's PyTorch FSDP: 2, fully_shard (FSDP2: the all-gather lands "
        "in one buffer that a copy-out kernel on the compute stream splits into the unit's "
        "parameters, split_with_sizes_copy, before the unit runs); 1, FullyShardedDataParallel "
        "(FSDP1: the all-gather writes the unit's flat parameter in place, no copy-out; the "
        "root never resharded after the forward, so fsdp_reshard_after_forward is default or "
        "none)",
    )
    loss_in_model: Bool = Field(
        False,
        description="eager code whose model's forward computes the loss and returns it "
        "(model(x, y), as Hugging Face models and nanoGPT do) rather than returning the "
        "logits to a loss computed outside (loss_fn(model(x), y)). Read for FSDP2's root "
        "unit: its pre-backward hook, which gathers the root when resharded and prefetches "
        "the last block, runs on the gradient of the root's output, so before the loss's "
        "backward when the output is the loss, after it when it is the logits",
    )
    deepspeed: DeepSpeedZeroConfig = Field(
        default_factory=DeepSpeedZeroConfig,
        description="zero_impl: deepspeed, DeepSpeed's zero_optimization settings",
    )
    optimizer: Literal["adam"] = "adam"
    optimizer_impl: Literal["fused", "foreach"] = Field(
        "fused",
        description="how Adam's step runs: fused, one multi-tensor kernel reading and writing "
        "each state once (Megatron-LM, Apex, torch.optim.AdamW(fused=True)); foreach, "
        "torch.optim.AdamW(foreach=True), PyTorch's default on CUDA: eight multi-tensor "
        "passes (weight decay, lerp of m, two of v, sqrt into a new list, divide, add eps, "
        "addcdiv), about 80 bytes per fp32 parameter instead of 28",
    )
    gemm_clock: Literal["sustained", "power_limited"] = Field(
        "sustained",
        description="the SM clock GEMMs are priced at: sustained, the power-capped clock of "
        "GEMMs back to back that the GEMM calibration ran at; power_limited, the clock the "
        "power cap leaves for the stage's mix of GEMMs and memory-bound kernels "
        "(simulator/hardware/power.py; measured on H100, 1 elsewhere). Off by default: on "
        "its own it moves the eager steps' bias fast while their host-bound gaps and the "
        "third script's memory-bound kernels are still priced low (docs/DESIGN_NOTES.md)",
    )
    grad_clip: Literal["norm", "foreach", "none"] = Field(
        "norm",
        description="global-norm gradient clipping before the optimizer step: norm, the "
        "norm only (one read of every gradient; Megatron-Core scales the fp32 main grads "
        "only when the coefficient is below 1); foreach, torch.nn.utils.clip_grad_norm_ "
        "(or a hand-written equivalent) in eager code: _foreach_norm, then _foreach_mul_ "
        "of every gradient by the clamped coefficient whatever its value (a read and a "
        "write more); none, no clipping and no norm",
    )
    optimizer_moments_dtype: Literal["fp32", "bf16"] = Field(
        "fp32",
        description="dtype of Adam's first and second moments; the master weights stay fp32 "
        "(bf16: DeepSeek-V3, arXiv:2412.19437 Sec. 3.3.3, 4 + 2 + 2 bytes per parameter "
        "instead of 4 + 4 + 4)",
    )
    rmsnorm_gain: Literal["fp32", "input_dtype"] = Field(
        "fp32",
        description="eager code's RMSNorm: fp32, the normalised rows multiplied by the gain in "
        "fp32 and cast for the next GEMM (benchmarks/device/measure.py); input_dtype, cast "
        "back to the input's dtype before the gain, y.type_as(x) * w (Meta's Llama reference, "
        "Hugging Face LlamaRMSNorm): with a bf16 residual stream the row kept for the gain's "
        "backward is bf16 instead of fp32. Memory only; the same with an fp32 stream",
    )
    kv_repeat: Bool = Field(
        False,
        description="eager GQA attention written with separate wq/wk/wv and K, V copied to "
        "every query head before SDPA (Meta's repeat_kv, repeat_interleave): the attention "
        "keeps the repeated K and V (heads x head_dim wide each) instead of the fused QKV "
        "output (false: one fused QKV Linear whose views reach the attention, measure.py). "
        "Memory only",
    )
    master_weights: Literal["fp32", "remainder", "none"] = Field(
        "fp32",
        description="with param_dtype narrower than fp32, the optimizer's master weights: "
        "fp32, a full fp32 copy (Megatron-LM, FSDP's MixedPrecision); remainder, only the 16 "
        "bits an fp32 weight has beyond its bf16 value (Apex DistributedFusedAdam("
        "store_param_remainders=True), as NeMo runs bf16 with distributed_fused_adam): 2 "
        "bytes instead of 4, bf16 and a fused optimizer only; none, the bf16 parameters are "
        "the optimizer's own and are updated in place (model.to(torch.bfloat16) with "
        "torch.optim.AdamW, whose moments then take the parameters' dtype: say "
        "optimizer_moments_dtype: bf16): 2 + 2 + 2 + 2 bytes per parameter instead of 2 + 2 "
        "+ 4 + 4 + 4. No effect with param_dtype fp32",
    )
    kernels: Literal["fused", "eager"] = Field(
        "fused",
        description="fused: Megatron-LM / Transformer Engine kernels (fused norms, RoPE, "
        "activations, bf16 residual stream); eager: plain PyTorch modules in eager mode (norm "
        "math in fp32, unfused RoPE and activations, fp32 residual stream)",
    )
    flash_attention: Bool = Field(
        True, description="fused flash attention (False: Megatron's older unfused softmax path)"
    )
    attention_backend: Literal["cudnn", "fa2"] = Field(
        "cudnn",
        description="the flash-attention kernels: cudnn (cuDNN's fused attention, what PyTorch "
        "SDPA and Transformer Engine pick on Hopper; the catalog's calibrated kernels) or fa2 "
        "(FlashAttention-2, the flash-attn package: Transformer Engine with NVTE_FUSED_ATTN=0, "
        "PyTorch SDPA's FLASH_ATTENTION backend), about half cuDNN's rate on H100",
    )
    tokens: PositiveFloat | None = Field(
        None, description="tokens of the whole training run, for time/cost to train", le=1e18
    )
    moe_dispatcher: Literal["alltoall", "allgather", "deepep"] = Field(
        "alltoall",
        description="token dispatch of an MoE layer (Megatron's --moe-token-dispatcher-type): "
        "all-to-all over the EP group, or all-gather of every token and reduce-scatter back; "
        "deepep: DeepEP's node-aware all-to-all (Megatron's flex dispatcher with DeepEP, as "
        "DeepSeek-V3): a token crosses the network once per destination node and NVLink once "
        "per destination GPU",
    )
    moe_expert_load: tuple[Float, ...] | None = Field(
        None, description="share of routed tokens per expert (sums to 1); default uniform"
    )
    moe_routing: Literal["balanced", "random", "learned"] = Field(
        "balanced",
        description="how a micro-batch's routed copies spread over the experts: balanced "
        "(each expert gets exactly its share, moe_expert_load or uniform: an idealisation) or "
        "random (each token picks its top_k experts uniformly at random, independently of "
        "the others, as Megatron-Core's --moe-router-force-load-balancing does with i.i.d. "
        "normal logits per token; the busiest EP rank, which every rank waits for, then "
        "carries the expected maximum of the ranks' counts) or learned (a learned router's "
        "shares move from call to call: each MoE layer call waits for its busiest EP rank, "
        "at the expected maximum of Dirichlet-multinomial rank shares around "
        "moe_expert_load or uniform, spread by moe_rank_correlation; "
        "simulator/model/route_skew.py)",
    )
    moe_router_fusion: Bool = Field(
        True,
        description="fused MoE code: the router's scores, top-k, routing map and aux-loss "
        "scores in one kernel (Megatron-Core's --moe-router-fusion, since 2025-08); false: "
        "Megatron-Core's PyTorch router, one kernel per tensor operation (about 17 forward, "
        "7 backward, and an all-reduce of the tokens per expert over TP), as code before "
        "that flag ran",
    )
    moe_permute_fusion: Bool = Field(
        True,
        description="fused MoE code: the token permutation before the dispatch and its "
        "inverse after the combine (with the routing weights) as Transformer Engine's fused "
        "kernels (Megatron-Core's --moe-permute-fusion); false: Megatron-Core's PyTorch "
        "permute / unpermute (index_select by an index from masked_select, or by a stable "
        "argsort with pad_to_capacity; a multiply by the weights, a zero output and a "
        "scatter_add_; the dropless index reads its size on the host), as NeMo 2.x ran "
        "Mixtral (the flag's default is off)",
    )
    moe_multihot_fusion: Bool = Field(
        True,
        description="fused MoE code with moe_dispatcher deepep: the received routes turned "
        "into the local experts' routing map in one kernel (Megatron-Core's "
        "fused_indices_to_multihot, only with --enable-experimental, a flag since 2025-06-12); "
        "false: its PyTorch _indices_to_multihot, 27 kernels and 5 host synchronisations "
        "(boolean indexing, repeat_interleave) after every dispatch, 5 kernels backward",
    )
    moe_probs_alltoall: Bool = Field(
        True,
        description="fused MoE code with moe_dispatcher alltoall: the routing probabilities "
        "of the permuted token copies travel with them in a second all-to-all (and a second "
        "all-gather over etp), fp32, forward and backward, and the experts' activation "
        "weights each row, as Megatron-Core runs it since Megatron-LM 2659630721 "
        "(2025-04-09: main since then, core_v0.12.1, 0.13 on); false: the probabilities stay "
        "on their rank and the un-permutation merges them, as core_v0.12.0 and earlier "
        "(NeMo 25.02 / 25.04) ran it",
    )
    moe_routes: Literal["learned", "replayed"] = Field(
        "learned",
        description="where an eager MoE step's routes come from: learned (a router picks "
        "experts per token, so each expert's token count, the row count of its GEMMs, changes "
        "every micro-batch) or replayed (a benchmark replaying the same forced routes every "
        "step, so the shapes repeat)",
    )
    moe_regroup: Literal["aranges", "argsort", "concat"] = Field(
        "aranges",
        description="eager MoE code (kernels: eager): how the copies received by the "
        "dispatch are arranged for the local experts, which run one after another on slices "
        "of them. aranges: regrouped by local expert with an index built from one "
        "torch.arange per (source rank, expert) piece, put back by the inverse index before "
        "the combine (benchmarks/device/steps.py); argsort: regrouped by an argsort of the "
        "pieces' expert ids (repeat_interleave by the received counts, which reads them on "
        "the host once more), put back the same way (steps_third.py); concat: not regrouped, "
        "each expert's input a torch.cat of its piece from every source rank, its output "
        "split back in received order (steps_alt.py). Autograd's backward of each slice "
        "writes a zero gradient of the whole received buffer and adds the slices' up: one "
        "slice per local expert, or per (source rank, local expert) with concat "
        "(simulator/model/moe.py)",
    )
    moe_route_correlation: Float = Field(
        ROUTE_CORRELATION_DEFAULT, ge=0, le=1,
        description="how alike a learned router sends the tokens of one call (micro-batch, "
        "layer) to an expert: the correlation between two tokens' choices, so an expert's "
        "count is beta-binomial, variance n p (1-p) (1 + (n-1) rho); 0: independent tokens "
        "(a router at initialisation on random tokens), 1: every token alike (a collapsed "
        "router). With measured_steps it sets how often an eager expert GEMM's row count is "
        "new to the process (simulator/model/shape_cache.py). Default: a stable learning "
        "router as measured (data/measured/diagnosis9-h100x4)",
    )
    moe_route_widening: Float | None = Field(
        None, ge=0, le=1,
        description="how fast a learned router's moe_route_correlation grows with the "
        "optimizer's steps: step s adds w (seq_len / tokens) (hidden (s - 1))^2 / "
        "global_batch to it "
        "(tokens: a call's, every EP source's; simulator/model/moe.py route_widening). Null: "
        "a stable learning router's as measured (schema.ROUTE_WIDENING_PER_HIDDEN2, AdamW at "
        "lr 3e-4) when moe_route_correlation is left at its default, 0 when it is set",
    )
    moe_rank_correlation: Float = Field(
        RANK_CORRELATION_DEFAULT, ge=0, le=1,
        description="with moe_routing: learned, how alike a learned router sends the token "
        "copies of one call to an EP rank (the correlation of two copies' ranks: a rank's "
        "count has variance n p (1-p) (1 + (n-1) rho)). Default: a stable learning router "
        "as measured (steps_third.py, data/measured/diagnosis9-h100x4); 0.21 measured for "
        "steps_alt.py's collapsing router (python -m simulator.calibrate routes)",
    )
    measured_steps: tuple[PositiveInt, PositiveInt] | None = Field(
        None,
        description="[first, last] steps of a fresh process the prediction is for (a "
        "benchmark timing steps 4..9 after 3 warm-up steps: [4, 9]); null: a long run's steady "
        "state. Eager MoE with learned routes: expert GEMMs of row counts the process has not "
        "seen pay cuBLAS's heuristic query on the host (gpus.yaml host_gemm_new_shape_*)",
    )
    overlap_moe_expert_parallel_comm: Bool = Field(
        False,
        description="Megatron-Core's switch: the EP all-to-all of one micro-batch overlaps "
        "the compute of another (combined 1F1B)",
    )
    delay_wgrad_compute: Bool = Field(
        False,
        description="Megatron-Core's --delay-wgrad-compute (with combined 1F1B only): a "
        "layer's expert and attention weight gradients are issued after the next node of the "
        "pair, and nothing of the backward waits for them",
    )
    moe_dispatch_dtype: Literal["bf16", "fp8"] = Field(
        "bf16",
        description="dtype of the tokens an MoE all-to-all sends to the experts (the forward "
        "dispatch and the output gradients of the backward combine); fp8: quantised in the "
        "precision recipe's format with its scales, as DeepSeek-V3 (arXiv:2412.19437 Sec. "
        "3.3.3; needs precision fp8 or mxfp8); the combine stays bf16",
    )

    @model_validator(mode="after")
    def _measured_steps_order(self) -> TrainingConfig:
        if self.measured_steps is not None and self.measured_steps[0] > self.measured_steps[1]:
            raise ValueError(
                f"measured_steps: [first, last] with first <= last, got {list(self.measured_steps)}"
            )
        return self

    @model_validator(mode="after")
    def _one_bucket_key(self) -> TrainingConfig:
        if self.grad_bucket_MiB is not None and "grad_bucket_MB" in self.model_fields_set:
            raise ValueError(
                "grad_bucket_MB and grad_bucket_MiB are the same size (MiB) under two names: "
                "give one"
            )
        return self

    @property
    def grad_bucket_bytes(self) -> float:
        """The gradient bucket in bytes: MiB x 2^20, as PyTorch DDP turns ``bucket_cap_mb``
        into ``bucket_bytes_cap`` (``int(bucket_cap_mb * 1024 * 1024)``,
        torch/nn/parallel/distributed.py). Megatron-LM's ``--ddp-bucket-size`` counts
        elements instead: N elements are N x the reduced dtype's bytes."""
        mib = self.grad_bucket_MB if self.grad_bucket_MiB is None else self.grad_bucket_MiB
        return mib * 2**20


class ParallelismConfig(Frozen):
    """How the job is split over GPUs."""

    tp: PositiveInt = Field(1, le=MAX_GPUS)
    cp: PositiveInt = Field(
        1,
        description="context parallel degree: each sequence split over cp GPUs in 2*cp chunks",
        le=MAX_GPUS,
    )
    cp_comm: Literal["p2p", "all_gather", "a2a"] = Field(
        "p2p",
        description="p2p: ring attention, K/V blocks passed around the CP ring beside the "
        "blockwise attention kernels; all_gather: K/V all-gathered before attention (Llama 3); "
        "a2a: Ulysses, Q/K/V all-to-all to full sequences of heads/cp heads and the output back "
        "(Transformer Engine's cp_comm_type a2a; the query and key/value heads per TP rank must "
        "divide by cp). A sliding model.attention_window runs with all_gather or a2a only, a "
        "chunked one under no mode (as Transformer Engine runs them); with cp 1 no effect",
    )
    pp: PositiveInt = Field(1, le=MAX_GPUS)
    dp: PositiveInt | None = Field(
        None, description="default: GPUs / (tp * cp * pp)", le=MAX_GPUS
    )
    zero: Annotated[Literal[0, 1, 2, 3], BeforeValidator(_integer_choice)] = 0
    sequence_parallel: Bool = False
    pp_schedule: Literal["gpipe", "1f1b", "interleaved", "dualpipe", "dualpipev"] = Field(
        "1f1b", description="dualpipe: DeepSeek-V3's bidirectional schedule (even pp; rank i "
        "holds stages i and pp-1-i; an even number of micro-batches, at least 2 pp); "
        "dualpipev: its cut-in-half V (virtual_stages 2; rank i holds stages i and 2pp-1-i)")
    virtual_stages: PositiveInt = Field(1, le=MAX_LAYERS)
    stage_layers: tuple[NonNegativeInt, ...] | None = Field(
        None, description="layers per pipeline stage (pp * virtual_stages entries); the first "
        "(embedding) and the last (LM head, MTP) may hold none, as Megatron-Core's "
        "--account-for-embedding/loss-in-pipeline-split and pipeline layouts place them"
    )
    ep: PositiveInt = Field(1, description="expert-parallel degree (MoE layers)", le=MAX_GPUS)
    etp: PositiveInt = Field(
        1, description="tensor-parallel degree inside each expert", le=MAX_GPUS
    )
    tp_input_dtype: Literal["residual", "compute"] = Field(
        "residual",
        description="eager code without sequence parallelism: the dtype in which a "
        "column-parallel layer's input enters the TP region, so the dtype of its gradient's "
        "all-reduce in the backward. residual: the norm's output as it is (fp32 with AMP "
        "master weights), cast by autocast inside the Linear (PyTorch DTensor ColwiseParallel, "
        "benchmarks/device/steps.py); compute: cast to bf16 before the region "
        "(benchmarks/device/measure.py). Fused (Megatron) code casts in its norms",
    )
    tp_impl: Literal["megatron", "dtensor"] = Field(
        "megatron",
        description="how the tensor parallelism is written. megatron: hand-written TP regions "
        "(Megatron-LM; eager code: custom autograd functions around process-group calls, "
        "benchmarks/device/steps.py). dtensor: PyTorch's torch.distributed.tensor.parallel "
        "(ColwiseParallel, RowwiseParallel, SequenceParallel with PrepareModuleInput, "
        "loss_parallel; benchmarks/device/steps_alt.py), eager code only: the host's extra time "
        "of each DTensor unit (gpus.yaml host_dtensor) and of the optimizer step per DTensor "
        "parameter (host_dtensor_opt_*), and with SP the fp32 all-gather of a "
        "norm's output kept for the backward instead of re-gathered",
    )
    tp_loss: Literal["vocab_parallel", "gathered"] = Field(
        "vocab_parallel",
        description="how the loss meets the column-parallel LM head's vocabulary-split logits "
        "(tp > 1). vocab_parallel: a cross-entropy over the local vocabulary with small "
        "all-reduces (Megatron-LM's, PyTorch's loss_parallel, benchmarks/device/steps.py). "
        "gathered: eager code only: the logits all-gathered over TP (and concatenated) so that "
        "every rank runs an ordinary cross-entropy over the whole vocabulary, its gradient "
        "sliced back to the rank's shard (benchmarks/device/steps_third.py)",
    )
    tp_embedding: Literal["vocab_parallel", "replicated"] = Field(
        "vocab_parallel",
        description="how the word embedding meets tensor parallelism (tp > 1). vocab_parallel: "
        "its rows split over the TP ranks, the looked-up rows all-reduced (Megatron-LM's "
        "VocabParallelEmbedding, DTensor's RowwiseParallel on it). replicated: eager code only: "
        "a whole nn.Embedding on every TP rank (weight, gradient and optimizer moments of all "
        "vocab x hidden rows, a plain lookup without collective, the dense gradient over the "
        "whole vocabulary; benchmarks/device/steps_third.py)",
    )
    pp_runtime: Literal["megatron", "torch"] = Field(
        "megatron",
        description="how the pipeline's sends and receives are issued. megatron: each transfer "
        "issued when its producer ends and received when its consumer needs it, sends on a "
        "stream of their own (Megatron-LM). torch: torch.distributed.pipelining as of PyTorch "
        "2.11, for the interleaved schedule: each receive posted where its runtime's lock-step "
        "pass places it (often passes before its consumer) and every transfer a "
        "batch_isend_irecv on the group's one NCCL stream, so a rank's transfers run one after "
        "another in posting order (benchmarks/device/steps_alt.py; simulator/parallel/"
        "torch_posts.py). Its single-stage schedules (gpipe, 1f1b) post each receive at its "
        "consumer: priced as megatron. Its memory, every schedule (simulator/model/"
        "pipeline_memory.py): a receive buffer per micro-batch, each stage output kept until its "
        "backward, the last stage's logits kept for the step, and autocast's weight copies made "
        "once a step (schedule.step() runs every micro-batch inside the script's one autocast "
        "region), not once a micro-batch",
    )
    pp_scatter_gather: Bool = Field(
        True,
        description="send 1/tp of a stage boundary activation per TP rank and all-gather it over "
        "NVLink at the receiver (Narayanan et al. SC21, Sec. 4.1)",
    )
    order: tuple[Literal["tp", "cp", "dp", "pp"], ...] = Field(
        ("tp", "cp", "dp", "pp"),
        description="rank order, innermost (fastest varying) first; cp may be left out "
        "(it then follows tp)",
    )

    @model_validator(mode="after")
    def _order_is_permutation(self) -> ParallelismConfig:
        if sorted(self.order) not in (["dp", "pp", "tp"], ["cp", "dp", "pp", "tp"]):
            raise ValueError(
                f"order must list tp, dp and pp (and optionally cp) once each, got {list(self.order)}"
            )
        return self

    @property
    def dims_order(self) -> tuple[str, ...]:
        """``order`` with every dense dimension: cp right after tp when not listed."""
        o = list(self.order)
        if "cp" not in o:
            o.insert(o.index("tp") + 1, "cp")
        return tuple(o)


class ClusterConfig(Frozen):
    topology: str = Field(description="path of the topology YAML, relative to the workload file")


class Straggler(Frozen):
    """One GPU (or every GPU of a node) whose compute runs ``slowdown`` times longer."""

    gpu: NonNegativeInt | None = None
    node: NonNegativeInt | None = None
    slowdown: Float = Field(gt=0, le=MAX_SLOWDOWN)

    @model_validator(mode="after")
    def _one_target(self) -> Straggler:
        if (self.gpu is None) == (self.node is None):
            raise ValueError("give exactly one of gpu or node")
        return self


class LinkFault(Frozen):
    """A degraded or failed link, named by the GPU or NIC it attaches.

    ``kind: nvlink`` addresses the GPU's NVLink port (``gpu``); ``kind: nic`` the node's NIC
    (``node`` and ``nic``) and its cable to the leaf switch.
    """

    kind: Literal["nvlink", "nic"]
    gpu: NonNegativeInt | None = None
    node: NonNegativeInt | None = None
    nic: NonNegativeInt | None = None
    bandwidth_factor: Float = Field(1.0, ge=0, le=1, description="0 = failed")

    @model_validator(mode="after")
    def _fields_of_kind(self) -> LinkFault:
        if 0 < self.bandwidth_factor < MIN_BANDWIDTH_FACTOR:
            raise ValueError(
                f"bandwidth_factor={self.bandwidth_factor:g} is neither failed (0) nor in "
                f"[{MIN_BANDWIDTH_FACTOR:g}, 1]"
            )
        if self.kind == "nic" and self.gpu is not None:
            raise ValueError("gpu=... names an nvlink fault; a nic fault is named by node and nic")
        if self.kind == "nvlink" and (self.node is not None or self.nic is not None):
            field = "node" if self.node is not None else "nic"
            raise ValueError(f"{field}=... names a nic fault; an nvlink fault is named by gpu")
        return self


class Reliability(Frozen):
    """Failures over a whole run (for goodput and the best checkpoint interval)."""

    gpu_mtbf_hours: PositiveFloat = Field(
        description="mean time between failures of one GPU", le=1e9
    )
    checkpoint_interval_min: PositiveFloat | None = Field(
        None, description="default: the optimum (Young/Daly)", le=1e9
    )
    checkpoint_write_s: Float = Field(60.0, ge=0, le=1e9)
    restart_s: Float = Field(600.0, ge=0, le=1e9)


class FaultsConfig(Frozen):
    stragglers: tuple[Straggler, ...] = ()
    straggler_scope: Literal["gpu", "layers"] = Field(
        "gpu",
        description="what a straggler's slowdown stretches: gpu (a slow GPU: every kernel it "
        "runs) or layers (a benchmark that emulates a straggler by padding the forward and "
        "backward of the transformer layers and the LM head, as benchmarks/device/steps_alt.py's "
        "Pacer does: the embedding, gradient bucketing and optimizer run at full speed)",
    )
    links: tuple[LinkFault, ...] = ()
    reliability: Reliability | None = None


class WorkloadConfig(Frozen):
    """A whole workload file."""

    name: SafeName
    model: ModelConfig
    training: TrainingConfig
    parallelism: ParallelismConfig = ParallelismConfig()
    cluster: ClusterConfig
    faults: FaultsConfig = FaultsConfig()
    seed: Int = Field(
        0, description="reserved: the simulation draws no random numbers (random expert "
        "routing is priced by closed forms), so no result depends on it today",
    )


# --------------------------------------------------------------------------------------------
# Topology (flat, so that `--set topology.nic_bandwidth_Gbps=800` and sweeps reach every knob)


class CostConfig(Frozen):
    """What the cluster costs to run: power beyond the GPU boards, the facility, and either a
    rental price or a purchase (capital cost amortised over the hardware's life plus the
    electricity bill). Used for energy and cost per million tokens and for a whole run."""

    pue: Float = Field(
        1.0, ge=1.0, description="power usage effectiveness: facility power / IT power (1.0: "
        "IT only; air-cooled halls ~1.4-1.6, liquid-cooled ~1.1-1.2)"
    )
    node_overhead_W: Float = Field(
        0.0, ge=0, description="power of a node beyond its GPU boards (CPUs, memory, NICs, "
        "fans, its share of switches); e.g. a DGX H100 draws up to 10.2 kW for 8 x 700 W GPUs"
    )
    price_per_gpu_hour: PositiveFloat | None = Field(
        None, description="USD per GPU-hour, all in (rental); default: the GPU catalog's"
    )
    capex_per_gpu_usd: PositiveFloat | None = Field(
        None, description="purchase price per GPU with its share of node and network; when "
        "given, a GPU-hour costs capex / (amortisation_years * 8766 h) plus electricity"
    )
    amortisation_years: PositiveFloat = Field(4.0, description="life of purchased hardware")
    electricity_usd_per_kWh: Float = Field(
        0.0, ge=0, description="price of energy (with capex_per_gpu_usd)"
    )

    @model_validator(mode="after")
    def _one_price(self) -> CostConfig:
        if self.price_per_gpu_hour is not None and self.capex_per_gpu_usd is not None:
            raise ValueError(
                "price_per_gpu_hour and capex_per_gpu_usd are alternatives: give one (a "
                "rental price or a purchase)"
            )
        return self


class TopologyConfig(Frozen):
    """A cluster: nodes of GPUs joined by NVLink, nodes joined by NICs and switches.

    Bandwidths are per direction. ``gpu`` is a catalog name or a mapping with ``base`` (a
    catalog name) and any GPU fields to override.
    """

    name: str = Field(min_length=1)
    gpu: str | dict[str, Any]
    nodes: PositiveInt = Field(le=MAX_GPUS)
    gpus_per_node: PositiveInt = Field(8, le=MAX_GPUS_PER_NODE)
    # intra-node
    intra_node: Literal["nvswitch", "mesh", "pcie"] = Field(
        "nvswitch", description="nvswitch: every GPU to a switch; mesh: direct NVLink pairs"
    )
    nvlink_domain_gpus: PositiveInt | None = Field(
        None,
        description="GPUs joined by one NVLink switch fabric (72 on a GB200/GB300 NVL72 rack of "
        "18 trays of 4; 64 for racks using 16 of their trays); a multiple of gpus_per_node "
        "dividing the GPU count; default gpus_per_node",
    )
    nvlink_bandwidth_GBps: PositiveFloat | None = Field(
        None,
        description="per GPU per direction; default: the GPU catalog's NVLink line rate "
        "(nvlink_line_GBps: NVLink 4 478.125, NVLink 5 956.25)",
        ge=0.1,
        le=1e6,
    )
    nvlink_latency_us: Float = Field(0.8, ge=0, le=MAX_LATENCY_US)
    nvls: Bool | None = Field(
        None,
        description="NVLink SHARP (NCCL's NVLS / NVLS Tree all-reduce, reduced in the NVSwitch); "
        "default (null): on where supported (NVSwitch, NVLink 4 or later), as NCCL enables it",
    )
    ib_sharp: Bool = Field(
        False,
        description="InfiniBand SHARP in the scale-out switches (NCCL CollNet with the SHARP "
        "plugin, Quantum-2 NDR or later); off by default, as NCCL (NCCL_COLLNET_ENABLE=0)",
    )
    # inter-node
    nics_per_node: NonNegativeInt = Field(8, le=MAX_GPUS_PER_NODE)
    nic_bandwidth_Gbps: PositiveFloat | None = Field(
        None,
        description="per NIC; default: the GPU catalog's nic_Gbps (its reference system)",
        ge=1.0,
        le=1e6,
    )
    network: Literal["fat_tree", "leaf_spine", "rail_only"] = Field(
        "fat_tree",
        description="fat_tree / leaf_spine: a folded Clos; rail_only: one switch fabric per "
        "rail and no spine, traffic between rails forwarded over NVLink (PXN)",
    )
    rail_optimized: Bool = True
    nodes_per_leaf: PositiveInt = Field(
        32, description="nodes a leaf switch (per rail, when rail-optimised) serves", le=MAX_GPUS
    )
    oversubscription: Float = Field(
        1.0, ge=1.0, le=1000.0, description="leaf downlink:uplink bandwidth ratio (2.0 = 2:1)"
    )
    tiers: Annotated[Literal[2, 3], BeforeValidator(_integer_choice)] = Field(
        2, description="switch tiers of the Clos: 2 (leaf, spine) or 3 (leaf, spine, core)"
    )
    nodes_per_pod: PositiveInt | None = Field(
        None,
        description="tiers: 3: nodes under one spine block (a multiple of nodes_per_leaf); "
        "default 16 leaf groups",
        le=MAX_GPUS,
    )
    spine_oversubscription: Float = Field(
        1.0,
        ge=1.0,
        le=1000.0,
        description="tiers: 3: a pod's spine-to-leaf:spine-to-core bandwidth ratio",
    )
    switch_latency_us: Float = Field(0.6, ge=0, le=MAX_LATENCY_US, description="per switch hop")
    nic_latency_us: Float = Field(2.0, ge=0, le=MAX_LATENCY_US, description="NIC + PCIe, each end")
    pcie_bandwidth_GBps: PositiveFloat | None = Field(
        None,
        description="GPU<->NIC per direction; default: the GPU catalog's pcie_GBps "
        "(Gen5 x16 ~ 64 GB/s, Gen6 x16 ~ 128 GB/s)",
        ge=0.1,
        le=1e6,
    )
    cost: CostConfig = CostConfig()

    @model_validator(mode="after")
    def _nvlink_domain(self) -> TopologyConfig:
        dom, tray = self.nvlink_domain_gpus, self.gpus_per_node
        n = self.nodes * tray
        if dom is None or (dom % tray == 0 and n % dom == 0):
            return self
        raise ValueError(f"nvlink_domain_gpus={dom} {_domain_advice(dom, tray, self.nodes)}")

    @model_validator(mode="after")
    def _cluster_size(self) -> TopologyConfig:
        if self.nodes * self.gpus_per_node > MAX_GPUS:
            raise ValueError(
                f"nodes={self.nodes} x gpus_per_node={self.gpus_per_node} = "
                f"{self.nodes * self.gpus_per_node} GPUs; the simulator takes up to {MAX_GPUS:,}"
            )
        return self


def _domain_advice(dom: int, tray: int, nodes: int) -> str:
    """What to change when NVLink domains of ``dom`` GPUs do not tile ``nodes`` x ``tray``: the
    node counts of whole domains nearby, or the largest domain that tiles the GPUs (a rack
    using part of its trays, as 16 of an NVL72 rack's 18 trays)."""
    n = nodes * tray
    if dom % tray:
        return f"must be a multiple of gpus_per_node ({tray}) (accepted: {tray}, {2 * tray}, ...)"
    t = dom // tray
    lo, hi = nodes // t * t, -(-nodes // t) * t
    whole = " or ".join(f"nodes: {x} ({x // t} domains)" for x in (lo, hi) if x)
    part = max(d for d in range(tray, dom + 1, tray) if n % d == 0)
    return (
        f"must divide the {n} GPUs (nodes x gpus_per_node) (accepted: whole domains, {whole}; "
        f"or domains of {part} GPUs, nvlink_domain_gpus: {part}, each using "
        f"{part // tray} of its {t} nodes)"
    )


# --------------------------------------------------------------------------------------------
# Sweep


class SweepConfig(Frozen):
    """Variations of a base workload by dotted key: a cartesian ``grid`` and/or ``points``."""

    name: SafeName
    base: str = Field(description="workload YAML, relative to the sweep file")
    grid: dict[str, tuple[Any, ...]] = Field(default_factory=dict)
    points: tuple[dict[str, Any], ...] = ()
    metric: str = Field("tokens_per_s", description="summary key the plots show")
