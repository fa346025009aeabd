"""A step of many micro-batches extrapolated from two or three shorter simulations (the
pipeline's periodic steady state, :mod:`simulator.extrapolate`) equals the simulation of every
micro-batch: step time, every breakdown part, memory, FLOPs and link bytes, for GPipe, 1F1B
and the interleaved schedule, with and without data-parallel overlap, with ZeRO-1 and ZeRO-3,
MoE (with and without skewed routing) and a straggler; the record-by-record check of one
inserted cycle accepts exactly that shape; and the closed-form GPipe bubble still holds at a
large micro-batch count."""

from __future__ import annotations

import pandas as pd
import pytest

from simulator.config.load import load_workload
from simulator.extrapolate import one_cycle_inserted, periodic, points
from simulator.run import simulate
from tests.conftest import SMALL_MODEL, small_topology, write_case
from tests.test_engine import SMALL_MODEL as ENGINE_MODEL
from tests.test_engine import layer_times, run_case
from tests.test_moe_engine import MODEL as MOE_MODEL

# (name, parallelism, training, faults): 8 H100 of one node, or 16 over two nodes (dp 2 or 4)
CASES = [
    ("1f1b, DP overlap", {"pp": 4, "dp": 2, "tp": 1}, {}, None),
    ("1f1b, no DP overlap", {"pp": 4, "dp": 2, "tp": 1}, {"overlap_grad_reduce": False}, None),
    ("gpipe", {"pp": 4, "dp": 2, "tp": 1, "pp_schedule": "gpipe"}, {}, None),
    ("interleaved", {"pp": 4, "dp": 2, "tp": 1, "pp_schedule": "interleaved",
                     "virtual_stages": 2}, {}, None),
    ("ZeRO-1 across nodes", {"pp": 2, "dp": 4, "tp": 2, "zero": 1}, {}, None),
    ("ZeRO-3", {"pp": 2, "dp": 4, "tp": 1, "zero": 3}, {}, None),
    ("straggler", {"pp": 4, "dp": 2, "tp": 1}, {}, {"stragglers": [{"gpu": 5, "slowdown": 1.3}]}),
    ("interleaved, no DP overlap, recompute", {"pp": 4, "dp": 2, "tp": 1,
     "pp_schedule": "interleaved", "virtual_stages": 2},
     {"overlap_grad_reduce": False, "recompute": "selective"}, None),
    ("interleaved, ZeRO-1 over nodes, TP 2", {"pp": 2, "dp": 4, "tp": 2, "zero": 1,
     "pp_schedule": "interleaved", "virtual_stages": 2}, {}, None),
    ("MoE, EP 4", {"pp": 2, "dp": 4, "tp": 2, "ep": 4, "zero": 1, "sequence_parallel": True},
     {}, None),
    ("dualpipe", {"pp": 4, "dp": 2, "tp": 1, "pp_schedule": "dualpipe"}, {}, None),
    ("dualpipe, no DP overlap, recompute", {"pp": 4, "dp": 2, "tp": 1, "zero": 1,
     "pp_schedule": "dualpipe"}, {"overlap_grad_reduce": False, "recompute": "selective"}, None),
    ("dualpipev", {"pp": 4, "dp": 2, "tp": 1, "pp_schedule": "dualpipev",
                   "virtual_stages": 2}, {}, None),
    ("MoE, EP 4, dualpipe", {"pp": 2, "dp": 4, "tp": 2, "ep": 4, "zero": 1,
     "sequence_parallel": True, "pp_schedule": "dualpipe"}, {}, None),
    ("MoE, skewed routing", {"pp": 2, "dp": 4, "tp": 2, "ep": 4, "zero": 1,
     "sequence_parallel": True},
     {"moe_expert_load": [0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05]}, None),
]


#: cases run with the fused host rates at zero: with Megatron-Core's host time (issue 10; the
#: paired passes carry no host clock, the unpaired ones do) this MoE DualPipe step is not
#: periodic record by record at its two points, so it is simulated in full (correct, slower);
#: the extrapolation is what these cases check
HOST_AHEAD = {"MoE, EP 4, dualpipe"}


