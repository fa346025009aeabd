"""Engine mechanics against closed forms, with stub compute and network models.

With every kernel priced at FLOPs / 1 PFLOP/s and free communication, a pipeline's step time
and bubble follow from the schedule alone: GPipe and 1F1B both take (m + p - 1) * (t_f + t_b)
per step, a bubble fraction of (p - 1) / (m + p - 1) (Huang et al. 2019; Narayanan et al.
2021), and the interleaved schedule shrinks the bubble by the number of chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from simulator.config.load import load_workload
from simulator.engine.build import Machine
from simulator.network.collectives import Step
from simulator.network.topology import load_fabrics
from simulator.run import simulate
from tests.conftest import SMALL_MODEL, small_topology, write_case
from tests.stubs import RATE, NoLinks, StubGpu


class StubCompute:
    gpu = StubGpu()

    def gemm_s(self, m, k, n, dtype="bf16"):
        return 2.0 * m * k * n / RATE

    def attention_s(self, batch, heads, seq, head_dim, **kw):
        f = 2.0 * batch * heads * seq * seq * head_dim
        return f * (2.5 if kw.get("backward") else 1.0) / RATE

    def memory_s(self, nbytes, access="stream"):
        return 0.0


@dataclass
class _Cost:
    time_s: float


class StubCollectives:
    """Every collective costs ``alpha + nbytes / bw``; sends likewise."""

    def __init__(self, alpha=0.0, bw=float("inf")):
        self.alpha, self.bw = alpha, bw

    def cost(self, op, groups, nbytes, algorithm=None):
        return _Cost(self.alpha + nbytes / self.bw)

    def p2p_cost(self, pairs, nbytes):
        return _Cost(self.alpha + nbytes / self.bw)

    def launch_s(self, op, group):
        return 0.0

    def bundles(self, op, groups, nbytes):
        # No flows: the whole cost is a fixed delay.
        return [Step((), self.alpha + nbytes / self.bw)]


def stub_machine(**kw) -> Machine:
    return Machine(StubGpu(), NoLinks(), StubCompute(), StubCollectives(**kw))


def run_case(tmp_path, *, model=None, training=None, parallelism=None, nodes=1, gpn=8, **mkw):
    model = {**SMALL_MODEL, "vocab": 8, **(model or {})}
    work = {
        "name": "t",
        "model": model,
        "training": {"global_batch": 8, "micro_batch": 1, **(training or {})},
        "parallelism": parallelism or {},
    }
    path = write_case(tmp_path, work, small_topology(nodes, gpn))
    return simulate(load_workload(path), machine=stub_machine(**mkw))


def layer_times(model=SMALL_MODEL, b=1):
    """t_f, t_b of one GELU layer at RATE (non-fused attention counted causal: 2bs^2h)."""
    h, s, f = model["hidden"], model["seq_len"], model["ffn_hidden"]
    gemm = 2 * b * s * (3 * h * h + h * h + 2 * h * f)
    attn = 2 * b * s * s * h
    return (gemm + attn) / RATE, (2 * gemm + 2.5 * attn) / RATE


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp,m", [(4, 8), (2, 2), (8, 16)])
def test_pipeline_bubble_closed_form(tmp_path, schedule, pp, m):
    res = run_case(
        tmp_path,
        training={"global_batch": m},
        parallelism={"pp": pp, "dp": 1, "tp": 1, "pp_schedule": schedule},
        gpn=pp,
    )
    s = res.summary
    tf_, tb_ = layer_times()
    per_stage = SMALL_MODEL["layers"] // pp
    expected_step = (m + pp - 1) * per_stage * (tf_ + tb_)
    assert s["step_time_s"] == pytest.approx(expected_step, rel=1e-3)
    bubble = s["breakdown_s"]["pp_bubble"] / s["step_time_s"]
    assert bubble == pytest.approx((pp - 1) / (m + pp - 1), rel=1e-3)
    assert sum(s["breakdown_s"].values()) == pytest.approx(s["step_time_s"], rel=1e-12)


def test_interleaved_shrinks_bubble_by_v(tmp_path):
    pp, m, v = 4, 8, 2
    res = run_case(
        tmp_path,
        training={"global_batch": m},
        parallelism={"pp": pp, "dp": 1, "tp": 1, "pp_schedule": "interleaved",
                     "virtual_stages": v},
        gpn=pp,
    )
    s = res.summary
    tf_, tb_ = layer_times()
    per_chunk = SMALL_MODEL["layers"] // (pp * v)
    # Narayanan et al. SC21: bubble time (p - 1) * (t_f + t_b) / v, ideal time m * (t_f + t_b).
    ideal = m * v * per_chunk * (tf_ + tb_)
    bubble = (pp - 1) * v * per_chunk * (tf_ + tb_) / v
    assert s["step_time_s"] == pytest.approx(ideal + bubble, rel=1e-3)


def test_1f1b_activation_memory_bounded_by_p(tmp_path):
    pp, m = 4, 16
    out = {}
    for sched in ("gpipe", "1f1b"):
        res = run_case(
            tmp_path,
            training={"global_batch": m},
            parallelism={"pp": pp, "dp": 1, "tp": 1, "pp_schedule": sched},
            gpn=pp,
        )
        mem = res.memory[(res.memory["what"] == "activations") & (res.memory["proc"] == "c0.s0")]
        out[sched] = mem.sort_values(["t_s", "delta_bytes"])["delta_bytes"].cumsum().max()
    # Stage 0 holds p micro-batches under 1F1B and all m under GPipe.
    assert out["1f1b"] == pytest.approx(out["gpipe"] * pp / m, rel=1e-9)


def test_dp_reduction_exposed_only_after_backward(tmp_path):
    # A slow network: gradient all-reduce of each layer takes longer than the layer's backward.
    res_overlap = run_case(
        tmp_path,
        parallelism={"pp": 1, "dp": 8, "tp": 1},
        training={"global_batch": 8, "overlap_grad_reduce": True, "grad_bucket_MB": 1},
        bw=20e9,
    )
    res_serial = run_case(
        tmp_path,
        parallelism={"pp": 1, "dp": 8, "tp": 1},
        training={"global_batch": 8, "overlap_grad_reduce": False, "grad_bucket_MB": 1},
        bw=20e9,
    )
    a, b = res_overlap.summary, res_serial.summary
    assert a["step_time_s"] < b["step_time_s"]
    # Overlapped, the kernels that share the GPU with an all-reduce run slower (measured
    # interference, fabrics.yaml), never by more than that factor.
    kappa = load_fabrics()["nccl"]["compute_slowdown_beside_comm"]
    assert b["breakdown_s"]["compute"] < a["breakdown_s"]["compute"]
    assert a["breakdown_s"]["compute"] <= b["breakdown_s"]["compute"] * (1 + kappa) + 1e-12
    # Without overlap all the reduction is exposed: bytes / bw in total (fp32 grads).
    grads = 4 * (12 * 1024**2 + 13 * 1024) * 8  # 8 GELU layers' weights and biases, fp32
    assert b["breakdown_s"]["dp_comm"] >= grads / 20e9 * 0.99


@pytest.mark.parametrize(
    "stage_layers,step_T",
    [
        ([2, 6], 7 * 6 + 8),  # (m - 1) * T_max + sum_s T_s: the light first stage fills
        ([6, 2], 8 * 6),  # the heavy first stage never waits: m * T_max
        ([1, 3, 2, 2], None),  # warm-up waits: no simple closed form for the step
    ],
)
def test_stage_imbalance_is_not_bubble(tmp_path, stage_layers, step_T):
    """Issue 15.4: with uneven stages the step follows the heaviest stage (1F1B with
    m = 8 micro-batches; T_s: one micro-batch's forward and backward on stage s, in units of
    one layer's T). The critical process waits m * (T_max - T_crit) for the heaviest stage:
    that is stage imbalance (``pp_imbalance``); only what the heaviest stage itself waits,
    step - m * T_max, is the schedule's bubble."""
    pp, m = len(stage_layers), 8
    res = run_case(
        tmp_path,
        training={"global_batch": m},
        parallelism={"pp": pp, "dp": 1, "tp": 1, "stage_layers": stage_layers},
        gpn=pp,
    )
    s, bd = res.summary, res.summary["breakdown_s"]
    tf_, tb_ = layer_times()
    T = [n * (tf_ + tb_) for n in stage_layers]
    if step_T is not None:
        assert s["step_time_s"] == pytest.approx(step_T * (tf_ + tb_), rel=1e-3)
    crit = int(s["critical_process"].rsplit("s", 1)[-1])
    tol = 1e-3 * s["step_time_s"]  # the tiny embedding and LM head (vocab 8) are left out
    assert bd["pp_imbalance"] == pytest.approx(m * (max(T) - T[crit]), abs=tol)
    assert bd["pp_bubble"] == pytest.approx(s["step_time_s"] - m * max(T), abs=tol)
    assert sum(bd.values()) == pytest.approx(s["step_time_s"], rel=1e-12)
    # What makes the heaviest stage heavier: here only its extra layers' compute.
    why = s.get("pp_imbalance_from")
    if bd["pp_imbalance"] > 0:
        assert why["heaviest_stage"] == stage_layers.index(max(stage_layers))
        assert sum(why["parts_s"].values()) == pytest.approx(bd["pp_imbalance"], rel=1e-9)
        assert why["parts_s"]["compute"] >= 0.99 * bd["pp_imbalance"]
    else:
        assert why is None


def test_busy_within_counts_compute_inside_a_window():
    from simulator.engine.sim import _busy_within

    busy = [(0.0, 1.0), (1.0, 3.0), (4.0, 6.0)]
    assert _busy_within(busy, 0.5, 4.5) == pytest.approx(0.5 + 2.0 + 0.5)
    assert _busy_within(busy, 3.0, 4.0) == 0.0
    assert _busy_within(busy, 7.0, 9.0) == 0.0


def test_dp_collective_slowed_while_its_gpu_computes(tmp_path, monkeypatch):
    """An all-reduce beside backward kernels takes longer by the measured fraction of the time
    it overlapped them (fabrics.yaml comm_slowdown_beside_compute), never by more."""
    import copy

    import simulator.engine.build as build

    case = dict(parallelism={"pp": 1, "dp": 8, "tp": 1},
                training={"global_batch": 8, "overlap_grad_reduce": True, "grad_bucket_MB": 1},
                bw=200e9)
    slowed = run_case(tmp_path, **case)
    fab = copy.deepcopy(load_fabrics())
    table = fab["nccl"]["comm_slowdown_beside_compute"]["H100-SXM-80GB"]["all_reduce"]
    f = max(e for pts in table.values() for _, e in pts)  # the largest measured extra
    fab["nccl"]["comm_slowdown_beside_compute"] = {}
    monkeypatch.setattr(build, "load_fabrics", lambda: fab)
    alone = run_case(tmp_path, **case)

    def durations(res):
        ev = res.events
        ar = ev[(ev["kind"] == "dp_comm") & (ev["gpu"] == ev["gpu"].min())]
        return list(ar["end_s"] - ar["start_s"])

    d1, d0 = durations(slowed), durations(alone)
    assert len(d1) == len(d0) > 1
    ratios = [a / b for a, b in zip(d1, d0, strict=True)]
    assert max(ratios) > 1.01  # buckets issued during backward ran beside its kernels
    assert all(1.0 - 1e-9 <= r <= 1.0 + f + 1e-9 for r in ratios)
    assert slowed.summary["step_time_s"] >= alone.summary["step_time_s"]
