"""``training.attention_backend``: FlashAttention-2's kernels instead of cuDNN's, priced with
the GPU's ``attention_fa2`` parameters and nothing else changed."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.errors import ConfigError
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.run import simulate
from tests.conftest import SMALL_MODEL, small_topology, write_case

WORK = {"name": "fa2", "model": {**SMALL_MODEL, "seq_len": 4096},
        "training": {"global_batch": 8, "micro_batch": 1},
        "parallelism": {"tp": 2, "pp": 1, "dp": 4}}  # fmt: skip


def _parts(summary_run) -> dict[str, float]:
    ev = summary_run.events
    row = ev[(ev.kind == "fwd") & (ev.layer == 1)].iloc[0]
    return {n: float(d) for n, d in (it.rsplit(":", 1) for it in row.parts.split(";"))}


def test_fa2_changes_only_the_attention_kernels(tmp_path):
    """Every part of a layer's forward but the attention kernel is priced the same; the
    attention kernel takes what the compute model gives for FA2 (the H100's cuDNN kernels are
    about twice as fast at these shapes: FA3 paper, Figs. 5-6, 539 vs 335 TFLOP/s)."""
    runs = {}
    for backend in ("cudnn", "fa2"):
        w = {**WORK, "training": {**WORK["training"], "attention_backend": backend}}
        (tmp_path / backend).mkdir()
        runs[backend] = simulate(load_workload(write_case(tmp_path / backend, w, small_topology())))
    a, b = _parts(runs["cudnn"]), _parts(runs["fa2"])
    assert a.keys() == b.keys()
    assert all(a[k] == b[k] for k in a if k != "attn")
    gpu = load_gpu("H100-SXM-80GB")
    bh = (1, SMALL_MODEL["heads"] // 2, 4096, SMALL_MODEL["hidden"] // SMALL_MODEL["heads"])
    for k, backend in ((a, "cudnn"), (b, "fa2")):
        t = ComputeModel(gpu, backend).attention_s(*bh) + gpu.kernel_launch_s
        assert k["attn"] == pytest.approx(t, rel=1e-9)
    assert 1.5 < b["attn"] / a["attn"] < 2.5
    assert runs["fa2"].summary["step_time_s"] > runs["cudnn"].summary["step_time_s"]


def test_fa2_on_a_gpu_without_its_measurements_is_one_config_error(tmp_path):
    w = {**WORK, "training": {**WORK["training"], "attention_backend": "fa2"}}
    path = write_case(tmp_path, w, small_topology(gpu="B200"))
    with pytest.raises(ConfigError) as e:
        simulate(load_workload(path))
    assert e.value.field == "training.attention_backend" and "B200" in str(e.value)
    assert "H100-SXM-80GB" in str(e.value)


def test_unknown_backend_is_refused(tmp_path):
    w = {**WORK, "training": {**WORK["training"], "attention_backend": "fa3"}}
    with pytest.raises(ConfigError) as e:
        load_workload(write_case(tmp_path, w, small_topology()))
    assert e.value.field == "training.attention_backend"
