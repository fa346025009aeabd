"""Every communication event names the parallel dimension(s) of its group, as the engine issued
it (the events' ``dim``, a collective's ``name@dim`` in ``parts``), and that group is the
layout's: structural invariants over small steps, folded and in full detail."""

from __future__ import annotations

import math
from collections import defaultdict

import pandas as pd
import pytest
import simpy

from simulator.config.load import load_workload
from simulator.engine.build import build_plan, make_job
from simulator.engine.records import EVENT_COLUMNS, parse_parts, part_entry
from simulator.report import timeline
from simulator.run import make_machine, resolve_loaded, simulate
from tests.conftest import SMALL_MODEL, small_topology, write_case

MOE = {**SMALL_MODEL, "moe": {"experts": 8, "top_k": 2, "ffn_hidden": 512, "shared_experts": 1}}

#: (model, training, parallelism): TP + CP + PP; ZeRO-3 over cp x dp; MoE with EP x ETP and
#: expert DP; MoE whose counts run over ETP (ep 1); pipeline scatter/gather without SP
CASES = {
    "tp_cp_pp": (SMALL_MODEL, {"recompute": "full"},
                 {"tp": 2, "cp": 2, "pp": 2, "dp": 1, "sequence_parallel": True}),
    "zero3_cp": (SMALL_MODEL, {}, {"tp": 2, "cp": 2, "pp": 1, "dp": 2, "zero": 3}),
    "moe_ep_etp": (MOE, {"moe_dispatcher": "alltoall"},
                   {"tp": 2, "pp": 2, "dp": 2, "ep": 2, "etp": 2, "sequence_parallel": True}),
    "moe_etp_only": (MOE, {"moe_dispatcher": "alltoall"},
                     {"tp": 2, "pp": 1, "dp": 4, "ep": 1, "etp": 2, "sequence_parallel": True}),
    "moe_allgather": (MOE, {"moe_dispatcher": "allgather"},
                      {"tp": 2, "pp": 2, "dp": 2, "ep": 2, "sequence_parallel": True}),
    "pp_gather": (SMALL_MODEL, {}, {"tp": 2, "pp": 2, "dp": 2, "pp_scatter_gather": True}),
}  # fmt: skip


def _loaded(tmp_path, case: str):
    model, training, par = CASES[case]
    work = {"name": case, "model": model,
            "training": {"global_batch": 8, "micro_batch": 1, **training},
            "parallelism": par}  # fmt: skip
    return load_workload(write_case(tmp_path, work, small_topology(1, 8)))


def _job(loaded):
    return make_job(loaded.workload, loaded.topology, resolve_loaded(loaded),
                    make_machine(loaded))  # fmt: skip


def _size(job, dim: str) -> int:
    """GPUs in a group of ``dim`` (``a+b``: the product of the axes) in the job's layouts."""
    return math.prod(job.layout_of(d).size(d) for d in dim.split("+"))


def test_parts_text_round_trips():
    text = ";".join([part_entry("gemm:a:b", 0.006), part_entry("tp_all_gather", 1e-3, "tp", True),
                     part_entry("moe_dispatch", 2e-3, "ep")])  # fmt: skip
    assert text == "gemm:a:b:0.006;~tp_all_gather@tp:0.001;moe_dispatch@ep:0.002"
    assert parse_parts(text) == [("gemm:a:b", 0.006, ""), ("~tp_all_gather", 1e-3, "tp"),
                                 ("moe_dispatch", 2e-3, "ep")]  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_collective_of_a_folded_step_records_the_dimension_of_its_program(tmp_path, case):
    """Folded: each collective coalesced into a compute row carries the dimension of its part
    in the stage's programs (the engine's own, ``moe_counts`` over etp where ep is 1); every
    row off the compute stream, and a compute row that is one collective, names a dimension
    whose group in the layout has more than one GPU; no collective goes without one."""
    loaded = _loaded(tmp_path, case)
    job = _job(loaded)
    plan, _ = build_plan(job, env=simpy.Environment())
    progs = [prog for p in plan.procs for prog in p.programs.all_programs()]
    comm = {(q.name, q.dim) for prog in progs for q in prog if q.kind == "comm"}
    names = {name for name, _ in comm}
    assert comm
    ev = simulate(loaded).events
    seen = set()
    for text in ev["parts"]:
        for name, _, dim in parse_parts(text):
            base = name.lstrip("~").removeprefix("re_")
            if dim:
                assert (base, dim) in comm, (name, dim)
                seen.add((base, dim))
            else:
                assert base not in names, name
    assert seen  # the step's layers coalesce their collectives
    comm_rows = ev[(ev["stream"] != "compute") | (ev["dim"] != "")]
    assert not comm_rows.empty
    for stream, kind, dim in set(zip(comm_rows["stream"], comm_rows["kind"], comm_rows["dim"],
                                     strict=True)):  # fmt: skip
        assert dim and _size(job, dim) > 1, (stream, kind, dim)
        if stream in plan.group_size:  # a data-parallel stream's group: the layout's
            assert _size(job, dim) == plan.group_size[stream], (stream, dim)
    if case == "moe_etp_only":
        assert ("moe_counts", "etp") in seen
    if case == "pp_gather":
        assert set(ev[ev["kind"] == "pp_comm"]["dim"]) == {"pp", "tp"}
    if case == "zero3_cp":
        assert set(ev[ev["stream"].isin(["dp", "gather"])]["dim"]) == {"cp+dp"}


