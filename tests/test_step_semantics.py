"""Figures mean what their names say: regressions of the audit in issue 14.

Each test works its expectation out independently of the engine (Megatron-LM's documented
behaviour, a closed form, or a structural invariant).
"""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.model import transformer as tf
from simulator.run import simulate
from tests.conftest import SMALL_MODEL, small_topology, write_case


def _run(tmp_path, work: dict, topo: dict, detail: str = "folded"):
    return simulate(load_workload(write_case(tmp_path, work, topo)), detail=detail)


@pytest.mark.parametrize("detail", ["folded", "full"])
def test_no_overlap_reduces_in_one_bucket(tmp_path, detail):
    """``overlap_grad_reduce: false``: Megatron-LM sets the bucket size to None, so the whole
    gradient buffer is one bucket, reduced once after the backward pass (not 25 MB pieces)."""
    work = {"name": "dp16", "model": SMALL_MODEL,
            "training": {"global_batch": 16, "overlap_grad_reduce": False,
                         "grad_reduce_dtype": "fp32"},
            "parallelism": {"tp": 1, "pp": 1, "dp": 16, "zero": 0}}
    res = _run(tmp_path, work, small_topology(nodes=2), detail)
    dp = res.events[res.events["kind"] == "dp_comm"]
    per_gpu = dp.groupby("gpu").size()
    assert (per_gpu == 1).all(), per_gpu.to_dict()
    # The one bucket holds every parameter's fp32 gradient (tp = pp = 1).
    assert dp["bytes"].iloc[0] == pytest.approx(tf.total_params(load_workload(
        tmp_path / "work.yaml").workload.model) * 4, rel=1e-9)
