"""What-if faults on the 1,024-GPU Llama-2-70B workload: a straggler, degraded and failed links.

Straggler. A GPU whose kernels take 1.2x as long slows its whole TP group (every TP
collective waits for it), so its pipeline stage's compute stream is busy ``B_s + 0.2 C_s``
instead of ``B_s`` (``C_s`` its kernels, ``B_s`` kernels plus exposed TP communication). Under
1F1B the pipeline then runs at the pace of its slowest stage (Narayanan et al. 2021): the base
step is already paced by the busiest stage ``B_max``, and stage ``s`` can absorb part of its
extra time in the ``p - 1 - s`` forward passes of its warm-up, so the step grows by about

    P_s = (m - p + 1 + s) / m * (B_s + 0.2 C_s - B_max)

and, whatever the schedule, by no more than ``0.2 C_s`` (a max-plus system: lengthening
activities by a total of ``0.2 C_s`` cannot lengthen its longest path by more). The data-parallel
gradient reduction is a rendezvous of all replicas, so every replica finishes as late as the
straggler's. With a 1.2x straggler on GPU 0 (first stage) the step grows 9.3% (P_0 predicts
10.2%), on GPU 1,023 (last stage, which paces the base step) 12.0% (P_3: 12.7%), when this test
was written; the 0.2 C_s ceiling is 12.5-12.7%. The shortfall against P_s is TP communication
that the slower kernels hide (a collective overlapping the next kernel is hidden longer).
Since the group synchronisation spread (``gpus.yaml`` ``sync_jitter``) every TP 8 group already
computes at ``f = 1 + s e_8`` (its expected slowest GPU); the straggler is the slowest for
sure, so its group runs at 1.2 and the extra is ``(1.2 / f - 1) C_s`` where 0.2 stood above.

Links. DP rings of stage 0 cross every node's NIC 0 for TP rank 0. Halving that NIC on one node
halves the bandwidth of that ring (a ring runs at its slowest link), so the stage's DP
communication takes ~2x as long (its latency part does not grow). A failed NIC is routed
around through the next NIC of the node over NVLink (as NCCL's PXN does); that NIC then
carries two rings, the same 2x. Failing every NIC of a node leaves no route: a one-line error.
"""

from __future__ import annotations

import pytest

from simulator.cli import main
from simulator.config.load import load_workload
from simulator.errors import PlanError
from simulator.hardware.catalog import load_gpu
from simulator.model.sync import group_sync_factor
from simulator.run import make_machine, simulate
from tests.conftest import ROOT

W70 = ROOT / "workloads" / "llama70b.yaml"


@pytest.fixture(scope="module")
def base():
    return simulate(load_workload(W70))


def run(*overrides: str):
    return simulate(load_workload(W70, list(overrides)))


def stage_times(res) -> dict[int, tuple[float, float]]:
    """Per stage of replica class 0: (B, C) = busy time of the compute stream, and the part
    of it spent in kernels (the rows' ``parts`` without the TP collectives)."""
    ev = res.events
    out: dict[int, tuple[float, float]] = {}
    for _proc, rows in ev[(ev["stream"] == "compute") & ev["proc"].str.startswith("c0.")].groupby(
        "proc"
    ):
        busy = float((rows["end_s"] - rows["start_s"]).sum())
        kern = 0.0
        for parts, s, e in zip(rows["parts"], rows["start_s"], rows["end_s"], strict=True):
            if not parts:
                kern += e - s
                continue
            for item in parts.split(";"):
                name, dur = item.rsplit(":", 1)
                if not name.lstrip("~").startswith("tp_"):  # ~: overlapped with the next
                    kern += float(dur)
        out[int(rows["stage"].iloc[0])] = (busy, kern)
    return out


def dp_end(res, proc: str) -> float:
    ev = res.events
    rows = ev[(ev["proc"] == proc) & ev["stream"].isin(["dp", "gather"])]
    return float(rows["end_s"].max())


def dp_time(res, proc: str) -> float:
    ev = res.events
    rows = ev[(ev["proc"] == proc) & ev["stream"].isin(["dp", "gather"])]
    return float((rows["end_s"] - rows["start_s"]).sum())


# --------------------------------------------------------------------------------------------
# Straggler


@pytest.mark.parametrize("gpu,stage", [(0, 0), (300, 1), (1023, 3)])
def test_straggler_lengthens_step_as_the_schedule_implies(base, gpu, stage):
    s0 = base.summary
    m, p = s0["layout"]["microbatches"], s0["layout"]["pp"]
    t0 = s0["step_time_s"]
    times = stage_times(base)
    b_s, c_s = times[stage]
    b_max = max(b for b, _ in times.values())
    f = group_sync_factor(s0["layout"]["tp"], load_gpu(s0["gpu"]).sync_jitter)
    extra = 1.2 / f - 1  # the straggler's group against a group at its expected slowest
    predicted = (m - p + 1 + stage) / m * (b_s + extra * c_s - b_max)
    ceiling = extra * c_s

    res = run(f"faults.stragglers=[{{gpu: {gpu}, slowdown: 1.2}}]")
    grew = res.summary["step_time_s"] - t0
    assert grew <= ceiling * (1 + 1e-9)
    assert 0.85 * predicted <= grew <= 1.0 * predicted, (grew / t0, predicted / t0)
    assert 0.07 < grew / t0 < 0.13  # roughly +17-20% of the compute-bound ~60% of the step

    # The straggler's replica has its own simulated processes; the DP reduction makes the
    # other replicas finish no earlier than the straggler's.
    classes = {p.split(".")[0] for p in res.events["proc"]}
    assert classes == {"c0", "c1"}
    for s in range(p):
        assert dp_end(res, f"c1.s{s}") == pytest.approx(dp_end(res, f"c0.s{s}"), abs=1e-9)


