"""First launches of cuBLAS kernels in eager expert backwards (simulator/model/kernel_first.py,
the engine's drains): the band rule's closed forms, the expected count against Monte Carlo of
routing and against the drains measured (data/measured/gemm-drain-h100x4,
data/measured/moe-bwd-host-h100x4), the refit, and the host clock's wait."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simulator.calibrate import kernel_bands
from simulator.cli import main
from simulator.engine.host import FIRST_LAUNCH, HostRates, program_matrix, with_drains
from simulator.engine.program import Part
from simulator.model import kernel_first
from simulator.model.kernel_first import band_of, expected_bands, first_launches
from simulator.model.ops import HOST_SYNC
from simulator.model.shape_cache import Stream

REPO = Path(__file__).resolve().parents[1]
AF = REPO / "validation/heldout14/h14_moe_ep4_AF.yaml"


def test_bands_are_eight_rows_then_the_octave_densities():
    m = np.arange(1, 65)
    assert np.array_equal(band_of(m), np.ceil(m / 8))
    # a flat density c over nine octaves: the 8 fine bands and 9 c coarse ones
    flat = (4.0,) * 9
    bands = band_of(np.arange(1, 32769), flat)
    assert len(np.unique(bands)) == 8 + 36
    assert np.all(np.diff(bands) >= 0)
    # no bands above 64 rows: one kernel from 57 rows up
    assert set(band_of(np.arange(57, 5000), (0.0,) * 9)) == {8.0}


def test_expected_bands_match_monte_carlo_of_the_router():
    rng = np.random.default_rng(7)
    n, p, rho, calls, steps = 400, 0.2, 0.3, 3, 4
    s = 1 / rho - 1
    trials = 20000
    probs = rng.beta(p * s, (1 - p) * s, size=(trials, calls * steps))
    counts = rng.binomial(n, probs)
    bands = band_of(np.maximum(counts, 1))
    distinct = [len(set(b[c > 0])) for b, c in zip(bands, counts, strict=True)]
    mc, se = float(np.mean(distinct)), float(np.std(distinct)) / trials**0.5
    assert expected_bands([Stream(n, p, rho, calls)], steps) == pytest.approx(mc, abs=4 * se)


def test_window_is_the_new_bands_of_its_steps():
    st = [Stream(1000, 0.1, 0.5, 6)]
    assert first_launches(st, 1, 1) == pytest.approx(expected_bands(st, 1))
    assert first_launches(st, 4, 9) * 6 == pytest.approx(
        expected_bands(st, 9) - expected_bands(st, 3))
    # a fresh process meets fewer new kernels as it ages
    assert first_launches(st, 10, 10) < first_launches(st, 2, 2) < first_launches(st, 1, 1)


def test_shipped_bands_are_the_refit():
    for name, (refit, shipped) in kernel_bands.refit().items():
        assert refit == pytest.approx(shipped, abs=1e-12), name


def test_the_rule_counts_the_drains_measured_in_the_eager_ep4_step(capsys, monkeypatch):
    """h14_moe_ep4_AF's expert backwards that drained, steps 4-9 of three launches on 4x H100:
    83 (gemm-drain-h100x4 ``nccl4``: 16 23 14 11 9 10), 73 and 75 (moe-bwd-host-h100x4 ``nccl4``,
    ``nccl4b``) in 24 rank-steps each (2 local experts x 6 layers x 2 micro-batches), with the
    router's correlation of those launches' own logged rows (0.77-0.79: AF's router collapses
    further than h8_moe_ep4_Q's, 0.53, the workload's)."""
    from simulator.model.shape_cache import correlation

    measured = (83 + 73 + 75) / (3 * 24)
    rho = float(np.mean([
        correlation(np.ravel(json.loads(f.read_text())["rows"]), 8 * 1024 * 4)
        for d in ("gemm-drain-h100x4", "moe-bwd-host-h100x4")
        for f in sorted((REPO / "data/measured" / d).glob("bwdhost-nccl4-r*.json"))]))
    assert 0.75 < rho < 0.8
    seen = {}
    from simulator.engine import build

    cls = next(c for c in vars(build).values()
               if isinstance(c, type) and hasattr(c, "moe_layers_on_rank"))
    orig = cls.one_host_rates

    def spy(self):
        loc, layers = self.moe_layers_on_rank()
        from simulator.model.moe import first_launch_drains
        seen["raw"] = first_launch_drains(self.m, self.t, loc, layers * self.job.microbatches,
                                          self.ep * self.etp)
        return orig(self)

    monkeypatch.setattr(cls, "one_host_rates", spy)
    _step(capsys, AF, f"training.moe_route_correlation={rho}")
    assert seen["raw"] == pytest.approx(measured, rel=0.15)


def _part(name: str, kind: str = "compute", dur: float = 1e-3) -> Part:
    return Part(name, kind, dur, block="moe")


def test_a_drain_waits_for_the_gpu_then_spends_its_time():
    prog = tuple(_part(n) for n in ("expert_split_grad_e1", "expert_fc2_e1_dgrad",
                                    "expert_fc2_e1_wgrad", "expert_fc2_e0_dgrad"))
    two = with_drains(prog, 1)
    assert [p.name for p in two] == ["expert_split_grad_e1", FIRST_LAUNCH,
                                     "expert_fc2_e1_dgrad", "expert_fc2_e1_wgrad",
                                     "expert_fc2_e0_dgrad"]
    assert two[1].kind == HOST_SYNC and two[1].dur == 0.0
    assert [p.name for p in with_drains(prog, 5)].count(FIRST_LAUNCH) == 2  # one an expert
    rates = HostRates(op_s=1e-4, collective_s=0.0, sync_s=5e-5, drain_s=3e-4)

    def gpu_time(parts):
        return sum(p.dur for p in parts)

    gg, gh, hg, hh = program_matrix(two, rates, gpu_time)
    # host: waits for the first part's GPU time (1 ms, issued at 0.1 ms), then 0.3 ms, then
    # issues three parts; GPU: the three parts follow the host (idle while it resumed)
    assert hg == pytest.approx(1e-3 + 3e-4 + 3e-4)
    assert gg == pytest.approx(1e-3 + 3e-4 + 1e-4 + 3e-3)
    assert gh == pytest.approx(1e-4 + 1e-3 + 3e-4 + 1e-4 + 3e-3)


def test_a_first_launch_works_before_its_wait_and_after_it():
    """``h' = max(g, h + pre) + post``: the first kernel's host work (``pre``) overlaps the
    GPU's lag; the pass's other first launches (``post``) follow the drain with the GPU idle."""
    prog = tuple(_part(n, dur=d) for n, d in (("expert_split_grad_e1", 1e-3),
                                              ("expert_fc2_e1_dgrad", 1e-3)))
    rates = HostRates(op_s=1e-4, collective_s=0.0, sync_s=0.0, drain_s=5e-5,
                      launch_pre_s=2.4e-3, launch_post_s=1.0e-3)

    def gpu_time(parts):
        return sum(p.dur for p in parts)

    gg, gh, hg, hh = program_matrix(with_drains(prog, 1), rates, gpu_time)
    # entered with the GPU 5 ms behind the host (g = 5 ms, h = 0): the work hides in the lag
    g, h = 5e-3, 0.0
    h_end = max(g + hg, h + hh)
    assert h_end == pytest.approx(max(g + 1e-3, h + 1e-4 + 2.4e-3) + 5e-5 + 1e-3 + 1e-4)
    # entered with the GPU idle: all of it is the GPU's wait
    g_idle = max(0.0 + gg, 0.0 + gh)
    assert g_idle == pytest.approx(1e-4 + 2.4e-3 + 5e-5 + 1e-3 + 1e-4 + 1e-3)
    pre, post = kernel_first.launch_work()
    assert pre == pytest.approx(kernel_first.FIRST_LAUNCH_BEFORE * kernel_first.FIRST_LAUNCH_S)
    assert pre + post == pytest.approx(kernel_first.KERNELS_PER_PASS
                                       * kernel_first.FIRST_LAUNCH_S)


def test_forward_drains_fall_before_the_experts_first_gemm():
    prog = tuple(_part(n) for n in ("expert_slice_e0", "expert_fc1_e0", "expert_act_e0",
                                    "expert_fc2_e0", "expert_fc1_e1", "expert_fc2_e1"))
    fwd = [p.name for p in with_drains(prog, 1, forward=True)]
    assert fwd == ["expert_slice_e0", FIRST_LAUNCH, "expert_fc1_e0", "expert_act_e0",
                   "expert_fc2_e0", "expert_fc1_e1", "expert_fc2_e1"]
    assert [p.name for p in with_drains(prog, 3, forward=True)].count(FIRST_LAUNCH) == 2
    assert FIRST_LAUNCH not in [p.name for p in with_drains(prog, 2)]  # backward: dgrads


def test_drains_are_spread_and_rounded():
    for drains, k in ((3.4, 12), (8.67, 12), (0.45, 16), (12.0, 12)):
        rates = HostRates(0.0, 0.0, 0.0, drains=drains, drain_bwds=k)
        each = [rates.drains_at(i) for i in range(k)]
        assert sum(each) == round(drains)
        assert max(each) <= 1 and each == [rates.drains_at(i + k) for i in range(k)]
    assert HostRates(1.0, 1.0, 1.0, drains=4.0, drain_bwds=12).scaled(2.0).drains == 4.0


def _step(capsys, path: Path, *sets: str) -> dict:
    args = ["run", str(path), "--json", "--no-files", "--no-progress"]
    for s in sets:
        args += ["--set", s]
    capsys.readouterr()
    try:
        main(args)
    except SystemExit:
        pass
    return json.loads(capsys.readouterr().out)


def test_each_drain_holds_the_step_for_its_host_time(capsys, monkeypatch):
    """With a drain's host time raised by 10 ms the GPU idles 10 ms more at each one; fused
    expert code (grouped GEMMs) has none."""
    seen = {}
    orig = HostRates.drains_at

    def count(self, k):
        seen["n"] = round(self.drains)
        return orig(self, k)

    monkeypatch.setattr(HostRates, "drains_at", count)
    base = _step(capsys, AF)["step_time_s"]
    monkeypatch.setattr(kernel_first, "DRAIN_S", kernel_first.DRAIN_S + 0.01)
    longer = _step(capsys, AF)["step_time_s"]
    assert seen["n"] >= 3
    assert longer - base >= 0.99 * 0.01 * seen["n"]
    seen.clear()
    _step(capsys, AF, "training.kernels=fused")
    assert "n" not in seen


def test_the_first_launches_cost_what_loading_the_kernels_beforehand_saved(capsys, monkeypatch):
    """h14_moe_ep4_AF on 4x H100 (gemm-drain-h100x4, ``nccl4`` against ``nccl4pre``: the same
    launch with the expert GEMMs run at 1,408 row counts before the first step): the slowest
    rank's step, median of the 6 timed steps, 0.294 -> 0.234 s. The modelled first launches
    (count, host work and drains, forward and backward) cost the step about as much; the
    drains alone (no host work: the model before gemm-first-launch-h100x4) under a tenth of it."""
    data = REPO / "data/measured/gemm-drain-h100x4"

    def median_step(tag: str) -> float:
        ranks = [json.loads((data / f"bwdhost-{tag}-r{r}.json").read_text())["steps"]
                 for r in range(4)]
        return float(np.median([max(s[i]["wall_s"] for s in ranks)
                                for i in range(len(ranks[0]))]))

    saved = median_step("nccl4") - median_step("nccl4pre")
    shipped = _step(capsys, AF)["step_time_s"]
    monkeypatch.setattr(HostRates, "drains_at", lambda self, k: 0)
    none = _step(capsys, AF)["step_time_s"]
    monkeypatch.undo()
    monkeypatch.setattr(kernel_first, "FIRST_LAUNCH_S", 0.0)
    monkeypatch.setattr(kernel_first, "FORWARD", False)
    waits = _step(capsys, AF)["step_time_s"]
    assert saved == pytest.approx(0.060, abs=0.002)
    assert shipped - none == pytest.approx(saved, rel=0.25)
    assert waits - none < 0.1 * saved
