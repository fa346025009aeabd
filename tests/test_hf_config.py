"""``model: {from: ...}``: Hugging Face configs and named models.

The configs under ``tests/data/hf/`` carry the shape fields of the config.json files released
on the Hugging Face Hub. Dense models are checked against their published parameter counts
(an independent figure: the model cards and papers); MoE and MLA models against the
architecture papers' numbers, as the named catalog writes them.
"""

from __future__ import annotations

import pytest
import yaml

from simulator.cli import main as cli_main
from simulator.config.load import load_workload
from simulator.errors import ConfigError
from simulator.model import transformer as tf
from tests.conftest import ROOT, small_topology

HF = ROOT / "tests" / "data" / "hf"


def workload(tmp_path, model: dict) -> str:
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(small_topology(1, 8)))
    work = {
        "name": "hf",
        "model": model,
        "training": {"global_batch": 8, "micro_batch": 1},
        "parallelism": {"tp": 8, "dp": 1},
        "cluster": {"topology": "topo.yaml"},
    }
    path = tmp_path / "work.yaml"
    path.write_text(yaml.safe_dump(work))
    return str(path)


@pytest.mark.parametrize(
    "name,seq_len,published",
    [
        ("llama3-8b", None, 8.03e9),  # Llama 3 model card: 8.03B
        ("mistral-7b", 4096, 7.24e9),  # Jiang et al. 2023: 7.24B
        ("qwen2-7b", 4096, 7.62e9),  # Qwen2 technical report: 7.6B (7.62B on the card)
        ("gpt-neox-20b", None, 20.55e9),  # Black et al. 2022: 20,554,567,680
    ],
)
def test_dense_configs_match_published_sizes(tmp_path, name, seq_len, published):
    model = {"from": str(HF / f"{name}.json")}
    if seq_len:
        model["seq_len"] = seq_len
    m = load_workload(workload(tmp_path, model)).workload.model
    # Biases (GPT-NeoX, Qwen2's QKV) are not modelled: a few million parameters.
    assert tf.total_params(m) == pytest.approx(published, rel=0.01)


def test_llama_from_hf_equals_the_named_model(tmp_path):
    a = load_workload(workload(tmp_path, {"from": str(HF / "llama3-8b.json")})).workload.model
    b = load_workload(workload(tmp_path, {"from": "llama3-8b"})).workload.model
    assert tf.total_params(a) == tf.total_params(b)
    for k in ("layers", "hidden", "ffn", "heads", "n_kv_heads", "vocab", "seq_len", "head_dim"):
        assert getattr(a, k) == getattr(b, k)
    assert a.activation == "swiglu" and a.norm_kind == "rmsnorm"


def test_qwen3_head_dim_wider_than_hidden_over_heads(tmp_path):
    m = load_workload(
        workload(tmp_path, {"from": str(HF / "qwen3-0.6b.json"), "seq_len": 4096})
    ).workload.model
    assert m.head_dim == 128 and m.hidden // m.heads == 64 and m.tied_embeddings


def test_gpt_neox_is_a_plain_gelu_mlp(tmp_path):
    m = load_workload(workload(tmp_path, {"from": str(HF / "gpt-neox-20b.json")})).workload.model
    assert m.activation == "gelu" and m.norm_kind == "layernorm" and m.seq_len == 2048


def test_moe_configs_map_to_model_moe(tmp_path):
    """Mixtral (Jiang et al. 2024: 8 experts, top 2), Qwen3-30B-A3B (128 experts, top 8,
    768 wide) and DeepSeek-V3 (arXiv:2412.19437: 256 routed + 1 shared expert, top 8, first 3
    layers dense, MLA, sigmoid routing over 8 groups, 4 used) read from their configs."""
    mix = load_workload(
        workload(tmp_path, {"from": str(HF / "mixtral-8x7b.json"), "seq_len": 4096})
    ).workload.model
    assert (mix.moe.experts, mix.moe.top_k, mix.moe.ffn_hidden) == (8, 2, 14336)
    qwen = load_workload(
        workload(tmp_path, {"from": str(HF / "qwen3-30b-a3b.json"), "seq_len": 4096})
    ).workload.model
    assert (qwen.moe.experts, qwen.moe.top_k, qwen.moe.ffn_hidden) == (128, 8, 768)
    assert qwen.head_dim == 128 and qwen.n_kv_heads == 4
    ds = load_workload(
        workload(tmp_path, {"from": str(HF / "deepseek-v3.json"), "seq_len": 4096})
    ).workload.model
    named = load_workload(workload(tmp_path, {"from": "deepseek-v3"})).workload.model
    assert ds.moe == named.moe and ds.mla == named.mla and ds.attention_kind == "mla"
    assert (ds.layers, ds.hidden, ds.ffn, ds.vocab) == (61, 7168, 18432, 129280)