def test_node_straggler_equals_gpu_straggler_when_node_is_one_tp_group(base):
    # tp = 8 = GPUs per node: a TP group is a node and waits for its slowest member anyway.
    a = run("faults.stragglers=[{gpu: 3, slowdown: 1.2}]").summary["step_time_s"]
    b = run("faults.stragglers=[{node: 0, slowdown: 1.2}]").summary["step_time_s"]
    assert a == pytest.approx(b, rel=1e-12)
    assert a > base.summary["step_time_s"]


def test_faster_gpu_is_not_a_speedup(base):
    # Synchronous training waits for the slowest: one fast GPU changes nothing.
    res = run("faults.stragglers=[{gpu: 5, slowdown: 0.5}]")
    assert res.summary["step_time_s"] == pytest.approx(base.summary["step_time_s"], rel=1e-3)


# --------------------------------------------------------------------------------------------
# Degraded and failed links


def test_degraded_nic_slows_dp_communication(base):
    res = run("faults.links=[{kind: nic, node: 0, nic: 0, bandwidth_factor: 0.5}]")
    before, after = dp_time(base, "c0.s0"), dp_time(res, "c0.s0")
    assert 1.7 < after / before <= 2.0  # the ring runs at its slowest link; latency unchanged
    # Stages whose rings do not cross that NIC keep their DP time.
    for s in (1, 2, 3):
        assert dp_time(res, f"c0.s{s}") == pytest.approx(dp_time(base, f"c0.s{s}"), rel=1e-9)
    assert res.summary["breakdown_s"]["dp_comm"] > base.summary["breakdown_s"]["dp_comm"]
    assert res.summary["step_time_s"] > base.summary["step_time_s"]


def test_failed_nic_is_rerouted_through_the_next_nic(base):
    failed = run("faults.links=[{kind: nic, node: 0, nic: 0, bandwidth_factor: 0}]")
    halved = run("faults.links=[{kind: nic, node: 0, nic: 0, bandwidth_factor: 0.5}]")
    # NIC 1 now carries GPU 0's ring as well as GPU 1's: each gets half, like a halved NIC 0.
    assert dp_time(failed, "c0.s0") == pytest.approx(dp_time(halved, "c0.s0"), rel=0.01)
    topo = make_machine(
        load_workload(W70, ["faults.links=[{kind: nic, node: 0, nic: 0, bandwidth_factor: 0}]"])
    ).topology
    names = [topo.link_names[i] for i in topo.route(0, 8)]
    assert "gpu0->nvsw0" in names and "nvsw0->gpu1" in names and "nic0.1->leaf1" in names
    assert not any("nic0.0" in n for n in names)


def test_more_failed_nics_share_the_survivors(base):
    # Three failed NICs of node 0: NIC 3 carries the rings of GPUs 0-3, a quarter each.
    res = run(
        "faults.links=[{kind: nic, node: 0, nic: 0, bandwidth_factor: 0}, "
        "{kind: nic, node: 0, nic: 1, bandwidth_factor: 0}, "
        "{kind: nic, node: 0, nic: 2, bandwidth_factor: 0}]"
    )
    assert 3.4 < dp_time(res, "c0.s0") / dp_time(base, "c0.s0") <= 4.0


def test_degraded_nvlink_slows_tp_communication(base):
    res = run("faults.links=[{kind: nvlink, gpu: 0, bandwidth_factor: 0.5}]")
    ratio = res.summary["breakdown_s"]["tp_comm"] / base.summary["breakdown_s"]["tp_comm"]
    assert 1.3 < ratio <= 2.0  # GPU 0's TP ring runs at half speed; latency unchanged


def test_cut_off_node_is_a_one_line_error(tmp_path, capsys):
    faults = ", ".join(f"{{kind: nic, node: 5, nic: {i}, bandwidth_factor: 0}}" for i in range(8))
    out = tmp_path / "out"
    rc = main(["run", str(W70), "--set", f"faults.links=[{faults}]", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {W70}: faults.links[7].bandwidth_factor: every NIC of node 5")
    assert not out.exists()


def test_topology_names_the_gpus_it_cannot_connect():
    """Below the config checks, the topology itself refuses a route that does not exist."""
    loaded = load_workload(
        W70,
        [
            "faults.links=["
            + ", ".join(f"{{kind: nic, node: 1, nic: {i}, bandwidth_factor: 0}}" for i in range(8))
            + "]"
        ],
    )
    topo = make_machine(loaded).topology
    with pytest.raises(PlanError, match="no path from gpu 0 to gpu 8"):
        topo.route(0, 8)
    assert topo.route(8, 9)  # inside the node NVLink still works
