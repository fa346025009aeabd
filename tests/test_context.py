"""Context parallelism: closed forms of the load-balanced split, ring-attention traffic and
memory, and the engine reducing gradients over cp x dp."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.config.schema import ModelConfig
from simulator.engine.program import Part, program_time
from simulator.errors import ConfigError
from simulator.model import comm as mc
from simulator.model import context
from simulator.model import memory as mem
from simulator.run import simulate
from tests.conftest import write_case

# Llama-3-8B shapes (32 heads, 8 KV heads, head_dim 128) at 32K tokens.
M = ModelConfig(layers=4, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=128256,
                seq_len=32768, activation="swiglu")  # fmt: skip


@pytest.mark.parametrize("cp", [1, 2, 4, 8, 16])
def test_load_balanced_causal_work_is_one_cp_th(cp):
    """Chunks i and 2cp-1-i: (i + 1/2) + (2cp-1-i + 1/2) = 2cp chunk blocks on every rank, and
    the causal total over 2cp chunks is (2cp)^2/2, so each rank does 1/cp of it."""
    total = (2 * cp) ** 2 / 2
    for r in range(cp):
        assert context.causal_units(r, cp) == 2 * cp == total / cp
    assert sorted(c for r in range(cp) for c in context.chunks_of(r, cp)) == list(range(2 * cp))


@pytest.mark.parametrize("mode", ["p2p", "all_gather"])
@pytest.mark.parametrize("cp,tp", [(2, 1), (4, 2), (8, 8)])
def test_attention_flops_per_rank_are_the_causal_total_over_cp(mode, cp, tp):
    """Causal flash attention forward is 2 b hq s^2 hd FLOPs (half of QK^T and PV); backward
    2.5x. A CP rank's blocks add up to 1/cp of it."""
    b = 1
    hq, hd, s = M.heads // tp, M.head_dim, M.seq_len
    for bwd, factor in ((False, 1.0), (True, 2.5)):
        ops = context.attention_ops(M, b, tp, cp, mode, bwd)
        flops = sum(op.flops for op in ops if op.kind == "attention")
        assert flops == pytest.approx(factor * 2 * b * hq * s * s * hd / cp, rel=1e-12)


