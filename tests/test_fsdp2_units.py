"""FSDP2's units as ``fully_shard`` runs them (PyTorch 2.11, ``torch/distributed/fsdp/
_fully_shard/``): the root unit (embedding, final norm, head) gathered by one all-gather and
reduce-scattered by one reduce-scatter after the embedding's backward; which units are gathered
again in backward (``training.fsdp_reshard_after_forward``); what is held at the loss's peak.
Counts and bytes worked by hand from the shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.config.load import load_workload
from simulator.errors import ConfigError
from simulator.run import simulate

ROOT = Path(__file__).resolve().parent.parent
# steps_third.py's FSDP2 2-GPU case: 16 blocks of width 3072 (GQA 24/8, SwiGLU 8192), vocab
# 32000, bf16 everything, one micro-batch of 4 x 2048 tokens per rank, full checkpointing
WORK = ROOT / "validation" / "heldout12" / "h12t_fsdp2_J_ac.yaml"
L, H, KV, F, V = 16, 3072, 1024, 8192, 32000
BLOCK = 2 * (2 * H * H + 2 * H * KV + 3 * H * F + 2 * H)  # bytes: wq, wo, wk, wv, w1-w3, norms
ROOT_BYTES = 2 * (2 * V * H + H)  # embedding, head, final norm


def _run(mode: str, microbatches: int = 1, loss_in_model: bool = False, version: int = 2):
    sets = {"training.fsdp_reshard_after_forward": mode,
            "training.global_batch": 8 * microbatches,
            "training.loss_in_model": loss_in_model, "training.fsdp_version": version}
    return simulate(load_workload(WORK, sets), extrapolate=False)


def _collectives(res, op: str) -> list[str]:
    ev = res.events
    ev = ev[(ev["gpu"] == ev["gpu"].min()) & ev["name"].str.contains(op)]
    return list(ev.sort_values("start_s")["name"])


@pytest.mark.parametrize("mode, backward_gathers", [("default", L), ("all", L + 1), ("none", 0)])
def test_all_gathers_per_step(mode, backward_gathers):
    """Forward: the root (one all-gather of embedding, norm and head), then every block.
    Backward: every block again unless reshard_after_forward is False on them (``none``); the
    root only when it was resharded after the forward (``all``), and then first, after the
    loss. Per micro-batch: the root's post-backward reshards it, so each forward gathers all."""
    for m in (1, 2):
        names = _collectives(_run(mode, m), "param all_gather")
        assert len(names) == m * (1 + L + backward_gathers)
        assert names[0] == "root param all_gather"
        assert names.count("root param all_gather") == m * (2 if mode == "all" else 1)
        if mode == "all":
            assert names[1 + L] == "root param all_gather"  # the backward's first


@pytest.mark.parametrize("mode", ["default", "all", "none"])
def test_every_fsdp2_all_gather_is_copied_out_on_the_compute_stream(mode):
    """FSDP2's ``wait_for_unshard`` splits each all-gather's output into the unit's parameters
    (``split_with_sizes_copy``) on the compute stream before the unit runs: one copy-out per
    all-gather, in the same order; FSDP1 (``fsdp_version: 1``) gathers into the flat
    parameter in place and has none."""
    res = _run(mode, 2)
    gathers = [n.replace(" param all_gather", "") for n in _collectives(res, "param all_gather")]
    ev = res.events
    ev = ev[(ev["gpu"] == ev["gpu"].min()) & ev["name"].str.endswith("gather copy-out")]
    copies = [n.replace(" gather copy-out", "") for n in ev.sort_values("start_s")["name"]]
    assert copies == gathers
    assert (ev["end_s"] > ev["start_s"]).all()
    if mode == "default":
        ev1 = _run(mode, 2, version=1).events
        assert not ev1["name"].str.endswith("gather copy-out").any()


def test_root_reduce_scattered_once_after_the_embedding():
    """One reduce-scatter per block and one for the root, the last of the step, of the
    embedding's, head's and final norm's gradients together."""
    res = _run("default")
    names = _collectives(res, "reduce_scatter")
    assert len(names) == L + 1
    assert names[-1] == "root grad reduce_scatter"
    ev = res.events
    root = ev[(ev["gpu"] == ev["gpu"].min()) & (ev["name"] == "root grad reduce_scatter")]
    assert float(root["bytes"].iloc[0]) == pytest.approx(ROOT_BYTES, rel=1e-12)


def test_loss_peak_holds_no_prefetch_and_the_root_only_if_kept():
    """The peak is the loss's backward (fp32 logits of 4 x 2048 x 32000: the kept log-softmax
    and nll_loss's and log_softmax's backward outputs, 12 bytes a logit). Gathered there: the
    root under ``default`` (kept since the forward), nothing under ``all`` (freed after the
    forward, gathered again by the root's pre-backward hook once the logits' gradient exists,
    which also prefetches the last block). Weights: the shards (2-way) plus that."""
    total = L * BLOCK + ROOT_BYTES
    kept = _run("default").summary["memory_gib"]
    freed = _run("all").summary["memory_gib"]
    assert kept["weights"] * 2**30 == pytest.approx(total / 2 + ROOT_BYTES, rel=1e-9)
    assert freed["weights"] * 2**30 == pytest.approx(total / 2, rel=1e-9)
    assert (kept["allocated"] - freed["allocated"]) * 2**30 == pytest.approx(ROOT_BYTES, rel=1e-9)


def test_loss_in_the_model_gathers_before_the_loss_backward():
    """A forward that returns the loss (``steps.py``, ``measure.py``): the root's pre-backward
    hook fires on the loss's gradient, before the loss's backward, so under ``all`` the root
    and the last block's prefetch are both held at the loss's peak."""
    total = L * BLOCK + ROOT_BYTES
    s = _run("all", loss_in_model=True).summary["memory_gib"]
    assert s["weights"] * 2**30 == pytest.approx(total / 2 + ROOT_BYTES + BLOCK, rel=1e-9)


def test_none_holds_every_block_from_forward_to_backward():
    """``none`` (ZeRO-2-like): at the loss's peak every block and the root are gathered."""
    total = L * BLOCK + ROOT_BYTES
    s = _run("none").summary["memory_gib"]
    assert s["weights"] * 2**30 == pytest.approx(total / 2 + total, rel=1e-9)


def test_refused_outside_fsdp2_units():
    with pytest.raises(ConfigError, match="fsdp_reshard_after_forward"):
        simulate(load_workload(WORK, {"training.fsdp_reshard_after_forward": "none",
                                      "parallelism.zero": 1}))
    with pytest.raises(ConfigError, match="fsdp_version"):  # FSDP1 keeps its root gathered
        simulate(load_workload(WORK, {"training.fsdp_version": 1}))
