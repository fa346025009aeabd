"""Models by name or from a Hugging Face ``config.json``.

A workload's ``model`` may be

* ``{from: path/to/config.json, ...}``: a Hugging Face transformers config (relative to the
  workload file), read by :func:`from_hf_config`; keys given beside ``from`` override what it
  maps (``seq_len`` is usually one of them: it is the training sequence length, which the
  config does not hold);
* ``{from: NAME, ...}``: a model of :data:`CATALOG` (``llama3-8b``, ``llama3-70b``,
  ``llama3.1-405b``, ...), written in the keys of this project, each with its source.

Architectures (``model_type``): ``llama``, ``mistral``, ``mixtral``, ``qwen2``, ``qwen3``,
``qwen3_moe``, ``deepseek_v3``, ``gpt_neox``, ``gpt_oss``, ``llama4`` (its ``text_config``).
Anything else is one error line naming the accepted ones. Parts of a config the simulator
does not model (rotary scaling, Qwen2's sliding window, biases of Qwen2's QKV projection,
DeepSeek-V3's multi-token-prediction layer) are left
out; the layer shapes, MoE routing and attention kind are what it maps.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from simulator.config.yaml_safe import read_bounded
from simulator.errors import ConfigError

#: The training sequence length is not in a HF config; ``max_position_embeddings`` is used
#: for it only up to this length (above it, ``model.seq_len`` must be given).
MAX_IMPLIED_SEQ_LEN = 8192

#: Named models: the keys of ``model`` (seq_len: the length the model was pre-trained at).
CATALOG: dict[str, dict[str, Any]] = {
    # Llama 2 70B: Touvron et al. 2023, Table 1 and the released config.json.
    "llama2-70b": {"layers": 80, "hidden": 8192, "ffn_hidden": 28672, "heads": 64,
                   "kv_heads": 8, "vocab": 32000, "seq_len": 4096, "activation": "swiglu"},
    # Llama 3 / 3.1: Llama Team, "The Llama 3 Herd of Models" (2024), Table 3.
    "llama3-8b": {"layers": 32, "hidden": 4096, "ffn_hidden": 14336, "heads": 32,
                  "kv_heads": 8, "vocab": 128256, "seq_len": 8192, "activation": "swiglu"},
    "llama3-70b": {"layers": 80, "hidden": 8192, "ffn_hidden": 28672, "heads": 64,
                   "kv_heads": 8, "vocab": 128256, "seq_len": 8192, "activation": "swiglu"},
    "llama3.1-405b": {"layers": 126, "hidden": 16384, "ffn_hidden": 53248, "heads": 128,
                      "kv_heads": 8, "vocab": 128256, "seq_len": 8192, "activation": "swiglu"},
    # GPT-3 175B: Brown et al. 2020, Table 2.1 (vocabulary of GPT-2's BPE, padded by Megatron).
    "gpt3-175b": {"layers": 96, "hidden": 12288, "heads": 96, "vocab": 51200,
                  "seq_len": 2048, "activation": "gelu"},
    # Mixtral 8x7B: Jiang et al. 2024, Table 1.
    "mixtral-8x7b": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "vocab": 32000,
                     "seq_len": 4096, "activation": "swiglu",
                     "moe": {"experts": 8, "top_k": 2, "ffn_hidden": 14336}},
    # DeepSeek-V3: DeepSeek-AI 2024 (arXiv:2412.19437), Section 4.2.
    "deepseek-v3": {"layers": 61, "hidden": 7168, "ffn_hidden": 18432, "heads": 128,
                    "vocab": 129280, "seq_len": 4096, "activation": "swiglu",
                    "attention": "mla",
                    "mla": {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                            "qk_rope_head_dim": 64, "v_head_dim": 128},
                    "moe": {"experts": 256, "top_k": 8, "ffn_hidden": 2048, "shared_experts": 1,
                            "dense_layers": 3, "router": "sigmoid", "router_groups": 8,
                            "router_group_top_k": 4}},
}  # fmt: skip


def _get(cfg: Mapping[str, Any], key: str, file: str, default: Any = ...) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is not ...:
        return default
    raise ConfigError(f"the Hugging Face config has no {key!r}", file=file, field="model.from")


def _act(cfg: Mapping[str, Any], file: str, gated: bool) -> str:
    act = str(_get(cfg, "hidden_act", file, "silu"))
    if gated and act in ("silu", "swish"):
        return "swiglu"
    if not gated and act.startswith("gelu"):
        return "gelu"
    raise ConfigError(
        f"hidden_act {act!r} with a {'gated' if gated else 'plain'} MLP is not modelled "
        "(accepted: silu with a gated MLP, gelu with a plain one)",
        file=file,
        field="model.from",
    )


def _dense(cfg: Mapping[str, Any], file: str, *, gated: bool = True) -> dict[str, Any]:
    heads = int(_get(cfg, "num_attention_heads", file))
    hidden = int(_get(cfg, "hidden_size", file))
    out: dict[str, Any] = {
        "layers": int(_get(cfg, "num_hidden_layers", file)),
        "hidden": hidden,
        "ffn_hidden": int(_get(cfg, "intermediate_size", file)),
        "heads": heads,
        "kv_heads": int(_get(cfg, "num_key_value_heads", file, heads)),
        "vocab": int(_get(cfg, "vocab_size", file)),
        "activation": _act(cfg, file, gated),
        "norm": "rmsnorm" if gated else "layernorm",
        "tied_embeddings": bool(_get(cfg, "tie_word_embeddings", file, False)),
    }
    head_dim = cfg.get("head_dim")
    if head_dim and int(head_dim) * heads != hidden:
        out["kv_channels"] = int(head_dim)  # Qwen3: heads * head_dim != hidden
    seq = cfg.get("max_position_embeddings")
    if isinstance(seq, int) and 0 < seq <= MAX_IMPLIED_SEQ_LEN:
        out["seq_len"] = seq
    return out


def _mixtral(cfg: Mapping[str, Any], file: str) -> dict[str, Any]:
    out = _dense(cfg, file)
    out["moe"] = {
        "experts": int(_get(cfg, "num_local_experts", file)),
        "top_k": int(_get(cfg, "num_experts_per_tok", file)),
        "ffn_hidden": out.pop("ffn_hidden"),
    }
    return out


def _qwen3_moe(cfg: Mapping[str, Any], file: str) -> dict[str, Any]:
    out = _dense(cfg, file)
    sparse_step = int(_get(cfg, "decoder_sparse_step", file, 1))
    mlp_only = {int(i) for i in _get(cfg, "mlp_only_layers", file, [])}
    out["moe"] = {
        "experts": int(_get(cfg, "num_experts", file)),
        "top_k": int(_get(cfg, "num_experts_per_tok", file)),
        "ffn_hidden": int(_get(cfg, "moe_intermediate_size", file)),
    }
    # transformers' Qwen3MoeDecoderLayer: sparse where not in mlp_only_layers and
    # (layer + 1) % decoder_sparse_step == 0 (the dense ones keep intermediate_size)
    if mlp_only:
        out["moe"]["layer_freq"] = [
            int(i not in mlp_only and (i + 1) % sparse_step == 0) for i in range(out["layers"])
        ]
    elif sparse_step != 1:
        out["moe"]["layer_freq"] = sparse_step
    return out


def _deepseek_v3(cfg: Mapping[str, Any], file: str) -> dict[str, Any]:
    out = _dense(cfg, file)
    out.pop("kv_heads", None)
    out.pop("kv_channels", None)
    out["attention"] = "mla"
    out["mla"] = {
        "q_lora_rank": cfg.get("q_lora_rank"),
        "kv_lora_rank": int(_get(cfg, "kv_lora_rank", file)),
        "qk_nope_head_dim": int(_get(cfg, "qk_nope_head_dim", file)),
        "qk_rope_head_dim": int(_get(cfg, "qk_rope_head_dim", file)),
        "v_head_dim": int(_get(cfg, "v_head_dim", file)),
    }
    scoring = str(_get(cfg, "scoring_func", file, "sigmoid"))
    out["moe"] = {
        "experts": int(_get(cfg, "n_routed_experts", file)),
        "top_k": int(_get(cfg, "num_experts_per_tok", file)),
        "ffn_hidden": int(_get(cfg, "moe_intermediate_size", file)),
        "shared_experts": int(_get(cfg, "n_shared_experts", file, 0)),
        "dense_layers": int(_get(cfg, "first_k_dense_replace", file, 0)),
        "router": "sigmoid" if scoring == "sigmoid" else "softmax",
        "router_groups": int(_get(cfg, "n_group", file, 1)),
        "router_group_top_k": cfg.get("topk_group"),
    }
    return out


def _mistral(cfg: Mapping[str, Any], file: str) -> dict[str, Any]:
    """Mistral: a dense Llama-like model; ``sliding_window`` (Mistral 7B v0.1: 4,096 on every
    layer, Jiang et al. 2023, arXiv:2310.06825, Section 2; null in later versions) maps onto
    a sliding ``attention_window`` on every layer."""
    out = _dense(cfg, file)
    window = cfg.get("sliding_window")
    if window and cfg.get("use_sliding_window", True):
        out["attention_window"] = int(window)
        out["attention_window_kind"] = "sliding"
    return out


def _gpt_oss(cfg: Mapping[str, Any], file: str) -> dict[str, Any]:
    """OpenAI's gpt-oss (transformers' GptOssConfig): every layer MoE, softmax over the top-k;
    ``layer_types`` alternate sliding_attention (``sliding_window`` tokens) and full_attention.
    Left out: the projections', router's and experts' biases, the attention sinks."""
    out = _dense(cfg, file)
    top_k = cfg.get("num_experts_per_tok") or _get(cfg, "experts_per_token", file)
    out["moe"] = {
        "experts": int(_get(cfg, "num_local_experts", file)),
        "top_k": int(top_k),
        "ffn_hidden": int(_get(cfg, "intermediate_size", file)),
    }
    window = cfg.get("sliding_window")
    if window:
        types = cfg.get("layer_types")
        out["attention_window"] = int(window)
        out["attention_window_kind"] = "sliding"
        # transformers' default layer_types: sliding on even layers, full on odd ones
        out["attention_window_pattern"] = (
            [int(t == "sliding_attention") for t in types] if types else 2
        )
    return out


