"""A host-bound step of ``n`` ranks is paced by its slowest host (``simulator/model/sync.py``
``host_group_factor``): the closed forms, the fit on the micro-benchmark, the mechanism in the
measured data, and what the engine does with it."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.calibrate import host_spread
from simulator.calibrate.sync import group_penalties
from simulator.hardware.catalog import default_kernel_params, load_gpu
from simulator.model.sync import expected_max_normal, host_group_factor, host_group_size

ROOT = Path(__file__).resolve().parents[1]
TP4 = ROOT / "validation" / "heldout11" / "h11t_tp4_G.yaml"
# the host-bound widths of steps.py --tiny (simulator/calibrate/host.py TINY)
TINY = ("model.hidden=256", "model.ffn_hidden=512", "model.heads=8", "model.kv_heads=4",
        "model.vocab=1024", "model.seq_len=128")


def test_closed_forms():
    """One process is its own pace; two are 1 + s / sqrt(pi) (E[max] of two standard normals),
    four 1 + 1.02938 s (Tippett 1925); every rank of a job is in the group."""
    s = 0.05
    assert host_group_factor(1, s) == 1.0
    assert host_group_factor(2, s) == pytest.approx(1.0 + s / math.sqrt(math.pi), abs=1e-9)
    assert host_group_factor(4, s) == pytest.approx(1.0 + 1.02938 * s, abs=1e-6)
    assert host_group_factor(4, 0.0) == 1.0
    assert [host_group_size(g) for g in (1, 2, 4, 1024)] == [1, 2, 4, 1024]
    assert expected_max_normal(8) > expected_max_normal(4)


def test_shipped_jitter_is_the_refit():
    refit, shipped = host_spread.refit()["defaults.host_jitter"]
    assert refit == pytest.approx(shipped, abs=1e-12)
    assert shipped == load_gpu("H100-SXM-80GB").host_jitter > 0.0


def test_fit_reproduces_the_measured_penalties():
    """The fitted scale gives the measured mean penalty of pairs and of the group of four
    (per-process host times in windows of the same steps, default launches) within a third."""
    pts = host_spread.penalties()
    s = host_spread.fit()
    for n in (2, 4):
        measured = np.mean([p for k, p in pts if k == n])
        assert s * expected_max_normal(n) == pytest.approx(measured, rel=1 / 3), n


def test_one_step_spreads_more_than_a_sum_of_steps():
    """Why the fit takes one step at a time: in host_spread.py's launches of 4 the slowest
    process of a single step is further above the mean than the slowest over 16 consecutive
    steps (part of a process's lag is drawn afresh between steps), and a single DTensor or
    plain eager step of 0.1-0.34 s (dtensor_spread.py) spreads at least as much as a 12 ms one:
    the lag does not average out within one continuous issue."""
    def fours(pts):
        return np.mean([p for n, p in pts if n == 4])
    one = fours(host_spread.penalties(1, dtensor=False))
    sixteen = fours(host_spread.penalties(16, dtensor=False))
    assert one > 1.2 * sixteen
    long = fours([p for t in host_spread.dtensor_issue_times() for p in group_penalties(t)])
    assert long > one


def _dtensor_spread_fours(step: str) -> list[float]:
    """The group-of-4 penalty of each launch and width of dtensor_spread.py's ``step``."""
    out = []
    for path in sorted(host_spread.DTENSOR.glob("dtensor_spread_w4*.jsonl")):
        by: dict = {}
        for r in map(json.loads, path.read_text().splitlines()):
            if r.get("step") == step:
                by.setdefault(r["width"], {}).setdefault(r["run"], {})[r["rank"]] = r["issue_s"]
        for runs in by.values():
            t = np.array([[runs[i][q] for q in sorted(runs[i])] for i in sorted(runs)])
            out.append(float(np.mean(t.max(1) / t.mean(1) - 1.0)))
    return out


def test_dtensor_and_plain_steps_spread_alike():
    """The spread is the box's, not DTensor's: in the same launches of 4 the DTensor TP + SP
    step and the plain eager step of the same processes have group penalties within a quarter
    of each other (so one host_jitter serves both)."""
    dt, plain = np.mean(_dtensor_spread_fours("dt")), np.mean(_dtensor_spread_fours("plain"))
    assert dt == pytest.approx(plain, rel=0.25)


def test_fit_predicts_the_h200_box_dtensor_steps():
    """Data the fit does not read (another box, 4x H200; dtensor_step_host.py's 24-layer and
    dtensor_block_host.py's 20-layer DTensor TP + SP steps, 2 and 4 ranks, 6 launches): the
    mean penalty of pairs and of the four within a third of s e_n."""
    s = host_spread.fit()
    pen: dict[int, list[float]] = {2: [], 4: []}
    step = ROOT / "data/measured/dtensor-step-host-h200x4"
    phases = ("fwd_s", "bwd_s", "ar_s", "opt_s", "zero_s")
    block = ("fwd_host_s", "bwd_host_s", "opt_host_s")
    sources = [(p, phases, lambda r: r["layers"] == 24, ("width",))
               for p in sorted(step.glob("dtensor_step_host_w*.jsonl"))]
    sources += [(p, block, lambda r: True, ("width", "gc")) for p in
                sorted((ROOT / "data/measured/dtensor-block-host-h200x4").glob("*.jsonl"))]
    for path, keys, keep, group in sources:
        by: dict = {}
        for r in map(json.loads, path.read_text().splitlines()):
            if "rank" in r and keep(r):
                k = tuple(r[g] for g in group)
                by.setdefault(k, {}).setdefault(r["run"], {})[r["rank"]] = sum(r[x] for x in keys)
        for runs in by.values():
            t = np.array([[runs[i][q] for q in sorted(runs[i])] for i in sorted(runs)])
            pen[t.shape[1]].append(float(np.mean(t.max(1) / t.mean(1) - 1.0)))
    for n in (2, 4):
        assert len(pen[n]) >= 8, n
        assert np.mean(pen[n]) == pytest.approx(s * expected_max_normal(n), rel=1 / 3), n


def test_a_group_that_meets_finishes_with_its_slowest_host():
    """The mechanism, in the measured data: with an all-reduce after every block (NCCL
    launches asynchronous: every host issues at its own pace), each rank's step, timed until
    its GPU is done, ends when the slowest host has issued the step, not the mean one: the
    group's step exceeds the mean rank's issue time by at least half the slowest's excess,
    and the slowest's issue time by at most a few per cent (the GPU's tail)."""
    for launch in ("n4a", "n4b", "n4c"):
        issue = host_spread.issue_times(launch, "layer")
        step = host_spread.issue_times(launch, "layer", "step_s")
        slowest, mean = issue.max(0).sum(), issue.mean(0).sum()
        group = step.max(0).sum()
        assert group - mean > 0.5 * (slowest - mean), launch
        assert group < 1.05 * slowest, launch


def _run(tmp_path: Path, name: str, jitter: float | None, tp: int, tiny: bool,
         gpus: int = 4) -> dict:
    w = yaml.safe_load(TP4.read_text())
    w["name"] = name
    w["parallelism"]["tp"] = tp
    w["parallelism"]["dp"] = gpus // tp
    w["training"]["global_batch"] = 4 * (gpus // tp)
    w["training"].pop("measured_steps", None)
    topo = yaml.safe_load((TP4.parent / w["cluster"]["topology"]).read_text())
    topo["gpus_per_node"] = gpus
    if jitter is not None:
        topo["gpu"] = {"base": topo["gpu"], "host_jitter": jitter}
    (tmp_path / f"{name}-topo.yaml").write_text(yaml.safe_dump(topo))
    w["cluster"]["topology"] = f"{name}-topo.yaml"
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump(w))
    cmd = [sys.executable, "-m", "simulator", "run", str(f), "--json", "--no-files"]
    for s in TINY if tiny else ():
        cmd += ["--set", s]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True,
                                     cwd=ROOT).stdout)


