"""Eager MoE code as each measuring script writes it (``training.moe_regroup``): the index
work around the experts, the backward of the slices the experts' inputs are cut from, and the
per-parameter work of expert modules under autocast; checked against closed forms."""

from __future__ import annotations

import pytest

from simulator.config.schema import ModelConfig
from simulator.engine.host import HostRates
from simulator.model import moe, moe_layer
from simulator.model.moe import Comm
from simulator.model.ops import HOST_SYNC, Op

# steps_alt.py's h11_moe_ep4_M: GPT-2 blocks (GELU experts with biases), 16 experts top-4
GPT_MOE = ModelConfig(
    layers=8, hidden=1536, ffn_hidden=1024, heads=12, vocab=32768, seq_len=1024,
    activation="gelu", norm="layernorm", moe=dict(experts=16, top_k=4, ffn_hidden=1024),
)  # fmt: skip
# steps_third.py-like: Llama blocks, SwiGLU experts, no biases
LLAMA_MOE = ModelConfig(
    layers=8, hidden=2048, ffn_hidden=1024, heads=16, vocab=32000, seq_len=1024,
    moe=dict(experts=32, top_k=4, ffn_hidden=1024),
)  # fmt: skip


def _ops(model, ep, regroup, backward, b=8):
    loc = moe.moe_local(model, b, 1, 1, ep, 1)
    fn = moe.moe_backward_ops if backward else moe.moe_forward_ops
    ops = fn(model, loc, tp=1, ep=ep, etp=1, d=2, grouped=False, regroup=regroup)
    return loc, [o for o in ops if not isinstance(o, Comm)]


@pytest.mark.parametrize("regroup,ep", [("aranges", 4), ("argsort", 4), ("concat", 4),
                                        ("concat", 2), ("aranges", 1)])
def test_slice_backward_is_a_zero_gradient_and_an_add_per_slice(regroup, ep):
    # autograd's slice_backward writes a zero gradient of the whole received buffer (R x h) and
    # copies the slice's rows in; the engine adds every slice's gradient into the first one
    d, h = 2, GPT_MOE.hidden
    loc, bwd = _ops(GPT_MOE, ep, regroup, True)
    R, L = sum(loc.expert_tokens), loc.local_experts
    n = L * (ep if regroup == "concat" else 1)
    zero = [o for o in bwd if o.name.startswith("expert_slice_zero")]
    copy = [o for o in bwd if o.name.startswith("expert_slice_copy")]
    add = [o for o in bwd if o.name.startswith("expert_slice_add")]
    assert (len(zero), len(copy), len(add)) == (n, n, n - 1)
    assert sum(o.bytes for o in zero) == pytest.approx(n * R * h * d)
    assert sum(o.bytes for o in copy) == pytest.approx(2 * R * h * d)
    assert sum(o.bytes for o in add) == pytest.approx(3 * (n - 1) * R * h * d)
    # each expert's slices follow its own backward, before the next expert's
    names = [o.name for o in bwd]
    for i in range(L):
        assert names.index(f"expert_fc1_e{i}_wgrad") < names.index(f"expert_slice_zero_e{i}_0")
    assert moe.moe_backward_ops(GPT_MOE, loc, tp=1, ep=ep, etp=1, d=2)  # fused: none
    fused = moe.moe_backward_ops(GPT_MOE, loc, tp=1, ep=ep, etp=1, d=2, regroup=regroup)
    assert not any(not isinstance(o, Comm) and moe.engine_op(o.name) for o in fused)


