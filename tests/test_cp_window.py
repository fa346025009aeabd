"""Local attention windows under context parallelism, as Transformer Engine runs them: a sliding
window with the K/V all-gather (each query chunk against the keys its window reaches), the
p2p ring and chunked windows refused. Closed forms: the query-key pairs of each load-balanced
chunk against a count, the busiest rank, the kernels' FLOPs and keys, the gathered bytes."""

from __future__ import annotations

import copy

import pytest

from simulator.config.schema import ModelConfig
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel, _attention_time
from simulator.model import context as cx
from simulator.model import transformer as tf
from tests.conftest import run_summary, small_topology
from tests.test_bad_input import BASE_WORK, expect, fails, write

DENSE = {
    "layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 8,
    "vocab": 32000, "seq_len": 4096, "activation": "swiglu",
}  # fmt: skip


def _model(**kw) -> ModelConfig:
    return ModelConfig.model_validate({**DENSE, **kw})


def _count(positions, w: int | None) -> int:
    """Query-key pairs counted one query at a time: query p sees keys max(0, p-w+1)..p."""
    return sum(p + 1 if w is None else min(p + 1, w) for p in positions)


@pytest.mark.parametrize("s,cp,w", [(4096, 2, 128), (4096, 4, 1024), (8192, 4, 1500),
                                    (4096, 2, 4096), (1024, 8, 200)])  # fmt: skip
def test_chunk_pairs_against_a_count(s, cp, w):
    """Each of the 2cp chunks of c tokens: its pairs against a count (within the half a
    diagonal, w/2 a query in the window's first c, as window_pairs2 rounds), and the chunks add
    up to window_pairs2's whole sequence exactly."""
    c = s // (2 * cp)
    for q in range(2 * cp):
        count = _count(range(q * c, (q + 1) * c), w)
        assert abs(count - cx.chunk_pairs(q, c, w)) <= max(c, w) / 2
    assert sum(cx.chunk_pairs(q, c, w) for q in range(2 * cp)) == tf.window_pairs2(
        s, w, "sliding") / 2  # fmt: skip


def test_a_window_unbalances_the_load_balanced_split():
    """Causal: every rank computes (2i+1) c^2/2 + (4cp-2i-1) c^2/2 = 2 cp c^2, rank 0 priced. A
    window w <= c: every query past the first w sees w keys, so each rank computes 2 c w pairs
    but rank 0, whose first chunk holds the sequence's start (c w - w^2/2 + c w); the busiest
    is rank 1. A window of 3 chunks: chunk q < 3 computes (2q+1) c^2/2 (causal), chunk 3
    (12 - 9/2 - 9/2) c^2 = 3 c^2 = c w, every later one c w: rank 3 (chunks 3 and 4) is the
    busiest, rank 0 (c^2/2 + 3 c^2) the lightest."""
    s, cp = 16384, 4
    c = s // (2 * cp)
    assert {cx.rank_pairs(r, cp, c, None) for r in range(cp)} == {(2 * cp) * c * c}
    assert cx.window_rank(cp, c, None) == 0
    w = 512
    assert cx.rank_pairs(0, cp, c, w) == 2 * c * w - w * w / 2
    assert all(cx.rank_pairs(r, cp, c, w) == 2 * c * w for r in range(1, cp))
    assert cx.window_rank(cp, c, w) == 1
    # a window wider than a chunk: rank 0's first chunk is causal, its second fully windowed
    w = 3 * c
    assert [cx.rank_pairs(r, cp, c, w) / (c * c) for r in range(cp)] == [3.5, 4.5, 5.5, 6.0]
    assert cx.window_rank(cp, c, w) == 3


