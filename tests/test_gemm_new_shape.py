"""Eager MoE expert GEMMs of row counts the process has not seen (issue 10/12): cuBLAS's
heuristic query on the host, ``training.measured_steps`` and ``training.moe_routes``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from simulator.calibrate import host as cal
from simulator.config.load import load_workload
from simulator.engine.host import HostRates
from simulator.engine.program import Part
from simulator.hardware.catalog import load_gpu
from simulator.model import kernel_first
from simulator.model.moe import first_launch_drains, load_spec, moe_local, new_shape_share
from simulator.model.shape_cache import slowest_share
from simulator.model.sync import host_group_factor

US = 1e-6
MOE = "validation/heldout7/h7_moe_ep2_Y.yaml"


def test_expert_gemms_pay_the_new_shape_time_by_kind():
    """An expert GEMM's forward, data-gradient and weight-gradient parts each add their own
    new-shape time to the model rate; SwiGLU's w3 GEMMs, routing kernels, dense GEMMs and
    collectives do not."""
    rates = HostRates(40 * US, 80 * US, 0.0, 120 * US,
                      expert_gemm_s=(300 * US, 330 * US, 130 * US))

    def part(name):
        return rates.part_s(Part(name, "compute", 0.0, block="moe"))

    assert part("expert_fc1_e0") == pytest.approx(340 * US)
    assert part("expert_fc2_e3_dgrad") == pytest.approx(370 * US)
    assert part("expert_fc1_e1_wgrad") == pytest.approx(170 * US)
    # SwiGLU's w3: w1's sizes, input and row count, so w1's cache entries serve it
    assert part("expert_fc3_e0") == part("expert_fc3_e2_dgrad") == 40 * US
    assert rates.part_s(Part("permute", "compute", 0.0, block="moe")) == 120 * US
    assert rates.part_s(Part("fc1", "compute", 0.0, block="mlp")) == 40 * US
    assert rates.part_s(Part("moe_dispatch", "comm", 0.0, block="moe")) == 80 * US


def _loc(w):
    """The busiest EP rank's experts of workload ``w``, its MoE layer calls a step and the
    ranks whose tokens an expert takes."""
    t, ep = w.training, w.parallelism.ep
    loc = moe_local(w.model, t.micro_batch, 1, 1, ep, 1, load_spec(t))
    return loc, w.model.layers * t.global_batch // (t.micro_batch * w.parallelism.dp), ep


@pytest.mark.parametrize("sets", [
    {},                                                      # a long run's steady state
    {"measured_steps": (4, 9), "moe_routes": "replayed"},    # same routes every step
    {"measured_steps": (4, 9), "kernels": "fused"},          # grouped GEMM: shapes repeat
])
def test_no_new_shapes(sets):
    w = load_workload(MOE).workload
    t = w.training.model_copy(update={"measured_steps": None} | sets)
    assert new_shape_share(w.model, t, *_loc(w)) == 0.0


def test_new_shapes_of_a_learned_router():
    """A fresh process's benchmark: some counts new, fewer the later the steps timed, more the
    more alike the router sends a call's tokens; none in a dense model."""
    w = load_workload(MOE).workload

    def share(steps, rho):
        t = w.training.model_copy(update={"measured_steps": steps, "moe_route_correlation": rho})
        return new_shape_share(w.model, t, *_loc(w))

    assert 0.0 < share((10, 15), 0.0) < share((4, 9), 0.0) < share((4, 9), 1e-3) < 1.0
    t = w.training.model_copy(update={"measured_steps": (4, 9)})
    assert new_shape_share(w.model.model_copy(update={"moe": None}), t) == 0.0


def test_the_constants_add_up_to_a_measured_expert_mlp():
    """Independent check of the micro-benchmark's per-GEMM constants: an expert MLP forward and
    backward at fresh row counts (two forward GEMMs, two data- and two weight-gradient GEMMs)
    costs its host, measured as a whole, within 25 % of the six constants' sum at each width."""
    rows = cal.jsonl(cal.NEW_SHAPE)
    c = cal.fit_new_shape()
    six = 2 * (c["fwd"] + c["dgrad"] + c["wgrad"])
    for width in ("small", "real"):
        by = {r["mode"]: r["host_us_per_call"] * US for r in rows
              if r["width"] == width and r["kind"] == "mlp_fwd_bwd"}
        assert by["fresh"] - by["fixed"] == pytest.approx(six, rel=0.25)
        assert abs(by["pool"] - by["fixed"]) < 0.1 * (by["fresh"] - by["fixed"])  # seen: no miss