@pytest.mark.parametrize("cp,tp", [(2, 1), (4, 2), (16, 8)])
def test_ring_attention_bytes_per_step_and_direction(cp, tp):
    """Each ring step sends the rank's current K/V block, 2 b (s/cp) (kv_heads/tp) hd * 2
    bytes, to one neighbour only: cp-1 hops forward; backward cp-1 K/V hops and cp-1 dK/dV
    hops one step behind them, every hop beside a kernel (Transformer Engine's backward ends
    on the rank's own block, so the last dK/dV hop delivers to the owner beside it)."""
    kv_local = max(1, M.n_kv_heads // tp)
    kv = 2 * 1 * (M.seq_len // cp) * kv_local * M.head_dim * 2
    assert context.kv_block_bytes(M, 1, tp, cp) == kv
    fwd = [op for op in context.attention_ops(M, 1, tp, cp, "p2p", False) if op.kind == "comm"]
    assert [op.bytes for op in fwd] == [kv] * (cp - 1)
    assert all(op.collective == "send_recv" and op.dim == "cp" and op.overlap for op in fwd)
    bwd = [op for op in context.attention_ops(M, 1, tp, cp, "p2p", True) if op.kind == "comm"]
    # first step K/V only, middle steps K/V + dK/dV in one buffer, last step dK/dV only
    assert [op.bytes for op in bwd] == [kv] + [2 * kv] * (cp - 2) + [kv] if cp > 1 else []
    assert all(op.overlap for op in bwd)
    assert context.ring_bytes(M, 1, tp, cp) == ((cp - 1) * kv, 2 * (cp - 1) * kv)
    # all-gather: the full K/V of the sequence, gathered forward and reduce-scattered backward
    ag = [op for op in context.attention_ops(M, 1, tp, cp, "all_gather", False) if op.kind == "comm"]
    assert [(op.collective, op.bytes) for op in ag] == [("all_gather", cp * kv)]


def test_ring_merges_partial_results_after_every_step_but_the_first():
    """cp-1 merges per pass; forward reads and writes the output 3x (d bytes) and the
    log-sum-exp 3x (fp32); backward accumulates dQ of the block's 2c queries and dK/dV of its
    c keys."""
    cp, tp, c = 4, 2, M.seq_len // 8
    hq, hkv, hd = M.heads // tp, M.n_kv_heads // tp, M.head_dim
    for bwd, expect in ((False, 3 * 2 * 2 * c * hq * hd + 3 * 4 * 2 * c * hq),
                        (True, 3 * 2 * hd * (2 * c * hq + 2 * c * hkv))):
        merges = [o for o in context.attention_ops(M, 1, tp, cp, "p2p", bwd) if o.name == "attn_merge"]
        assert len(merges) == cp - 1 and all(o.bytes == expect for o in merges)


@pytest.mark.parametrize("t_kv", [1.0, 2.5])
@pytest.mark.parametrize("bwd", [False, True])
@pytest.mark.parametrize("cp", [2, 4, 8])
def test_ring_attention_time_is_max_of_kernel_and_hop_per_step(cp, bwd, t_kv):
    """Priced as the engine runs it (:func:`program_time`), a ring pass takes, per step with
    a hop, max(kernel slowed while the hop runs, hop), plus the merges, and no hop after the
    last kernel:
    the diagonal block is first forward and last backward (Transformer Engine's order)."""
    ops = context.attention_ops(M, 1, 2, cp, "p2p", bwd)
    k_diag, k_blk, merge, i = 3.0, 2.0, 0.25, 0.25  # seconds, and interference
    dur = {"attn_blk0": k_diag, "attn_blk": k_blk, "attn_merge": merge}
    kv = context.kv_block_bytes(M, 1, 2, cp)
    prog = tuple(Part(o.name, "comm", t_kv * o.bytes / kv, op=o.collective, nbytes=o.bytes,
                      overlap_next=o.overlap, dim="cp") if o.kind == "comm"
                 else Part(o.name, "compute", dur[o.name]) for o in ops)  # fmt: skip
    total, _, exposed = program_time(prog, interference=i)
    hop = (lambda j: t_kv * (2 if 0 < j < cp - 1 else 1)) if bwd else (lambda j: t_kv)
    diag_at = cp - 1 if bwd else 0
    # a kernel k runs (1 + i) slower while a hop h runs beside it, k + min(h, k (1 + i)) i/(1 + i)
    # (the forward's last kernel has no hop); the step lasts the longer of kernel and hop
    beside = (lambda j: True) if bwd else (lambda j: j < cp - 1)
    kern = lambda j: k_diag if j == diag_at else k_blk  # noqa: E731
    slowed = lambda j: kern(j) + min(hop(j), kern(j) * (1 + i)) * i / (1 + i)  # noqa: E731
    expect = sum(max(slowed(j), hop(j)) if beside(j) else kern(j) for j in range(cp))
    expect += (cp - 1) * merge
    assert total == pytest.approx(expect, rel=1e-12)
    # what is exposed is the hops' excess over their kernels
    excess = sum(max(0.0, hop(j) - slowed(j)) for j in range(cp) if beside(j))
    assert dict(exposed).get("cp", 0.0) == pytest.approx(excess, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_activation_memory_divided_by_cp(cp):
    """With flash attention every saved tensor is linear in the tokens a rank holds."""
    kw = dict(micro_batch=1, tp=2, sequence_parallel=True)
    one = mem.activation_bytes_per_layer(M, recompute="none", **kw)
    part = mem.activation_bytes_per_layer(mc.cp_local(M, cp), recompute="none", **kw)
    assert part == pytest.approx(one / cp, rel=1e-12)


def _case(tmp_path, par, train=None, model=None, nodes=1):
    topo = {"name": "t", "gpu": "H100-SXM-80GB", "nodes": nodes, "gpus_per_node": 8,
            "nics_per_node": 8}  # fmt: skip
    small = {"layers": 2, "hidden": 1024, "ffn_hidden": 2816, "heads": 16, "kv_heads": 4,
             "vocab": 32000, "seq_len": 8192, "activation": "swiglu", **(model or {})}  # fmt: skip
    work = {"name": "cp", "model": small,
            "training": {"global_batch": 8, "micro_batch": 1, **(train or {})},
            "parallelism": par}  # fmt: skip
    return load_workload(write_case(tmp_path, work, topo))


def test_engine_memory_divided_by_cp_and_gradients_reduced_over_cp(tmp_path):
    base = simulate(_case(tmp_path, {"tp": 1, "cp": 1, "dp": 8})).summary
    cp2 = simulate(_case(tmp_path, {"tp": 1, "cp": 2, "dp": 4})).summary
    assert cp2["memory_gib"]["activations"] == pytest.approx(
        base["memory_gib"]["activations"] / 2, rel=1e-9
    )
    assert cp2["breakdown_s"]["cp_comm"] >= 0.0
    # cp 8, dp 1: no data parallelism, yet the gradients are reduced over the 8 CP ranks
    cp8 = simulate(_case(tmp_path, {"tp": 1, "cp": 8, "dp": 1})).summary
    assert cp8["layout"]["cp"] == 8 and cp8["layout"]["dp"] == 1
    ev = simulate(_case(tmp_path, {"tp": 1, "cp": 8, "dp": 1}), detail="full")
    reduce = ev.events[ev.events.kind == "dp_comm"]
    assert len(reduce) > 0
    # ZeRO-1 shards the optimizer state over cp x dp ranks
    z = simulate(_case(tmp_path, {"tp": 1, "cp": 8, "dp": 1, "zero": 1})).summary
    assert z["memory_gib"]["optimizer"] == pytest.approx(cp8["memory_gib"]["optimizer"] / 8)


def test_breakdown_adds_up_with_cp(tmp_path):
    for mode in ("p2p", "all_gather"):
        res = simulate(_case(tmp_path, {"tp": 2, "cp": 4, "dp": 1, "cp_comm": mode,
                                        "sequence_parallel": True}))  # fmt: skip
        s = res.summary
        assert sum(s["breakdown_s"].values()) == pytest.approx(s["step_time_s"], rel=1e-12)
        assert (res.events.kind == "cp_comm").any()
        # the all-gather of K and V runs before attention and shows; ring attention's sends run
        # beside the previous chunk's attention and may hide entirely (they do here)
        if mode == "all_gather":
            assert s["breakdown_s"]["cp_comm"] > 0.0


@pytest.mark.parametrize(
    "par,train,field",
    [
        ({"tp": 1, "cp": 3, "dp": 1}, {}, "parallelism.cp"),  # 8 GPUs: 3 does not divide
        ({"tp": 1, "cp": 8, "dp": 1}, {"kernels": "eager"}, "parallelism.cp"),
        ({"tp": 1, "cp": 8, "dp": 1}, {"flash_attention": False}, "parallelism.cp"),
    ],
)
def test_bad_cp_is_one_line_config_error(tmp_path, par, train, field):
    with pytest.raises(ConfigError) as e:
        simulate(_case(tmp_path, par, train))
    assert e.value.field in (field, "parallelism.tp", "parallelism.dp")


def test_seq_len_must_split_into_2cp_chunks(tmp_path):
    with pytest.raises(ConfigError) as e:
        simulate(_case(tmp_path, {"tp": 1, "cp": 8, "dp": 1}, model={"seq_len": 8200}))
    assert e.value.field == "parallelism.cp" and "2*cp" in str(e.value)