def test_all_gather_ops_of_a_sliding_window():
    """The busiest rank's two chunk kernels: c queries against min((q+1) c, c + w - 1) keys
    (TE's kv range for window_size (w-1, 0)), 4 b h_q hd FLOPs a pair (2.5x backward), the
    window on the op; K/V gathered (again in backward) and dK/dV reduce-scattered whole, as
    without a window."""
    s, cp, w, b, tp = 16384, 4, 512, 2, 2
    c = s // (2 * cp)
    m = _model(seq_len=s, attention_window=w)
    hq, hd = 16 // tp, 64
    full = cx.attention_ops(_model(seq_len=s), b, tp, cp, "all_gather", False)
    for bwd, f in ((False, 1.0), (True, 2.5)):
        ops = cx.attention_ops(m, b, tp, cp, "all_gather", bwd)
        attn = [op for op in ops if op.kind == "attention"]
        assert [op.name for op in attn] == ["attn_c1", "attn_c6"]  # rank 1: chunks 1 and 6
        for op in attn:
            assert (op.seq, op.kv_seq, op.window) == (c, c + w - 1, w)
            assert op.flops == f * 4.0 * b * hq * hd * c * w
        comm = [(op.name, op.collective, op.bytes) for op in ops if op.kind == "comm"]
        kv = 2 * b * s * (8 // tp) * hd * 2  # the whole sequence's K and V, bf16
        gather = ("cp_all_gather", "all_gather", kv)  # backward: K/V gathered again (TE)
        assert comm == ([gather, ("cp_reduce_scatter", "reduce_scatter", kv)] if bwd
                        else [gather])  # fmt: skip
    assert [op.bytes for op in full if op.kind == "comm"] == [kv]


def test_window_kernel_keys_per_row_tile():
    """A chunk of s queries after kv - s earlier keys, under a window of w: row tile i sees
    min(kv - s + (i+1) block, w + block) keys, the cost per key seen a causal kernel's."""
    cm = ComputeModel(load_gpu("H100-SXM-80GB"))
    pp = cm._attn_p.fwd
    blk, s, w = pp.block, 2048, 600
    kv = s + w - 1

    def keys_cost(keys, longest):  # _attention_time's own terms for a given key count
        unit = 4.0 * blk * (64 + pp.head_dim_overhead)
        rate = cm.gpu.peak_flops("bf16") / cm.gpu.sm_count * pp.eta * (
            128.0 + pp.head_dim_overhead) / 128.0  # fmt: skip
        n = -(-s // blk)
        total = 8 * (keys + n * pp.block_overhead)
        return pp.t0_s + (total / cm.gpu.sm_count + pp.tail * (longest + pp.block_overhead)
                          ) * unit / rate  # fmt: skip

    n = -(-s // blk)
    keys = sum(min(kv - s + (i + 1) * blk, w + blk) for i in range(n))
    got = _attention_time(pp, cm.gpu.sm_count, cm.gpu.peak_flops("bf16"), 8, s, 64, True, 1.0,
                          kv, w)  # fmt: skip
    assert got == pytest.approx(keys_cost(keys, min(kv, w + blk)), rel=1e-12)
    # the window saves the tiles beyond it, and a window over every key changes nothing
    assert got < _attention_time(pp, cm.gpu.sm_count, cm.gpu.peak_flops("bf16"), 8, s, 64,
                                 True, 1.0, s + 4096)  # fmt: skip
    assert cm.attention_s(1, 8, s, 64, kv_seq=kv, window=kv) == cm.attention_s(1, 8, s, 64,
                                                                               kv_seq=kv)


WORK = {
    "name": "cp-window",
    "model": {**DENSE, "attention_window": 512, "attention_window_pattern": 2},
    "training": {"global_batch": 8, "micro_batch": 1},
    "parallelism": {"tp": 2, "cp": 2, "pp": 1, "zero": 1, "cp_comm": "all_gather",
                    "sequence_parallel": True},
}  # fmt: skip


def _run(tmp_path, capsys, work) -> dict:
    return run_summary(tmp_path, capsys, work, small_topology(1, 8))


def test_engine_runs_sliding_windows_under_cp(tmp_path, capsys):
    """A window of the whole sequence is the causal all-gather, step for step; a sliding window
    on every other layer is faster; no local layer (pattern of zeros) is today's model."""
    full = _run(tmp_path, capsys, {**WORK, "model": DENSE})
    w = copy.deepcopy(WORK)
    w["model"]["attention_window"] = DENSE["seq_len"]
    assert _run(tmp_path, capsys, w)["step_time_s"] == full["step_time_s"]
    win = _run(tmp_path, capsys, WORK)
    assert win["step_time_s"] < full["step_time_s"]
    w["model"].update({"attention_window": 512, "attention_window_pattern": [0, 0, 0, 0]})
    w["parallelism"]["cp_comm"] = "p2p"  # no local layer: the ring runs as today
    assert _run(tmp_path, capsys, w) == _run(
        tmp_path, capsys, {**w, "model": DENSE})  # fmt: skip


@pytest.mark.parametrize(
    "model,par,field,words",
    [
        ({"attention_window": 128}, {"cp": 2, "dp": 1}, "parallelism.cp_comm",
         ["p2p", "refuses sliding windows", "all_gather"]),
        ({"attention_window": 128, "attention_window_kind": "chunked"},
         {"cp": 2, "dp": 1, "cp_comm": "all_gather"}, "model.attention_window_kind",
         ["no chunked mask", "all_gather or a2a"]),
        ({"attention_window": 1024, "attention_window_kind": "chunked",
          "attention_window_pattern": 2},
         {"cp": 2, "dp": 1, "cp_comm": "all_gather"}, "model.attention_window_kind",
         ["no chunked mask", "whole sequence is full causal attention"]),  # Llama 4's files
        ({"attention_window": 1024}, {"cp": 2, "dp": 1}, "parallelism.cp_comm",
         ["refuses sliding windows", "whole sequence is full causal attention"]),
    ],
)  # fmt: skip
def test_windows_that_transformer_engine_refuses_under_cp(tmp_path, capsys, model, par, field,
                                                         words):
    w = copy.deepcopy(BASE_WORK)
    w["model"].update(model)
    w["parallelism"].update(par)
    p = write(tmp_path, w)
    expect(fails(capsys, tmp_path, "run", str(p)), p, field, *words)