def _workload(tmp_path, par, training, faults, m, gpu=None):
    dp = par["dp"]
    gpus = par["pp"] * dp * par["tp"]
    work = {
        "name": "x",
        "model": MOE_MODEL if "ep" in par else SMALL_MODEL,
        "training": {"global_batch": m * dp, "micro_batch": 1, **training},
        "parallelism": par,
    }
    if faults:
        work["faults"] = faults
    topo = small_topology(max(1, gpus // 8), min(gpus, 8), nics_per_node=8,
                          **({"gpu": gpu} if gpu else {}))
    return load_workload(write_case(tmp_path, work, topo))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_extrapolated_equals_every_microbatch(tmp_path, case):
    name, par, training, faults = case
    sched = par.get("pp_schedule", "1f1b")
    cycle = {"interleaved": par["pp"], "dualpipe": 2}.get(sched, 1)
    ms = points(10**6, par["pp"], par.get("virtual_stages", 1), sched)
    m = 6 * (ms[0] + cycle)  # just long enough to be extrapolated
    gpu = ({"base": "H100-SXM-80GB", "host_fused_op_s": 0.0, "host_fused_collective_s": 0.0}
           if name in HOST_AHEAD else None)
    lw = _workload(tmp_path, par, training, faults, m, gpu)
    ex = simulate(lw).summary
    full = simulate(lw, extrapolate=False).summary
    assert ex["extrapolated"] == {"microbatches": m, "simulated_microbatches": list(ms)}
    assert full["extrapolated"] is None
    assert ex["step_time_s"] == pytest.approx(full["step_time_s"], rel=1e-9)
    for part, secs in full["breakdown_s"].items():  # each part within 1e-9 of the step
        assert ex["breakdown_s"][part] == pytest.approx(secs, abs=1e-9 * full["step_time_s"])
    assert sum(ex["breakdown_s"].values()) == pytest.approx(ex["step_time_s"], rel=1e-12)
    for k, gib in full["memory_gib"].items():
        assert ex["memory_gib"][k] == pytest.approx(gib, rel=1e-9, abs=1e-9)
    for k in ("tokens_per_s", "mfu", "hfu", "hardware_flops_per_step", "model_flops_per_step"):
        assert ex[k] == pytest.approx(full[k], rel=1e-9), k
    for a, b in zip(ex["busiest_links"], full["busiest_links"], strict=True):
        assert a["bytes"] == pytest.approx(b["bytes"], rel=1e-9)
        assert a["utilization"] == pytest.approx(b["utilization"], rel=1e-5, abs=1e-6)
    for k in ("uniform_step_time_s", "imbalance_cost_s"):
        if k in full.get("moe", {}):
            assert ex["moe"][k] == pytest.approx(full["moe"][k], rel=1e-9, abs=1e-12)
    assert ex["layout"]["microbatches"] == full["layout"]["microbatches"] == m


def _records(rows):
    return pd.DataFrame(rows, columns=["proc", "kind", "start_s", "end_s"])


def test_one_cycle_inserted_accepts_only_one_insertion_and_a_constant_delay():
    """Worked by hand: a stage runs F F B F B B (1 s each); the longer step inserts one
    forward-backward pair after the first three records, which delays the rest by 2 s."""
    kinds = ["F", "F", "B", "F", "B", "B"]
    short = _records([("s0", k, float(i), i + 1.0) for i, k in enumerate(kinds)])
    longer = kinds[:3] + ["F", "B"] + kinds[3:]
    long = _records([("s0", k, float(i), i + 1.0) for i, k in enumerate(longer)])

    def check(lg, shift=2.0):
        return one_cycle_inserted(short, lg, ["proc"], ["start_s", "end_s"], ["kind"], shift,
                                  1e-12)  # fmt: skip

    assert check(long)
    assert not check(long, shift=2.5)  # the rest is not delayed by the step's increment
    late = long.copy()
    late.loc[7, ["start_s", "end_s"]] += 1e-6  # the last backward 1 us late: not periodic
    assert not check(late)
    swapped = long.copy()
    swapped.loc[7, "kind"] = "F"  # the last record of another kind than the short step's
    assert not check(swapped)
    other = long.copy()
    other["proc"] = "s1"  # records of a process the short step did not have
    assert not check(other)


def test_gpipe_bubble_closed_form_at_many_microbatches(tmp_path):
    pp, m = 4, 400
    res = run_case(tmp_path, training={"global_batch": m},
                   parallelism={"pp": pp, "dp": 1, "tp": 1, "pp_schedule": "gpipe"}, gpn=pp)
    s = res.summary
    assert s["extrapolated"]["microbatches"] == m
    tf_, tb_ = layer_times()
    per_stage = ENGINE_MODEL["layers"] // pp
    assert s["step_time_s"] == pytest.approx((m + pp - 1) * per_stage * (tf_ + tb_), rel=1e-3)
    bubble = s["breakdown_s"]["pp_bubble"] / s["step_time_s"]
    assert bubble == pytest.approx((pp - 1) / (m + pp - 1), rel=1e-3)


def test_gpipe_activation_memory_grows_with_microbatches_1f1b_does_not(tmp_path):
    """Memory from the simulated points: GPipe keeps all m micro-batches, 1F1B at most pp."""
    pp, m = 4, 400
    act = {}
    for sched in ("gpipe", "1f1b"):
        res = run_case(tmp_path, training={"global_batch": m},
                       parallelism={"pp": pp, "dp": 1, "tp": 1, "pp_schedule": sched}, gpn=pp)
        assert res.summary["extrapolated"] is not None
        act[sched] = res.summary["memory_gib"]["activations"]
    short = {}
    for sched in ("gpipe", "1f1b"):  # 4 pp micro-batches: simulated in full
        res = run_case(tmp_path, training={"global_batch": 4 * pp},
                       parallelism={"pp": pp, "dp": 1, "tp": 1, "pp_schedule": sched}, gpn=pp)
        assert res.summary["extrapolated"] is None
        short[sched] = res.summary["memory_gib"]["activations"]
    assert act["gpipe"] == pytest.approx(short["gpipe"] * m / (4 * pp), rel=1e-9)  # all m
    assert act["1f1b"] == pytest.approx(short["1f1b"], rel=1e-9)  # at most pp in flight


def test_points_and_periodicity():
    assert points(1120, 35, 3, "interleaved") == (70, 105)
    assert points(1000, 4, 1, "1f1b") == (8, 9)
    assert points(1000, 4, 1, "gpipe") == (8, 9, 10)
    assert points(53, 4, 1, "1f1b") is None  # short enough to simulate in full
    assert points(54, 4, 1, "1f1b") == (8, 9)
    assert points(1001, 4, 2, "interleaved") is None  # not a whole number of cycles
    assert periodic([1.0, 2.0, 3.0]) and not periodic([1.0, 2.0, 3.1])
    assert periodic([5.0, 5.0, 5.0 + 1e-12])  # a part that does not grow: float noise
