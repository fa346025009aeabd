"""The word embedding's weight gradient with fused kernels (Megatron-Core): a dense
``[V/tp, h]`` gradient every micro-batch, added into ``main_grad``; against closed forms
worked from PyTorch's ``embedding_dense_backward`` and Megatron-Core's DDP hook."""

from types import SimpleNamespace

import pytest

from simulator.config.schema import ModelConfig
from simulator.engine.program import embed_grad
from simulator.model import eager
from simulator.model import transformer as tf

M = ModelConfig(layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=128256,
                seq_len=8192)  # Llama 3 8B shapes


def _bytes(ops, names=None):
    return sum(o.bytes for o in ops if names is None or o.name in names)


def _ops(tp=1, b=1, **kw):
    return tf.embedding_backward_ops(M, micro_batch=b, tp=tp, sequence_parallel=tp > 1, **kw)


def test_tp1_closed_form():
    V, h, T = 128256, 4096, 8192
    ops = _ops(main_grad_bytes=4)
    assert [o.name for o in ops] == ["embed_sort", "embed_zero", "embed_partial",
                                     "embed_scatter", "embed_gacc"]
    assert all(o.backward and o.kind == "memory" for o in ops)
    # zero-fill 2 + main_grad.add_(grad): read 2, read 4, write 4 -> 12 bytes an element
    assert _bytes(ops, {"embed_zero", "embed_gacc"}) == V * h * (2 + 2 + 4 + 4)
    # radix sort: 8 passes x (keys + values) x (read + write) x 8 bytes
    sort = 8 * 2 * 2 * 8 * T
    # every id its own partial (distinct ids): read dY 2, write fp32 4; read 4, write row 2
    assert _bytes(ops) == pytest.approx(V * h * 12 + sort + T * h * (2 + 4) + T * h * (4 + 2))
    # about 6.7 GB a micro-batch at TP 1, 6.3 GB of it the 128K x 4096 table's
    assert 6.6e9 < _bytes(ops) < 6.8e9


def test_tp_shard_closed_form():
    V, h, T, tp = 128256, 4096, 8192, 4
    ops = _ops(tp=tp, main_grad_bytes=4)
    rows = V / tp * h
    assert _bytes(ops, {"embed_zero"}) == rows * 2 and _bytes(ops, {"embed_gacc"}) == rows * 10
    # foreign ids all map to row 0: one partial per 10 of them, one per own id
    partials = T / tp + (T - T / tp) / 10
    assert _bytes(ops, {"embed_partial"}) == pytest.approx(T * h * 2 + partials * h * 4)
    assert _bytes(ops, {"embed_scatter"}) == pytest.approx(partials * h * 4 + T / tp * h * 2)
    # index_put_ backward: clone dY, mask -> indices, zero the foreign rows
    foreign = T - T / tp
    assert _bytes(ops, {"embed_mask"}) == pytest.approx(2 * T * h * 2 + T + foreign * (h * 2 + 16))


def test_dense_part_is_per_micro_batch_not_per_token():
    """Doubling the tokens doubles the token-driven work only; the table-sized zero-fill and
    main_grad addition stay, so b=2 costs less than twice b=1 by exactly one table pass."""
    one, two = _bytes(_ops(b=1, main_grad_bytes=4)), _bytes(_ops(b=2, main_grad_bytes=4))
    assert 2 * one - two == pytest.approx(128256 * 4096 * 12)


def test_grad_reduce_dtype_and_tied_head():
    V, h = 128256, 4096
    bf16 = _ops(main_grad_bytes=2)
    assert _bytes(bf16, {"embed_gacc"}) == V * h * 6
    tied = _ops(main_grad_bytes=4, tied_head=True)
    # the head's zero-filled dummy wgrad (2) and autograd's sum of the two (read 2 + 2, write 2)
    assert _bytes(tied) - _bytes(_ops(main_grad_bytes=4)) == V * h * (2 + 6)
    assert [o.name for o in tied][-3:] == ["head_wgrad_zero", "embed_gsum", "embed_gacc"]


def test_fp32_weights_accumulate_into_grad():
    V, h, T = 128256, 4096, 8192
    ops = _ops(param_dtype="fp32", main_grad_bytes=0)
    assert _bytes(ops, {"embed_zero"}) == V * h * 4 and _bytes(ops, {"embed_gacc"}) == V * h * 12
    assert _bytes(ops, {"embed_partial"}) == T * h * (4 + 4)


def test_eager_unchanged_and_settings():
    """Eager code keeps its measured op list (nn.Embedding: the dense zero-fill is in it
    already, no main_grad); the settings follow the training and the layout."""
    ref = eager.embedding_backward(M, 1, 2, False, 2)
    assert _ops(tp=2, kernels="eager", main_grad_bytes=4, tied_head=True) == ref
    t = SimpleNamespace(kernels="fused", param_dtype="bf16", grad_reduce_dtype="fp32")
    tied = M.model_copy(update={"tied_embeddings": True})
    assert embed_grad(t, M, 1) == {"main_grad_bytes": 4, "tied_head": False}
    assert embed_grad(t, tied, 1) == {"main_grad_bytes": 4, "tied_head": True}
    assert embed_grad(t, tied, 2)["tied_head"] is False
    assert embed_grad(SimpleNamespace(**{**t.__dict__, "grad_reduce_dtype": "bf16"}), M, 1)[
        "main_grad_bytes"] == 2
    assert embed_grad(SimpleNamespace(**{**t.__dict__, "param_dtype": "fp32"}), M, 1)[
        "main_grad_bytes"] == 0
    assert embed_grad(SimpleNamespace(**{**t.__dict__, "kernels": "eager"}), M, 1) == {}


def test_sequence_parallel_backward_gathers_the_gradient():
    """With SP the embedding's output is reduce-scattered into the sequence-parallel region,
    whose backward all-gathers the ``[b, s, h]`` gradient (bf16 with fused kernels) before the
    lookup's backward; without SP the all-reduce's backward is the identity; forward keeps one
    collective either way."""
    from simulator.model import comm as mc

    b, s, h = 2, 8192, 4096
    kw = dict(micro_batch=b, tp=4, main_grad_bytes=4)
    sp = mc.embedding_ops(M, sequence_parallel=True, backward=True, **kw)
    assert sp[0].name == "tp_all_gather" and (sp[0].dim, sp[0].collective) == ("tp", "all_gather")
    assert sp[0].bytes == b * s * h * 2
    assert [o.name for o in sp[1:]] == [o.name for o in tf.embedding_backward_ops(
        M, micro_batch=b, tp=4, sequence_parallel=True, main_grad_bytes=4)]
    no_sp = mc.embedding_ops(M, sequence_parallel=False, backward=True, **kw)
    assert not any(o.name.startswith("tp_") for o in no_sp)
    kw.pop("main_grad_bytes")
    fwd = [o.name for o in mc.embedding_ops(M, sequence_parallel=True, backward=False, **kw)]
    assert fwd.count("tp_reduce_scatter") == 1 and "tp_all_gather" not in fwd