def _llama4(cfg: Mapping[str, Any], file: str) -> dict[str, Any]:
    """Meta's Llama 4 (transformers' Llama4TextConfig, under ``text_config`` of a ``llama4``
    config): MoE layers every ``interleave_moe_layer_step`` (or ``moe_layers``), each with one
    shared expert and a sigmoid over the top-k scores, the dense layers ``intermediate_size_mlp``
    wide; chunked attention (``attention_chunk_size``) on the RoPE layers, full on the NoPE ones
    (``no_rope_layers``, default every ``no_rope_layer_interval``-th). The vision model is
    left out."""
    text = cfg.get("text_config") if cfg.get("model_type") == "llama4" else cfg
    if not isinstance(text, Mapping):
        raise ConfigError("a llama4 config needs its text_config", file=file, field="model.from")
    out = _dense(text, file)
    out["ffn_hidden"] = int(_get(text, "intermediate_size_mlp", file))
    out["moe"] = {
        "experts": int(_get(text, "num_local_experts", file)),
        "top_k": int(_get(text, "num_experts_per_tok", file)),
        "ffn_hidden": int(_get(text, "intermediate_size", file)),
        "shared_experts": 1,
        "router": "sigmoid",
    }
    moe_layers = text.get("moe_layers")
    step = int(_get(text, "interleave_moe_layer_step", file, 1))
    if moe_layers is not None:
        chosen = {int(i) for i in moe_layers}
        out["moe"]["layer_freq"] = [int(i in chosen) for i in range(out["layers"])]
    elif step != 1:
        out["moe"]["layer_freq"] = step
    chunk = text.get("attention_chunk_size")
    if chunk:
        out["attention_window"] = int(chunk)
        out["attention_window_kind"] = "chunked"
        rope = text.get("no_rope_layers")
        out["attention_window_pattern"] = (
            [int(bool(x)) for x in rope] if rope
            else int(_get(text, "no_rope_layer_interval", file, 4))
        )
    return out


