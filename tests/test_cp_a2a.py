"""All-to-all (Ulysses) context parallelism, ``parallelism.cp_comm: a2a``, as Transformer
Engine's ``AttnFuncWithCPAndQKVOA2A`` runs it. Closed forms: the bytes of each all-to-all (Q,
K, V, O forward; dO, dQ, dK, dV backward), the kernel's FLOPs (the non-CP kernel's over cp:
full sequence, heads/cp), the heads that must divide by cp, cp=1 unchanged."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from simulator.config.load import load_workload
from simulator.config.schema import ModelConfig
from simulator.errors import ConfigError
from simulator.model import context as cx
from simulator.plan import Candidate, enumerate_layouts, knob_variants, plan
from simulator.run import simulate
from tests.conftest import run_summary, small_topology, write_case
from tests.test_bad_input import BASE_WORK, expect, fails, write

# Llama-3-8B shapes (32 heads, 8 KV heads, head_dim 128) at 32K tokens.
M = ModelConfig(layers=4, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=128256,
                seq_len=32768, activation="swiglu")  # fmt: skip


@pytest.mark.parametrize("cp,tp,b", [(2, 1, 1), (4, 2, 2), (8, 1, 1), (4, 1, 3)])
def test_a2a_bytes_per_rank_and_layer(cp, tp, b):
    """Each all-to-all's buffer is the rank's s/cp tokens of its heads: b (s/cp) (32/tp) 128 x 2
    bytes for Q, O, dO, dQ; b (s/cp) (8/tp) 128 x 2 for K, V, dK, dV; a rank sends (cp-1)/cp
    of it. Forward Q, K, V then the kernel then O; backward dO, the kernel, dQ, dK, dV; none
    overlapped, all over the CP group."""
    s = 32768
    q = b * (s // cp) * (32 // tp) * 128 * 2
    kv = b * (s // cp) * (8 // tp) * 128 * 2
    assert cx.a2a_bytes(M, b, tp, cp) == (q, kv)
    fwd = cx.attention_ops(M, b, tp, cp, "a2a", False)
    assert [op.name for op in fwd] == ["cp_a2a_q", "cp_a2a_k", "cp_a2a_v", "attn", "cp_a2a_o",
                                       "cp_a2a_copy"]  # fmt: skip
    bwd = cx.attention_ops(M, b, tp, cp, "a2a", True)
    assert [op.name for op in bwd] == ["cp_a2a_do", "attn", "cp_a2a_dq", "cp_a2a_dk",
                                       "cp_a2a_dv", "cp_a2a_copy"]  # fmt: skip
    for ops in (fwd, bwd):
        comm = [op for op in ops if op.kind == "comm"]
        assert all(op.collective == "all_to_all" and op.dim == "cp" and not op.overlap
                   for op in comm)  # fmt: skip
        assert sorted(op.bytes for op in comm) == sorted([q, kv, kv, q])
        # on the wire from one rank: (cp-1)/cp of Q, K, V, O (forward) / dO, dQ, dK, dV
        wire = sum(op.bytes for op in comm) * (cp - 1) / cp
        assert wire == (2 * q + 2 * kv) * (cp - 1) / cp
        # the layout copies: two of each tensor, read and written
        copy_op = ops[-1]
        assert copy_op.kind == "memory" and copy_op.bytes == 4 * (2 * q + 2 * kv)


@pytest.mark.parametrize("cp,tp", [(2, 1), (4, 2), (8, 1), (2, 4)])
@pytest.mark.parametrize("window", [None, 1000])
def test_a2a_kernel_is_the_full_sequence_on_heads_over_cp(cp, tp, window):
    """The kernel runs the whole sequence with (32/tp)/cp query and (8/tp)/cp key/value heads:
    causal 2 b hq s^2 hd / cp FLOPs, a sliding window of w 2 b hq (2 s w - w^2) hd / cp,
    backward 2.5x; every rank alike, so a window keeps the work balanced."""
    m = M if window is None else M.model_copy(update={"attention_window": window})
    b, s, hd, hq = 1, 32768, 128, 32 // tp
    pairs2 = s * s if window is None else 2 * s * window - window * window
    for bwd, f in ((False, 1.0), (True, 2.5)):
        (attn,) = [op for op in cx.attention_ops(m, b, tp, cp, "a2a", bwd)
                   if op.kind == "attention"]  # fmt: skip
        assert attn.flops == f * 2 * b * hq * pairs2 * hd / cp
        assert (attn.seq, attn.heads, attn.kv_heads) == (s, hq // cp, (8 // tp) // cp)
        assert attn.window == (window or 0) and attn.causal


@pytest.mark.parametrize("heads,kv,tp,cp", [(32, 8, 1, 16), (32, 8, 4, 4), (32, 2, 1, 4),
                                            (32, 4, 8, 2), (24, 8, 2, 8)])  # fmt: skip
def test_heads_that_do_not_divide_by_cp_are_refused(heads, kv, tp, cp):
    """TE asserts num_heads % cp_size == 0 for Q and for K/V (per TP rank; KV heads
    replicated when tp is a multiple of them, so 4 KV heads at tp 8 are 1 a rank)."""
    m = M.model_copy(update={"heads": heads, "kv_heads": kv, "hidden": heads * 128})
    with pytest.raises(ConfigError) as e:
        cx.attention_ops(m, 1, tp, cp, "a2a", False)
    assert e.value.field == "parallelism.cp_comm" and "divide by cp" in str(e.value)


@pytest.mark.parametrize(
    "model,par,field,words",
    [
        ({"kv_heads": 2}, {"tp": 1, "cp": 4, "dp": 2, "pp": 1, "cp_comm": "a2a"},
         "parallelism.cp_comm", ["a2a", "cp=4", "key/value 2", "divide by cp"]),
        ({"attention_window": 128, "attention_window_kind": "chunked"},
         {"cp": 2, "dp": 1, "cp_comm": "a2a"}, "model.attention_window_kind",
         ["no chunked mask"]),
    ],
)  # fmt: skip
def test_a2a_refusals_are_one_line(tmp_path, capsys, model, par, field, words):
    w = copy.deepcopy(BASE_WORK)
    w["model"].update(model)
    w["parallelism"].update(par)
    p = write(tmp_path, w)
    expect(fails(capsys, tmp_path, "run", str(p)), p, field, *words)


DENSE = {
    "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 8,
    "vocab": 32000, "seq_len": 8192, "activation": "swiglu",
}  # fmt: skip
WORK = {
    "name": "cp-a2a",
    "model": DENSE,
    "training": {"global_batch": 8, "micro_batch": 1},
    "parallelism": {"tp": 2, "cp": 2, "pp": 1, "zero": 1, "cp_comm": "a2a",
                    "sequence_parallel": True},
}  # fmt: skip


def _run(tmp_path, capsys, work) -> dict:
    return run_summary(tmp_path, capsys, work, small_topology(1, 8))


def test_cp1_is_unchanged_by_a2a(tmp_path, capsys):
    """cp_comm is read only where cp > 1: at cp 1 a2a is p2p byte for byte."""
    w = copy.deepcopy(WORK)
    w["parallelism"]["cp"] = 1
    a2a = _run(tmp_path, capsys, w)
    w["parallelism"]["cp_comm"] = "p2p"
    assert a2a == _run(tmp_path, capsys, w)


def test_engine_runs_a2a_and_prices_it_as_cp_comm(tmp_path):
    """The all-to-alls show as cp_comm (none is overlapped), the breakdown adds up, the saved
    activations are the other modes' (TE saves the post-all-to-all Q, K, V, O: same bytes),
    and a sliding window on every layer is faster."""
    topo = small_topology(1, 8)
    res = simulate(load_workload(write_case(tmp_path, WORK, topo)), detail="full")
    s = res.summary
    assert s["breakdown_s"]["cp_comm"] > 0.0
    assert sum(s["breakdown_s"].values()) == pytest.approx(s["step_time_s"], rel=1e-12)
    assert (res.events.kind == "cp_comm").any()
    w = copy.deepcopy(WORK)
    w["parallelism"]["cp_comm"] = "all_gather"
    ag = simulate(load_workload(write_case(tmp_path, w, topo))).summary
    assert s["memory_gib"]["activations"] == ag["memory_gib"]["activations"]
    w = copy.deepcopy(WORK)
    w["model"] = {**DENSE, "attention_window": 1024}
    win = simulate(load_workload(write_case(tmp_path, w, topo))).summary
    assert win["step_time_s"] < s["step_time_s"]


def test_plan_tries_each_cp_comm_transformer_engine_runs(tmp_path):
    """plan's knob variants of a cp > 1 layout: each other cp_comm, a2a only where the KV heads
    per TP rank divide by cp (2 KV heads: cp 2 at tp 1), p2p not with a sliding window; no
    variant at cp 1. Every simulated layout's effective mode is one that runs."""
    w = copy.deepcopy(WORK)
    w["model"] = {**DENSE, "layers": 2, "kv_heads": 2}
    w["parallelism"] = {"tp": 1, "cp": 1, "cp_comm": "p2p"}
    work = load_workload(write_case(tmp_path, w, small_topology(1, 8))).workload
    base = Candidate(1, 1, 4, 1, 1, "none", "1f1b", 1, False, cp=2)
    modes = lambda c: sorted(v.cp_comm for v in knob_variants(c, work) if v.cp_comm)  # noqa: E731
    assert modes(base) == ["a2a", "all_gather"]
    assert modes(replace(base, cp=4, dp=2)) == ["all_gather"]
    assert modes(replace(base, tp=2, dp=2)) == ["all_gather"]  # 1 KV head a TP rank
    assert modes(replace(base, cp=1, dp=8)) == []
    win = work.model_copy(update={
        "model": work.model.model_copy(update={"attention_window": 1024}),
        "parallelism": work.parallelism.model_copy(update={"cp_comm": "all_gather"})})
    assert sorted(v.cp_comm for v in knob_variants(base, win) if v.cp_comm) == ["a2a"]
    assert replace(base, cp_comm="a2a").apply(work).parallelism.cp_comm == "a2a"
    assert replace(base, cp_comm="a2a").overrides()["parallelism.cp_comm"] == "a2a"
    res = plan(load_workload(write_case(tmp_path, w, small_topology(1, 8))), 8, top=1000,
               workers=1)  # fmt: skip
    for p in res.top:
        c = p.candidate
        if c.cp_comm == "a2a":
            assert (c.tp, c.cp) == (1, 2)
        assert p.summary["layout"]["cp"] == c.cp


