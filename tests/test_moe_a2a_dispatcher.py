"""Megatron-Core's alltoall dispatcher's bookkeeping in fused programs, as its code runs it
(``token_dispatcher.py`` / ``moe_utils.py`` at Megatron-LM 1e057005, Transformer Engine
2.1-2.5's ``permutation.py``): the count kernels around the count all-gather, the split
sizes' copies to the host, TE's row map, the wait after the permutation, the routing
probabilities' all-to-all beside the tokens (``training.moe_probs_alltoall``, since
Megatron-LM 2659630721) and the un-sort's split sizes; none of it in eager code or other
dispatchers, none of the integer work backward."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.config.schema import ModelConfig, TrainingConfig
from simulator.engine.host import HostRates
from simulator.engine.program import Part
from simulator.model import moe
from simulator.model.moe_layer import layer_ops
from simulator.model.ops import HOST_SYNC

REPO = Path(__file__).resolve().parents[1]

MODEL = ModelConfig(
    layers=2, hidden=1024, ffn_hidden=4096, heads=16, kv_heads=8, vocab=32000, seq_len=2048,
    activation="swiglu", moe={"experts": 64, "top_k": 4, "ffn_hidden": 512},
)  # fmt: skip
E, K = 64, 4


def _model(**moe_kw) -> ModelConfig:
    return MODEL.model_copy(update={"moe": MODEL.moe.model_copy(update=moe_kw)})


def _fwd(model=MODEL, ep=4, etp=1, **kw):
    loc = moe.moe_local(model, 1, 2, 1, ep, etp)
    return loc, moe.moe_forward_ops(model, loc, tp=2, ep=ep, etp=etp, d=2, **kw)


def _layer(model=MODEL, backward=False, **kw):
    args = dict(micro_batch=1, tp=2, sequence_parallel=True, backward=backward, moe_layer=True,
                ep=4, etp=1)  # fmt: skip
    args.update(kw)
    return [op.name for op in layer_ops(model, **args)]


def _between(names, first, last):
    return names[names.index(first):names.index(last) + 1]


def test_dropless_forward_lists_the_dispatchers_calls_in_order():
    loc, ops = _fwd()
    names = [op.name for op in ops]
    # preprocess: routing_map.sum(dim=0), the input splits, the count all-gather over the
    # expert TP x EP group, the local slice made contiguous, its sums per rank, per TP rank,
    # per local expert; the four copies to the host; TE's two row-map kernels, the permutation;
    # the tokens' all-to-all, then their probabilities'
    assert _between(names, "a2a_counts_sum", "moe_dispatch_probs") == [
        "a2a_counts_sum", "a2a_counts_splits", "moe_counts", "a2a_counts_slice",
        "a2a_counts_rank", "a2a_counts_tp", "a2a_counts_local", "a2a_dtoh_tokens",
        "a2a_dtoh_input", "a2a_dtoh_output", "a2a_dtoh_output_tp", "te_row_map_1",
        "te_row_map_2", "permute", "moe_dispatch", "moe_dispatch_probs"]  # fmt: skip
    by = {op.name: op for op in ops}
    counts = by["moe_counts"]
    assert (counts.collective, counts.nbytes) == ("all_gather", 4 * E * 8)  # E int64 a rank
    t = loc.tokens
    assert by["moe_dispatch_probs"].collective == "all_to_all"
    assert by["moe_dispatch_probs"].nbytes == pytest.approx(t * K * 4)  # fp32, a copy each
    # 16 local experts: the received copies sorted by expert with their probabilities, and
    # back, the un-sort's sizes a transposed view made contiguous first
    rows = sum(loc.expert_tokens)  # the copies this rank's experts compute
    assert by["sort_chunks"].bytes == pytest.approx(2 * rows * (1024 * 2 + 4))
    assert names.index("unsort_sizes") + 1 == names.index("unsort_chunks")


def test_the_wait_follows_the_permutation_unless_tokens_are_dropped():
    names = _layer()
    i = names.index("moe_counts_sync")
    assert names[i - 1] == "permute" and names[i + 1] == "moe_dispatch"
    # capacity factor without padding: num_out_tokens (one more sum and copy) is needed
    # before the permutation (cuda_sync_point before_permutation_1)
    capped = _layer(_model(capacity_factor=1.0))
    i = capped.index("moe_counts_sync")
    assert capped[i - 1] == "a2a_dtoh_out_tokens" and capped[i + 1] == "te_row_map_1"
    assert capped.index("a2a_counts_sum") + 1 == capped.index("a2a_counts_out")
    assert sum(n == "moe_counts_sync" for n in capped) == 1


def test_probabilities_stay_home_in_older_code():
    _, new = _fwd()
    _, old = _fwd(probs_alltoall=False)
    assert [op.name for op in old] == [op.name for op in new if op.name != "moe_dispatch_probs"]
    for bwd in (False, True):
        assert "moe_dispatch_probs" not in _layer(backward=bwd, probs_alltoall=False)


def test_expert_tp_gathers_the_probabilities_too():
    loc, ops = _fwd(ep=2, etp=2)
    by = {op.name: op for op in ops}
    assert by["moe_counts"].nbytes == 2 * 2 * E * 8
    gather = by["moe_etp_gather_probs"]
    assert (gather.collective, gather.dim) == ("all_gather", "etp")
    assert gather.nbytes == pytest.approx(sum(loc.expert_tokens) * 4)
    bwd = moe.moe_backward_ops(MODEL, loc, tp=2, ep=2, etp=2, d=2)
    assert {op.name: op.collective for op in bwd if isinstance(op, moe.Comm)}[
        "moe_etp_gather_probs"] == "reduce_scatter"


def test_backward_runs_no_bookkeeping_and_returns_the_probabilities_gradient():
    loc = moe.moe_local(MODEL, 1, 2, 1, 4, 1)
    bwd = moe.moe_backward_ops(MODEL, loc, tp=2, ep=4, etp=1, d=2)
    names = [op.name for op in bwd]
    assert not [n for n in names if n.startswith((*moe.PLAIN_ATEN_PREFIXES, moe.ROW_MAP_PREFIX))]
    comms = [op for op in bwd if isinstance(op, moe.Comm)]
    assert [c.name for c in comms] == ["moe_combine", "moe_dispatch_probs", "moe_dispatch"]
    assert comms[1].nbytes == pytest.approx(loc.tokens * K * 4)
    assert not any(op.kind == HOST_SYNC for op in bwd if not isinstance(op, moe.Comm))


@pytest.mark.parametrize("kw", [dict(dispatcher="deepep"), dict(dispatcher="allgather"),
                                dict(grouped=False)])
def test_other_dispatchers_and_eager_code_are_untouched(kw):
    _, on = _fwd(**kw)
    _, off = _fwd(probs_alltoall=False, **kw)
    assert [op.name for op in on] == [op.name for op in off]
    assert not [op.name for op in on
                if op.name.startswith((*moe.PLAIN_ATEN_PREFIXES, moe.ROW_MAP_PREFIX))
                or op.name.endswith("_probs")]


def test_drop_and_pad_exchanges_no_counts_but_still_the_probabilities():
    names = [op.name for op in _fwd(_model(capacity_factor=1.0, pad_to_capacity=True))[1]]
    assert "moe_counts" not in names and "moe_dispatch_probs" in names
    assert not [n for n in names if n.startswith((*moe.PLAIN_ATEN_PREFIXES, moe.ROW_MAP_PREFIX))]


def test_pytorch_permutation_copies_the_local_counts_and_builds_no_row_map():
    names = [op.name for op in _fwd(permute_kind="unfused")[1]]
    assert "a2a_dtoh_global" in names
    assert not [n for n in names if n.startswith((moe.ROW_MAP_PREFIX, "unsort_sizes"))]


def test_without_expert_parallelism_only_the_local_counts_are_copied():
    names = [op.name for op in _fwd(ep=1)[1]]
    assert [n for n in names if n.startswith(moe.PLAIN_ATEN_PREFIXES)] == [
        "a2a_counts_sum", "a2a_dtoh_tokens"]
    assert "moe_counts" not in names and "moe_dispatch_probs" not in names


def test_plain_calls_take_the_measured_plain_aten_rate():
    rates = HostRates(op_s=80e-6, collective_s=90e-6, sync_s=50e-6, multihot_op_s=8e-6)
    for name in ("a2a_counts_sum", "a2a_dtoh_output_tp", "unsort_sizes"):
        assert rates.part_s(Part(name, "compute", 0.0, block="moe")) == 8e-6
    assert rates.part_s(Part("te_row_map_1", "compute", 0.0, block="moe")) == 80e-6
    assert rates.part_s(Part("moe_dispatch_probs", "comm", 0.0, block="moe")) == 90e-6


def test_key_defaults_to_current_code_and_suites_of_older_code_turn_it_off():
    assert TrainingConfig(global_batch=8).moe_probs_alltoall is True
    # the Parallel Folding paper (2025-04-20) and NeMo 25.02 / 25.04 (Megatron-Core 0.11 and
    # 0.12.0) ran code before Megatron-LM 2659630721; the ModelZoo's A2A row ran main 1e057005
    for name, want in (("parallel-folding", False), ("parallel-folding-scale", False),
                       ("nemo-mbridge-moe", False), ("qwen3-zoo-h100", True)):
        suite = yaml.safe_load((REPO / f"validation/moe/{name}.yaml").read_text())
        rows = [c for c in suite["cases"]
                if c["workload"]["training"].get("moe_dispatcher", "alltoall") == "alltoall"]
        assert rows
        assert all(c["workload"]["training"].get("moe_probs_alltoall", True) is want
                   for c in rows)