def test_regroup_index_work_follows_each_script():
    ep = 4
    loc, ar = _ops(LLAMA_MOE, ep, "aranges", False)
    L = loc.local_experts
    names = [o.name for o in ar]
    # steps.py: an arange per (local expert, source) piece and their cat, the gather by the
    # index; the inverse index (arange, write) and its gather before the combine
    assert sum(n.startswith("perm_arange") for n in names) == L * ep
    assert {"perm_cat", "sort_chunks", "inv_arange", "inv_scatter", "unsort_chunks"} <= set(names)
    # steps_third.py: the expert ids and their argsort instead of the aranges
    _, srt = _ops(LLAMA_MOE, ep, "argsort", False)
    names = [o.name for o in srt]
    assert not any(n.startswith("perm_arange") for n in names) and "perm_cat" not in names
    assert {"perm_ids", "perm_sort", "sort_chunks", "unsort_chunks"} <= set(names)
    # steps_alt.py: one torch.cat per local expert of its rows from every source, no index
    loc, cat = _ops(GPT_MOE, ep, "concat", False)
    names = [o.name for o in cat]
    ins = [o for o in cat if o.name.startswith("expert_cat_in")]
    assert len(ins) == loc.local_experts
    assert sum(o.bytes for o in ins) == pytest.approx(2 * sum(round(m) for m in loc.expert_tokens)
                                                      * GPT_MOE.hidden * 2)
    assert not any(n.startswith(("perm_", "inv_", "sort_chunks", "unsort_chunks")) for n in names)
    # integer work and the input cats have no backward kernel
    _, back = _ops(GPT_MOE, ep, "concat", True)
    assert not any(o.name.startswith(("perm_", "expert_cat_in")) for o in back)


def _body(model, ep, regroup, backward, param_dtype="fp32"):
    return moe_layer.layer_ops(model, micro_batch=8, tp=1, sequence_parallel=False,
                               backward=backward, moe_layer=True, kernels="eager",
                               param_dtype=param_dtype, ep=ep, regroup=regroup)


def test_host_reads_of_an_eager_forward():
    # torch.bincount reads the ids' min and max (after the gather), .tolist() / .cpu() the
    # exchanged counts; argsort's repeat_interleave by the received counts reads their sum
    # after the dispatch
    fwd = _body(LLAMA_MOE, 4, "argsort", False, "bf16")
    names = [o.name for o in fwd]
    syncs = [o.name for o in fwd if o.kind == HOST_SYNC]
    assert syncs == ["moe_bincount_sync", "moe_counts_sync", "moe_regroup_sync"]
    assert names.index("permute") < names.index("moe_bincount_sync") < names.index("moe_counts")
    assert names.index("moe_counts") < names.index("moe_counts_sync") < names.index("moe_dispatch")
    assert names.index("moe_dispatch") < names.index("moe_regroup_sync") < names.index("perm_ids")
    for regroup in ("aranges", "concat"):
        assert sum(o.kind == HOST_SYNC for o in _body(LLAMA_MOE, 4, regroup, False, "bf16")) == 2
    # EP 1: no count exchange, one read (the counts' own, where bincount's is)
    assert sum(o.kind == HOST_SYNC for o in _body(LLAMA_MOE, 1, "argsort", False, "bf16")) == 1


@pytest.mark.parametrize("model,weights", [(GPT_MOE, 2), (LLAMA_MOE, 3)])
def test_each_expert_parameter_is_cast_and_accumulated_on_its_own(model, weights):
    # autocast over fp32 weights: each expert Linear casts its weight (and GPT's bias) before
    # its GEMM (6 B an element), autograd casts each gradient back (6 B) and adds it (12 B)
    ep = 4
    loc = moe.moe_local(model, 8, 1, 1, ep, 1)
    L, h, f = loc.local_experts, model.hidden, loc.ffn
    biases = model.activation == "gelu"
    w = L * weights * h * f
    bias = L * (f + h) if biases else 0
    fwd, bwd = _body(model, ep, "concat", False), _body(model, ep, "concat", True)
    casts = [o for o in fwd if o.name.startswith(("expert_wcast_", "expert_bcast_"))]
    assert len(casts) == L * weights * (2 if biases else 1)
    assert sum(o.bytes for o in casts) == 6 * (w + bias)
    assert sum(o.bytes for o in bwd if o.name.startswith(("expert_gcast_", "expert_bgcast_"))) \
        == 6 * (w + bias)
    assert sum(o.bytes for o in bwd if o.name.startswith(("expert_gacc_", "expert_bgacc_"))) \
        == 12 * (w + bias)
    assert sum(o.name.startswith("expert_bgrad_") for o in bwd) == (L * 2 if biases else 0)
    # bf16 parameters: no casts; the biases' gradients stay
    plain = _body(model, ep, "concat", True, "bf16")
    assert not any(o.name.startswith(("expert_gcast", "expert_gacc")) for o in plain)
    assert sum(o.name.startswith("expert_bgrad_") for o in plain) == (L * 2 if biases else 0)


