"""FSDP2's per-unit and per-parameter-tensor host work on the host clock of eager ZeRO-3 steps
(``HostRates.fsdp_call_s``, ``HostRates.fsdp_tensor_s``, :data:`simulator.engine.host.FSDP_CALLS`):
exposed where the host sets the step, hidden where the GPU does. Counts worked out by hand
from the workload and the modules of the measuring scripts."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.engine.host import FSDP_CALLS
from simulator.model import eager
from simulator.run import simulate
from tests.conftest import ROOT

CASE = ROOT / "validation/heldout5/h5_fsdp2_S.yaml"  # 12 layers, FSDP 2, 2 micro-batches each
# steps.py --tiny widths: the GPU has almost nothing to do, the host sets the step
TINY = ("model.hidden=256", "model.ffn_hidden=512", "model.heads=8", "model.kv_heads=8",
        "model.vocab=1024", "model.seq_len=128")
# wide enough that every layer's kernels take far longer than their host issues them
WIDE = ("model.layers=4", "model.hidden=8192", "model.ffn_hidden=28672", "model.heads=64",
        "model.kv_heads=64", "model.seq_len=4096", "training.micro_batch=1",
        "training.global_batch=4")


def _step(overrides: tuple[str, ...], call_s: float, tensor_s: float = 0.0) -> dict:
    gpu = (f"topology.gpu={{base: H100-SXM-80GB, host_fsdp_call_s: {call_s!r}, "
           f"host_fsdp_tensor_s: {tensor_s!r}, host_jitter: 0.0}}")  # one host's pace
    return simulate(load_workload(CASE, [*overrides, gpu])).summary


def test_fsdp_calls_per_unit_follow_fsdp2():
    """Reshard after forward: one all-gather per unit in forward; in backward another
    all-gather and the reduce-scatter."""
    assert FSDP_CALLS == {"fwd": ("all_gather",), "bwd": ("all_gather", "reduce_scatter")}


@pytest.mark.parametrize("reshard, root_calls", [("all", 3), ("default", 2)])
def test_launch_bound_fsdp_step_exposes_every_units_hooks(reshard, root_calls):
    """At tiny widths each of the 12 blocks costs its host 3 FSDP calls per micro-batch and
    the root unit (embedding, final norm, head: one ``fully_shard`` unit) its all-gather in
    forward and its reduce-scatter, plus an all-gather in backward where it was resharded after
    the forward (``all``, as steps.py passes ``reshard_after_forward=True``; kept gathered
    under ``default``, its pre-backward unshard a no-op); 2 micro-batches per replica: 78 or
    76 calls. At 1 ms a call the step grows by that many ms, all of it shown as ``host``."""
    mode = (f"training.fsdp_reshard_after_forward={reshard}",)
    base, hooked = _step(TINY + mode, 0.0), _step(TINY + mode, 1e-3)
    calls = (3 * 12 + root_calls) * 2
    grown = hooked["step_time_s"] - base["step_time_s"]
    assert grown == pytest.approx(calls * 1e-3, rel=0.01)
    shown = hooked["breakdown_s"]["host"] - base["breakdown_s"]["host"]
    assert shown == pytest.approx(calls * 1e-3, rel=0.02)


def test_compute_bound_fsdp_step_hides_the_hooks():
    """At hidden 8,192 and 4,096-token sequences a layer's forward keeps the GPU busy for
    milliseconds: the host's (3 x 4 blocks + 3 for the root) x 2 micro-batches x 1 ms = 30 ms
    of FSDP calls run while the GPU computes, and the step moves by under 1 % of that."""
    base, hooked = _step(WIDE, 0.0), _step(WIDE, 1e-3)
    assert base["breakdown_s"]["compute"] > 0.8 * base["step_time_s"]
    assert abs(hooked["step_time_s"] - base["step_time_s"]) < 0.01 * 30e-3


def test_parameter_tensors_follow_the_modules():
    """measure.py's Llama layer holds qkv, o, gate_up, down and two RMSNorm gains (6); its root
    the embedding, the final norm and the head. A nanoGPT block (c_attn, c_proj, c_fc,
    c_proj with biases, two LayerNorms with biases) holds 12; its embedding unit wte and
    wpe, its head unit ln_f (gain, bias) and lm_head."""
    llama = load_workload(CASE).workload.model
    gpt = load_workload(CASE, ["model.activation=gelu", "model.norm=layernorm"]).workload.model
    counts = [(eager.layer_param_tensors(m), eager.embedding_param_tensors(m),
               eager.head_param_tensors(m)) for m in (llama, gpt)]
    assert counts == [(6, 1, 2), (12, 2, 3)]


def test_launch_bound_fsdp_step_exposes_every_tensors_work():
    """At tiny widths, 1 ms per parameter tensor per FSDP call and nothing per call: each unit's
    3 calls a micro-batch touch its tensors (12 layers of 6; the root resharded after the
    forward, as steps.py has it, the embedding's 1 and the head's 2: 75), 2 micro-batches per
    replica: 3 x 75 x 2 = 450 ms, all of it shown as ``host``."""
    base, hooked = _step(TINY, 0.0), _step(TINY, 0.0, 1e-3)
    grown = hooked["step_time_s"] - base["step_time_s"]
    assert grown == pytest.approx(3 * 75 * 2 * 1e-3, rel=0.01)
    shown = hooked["breakdown_s"]["host"] - base["breakdown_s"]["host"]
    assert shown == pytest.approx(3 * 75 * 2 * 1e-3, rel=0.02)


def test_compute_bound_fsdp_step_hides_the_tensors_work():
    """At hidden 8,192 the 4 layers' forward and backward keep the GPU busy for tens of ms
    each: 3 calls x (4 x 6 + 1 + 2 tensors) x 2 micro-batches x 0.1 ms = 16.2 ms of host work
    runs while the GPU computes, and the step moves by under 1 % of that."""
    base, hooked = _step(WIDE, 0.0), _step(WIDE, 0.0, 1e-4)
    assert abs(hooked["step_time_s"] - base["step_time_s"]) < 0.01 * 16.2e-3
