"""The host that issues eager kernels as a second clock beside the GPU
(simulator.engine.host), against timelines worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from simulator.engine.host import HostRates, apply, compose, program_matrix
from simulator.engine.program import Part, program_time
from simulator.hardware.catalog import load_gpu
from simulator.model.ops import HOST_SYNC

US = 1e-6


def _k(dur_us: float, kind: str = "compute", overlap: bool = False) -> Part:
    return Part("k", kind, dur_us * US, overlap_next=overlap)


def _m(prog, op_us: float, coll_us: float = 0.0, sync_us: float = 0.0):
    rates = HostRates(op_us * US, coll_us * US, sync_us * US)
    return program_matrix(prog, rates, lambda parts: program_time(tuple(parts))[0])


def test_short_kernels_wait_for_the_host():
    """Host at 7 us a kernel; kernels of 1, 1, 100, 1 us, GPU and host free at 0: they are
    issued at 7, 14, 21, 28 and run at 7-8, 14-15, 21-121, 121-122: the GPU is done at 122 us,
    the host at 28 us."""
    m = _m(tuple(_k(d) for d in (1, 1, 100, 1)), 7)
    gpu, host = apply(m, 0.0, 0.0)
    assert gpu == pytest.approx(122 * US) and host == pytest.approx(28 * US)


def test_a_host_ahead_costs_nothing():
    """The host entered 1 ms ahead of the GPU (it issued these while the GPU was busy): the
    program runs back to back from the GPU's time."""
    m = _m(tuple(_k(50) for _ in range(20)), 7)
    gpu, host = apply(m, 1e-3, 0.0)
    assert gpu == pytest.approx(1e-3 + 1000 * US) and host == pytest.approx(140 * US)


def test_the_host_lead_carries_from_one_program_to_the_next():
    """A GPU-bound program (10 kernels of 100 us, host 10 us each) then a host-bound one
    (10 kernels of 1 us, host 50 us each). Each alone: 1,010 us and 501 us, 1,511 us added up
    (a per-program floor). With the host clock the second program's kernels are issued at
    150, 200, .. 600 us, while the GPU is still busy with the first (until 1,010 us): done
    at 1,020 us."""
    first = _m(tuple(_k(100) for _ in range(10)), 10)
    second = _m(tuple(_k(1) for _ in range(10)), 50)
    assert apply(second, 0.0, 0.0)[0] == pytest.approx(501 * US)
    gpu, host = apply(compose(first, second), 0.0, 0.0)
    assert gpu == pytest.approx(1020 * US) and host == pytest.approx(600 * US)


def test_a_synchronisation_drains_the_host_lead():
    """Two kernels of 100 us (host 10 us each), the count synchronisation (20 us after the
    GPU drains), two kernels of 1 us: the GPU drains at 210 us, the host resumes at 230,
    issues the next at 240 and 250: done at 251 us. Without the synchronisation: 212 us."""
    prog = (_k(100), _k(100), Part("sync", HOST_SYNC, 0.0), _k(1), _k(1))
    gpu, host = apply(_m(prog, 10, sync_us=20), 0.0, 0.0)
    assert gpu == pytest.approx(251 * US) and host == pytest.approx(250 * US)
    no_sync = tuple(p for p in prog if p.kind != HOST_SYNC)
    assert apply(_m(no_sync, 10), 0.0, 0.0)[0] == pytest.approx(212 * US)


def test_a_collective_call_costs_its_own_host_time():
    """A collective of 5 us (host 80 us), then a kernel of 1 us (host 40 us): done at 121."""
    prog = (_k(5, "comm"), _k(1))
    assert apply(_m(prog, 40, coll_us=80), 0.0, 0.0)[0] == pytest.approx(121 * US)


def _run(kernels: str, out) -> dict:
    tiny = ["model.hidden=256", "model.ffn_hidden=512", "model.heads=8", "model.kv_heads=4",
            "model.vocab=1024", "model.seq_len=128", f"training.kernels={kernels}"]
    cmd = [sys.executable, "-m", "simulator", "run", "validation/heldout/ho_tp4_B.yaml",
           "--json", "--out", str(out / kernels)]
    for s in tiny:
        cmd += ["--set", s]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def test_a_tiny_eager_step_is_the_hosts_time(tmp_path):
    """Shrunk to hidden 256 the GPU work is negligible: the eager step is its host's time, at
    least kernels x host_op_s + collective calls x host_collective_s of one micro-batch of
    one layer, and the breakdown shows it as ``host``; Megatron's fused kernels have no host
    wait (their host is assumed ahead)."""
    gpu = load_gpu("H100-SXM-80GB")
    eager, fused = _run("eager", tmp_path), _run("fused", tmp_path)
    assert eager["breakdown_s"]["host"] > 0.5 * eager["step_time_s"]
    assert sum(eager["breakdown_s"].values()) == pytest.approx(eager["step_time_s"])
    assert fused["breakdown_s"]["host"] == 0.0
    assert eager["step_time_s"] > 10 * fused["step_time_s"]
    assert eager["step_time_s"] > 1000 * gpu.host_op_s


def test_token_routing_kernels_cost_the_moe_rate():
    """A routing kernel of an MoE layer (``block == "moe"``, e.g. ``permute``) is issued at
    the MoE routing rate; an expert's GEMM of the same block and a dense kernel at the model
    rate; a collective at the collective rate."""
    rates = HostRates(40 * US, 80 * US, 0.0, 120 * US)
    assert rates.part_s(Part("permute", "compute", 0.0, block="moe")) == 120 * US
    assert rates.part_s(Part("expert_fc1_e0", "compute", 0.0, block="moe")) == 40 * US
    assert rates.part_s(Part("permute", "compute", 0.0)) == 40 * US
    assert rates.part_s(Part("moe_dispatch", "comm", 0.0, block="moe")) == 80 * US
