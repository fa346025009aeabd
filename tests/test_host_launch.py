"""The host as a launcher of eager kernels after a synchronisation
(simulator.engine.program.host_launch), against closed forms worked out by hand."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.engine.program import Part, host_floor, host_launch, launch_idle, program_time
from simulator.hardware.catalog import load_gpu
from simulator.model.ops import HOST_SYNC

US = 1e-6


def _k(dur_us: float, kind: str = "compute", overlap: bool = False) -> Part:
    return Part("k", kind, dur_us * US, overlap_next=overlap)


def test_idle_while_the_host_launches_short_kernels():
    """Host at 7 us a launch; kernels of 1, 1, 100, 1 us: they start at 7, 14, 21 and 121 us
    (the host is ahead from the third on): idle 7 + 6 + 6 = 19 us."""
    parts = [(7 * US, _k(d)) for d in (1, 1, 100, 1)]
    assert launch_idle(parts) == pytest.approx(19 * US)


def test_long_kernels_cost_only_the_first_launch():
    assert launch_idle([(7 * US, _k(50)) for _ in range(20)]) == pytest.approx(7 * US)
    # a GEMM launch (15.6 us) before kernels of 10 us: 15.6 idle, then the host is behind by
    # 6.9 - 10 < 0 at every next kernel: no more idle
    parts = [(15.6 * US, _k(10)), *[(6.9 * US, _k(10)) for _ in range(5)]]
    assert launch_idle(parts) == pytest.approx(15.6 * US)


def test_a_collective_beside_the_next_kernel_does_not_hold_the_gpu():
    parts = [(7 * US, _k(100, "comm", overlap=True)), (7 * US, _k(1))]
    assert launch_idle(parts) == pytest.approx(14 * US)  # the kernel waits for two launches


class _Pr:
    class cm:  # noqa: N801 - a stand-in for the compute model
        gpu = load_gpu("H100-SXM-80GB")


def test_sync_becomes_the_wait_of_one_cycle():
    from simulator.model.ops import Op

    ops = [Op("a", "memory", "x"), Op("s", HOST_SYNC, "x"), Op("g", "gemm", "x"),
           Op("b", "memory", "x")]
    prog = (_k(1), Part("s", HOST_SYNC, 0.0), _k(1), _k(1))
    out = host_launch(ops, prog, _Pr)
    gpu = _Pr.cm.gpu
    # after the sync: the GEMM, b, then the next layer's a, each launched by the host in
    # host_op_s (the host's time per kernel of eager model code): each 1 us kernel waits
    h = gpu.host_op_s
    want = h + (h - 1 * US) + (h - 1 * US)
    assert [p.name for p in out] == ["k", "host_launch_wait", "k", "k"]
    assert out[1].dur == pytest.approx(want)
    assert host_launch(ops[:1], prog[:1], _Pr) == prog[:1]  # no sync: unchanged


@pytest.mark.parametrize("kernels,waits", [("eager", 1), ("fused", 0)])
def test_eager_moe_layer_forward_waits_once_after_its_count_sync(kernels, waits):
    """Plain PyTorch MoE reads the expert counts on the host once per layer forward; the
    backward has no synchronisation, Megatron's fused MoE none at all."""
    from simulator.engine.build import build_plan, make_job
    from simulator.engine.sim import CountingEnvironment
    from simulator.run import make_machine, resolve_loaded

    loaded = load_workload("validation/measured-moe/moe_ep2_uniform.yaml",
                           ["topology.gpus_per_node=2", f"training.kernels={kernels}"])
    job = make_job(loaded.workload, loaded.topology, resolve_loaded(loaded),
                   make_machine(loaded))
    plan, _ = build_plan(job, env=CountingEnvironment())
    progs = plan.procs[0].programs
    assert sum(p.name == "host_launch_wait" for p in progs.layer_fwd) == waits
    assert not any(p.name == "host_launch_wait" for p in progs.layer_bwd)
    assert not any(p.kind == HOST_SYNC for prog in (progs.layer_fwd, progs.layer_bwd)
                   for p in prog)


def test_host_floor_is_the_host_time_of_a_short_program():
    """n kernels and c collective calls shorter than their host time: the program takes
    n x host_op_s + c x host_collective_s; the wait is the difference, one part at the end."""
    op_s, coll_s = 40 * US, 200 * US
    prog = tuple(_k(1) for _ in range(10)) + (Part("tp_all_gather", "comm", 5 * US),)
    out = host_floor(prog, op_s, coll_s)
    assert out[:-1] == prog and out[-1].name == "host_bound_wait"
    assert program_time(out)[0] == pytest.approx(10 * op_s + coll_s)


def test_host_floor_leaves_a_gpu_bound_program_alone():
    prog = tuple(_k(100) for _ in range(10))  # 1 ms of kernels, 0.4 ms of host
    assert host_floor(prog, 40 * US, 200 * US) == prog
    assert host_floor(prog, 0.0, 0.0) == prog


@pytest.mark.parametrize("kernels", ["eager", "fused"])
def test_only_eager_programs_are_host_bound(kernels):
    """A tiny eager model's layer takes at least its host time; Megatron's fused kernels are
    not floored (their host is assumed ahead, as at the scale they run)."""
    from simulator.engine.build import build_plan, make_job
    from simulator.engine.sim import CountingEnvironment
    from simulator.run import make_machine, resolve_loaded

    loaded = load_workload("validation/heldout/ho_tp4_B.yaml",
                           ["model.hidden=256", "model.ffn_hidden=512", "model.heads=8",
                            "model.kv_heads=4", "model.vocab=1024", "model.seq_len=128",
                            f"training.kernels={kernels}"])
    job = make_job(loaded.workload, loaded.topology, resolve_loaded(loaded),
                   make_machine(loaded))
    plan, _ = build_plan(job, env=CountingEnvironment())
    progs = plan.procs[0].programs
    gpu = load_gpu("H100-SXM-80GB")
    for prog in (progs.layer_fwd, progs.layer_bwd):
        waits = [p for p in prog if p.name == "host_bound_wait"]
        if kernels == "fused":
            assert not waits
            continue
        n = sum(1 for p in prog if p.kind != "comm" and p.name != "host_bound_wait")
        c = sum(1 for p in prog if p.kind == "comm")
        assert len(waits) == 1
        assert program_time(prog)[0] == pytest.approx(n * gpu.host_op_s + c * gpu.host_collective_s)