@pytest.mark.parametrize(
    "model,field,words",
    [
        ({"from": str(HF / "bert.json")}, "model_type", "'bert' is not supported"),
        ({"from": str(HF / "qwen2-7b.json")}, "model.seq_len", "give model.seq_len"),
        ({"from": "llama-9000"}, "model.from", "unknown model 'llama-9000'"),
        ({"from": str(HF / "nope.json")}, "model.from", "does not exist"),
    ],
)
def test_bad_sources_are_one_line(tmp_path, capsys, model, field, words):
    path = workload(tmp_path, model)
    with pytest.raises(ConfigError) as e:
        load_workload(path)
    assert e.value.field == field and words in str(e.value)
    assert cli_main(["run", path, "--no-files"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and len(err.splitlines()) == 1 and words in err


def test_a_missing_or_unreadable_config_names_the_workload_or_the_config(tmp_path):
    # A path that does not exist is the workload's model.from to fix; a folder, a device or
    # a file that is not JSON names the config read.
    path = workload(tmp_path, {"from": "missing/config.json"})
    with pytest.raises(ConfigError) as e:
        load_workload(path)
    assert (e.value.file, e.value.field) == (str(path), "model.from"), str(e.value)
    (tmp_path / "adir").mkdir()
    (tmp_path / "text.json").write_text("not json\n")
    for src, words in [("adir/", "is a directory, expected a JSON file"),
                       ("/dev/zero", "not a regular file"),
                       ("text.json", "cannot read the config as JSON")]:
        with pytest.raises(ConfigError) as e:
            load_workload(workload(tmp_path, {"from": src}))
        assert words in str(e.value) and e.value.file.endswith(src.strip("/")), str(e.value)


def test_gpt_oss_and_llama4_configs_map_onto_the_shipped_workloads(tmp_path):
    """gpt-oss-120b's config.json (sliding windows of 128 on the even layers, 128 experts
    top 4) and Llama 4 Maverick's (text_config: MoE every 2nd layer, chunks of 8,192 with
    every 4th layer full) give the models the shipped workloads write out by hand."""
    for name, seq in (("gpt-oss-120b", 4096), ("llama4-maverick", 16384)):
        hf = load_workload(
            workload(tmp_path, {"from": str(HF / f"{name}.json"), "seq_len": seq})
        ).workload.model
        shipped = load_workload(ROOT / "workloads" / f"{name}.yaml").workload.model
        shipped = shipped.model_copy(update={"seq_len": seq})
        assert hf.layer_kinds == shipped.layer_kinds
        assert tf.total_params(hf) == tf.total_params(shipped)
        assert tf.model_flops_per_step(hf, 8) == tf.model_flops_per_step(shipped, 8)
    # at sequences no longer than a chunk, the chunked layers are full attention: the window
    # the config gives is dropped rather than refused
    short = load_workload(
        workload(tmp_path, {"from": str(HF / "llama4-maverick.json"), "seq_len": 4096})
    ).workload.model
    assert short.attention_window is None and short.moe_layers == 24


def test_mistral_sliding_window(tmp_path):
    """Mistral 7B v0.1's 4,096-token window on every layer (Jiang et al. 2023): kept at
    longer sequences, dropped where it covers the whole sequence (full causal attention)."""
    long = load_workload(
        workload(tmp_path, {"from": str(HF / "mistral-7b.json"), "seq_len": 8192})
    ).workload.model
    assert long.attention_window == 4096 and long.is_local_layer(0) and long.is_local_layer(31)
    short = load_workload(
        workload(tmp_path, {"from": str(HF / "mistral-7b.json"), "seq_len": 4096})
    ).workload.model
    assert short.attention_window is None