def test_kernels_no_python_launches_pay_the_engine_rate():
    rates = HostRates(4e-5, 8e-5, 5e-5, 1e-4, engine_op_s=1.5e-5)
    for name in ("expert_slice_add_e0_1", "expert_wcast_fc1_e0", "expert_gacc_fc2_e3"):
        assert rates.part_s(Op(name, "memory", "moe")) == 1.5e-5
    assert rates.part_s(Op("expert_act_e0", "memory", "moe")) == 4e-5
    assert rates.part_s(Op("expert_cat_in_e0", "memory", "moe")) == 1e-4  # routing Python
    assert HostRates(4e-5, 8e-5, 5e-5).part_s(Op("expert_slice_add_e0_1", "memory", "moe")) \
        == 4e-5  # no engine rate: the model kernel's
    assert rates.scaled(2.0).engine_op_s == 3e-5


def test_split_backward_cats_each_experts_output_gradients():
    # steps_alt.py splits each expert's output per source rank (y.split): autograd's
    # split_with_sizes_backward cats the pieces' gradients, one copy of the expert's rows,
    # an engine kernel; the other scripts run each expert on one contiguous input (no split)
    d, h = 2, GPT_MOE.hidden
    loc, bwd = _ops(GPT_MOE, 4, "concat", True)
    cats = [o for o in bwd if o.name.startswith(moe.SPLIT_GRAD)]
    assert len(cats) == loc.local_experts
    assert [o.bytes for o in cats] == pytest.approx([2 * round(m) * h * d
                                                     for m in loc.expert_tokens])
    assert all(moe.engine_op(o.name) for o in cats)
    names = [o.name for o in bwd]
    for i in range(loc.local_experts):  # before the expert's own backward
        assert names.index(f"{moe.SPLIT_GRAD}e{i}") < names.index(f"expert_fc2_e{i}_dgrad")
    for regroup in ("aranges", "argsort"):
        _, other = _ops(GPT_MOE, 4, regroup, True)
        assert not any(o.name.startswith(moe.SPLIT_GRAD) for o in other)


def test_concat_section_kernels_match_the_profiled_count():
    # data/measured/expert-host-h100x4: steps_alt.py's expert loop, 4 sources x 4 local
    # experts, profiled on one H100 (CUDA kernels, memsets, memcpys); the section less four
    # times one expert alone on one input is what the loop adds around the experts: forward
    # the experts' input cats and the outputs' cat, backward the split cats and the slices'
    # zero gradients, copies and adds, which the op lists must count kernel for kernel
    import json
    from pathlib import Path

    rows = [json.loads(x) for x in (Path(__file__).parents[1] / "data/measured/"
            "expert-host-h100x4/expert_host.jsonl").read_text().splitlines()]
    sec = next(r for r in rows if r["kind"] == "section" and r["fwd_kernels"])
    one = next(r for r in rows if r["kind"] == "expert" and r["fwd_kernels"])
    L = sec["experts"]
    loc, fwd = _ops(GPT_MOE, sec["sources"], "concat", False)
    _, bwd = _ops(GPT_MOE, sec["sources"], "concat", True)
    assert loc.local_experts == L
    around_f = [o for o in fwd if o.name.startswith("expert_cat")]
    around_b = [o for o in bwd if o.name.startswith((moe.SPLIT_GRAD, moe.SLICE_GRAD))]
    assert len(around_f) == sec["fwd_kernels"] - L * one["fwd_kernels"]
    assert len(around_b) == sec["bwd_kernels"] - L * one["bwd_kernels"]