def _step(ms: str) -> float:
    tiny = ["model.hidden=256", "model.ffn_hidden=512", "model.moe.ffn_hidden=512",
            "model.heads=4", "model.kv_heads=4", "model.vocab=1024", "model.seq_len=128",
            f"training.measured_steps={ms}"]
    cmd = [sys.executable, "-m", "simulator", "run", MOE, "--json", "--no-files"]
    for s in tiny:
        cmd += ["--set", s]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["step_time_s"]


def test_a_host_bound_benchmark_step_pays_the_expected_new_shapes():
    """Shrunk to hidden 256 the eager MoE step is its host's time, so a benchmark of a fresh
    process ([4, 9]) is slower than the steady state by exactly the new-shape time of its
    expected new expert GEMMs (and the host time of each first launch of a cuBLAS kernel,
    :mod:`simulator.model.kernel_first`): 6 layers x 2 micro-batches x 4 local experts, each fc1 and fc2
    with a forward, a data-gradient and a weight-gradient GEMM, times the share new at the
    slower of the 2 EP ranks (each layer's forward; each micro-batch's backward), at the pace
    of the slower of the 2 hosts (``host_jitter``)."""
    gpu = load_gpu("H100-SXM-80GB")
    w = load_workload(MOE).workload
    tiny = w.model.model_copy(update={"hidden": 256, "seq_len": 128})
    t = w.training.model_copy(update={"measured_steps": (4, 9)})
    # the row counts of its learned router at the experts' mean loads (not the busiest rank's
    # share of a call: the correlation describes that)
    loc = moe_local(tiny, t.micro_batch, 1, 1, 2, 1, t.moe_expert_load)
    share = new_shape_share(tiny, t, loc, 6 * 2, 2)
    fwd, bwd = slowest_share(share, 4, 2), slowest_share(share, 4 * 6, 2)
    assert share < bwd < fwd < 1.0
    per_expert = 2 * (fwd * gpu.host_gemm_new_shape_fwd_s
                      + bwd * (gpu.host_gemm_new_shape_dgrad_s + gpu.host_gemm_new_shape_wgrad_s))
    paced = host_group_factor(2, gpu.host_jitter)
    # and the expert backwards that launch a cuBLAS kernel new to the process: each a host wait
    # (nothing to wait for: the GPU is ahead), DRAIN_S and cuBLASLt's work for the pass's new
    # kernels; as many in the expert forwards; each layer its slower rank's
    bwds = 6 * 2 * 4
    drains = bwds * slowest_share(first_launch_drains(tiny, t, loc, 6 * 2, 2) / bwds, 4, 2)
    assert round(drains) >= 1
    assert _step("[4,9]") - _step("null") == pytest.approx(
        (6 * 2 * 4 * per_expert + round(drains) * (1 + kernel_first.FORWARD)
         * (kernel_first.DRAIN_S + sum(kernel_first.launch_work()))) * paced, rel=1e-3)


@pytest.mark.parametrize("case", ["h8_moe_ep2_Q", "h8_moe_ep4_Q"])
def test_the_new_row_counts_of_a_collapsing_router_as_logged(case, monkeypatch):
    """The share of expert GEMM calls at a row count new to the process in steps 4-9, as the
    engine draws it (the busiest EP rank's experts at their mean loads, the router's
    correlation), against the share counted from every logged call's rows of the same case
    (data/measured/diagnosis9-h100x4, mean over the ranks: 0.46 at EP 2, 0.53 at EP 4, the
    calls of no rows in the denominator). The busiest rank's share of a call as the experts'
    load (the model before) gave 0.57 and 0.82."""
    from simulator.calibrate import routes
    from simulator.engine import build
    from simulator.run import simulate

    logged = next(c for c in routes.cases() if c.name == case)
    measured = routes.measured_share(logged, 4, 9)
    seen = {}
    orig = build.new_shape_share

    def spy(*a, **k):
        seen["share"] = orig(*a, **k)
        return seen["share"]

    monkeypatch.setattr(build, "new_shape_share", spy)
    simulate(load_workload(f"validation/heldout8/{case}.yaml"))
    assert seen["share"] == pytest.approx(measured, rel=0.1)
