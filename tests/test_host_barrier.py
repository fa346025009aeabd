"""A host read after a collective of ``n`` ranks is a barrier of their hosts
(``simulator/model/sync.py`` ``host_barrier_s``): the closed forms, the fit on the
micro-benchmark, the mechanism in the measured data, and what the engine does with it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.calibrate import host_barrier
from simulator.engine.host import HostRates, program_matrix
from simulator.engine.program import Part
from simulator.hardware.catalog import default_kernel_params, load_gpu
from simulator.model.ops import HOST_SYNC
from simulator.model.sync import BARRIER_SYNCS, expected_max_normal, host_barrier_s

ROOT = Path(__file__).resolve().parents[1]
EP2 = ROOT / "validation" / "heldout7" / "h7_moe_ep2_Y.yaml"
# host-bound widths (the GPU idles): each barrier's time is on the step's path
TINY = ("model.hidden=256", "model.ffn_hidden=512", "model.moe.ffn_hidden=512",
        "model.heads=4", "model.kv_heads=4", "model.vocab=1024", "model.seq_len=128")


def test_closed_forms():
    """One rank has no barrier; a pair pays c / sqrt(pi), four 1.02938 c (E[max] of n
    standard normals, Tippett 1925)."""
    c = 6e-5
    assert host_barrier_s(1, c) == 0.0
    assert host_barrier_s(2, c) == pytest.approx(c / math.sqrt(math.pi), rel=1e-9)
    assert host_barrier_s(4, c) == pytest.approx(1.02938 * c, rel=1e-5)
    assert BARRIER_SYNCS == {"moe_bincount_sync", "moe_counts_sync", "moe_regroup_sync"}


def test_shipped_barrier_is_the_refit():
    refit, shipped = host_barrier.refit()["defaults.host_barrier_s"]
    assert refit == pytest.approx(shipped, abs=1e-12)
    assert shipped == load_gpu("H100-SXM-80GB").host_barrier_s > 0.0


def test_fit_reproduces_each_launch():
    """The fitted scale gives each launch's measured cost a barrier (pair; two launches of
    four) within a third, and one process's read is what host_sync_s and a drained GPU price
    (48 us + the exchange), within 20 us."""
    c = host_barrier.fit()
    for (w, lab), parts in host_barrier.barrier_costs().items():
        assert c * expected_max_normal(w) == pytest.approx(sum(parts), rel=1 / 3), (w, lab)
    assert host_barrier.one_process_read() == pytest.approx(
        load_gpu("H100-SXM-80GB").host_sync_s, abs=2e-5)


def test_the_redraw_is_a_time_a_barrier_not_a_share_of_the_segment():
    """In the launches of four, the sum over segments of each one's slowest rank exceeds the
    slowest rank's sum, by a share of the step that grows as the segments shorten (4 -> 256
    segments a step: the excess is a time per barrier, not a share of the segment) while the
    time per barrier stays within a factor of 3."""
    share, per = {}, {}
    for k in (4, 256):
        r = [host_barrier._per_segment(w, lab, rnd, "sync", k)[0]
             for w, lab in host_barrier.launches() if w == 4
             for rnd in (0, 1)]
        per[k] = float(np.mean(r))
        seg = np.mean([np.mean([s["issue"] for s in host_barrier.runs()[(w, lab, rnd, "sync",
                                                                            k)][0]]) * 1e-6
                       for w, lab in host_barrier.launches() if w == 4 for rnd in (0, 1)])
        share[k] = per[k] / seg
    assert per[4] > 0 and per[256] > 0
    assert share[256] > 10 * share[4]
    assert 1 / 3 < per[256] / per[4] < 3


def _part(name: str, kind: str = "compute") -> Part:
    return Part(name, kind, 1e-6, block="moe")


def test_a_barrier_adds_its_time_to_the_host_path():
    """A program of host-bound kernels and synchronisations: the host path is the kernels'
    host time, plus at each synchronisation the GPU's last kernel (1 us, which the read waits
    for) and sync_s, plus barrier_s at each barrier; a synchronisation that is no barrier
    (Megatron's multihot reads) pays sync_s only."""
    rates = HostRates(op_s=4e-5, collective_s=8e-5, sync_s=5e-5, barrier_s=3e-5)
    prog = (_part("attn"), _part("moe_bincount_sync", HOST_SYNC), _part("permute"),
            _part("moe_counts_sync", HOST_SYNC), _part("expert_x"),
            _part("multihot_sync", HOST_SYNC), _part("combine"))
    _, _, _, hh = program_matrix(prog, rates, lambda parts: 1e-6 * len(parts))
    assert hh == pytest.approx(4 * 4e-5 + 3 * (1e-6 + 5e-5) + 2 * 3e-5, rel=1e-12)
    # scaling the rates by a group's pace leaves the barrier (already a group's figure)
    assert rates.scaled(1.2).barrier_s == 3e-5 and rates.scaled(1.2).sync_s == pytest.approx(6e-5)


def _run(tmp_path: Path, name: str, barrier: float | None) -> float:
    w = yaml.safe_load(EP2.read_text())
    w["name"] = name
    w["training"].pop("measured_steps", None)
    topo = yaml.safe_load((EP2.parent / w["cluster"]["topology"]).read_text())
    if barrier is not None:
        topo["gpu"] = {"base": topo["gpu"], "host_barrier_s": barrier}
    (tmp_path / f"{name}-topo.yaml").write_text(yaml.safe_dump(topo))
    w["cluster"]["topology"] = f"{name}-topo.yaml"
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(w))
    cmd = [sys.executable, "-m", "simulator", "run", str(f), "--json", "--no-files"]
    for s in TINY:
        cmd += ["--set", s]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                     cwd=ROOT).stdout)["step_time_s"]


def test_a_host_bound_ep2_step_pays_every_barrier(tmp_path):
    """steps_alt.py's EP 2 step at host-bound widths: each MoE layer forward reads the host
    twice after the EP exchanges (bincount's range, the counts), 6 layers x 2 micro-batches
    a rank, so the step is 24 x e_2 x host_barrier_s longer than with no barrier cost."""
    w = yaml.safe_load(EP2.read_text())
    micro = w["training"]["global_batch"] // (w["training"]["micro_batch"]
                                              * w["parallelism"]["dp"])
    barriers = 2 * w["model"]["layers"] * micro
    assert barriers == 24
    c = default_kernel_params()["host_barrier_s"]
    with_b, without = _run(tmp_path, "b", None), _run(tmp_path, "b0", 0.0)
    assert with_b - without == pytest.approx(barriers * host_barrier_s(2, c), rel=1e-3)