@pytest.mark.parametrize("case", ["tp_cp_pp", "zero3_cp", "moe_ep_etp"])
def test_full_detail_collectives_run_over_the_layout_group_they_name(tmp_path, case):
    """Full detail: every GPU of the layout group that a collective row names (by its GPU's
    coordinates and the row's ``dim``) records the same collective at the same instant, and
    as many GPUs do as a whole number of such groups; a send goes to another pipeline stage."""
    loaded = _loaded(tmp_path, case)
    job = _job(loaded)
    ev = simulate(loaded, detail="full").events
    rows = ev[ev["stream"] != "compute"]
    assert set(rows["stream"]) - {"pp"}
    at = defaultdict(set)
    for r in rows.itertuples(index=False):
        at[(r.stream, r.name, r.start_s, r.end_s)].add(int(r.gpu))
    for r in rows.itertuples(index=False):
        assert r.dim, r
        if r.stream == "pp":
            assert r.dim == "pp"
            continue
        dims = tuple(r.dim.split("+"))
        lay = job.layout_of(dims[0])
        group = set(lay.group(dims, lay.coords(int(r.gpu))))
        members = at[(r.stream, r.name, r.start_s, r.end_s)]
        assert len(group) == _size(job, r.dim) > 1
        assert group <= members and len(members) % len(group) == 0, (r.stream, r.name, r.dim)


def test_timeline_draws_each_coalesced_collective_in_its_recorded_dimension():
    """The timeline's communication rows come from the dimension in ``parts``, whatever the
    collective's name."""
    row = dict(gpu=0, proc="g0", stage=0, stream="compute", kind="fwd", dim="", name="L0 fwd",
               start_s=1.0, end_s=1.010, bytes=0.0, flops=1e12, layer=0, microbatch=2,
               coalesced=5, parts="norm:0.001;moe_counts@etp:0.002;~any_name@tp:0.001;"
                                  "fc1:0.004;re_moe_combine@ep:0.002")  # fmt: skip
    rows = timeline.comm_rows_from_parts(pd.DataFrame([row], columns=list(EVENT_COLUMNS)))
    got = [(r.stream, r.kind, round(r.start_s, 6), round(r.end_s, 6)) for r in rows.itertuples()]
    # ~: beside the next kernel (fc1), so it takes no time of its own in the row
    assert got == [("etp", "etp_comm", 1.001, 1.003), ("tp", "tp_comm", 1.003, 1.004),
                   ("ep", "ep_comm", 1.007, 1.009)]  # fmt: skip


def test_timeline_names_a_row_by_the_dimensions_its_collectives_ran_over(tmp_path):
    """ZeRO-3 over cp x dp: the gradient reduction's row is labelled CP+DP and the gathers'
    ZeRO CP+DP, read from the recorded dimensions; a plain dp row keeps its name."""
    loaded = _loaded(tmp_path, "zero3_cp")
    ev = simulate(loaded).events
    dp_rows = ev[ev["stream"] == "dp"]
    assert set(dp_rows["dim"]) == {"cp+dp"}
    assert timeline.stream_label("dp", dp_rows) == "CP+DP"
    gathers = ev[ev["stream"] == "gather"]
    assert timeline.stream_label("gather", gathers) == "ZeRO CP+DP"
    assert timeline.stream_label("dp", dp_rows.assign(dim="dp")) == "DP"
    assert timeline.stream_label("tp", ev[ev["stream"] == "tp"]) == "TP"
