"""Megatron-Core's token drop-and-pad (``model.moe.pad_to_capacity``) and its PyTorch
permutation (``training.moe_permute_fusion: false``), as NeMo 2.x ran Mixtral: rows, counts and
synchronisations against Megatron-Core's code (``moe_utils.py`` ``permute`` / ``unpermute`` /
``get_capacity``, ``token_dispatcher.py`` ``preprocess``, core_v0.11.0) worked by hand, and
the bytes of each kernel against closed forms of the tensors it reads and writes."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from simulator.config.schema import ModelConfig, TrainingConfig
from simulator.model import moe
from simulator.model.moe_layer import layer_ops
from simulator.model.ops import HOST_SYNC

MIXTRAL = dict(
    layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=32000, seq_len=4096,
    activation="swiglu",
)  # fmt: skip


def _model(pad: bool = True, cf: float | None = 1.0, experts: int = 8, top_k: int = 2):
    m = {"experts": experts, "top_k": top_k, "ffn_hidden": 14336, "capacity_factor": cf,
         "pad_to_capacity": pad}  # fmt: skip
    return ModelConfig(**MIXTRAL, moe=m)


def test_padded_experts_compute_their_capacity_whatever_the_routes():
    # capacity per source rank: ceil(tokens x top_k / experts x factor) (get_capacity)
    m = _model(cf=1.1)
    t, E, k, ep = 2 * 4096, 8, 2, 4
    cap = math.ceil(t * k / E * 1.1)
    skew = (0.3, 0.2) + (0.5 / 6,) * 6
    for load in (None, moe.RANDOM, skew):
        loc = moe.moe_local(m, 2, 1, 1, ep, 1, load)
        assert loc.pad_capacity == cap
        assert loc.expert_tokens == (ep * cap,) * (E // ep)
        assert loc.imbalance == 1.0 and loc.uniform
    # the skewed routes drop what exceeds the capacity (0.3 and 0.2 of the copies at 1.1/8)
    loc = moe.moe_local(m, 2, 1, 1, ep, 1, skew)
    assert loc.dropped == pytest.approx((0.3 - 1.1 / 8) + (0.2 - 1.1 / 8))


def test_pad_needs_a_capacity():
    with pytest.raises(ValidationError, match="pad_to_capacity"):
        _model(pad=True, cf=None)


def _fwd(m, permute_kind="fused", ep=8, b=2):
    loc = moe.moe_local(m, b, 1, 1, ep, 1)
    return loc, moe.moe_forward_ops(m, loc, tp=1, ep=ep, etp=1, d=2, permute_kind=permute_kind)


def test_padded_dispatch_sends_the_capacities_and_exchanges_no_counts():
    m = _model()
    loc, ops = _fwd(m)
    names = [op.name for op in ops]
    assert "moe_counts" not in names
    dispatch = next(op for op in ops if op.name == "moe_dispatch")
    # every expert's capacity of the rank's 8,192 tokens (2,048 rows each) of 4,096 bf16
    assert dispatch.nbytes == 8 * 2048 * 4096 * 2
    # the layer waits for no count on its host; the dropless layer does
    body = layer_ops(m, micro_batch=2, tp=1, sequence_parallel=False, backward=False,
                     moe_layer=True, ep=8)
    assert not any(op.kind == HOST_SYNC for op in body)
    dropless = layer_ops(_model(pad=False, cf=None), micro_batch=2, tp=1,
                         sequence_parallel=False, backward=False, moe_layer=True, ep=8)
    assert sum(op.kind == HOST_SYNC for op in dropless) == 1


def test_unfused_permutation_bytes_with_pad():
    """Each kernel's bytes, from the tensors it touches (t tokens, E experts, R = E x
    capacity rows, h wide, bf16 d = 2, int64 indices, int8/bool maps)."""
    m = _model()
    t, E, h, d, I64 = 8192, 8, 4096, 2, 8
    R = E * 2048
    _, ops = _fwd(m, "unfused")
    got = {op.name: op.bytes for op in ops if not isinstance(op, moe.Comm)}
    want = {
        "permute_map_int8": 2 * t * E,                     # bool -> int8
        "permute_map_t": 2 * t * E,                        # .T.contiguous()
        "permute_argsort": t * E * (I64 + 2 * (1 + I64)),  # index written; keys+index r/w
        "permute_index_slice": 2 * R * I64,                # [:, :capacity].contiguous()
        "permute_gather": 2 * R * h * d + R * I64,         # index_select
        "unpermute_probs_t": 2 * t * E * d,
        "unpermute_index_mul": 2 * R * I64,
        "unpermute_index_add": 3 * R * I64,
        "unpermute_probs_gather": R * (I64 + 2 * d),
        "unpermute_scale": 2 * R * h * d + R * d,          # rows x weights
        "unpermute_zeros": t * h * d,
        "unpermute_scatter_add": 3 * R * h * d + R * I64,  # read rows, RMW an output row each
    }
    for name, nbytes in want.items():
        assert got[name] == pytest.approx(nbytes), name
    assert "permute" not in got and "unpermute" not in got
    assert not any(op.kind == HOST_SYNC for op in ops if not isinstance(op, moe.Comm))


def test_unfused_permutation_backward():
    m = _model()
    t, E, h, d, I64 = 8192, 8, 4096, 2, 8
    R = E * 2048
    loc = moe.moe_local(m, 2, 1, 1, 8, 1)
    bwd = moe.moe_backward_ops(m, loc, tp=1, ep=8, etp=1, d=2, permute_kind="unfused")
    got = {op.name: op.bytes for op in bwd if not isinstance(op, moe.Comm)}
    want = {
        "unpermute_scatter_add_grad": 2 * R * h * d + R * I64,  # gather of the output grad
        "unpermute_scale_dx": 2 * R * h * d + R * d,
        "unpermute_scale_dprobs": 3 * R * h * d,             # grad x rows, written
        "unpermute_scale_dprobs_sum": R * h * d + R * d,     # and summed over h
        "unpermute_probs_gather": R * (I64 + 2 * d),
        "unpermute_probs_t": 2 * t * E * d,
        "permute_gather_zeros": t * h * d,                   # index_select's backward
        "permute_gather_index_add": 3 * R * h * d + R * I64,
    }
    for name, nbytes in want.items():
        assert got[name] == pytest.approx(nbytes), name
    # integer maps, indices and the zero output carry no gradient
    for name in ("permute_map_int8", "permute_map_t", "permute_argsort", "permute_index_slice",
                 "unpermute_index_mul", "unpermute_index_add", "unpermute_zeros"):
        assert name not in got
    # the fused path's backward is one kernel each way
    fused = moe.moe_backward_ops(m, loc, tp=1, ep=8, etp=1, d=2)
    assert {"permute", "unpermute"} <= {op.name for op in fused}


def test_unfused_dropless_unpermute_reads_its_size_on_the_host():
    m = _model(pad=False, cf=None)
    _, ops = _fwd(m, "unfused")
    names = [op.name for op in ops]
    # masked_select of the weights: a synchronisation after the combine, before it
    i = names.index("moe_unpermute_sync")
    assert names.index("moe_combine") < i < names.index("unpermute_masked_select")
    assert "permute_masked_select" in names and "permute_argsort" not in names
    loc = moe.moe_local(m, 2, 1, 1, 8, 1)
    bwd = moe.moe_backward_ops(m, loc, tp=1, ep=8, etp=1, d=2, permute_kind="unfused")
    assert not any(op.kind == HOST_SYNC for op in bwd if not isinstance(op, moe.Comm))


def test_permute_kernels_by_setting():
    t = TrainingConfig(global_batch=8)
    assert moe.permute_kernels(t) == "fused"
    off = t.model_copy(update={"moe_permute_fusion": False})
    assert moe.permute_kernels(off) == "unfused"
    # DeepEP permutes inside its own path, eager code with its own ops
    assert moe.permute_kernels(off.model_copy(update={"moe_dispatcher": "deepep"})) == "fused"
    assert moe.permute_kernels(off.model_copy(update={"kernels": "eager"})) == "fused"


def test_pieces_priced_against_the_h100_measurement():
    """Megatron-Core's PyTorch permutation pieces as measured on one H100
    (data/measured/moe-permute-h100x1, benchmarks/device/moe_permute.py) against the model's
    kernels for the same shapes, each case of at least 8,192 rows: the row gather at the copy's
    rate, index_select's backward and scatter_add_ at their measured access classes (medians
    over the cases: simulator/calibrate/memory.py), the rest at the copy's rate."""
    import json
    from pathlib import Path

    from simulator.engine.program import _op_time
    from simulator.hardware.catalog import load_gpu
    from simulator.hardware.compute import ComputeModel

    path = Path(__file__).resolve().parents[1] / "data/measured/moe-permute-h100x1/permute.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    by: dict = {}
    for r in rows:
        if "case" in r:
            by.setdefault(r["case"], {})[r["piece"]] = r
    cm = ComputeModel(load_gpu("H100-SXM-80GB"))

    def priced(ops):
        return sum(_op_time(cm, op, "bf16") for op in ops)

    checked = 0
    for p in by.values():
        ref = p["copy_Rh_ref"]
        t, h, E, R, pad = ref["tokens"], ref["hidden"], ref["experts"], ref["rows"], \
            ref["drop_and_pad"]
        if R < 8192:
            continue
        fwd = {op.name: op for op in moe._unfused_permute_ops(t, E, R, h, 2, pad)}
        bwd = moe._unfused_permute_backward("permute_gather", t, E, R, h, 2)
        got = {
            "permute_gather_fwd": priced([fwd["permute_gather"]]),
            "permute_gather_bwd": priced(bwd),
            "unpermute_bwd": priced(
                moe._unfused_permute_backward("unpermute_scatter_add", t, E, R, h, 2)
                + moe._unfused_permute_backward("unpermute_scale", t, E, R, h, 2)[:1]),
        }
        if pad:  # (the dropless unpermute waits for its host every call)
            got["unpermute_fwd"] = priced(moe._unfused_unpermute_ops(t, E, R, h, 2, pad))
        for piece, model_s in got.items():
            # (top-8 routes re-read each token's row 8 times, from L2: the gather runs 1.25x
            # a copy of its rows there; the model prices the copy)
            tol = 0.3 if piece == "permute_gather_fwd" else 0.15
            assert model_s == pytest.approx(p[piece]["time_s"], rel=tol), (ref["case"], piece)
            checked += 1
    assert checked >= 14
