"""The eager cross-entropy's log-softmax over fp32 logits: PyTorch keeps a row in shared memory
(48 KiB, read once and written once) only while it fits; an LLM vocabulary's row does not, and
the multi-pass kernels read it three times and write it once (forward: max, sum of
exponentials, write; backward: the gradient's sum, then gradient and output read, input
gradient written). Byte counts worked by hand; the measured kernels of
data/measured/acgemm-h100x1 (one H100) against them at the H100's copy bandwidth."""

from __future__ import annotations

import json

import pytest

from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.model import eager
from simulator.model.ops import FP32
from tests.conftest import ROOT

DATA = ROOT / "data/measured/acgemm-h100x1/block_gemms.jsonl"


@pytest.mark.parametrize("row, fwd, bwd", [
    (1000, 2, 3),      # 4,000 bytes: in shared memory
    (12288, 2, 3),     # exactly 48 KiB
    (12289, 4, 4),     # one logit more
    (32000, 4, 4),
    (65536, 4, 4),
])
def test_passes(row, fwd, bwd):
    assert eager.log_softmax_passes(row, False) == fwd
    assert eager.log_softmax_passes(row, True) == bwd


def test_bf16_rows_fit_twice_as_many():
    assert eager.log_softmax_passes(24576, False, itemsize=2) == 2
    assert eager.log_softmax_passes(24577, False, itemsize=2) == 4


def _kernels(shape: str) -> dict[str, float]:
    for line in DATA.read_text().splitlines():
        r = json.loads(line)
        if r["op"] == "kernels" and r.get("shape") == shape and r.get("module") == "tail":
            out = {}
            for name, t in r["kernels"]:
                for key in ("cunn_SoftMaxForward", "cunn_SoftMaxBackward"):
                    if key in name:
                        out[key] = t
            return out
    raise AssertionError(f"no tail kernels for {shape}")


@pytest.mark.parametrize("shape, vocab", [("AC", 65536), ("I", 32000), ("J", 32000)])
def test_measured_kernels_match_four_passes(shape, vocab):
    """The profiled kernels of 2,048-token rows come within 12 % of four passes at the H100's
    streaming bandwidth, where the one-pass count (2 and 3 passes) is 33-50 % short."""
    cm = ComputeModel(load_gpu("H100-SXM-80GB"))
    x = 2048 * vocab
    got = _kernels(shape)
    for key, bwd in (("cunn_SoftMaxForward", False), ("cunn_SoftMaxBackward", True)):
        model = cm.memory_s(eager.log_softmax_passes(vocab, bwd) * x * FP32)
        assert model == pytest.approx(got[key], rel=0.12)
        one_pass = cm.memory_s((3 if bwd else 2) * x * FP32)
        assert one_pass < 0.8 * got[key]
