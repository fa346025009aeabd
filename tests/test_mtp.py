"""Multi-token prediction (``model.mtp_depth``) and empty first/last virtual stages: the MTP
module's kernels and bytes by hand, the head program as the sum of its parts, the last
stage's parameters, and the pipeline layouts Megatron-Core runs (embedding or loss alone)."""

from __future__ import annotations

import pytest

from simulator.config.load import load_workload
from simulator.engine.program import Pricer, build_stage_programs, price
from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.model import mtp
from simulator.run import simulate
from tests.conftest import ROOT
from tests.test_bad_input import changed, expect, fails, write

LLAMA = ROOT / "workloads/llama70b.yaml"
H, FFN = 1024, 2816
SMALL = ("model.layers=4", f"model.hidden={H}", f"model.ffn_hidden={FFN}", "model.heads=16",
         "model.kv_heads=4", "model.seq_len=1024", "training.global_batch=8",
         "training.micro_batch=1", "parallelism.tp=2", "parallelism.pp=2", "parallelism.dp=1",
         "parallelism.zero=1", "parallelism.sequence_parallel=true", "topology.nodes=1",
         "topology.gpus_per_node=4")  # fmt: skip


def _model(depth: int):
    return load_workload(LLAMA, (*SMALL, f"model.mtp_depth={depth}")).workload.model


def test_projection_by_hand():
    m = _model(1)
    tokens, tp = 1024, 2
    f = mtp.proj_ops(m, micro_batch=1, tp=tp, sequence_parallel=True, backward=False)
    gemm = next(op for op in f if op.kind == "gemm")
    assert gemm.flops == 2 * tokens * 2 * H * (H // tp)
    comms = [(op.collective, op.bytes) for op in f if op.kind == "comm"]
    # the [b*s, 2h] input gathered from the SP region, the [b*s, h/tp] output over TP
    assert comms == [("all_gather", tokens * 2 * H * 2), ("all_gather", tokens * H * 2)]
    b = mtp.proj_ops(m, micro_batch=1, tp=tp, sequence_parallel=True, backward=True)
    assert sum(op.flops for op in b) == 2 * gemm.flops
    assert [op.collective for op in b if op.kind == "comm"] == ["reduce_scatter"]
    assert mtp.mtp_params(m, 100) == 100 + 2 * H * H + 2 * H


def test_head_program_is_head_plus_modules():
    cm = ComputeModel(load_gpu("H100-SXM-80GB"))
    kw = dict(micro_batch=1, tp=2, sp=True, recompute="none", dtype="bf16", cm=cm,
              comm_cost=lambda dim, op, nbytes: 1e-4)  # fmt: skip
    base = build_stage_programs(model=_model(0), **kw)
    pr = Pricer(cm, "bf16")
    okw = dict(micro_batch=1, tp=2, sequence_parallel=True)

    def dur(prog):
        return sum(p.dur for p in prog)

    proj = [dur(price(mtp.proj_ops(_model(1), backward=b, **okw), pr, kw["comm_cost"]))
            for b in (False, True)]  # fmt: skip
    for depth in (1, 2):
        got = build_stage_programs(model=_model(depth), **kw)
        assert dur(got.head_fwd) == pytest.approx(dur(base.head_fwd) + depth * (
            dur(base.head_fwd) + dur(base.embed_fwd) + proj[0] + dur(base.layer_fwd)))
        assert dur(got.head_bwd) == pytest.approx(dur(base.head_bwd) + depth * (
            dur(base.head_bwd) + dur(base.embed_bwd) + proj[1] + dur(base.layer_bwd)))
        assert got.layer_fwd == base.layer_fwd and got.embed_fwd == base.embed_fwd


def test_mtp_makes_the_last_stage_heavier():
    def run(*extra):
        return simulate(load_workload(LLAMA, (*SMALL, *extra))).summary

    a, b = run(), run("model.mtp_depth=1")
    assert b["step_time_s"] > a["step_time_s"]
    assert b["breakdown_s"]["pp_imbalance"] > a["breakdown_s"]["pp_imbalance"]
    # a layout with the MTP and the loss alone on the last stage (Megatron's ...|mL)
    c = run("model.mtp_depth=1", "parallelism.stage_layers=[4,0]")
    assert c["fits"] and c["step_time_s"] > 0


def test_empty_stages_only_at_the_ends(tmp_path, capsys):
    ok = load_workload(LLAMA, (*SMALL, "parallelism.pp=2", "parallelism.virtual_stages=2",
                               "parallelism.pp_schedule=interleaved",
                               "parallelism.stage_layers=[0,2,2,0]")).workload  # fmt: skip
    assert ok.parallelism.stage_layers == (0, 2, 2, 0)
    # the base case: 8 layers on pp 2
    p = write(tmp_path, changed("parallelism", virtual_stages=2, pp_schedule="interleaved",
                                stage_layers=[4, 0, 4, 0]))  # fmt: skip
    expect(fails(capsys, tmp_path, "run", str(p)), p, "parallelism.stage_layers",
           "virtual stage 1 holds no layer")


def test_plan_prescreen_counts_the_mtp_memory():
    # the estimator's memory of a layout with MTP is the engine's (Mixtral 8x7B, 16 GPUs)
    from simulator.config.load import LoadedWorkload
    from simulator.plan import enumerate_layouts, plan_topology
    from simulator.plan_estimate import Estimator
    from simulator.run import make_machine

    loaded = load_workload(ROOT / "workloads" / "mixtral-8x7b.yaml", ("model.mtp_depth=1",))
    topo = plan_topology(loaded.topology, 16)
    machine = make_machine(LoadedWorkload(loaded.workload, topo, loaded.workload_path,
                                          loaded.topology_path))  # fmt: skip
    est = Estimator(loaded.workload, topo, machine)
    picks = [c for c in enumerate_layouts(loaded.workload, 16, 8)
             if (c.tp, c.pp, c.ep, c.etp, c.zero, c.pp_schedule, c.micro_batch)
             == (1, 2, 8, 1, 1, "1f1b", 1)]  # fmt: skip
    assert picks
    cand = picks[0]
    work, res = est.resolve(cand)
    s = simulate(LoadedWorkload(work, topo, loaded.workload_path, loaded.topology_path),
                 machine=machine).summary  # fmt: skip
    assert est.estimate(cand, res).memory_gib == pytest.approx(s["memory_gib"]["total"],
                                                               rel=1e-9)  # fmt: skip