#: model_type -> mapping function.
ARCHITECTURES: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {
    "llama": _dense,
    "mistral": _mistral,
    "qwen2": _dense,
    "qwen3": _dense,
    "mixtral": _mixtral,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v3": _deepseek_v3,
    "gpt_neox": lambda cfg, file: _dense(cfg, file, gated=False),
    "gpt_oss": _gpt_oss,
    "llama4": _llama4,
    "llama4_text": _llama4,
}


def from_hf_config(path: str | Path) -> dict[str, Any]:
    """The ``model`` keys of a Hugging Face ``config.json`` (see the module docstring)."""
    file = str(path)
    text = read_bounded(path, what="Hugging Face config", kind="JSON")  # a small regular file, UTF-8
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"cannot read the config as JSON ({e})", file=file) from None
    if not isinstance(cfg, dict):
        raise ConfigError("expected a JSON object", file=file)
    kind = cfg.get("model_type")
    if kind not in ARCHITECTURES:
        raise ConfigError(
            f"model_type {kind!r} is not supported (accepted: {', '.join(ARCHITECTURES)})",
            file=file,
            field="model_type",
        )
    return ARCHITECTURES[kind](cfg, file)


def resolve_model(raw: dict[str, Any], workload_path: Path) -> dict[str, Any]:
    """``raw`` (a workload mapping) with ``model: {from: ...}`` replaced by the model's keys,
    the keys given beside ``from`` winning. Anything else is returned unchanged."""
    model = raw.get("model")
    if not isinstance(model, dict) or "from" not in model:
        return raw
    src = model["from"]
    rest = {k: v for k, v in model.items() if k != "from"}
    if not isinstance(src, str) or not src:
        raise ConfigError(
            "expected a catalog name or a path to a Hugging Face config.json",
            file=str(workload_path),
            field="model.from",
        )
    if src in CATALOG:
        base = json.loads(json.dumps(CATALOG[src]))
    elif src.endswith(".json") or "/" in src:
        p = Path(src)
        p = p if p.is_absolute() else workload_path.parent / p
        if not p.exists():
            raise ConfigError(
                f"Hugging Face config {src!r} does not exist (a path is relative to the "
                "workload's folder)",
                file=str(workload_path),
                field="model.from",
            )
        base = from_hf_config(p)
    else:
        raise ConfigError(
            f"unknown model {src!r} (catalog: {', '.join(CATALOG)}; or a path to a Hugging "
            "Face config.json)",
            file=str(workload_path),
            field="model.from",
        )
    merged = {**base, **rest}
    if "seq_len" not in merged:
        raise ConfigError(
            "the training sequence length is not in the Hugging Face config "
            f"(max_position_embeddings is above {MAX_IMPLIED_SEQ_LEN}): give model.seq_len",
            file=str(workload_path),
            field="model.seq_len",
        )
    window = merged.get("attention_window")
    if ("attention_window" not in rest and isinstance(window, int)
            and isinstance(merged["seq_len"], int) and window >= merged["seq_len"]):
        # a window or chunk as long as the training sequence is full causal attention (Llama
        # 4's 8,192 chunks, Mistral's 4,096 window at sequences that long or shorter): the
        # config's window is dropped, not refused
        for k in ("attention_window", "attention_window_kind", "attention_window_pattern"):
            merged.pop(k, None)
    return {**raw, "model": merged}