def test_selective_recompute_reruns_the_all_to_alls(tmp_path):
    """Megatron-Core's checkpointed core attention runs Transformer Engine's attention again,
    its four forward all-to-alls and layout copies included: they come back as re_ parts of
    the same collective on the CP group."""
    w = copy.deepcopy(WORK)
    w["training"]["recompute"] = "selective"
    res = simulate(load_workload(write_case(tmp_path, w, small_topology(1, 8))), detail="full")
    ev = res.events
    for t in "qkvo":
        again, first = ev[ev.name == f"re_cp_a2a_{t}"], ev[ev.name == f"cp_a2a_{t}"]
        assert len(again) > 0 and set(again.dim) == {"cp"}
        assert set(again.bytes) == set(first.bytes)
    w["training"]["recompute"] = "none"
    plain = simulate(load_workload(write_case(tmp_path, w, small_topology(1, 8))),
                     detail="full").events  # fmt: skip
    assert not any(n.startswith("re_cp") for n in set(plain.name))


def test_plan_searches_cp_when_the_workloads_cp_comm_cannot_run(tmp_path):
    """A sliding-window model whose workload keeps the default p2p (TE refuses the window on
    the ring), or asks for a2a where the heads do not divide: plan still searches cp > 1, each
    layout with the first mode TE runs for it (not every cp > 1 layout dropped as refused),
    and tries the others as knobs."""
    w = copy.deepcopy(WORK)
    w["model"] = {**DENSE, "layers": 2, "kv_heads": 2, "attention_window": 1024}
    w["parallelism"] = {"tp": 1, "cp": 1}  # cp_comm: the default p2p
    loaded = load_workload(write_case(tmp_path, w, small_topology(1, 8)))
    work = loaded.workload
    cps = {c.cp: c.cp_comm for c in enumerate_layouts(work, 8, 8) if c.tp == 1}
    assert cps == {1: None, 2: "all_gather"}  # seq_len 8192: cp 4 leaves under 4096 tokens
    base = Candidate(1, 1, 4, 1, 1, "none", "1f1b", 1, False, cp=2, cp_comm="all_gather")
    assert [v.cp_comm for v in knob_variants(base, work) if v.cp_comm != "all_gather"] == ["a2a"]
    res = plan(loaded, 8, top=1000, workers=1)
    assert res.counts["invalid"] == 0
    assert {p.candidate.cp_comm for p in res.top if p.candidate.cp > 1} == {"all_gather", "a2a"}
    for p in res.top:
        assert p.summary["layout"]["cp"] == p.candidate.cp
    # a2a in the workload, 2 KV heads: cp 4 runs with p2p (the first mode TE runs there)
    w["model"].pop("attention_window")
    w["model"]["seq_len"] = 16384
    w["parallelism"]["cp_comm"] = "a2a"
    work = load_workload(write_case(tmp_path, w, small_topology(1, 8))).workload
    cps = {c.cp: c.cp_comm for c in enumerate_layouts(work, 8, 8) if c.tp == 1}
    assert cps[2] is None and cps[4] == "p2p"