def test_engine_paces_host_bound_steps_by_the_slowest_host(tmp_path):
    """At host-bound widths a TP 4 step takes about 1 + s e_4 times as long as with no spread
    (all its time is the host's but the GPU's last kernels), DDP 4 too (its ranks meet at the
    gradient all-reduce); one GPU is its own host's pace, untouched; the same TP 4 step at its
    full width, where the GPU sets the pace, moves by less than 1 %."""
    s = default_kernel_params()["host_jitter"]
    f = host_group_factor(4, s)
    for tp in (4, 1):
        t1 = _run(tmp_path, f"tiny{tp}", None, tp, True)["step_time_s"]
        t0 = _run(tmp_path, f"tiny{tp}-0", 0.0, tp, True)["step_time_s"]
        assert 1.0 + 0.9 * (f - 1.0) < t1 / t0 <= f * (1 + 1e-9), tp
    one = _run(tmp_path, "one", None, 1, True, gpus=1)["step_time_s"]
    one0 = _run(tmp_path, "one-0", 0.0, 1, True, gpus=1)["step_time_s"]
    assert one == one0
    full = _run(tmp_path, "full", None, 4, False)["step_time_s"]
    full0 = _run(tmp_path, "full-0", 0.0, 4, False)["step_time_s"]
    assert full == pytest.approx(full0, rel=0.01)
