"""DualPipe (DeepSeek-V3, arXiv:2412.19437 Section 3.2.1) and DualPipeV as simulated schedules.

Its order (:func:`simulator.parallel.schedules.dualpipe`) runs each pass once per rank, feeds
half of the micro-batches from each end and keeps at most PP + 1 chunks of activations. On a
uniform toy whose kernels are priced by a closed form with ``W = F`` and ``B = 2 F`` (every
GEMM's dgrad and wgrad cost its forward; attention, memory-bound kernels, the LM head and
communication free), the engine's bubble is Table 2's ``(PP/2 - 1)(F&B + B - 3W)``, where a
dense model's ``F&B`` is ``F + B`` (nothing to overlap), and 1F1B's on the same toy is
``(PP - 1)(F + B)``. Each rank holds two stages (2x parameters, the optimizer state sharded
over both copies), and the mirrored copies' gradients are reduced together. DualPipeV (the
same order on ``pp`` ranks holding ``2 pp`` stages in a V) has the same bubble with ``PP = 2 pp``
stages and one copy of the parameters.
"""

from __future__ import annotations

import pandas as pd
import pytest

from simulator.config.load import load_workload
from simulator.engine.build import Machine
from simulator.parallel.schedules import Work, dualpipe, dualpipev, max_in_flight, table2_bubble
from simulator.run import simulate
from tests.conftest import SMALL_MODEL, small_topology, write_case
from tests.stubs import RATE, NoLinks, StubGpu
from tests.test_bad_input import changed, expect, fails, write
from tests.test_engine import StubCollectives, StubCompute
from tests.test_moe_engine import MODEL as MOE_MODEL

VOCAB = 8  # the only dimension of 8 in the toy: the LM head's GEMMs (free below)


class UniformCompute(StubCompute):
    """GEMMs at FLOPs / RATE, everything else free: a layer's F, W and dgrad are equal."""

    def gemm_s(self, m, k, n, dtype="bf16"):
        return 0.0 if VOCAB in (m, k, n) else super().gemm_s(m, k, n, dtype)

    def attention_s(self, *args, **kw):
        return 0.0


def uniform_times(pp: int) -> tuple[float, float, float]:
    """F, B, W of one stage of the toy (SMALL_MODEL's GELU layers, micro-batch 1)."""
    h, s, f = SMALL_MODEL["hidden"], SMALL_MODEL["seq_len"], SMALL_MODEL["ffn_hidden"]
    gemm = 2 * s * (4 * h * h + 2 * h * f) / RATE * (SMALL_MODEL["layers"] // pp)
    return gemm, 2 * gemm, gemm


def run_toy(tmp_path, pp: int, m: int, schedule: str, *, dp: int = 1, zero: int = 0):
    v = 2 if schedule == "dualpipev" else 1
    work = {
        "name": "t",
        "model": {**SMALL_MODEL, "vocab": VOCAB},
        "training": {"global_batch": m * dp, "micro_batch": 1},
        "parallelism": {"pp": pp, "dp": dp, "tp": 1, "zero": zero, "pp_schedule": schedule,
                        "virtual_stages": v},
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_case(tmp_path, work, small_topology(1, pp * dp))
    machine = Machine(StubGpu(), NoLinks(), UniformCompute(), StubCollectives())
    return simulate(load_workload(path), machine=machine, extrapolate=False)


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 10), (8, 16), (16, 32), (16, 40)])
def test_order_runs_every_pass_once_from_both_ends(pp, m):
    half = m // 2
    for rank in range(pp):
        order = dualpipe(rank, pp, m)
        works = [w for item in order for w in ((item,) if isinstance(item, Work) else item)]
        seen: dict[tuple, list[str]] = {}
        for w in works:
            assert w.chunk == (w.microbatch >= half)  # chunk 0: the first half, from rank 0
            seen.setdefault((w.microbatch, w.chunk), []).append(w.phase)
        assert set(seen) == {(mb, int(mb >= half)) for mb in range(m)}
        assert all(ph in (["F", "B"], ["F", "I", "W"]) for ph in seen.values()), seen
        for item in order:  # a pair is a forward and a backward of the two chunks
            if not isinstance(item, Work):
                assert [w.phase for w in item] == ["F", "B"] and item[0].chunk != item[1].chunk
        # Table 2's activation count: PP + 1 chunks in flight (a pair's forward counted
        # before its backward)
        assert max_in_flight(works) == pp + 1


@pytest.mark.parametrize("pp,m", [(2, 6), (4, 8), (4, 10), (8, 16)])
def test_dualpipev_order_runs_both_chunks_of_every_microbatch(pp, m):
    for rank in range(pp):
        order = dualpipev(rank, pp, m)
        works = [w for item in order for w in ((item,) if isinstance(item, Work) else item)]
        seen: dict[tuple, list[str]] = {}
        for w in works:
            seen.setdefault((w.microbatch, w.chunk), []).append(w.phase)
        assert set(seen) == {(mb, c) for mb in range(m) for c in (0, 1)}
        assert all(ph in (["F", "B"], ["F", "I", "W"]) for ph in seen.values()), seen
        assert max_in_flight(works) == 2 * pp + 1  # Table 2: PP + 1 of its 2 pp stages


@pytest.mark.parametrize("pp,m", [(4, 8), (4, 12), (8, 16), (8, 24)])
def test_bubble_is_table2_and_below_1f1b(tmp_path, pp, m):
    f, b, w = uniform_times(pp)
    out = {}
    for sched in ("dualpipe", "1f1b"):
        s = run_toy(tmp_path / sched, pp, m, sched).summary
        out[sched] = s["breakdown_s"]["pp_bubble"] + s["breakdown_s"]["pp_imbalance"]
    assert out["dualpipe"] == pytest.approx(table2_bubble("dualpipe", pp, f, b, w, f + b),
                                            rel=1e-9)  # fmt: skip
    assert out["1f1b"] == pytest.approx(table2_bubble("1f1b", pp, f, b), rel=1e-9)
    assert out["dualpipe"] < out["1f1b"]


@pytest.mark.parametrize("pp,m", [(2, 4), (2, 6), (4, 8), (4, 12)])
def test_dualpipev_bubble_is_table2_over_2pp_stages(tmp_path, pp, m):
    """DualPipeV's row of the README's table: DualPipe's bubble with PP = 2 pp stages (of
    half the layers each), on pp ranks; the step is every rank's 2 m chunks plus it."""
    f, b, w = uniform_times(2 * pp)
    s = run_toy(tmp_path, pp, m, "dualpipev").summary
    bubble = table2_bubble("dualpipe", 2 * pp, f, b, w, f + b)
    assert s["breakdown_s"]["pp_bubble"] + s["breakdown_s"]["pp_imbalance"] == pytest.approx(
        bubble, rel=1e-9)
    assert s["step_time_s"] == pytest.approx(2 * m * (f + b) + bubble, rel=1e-9)


def test_dualpipev_holds_one_copy(tmp_path):
    """Each stage on one rank: the ranks' weights add up to 1F1B's, and with one replica
    nothing is reduced."""
    pp, m = 4, 8
    v, one = run_toy(tmp_path / "v", pp, m, "dualpipev"), run_toy(tmp_path / "o", pp, m, "1f1b")
    assert sum(_per_proc(v, "weights").values()) == pytest.approx(
        sum(_per_proc(one, "weights").values()), rel=1e-12)
    assert _dp_bytes(v) == {}


def _per_proc(res, what: str) -> dict[str, float]:
    mem = res.memory[res.memory["what"] == what]
    return mem.groupby("proc")["delta_bytes"].sum().to_dict()


def _peak_activations(res, proc: str) -> float:
    mem = res.memory[(res.memory["what"] == "activations") & (res.memory["proc"] == proc)]
    return float(mem.sort_values(["t_s", "delta_bytes"])["delta_bytes"].cumsum().max())


def test_two_parameter_copies_and_pp_plus_one_activations(tmp_path):
    pp, m = 4, 8
    dual = run_toy(tmp_path / "d", pp, m, "dualpipe", zero=1)
    one = run_toy(tmp_path / "o", pp, m, "1f1b", zero=1)
    dw, ow = _per_proc(dual, "weights"), _per_proc(one, "weights")
    dopt, oopt = _per_proc(dual, "optimizer"), _per_proc(one, "optimizer")
    for r in range(pp):
        mine, twin = f"c0.s{r}", f"c0.s{pp - 1 - r}"
        # stages r and pp-1-r: both stages' weights; their optimizer state over both copies
        assert dw[mine] == pytest.approx(ow[mine] + ow[twin], rel=1e-12)
        assert dopt[mine] == pytest.approx((oopt[mine] + oopt[twin]) / 2, rel=1e-12)
    # a middle rank holds PP + 1 chunks of activations; 1F1B's stage 1 holds PP - 1
    stage_act = _peak_activations(one, "c0.s1") / (pp - 1)
    assert _peak_activations(dual, f"c0.s{pp // 2 - 1}") == pytest.approx((pp + 1) * stage_act,
                                                                          rel=1e-12)  # fmt: skip


def _dp_bytes(res) -> dict[int, float]:
    """Bytes reduced on the ``dp`` stream by each pipeline rank (one replica class)."""
    rows = res.rows
    df = pd.DataFrame({c: rows.column(c) for c in ("stage", "stream", "bytes")})
    return df[df["stream"] == "dp"].groupby("stage")["bytes"].sum().to_dict()


def test_mirrored_copies_reduce_both_stages_gradients(tmp_path):
    """With one replica DualPipe still reduces: each rank's two stages with the mirrored
    rank's copies. It carries what 1F1B with two replicas reduces for both stages."""
    pp, m = 4, 8
    dual = _dp_bytes(run_toy(tmp_path / "d", pp, m, "dualpipe"))
    one = _dp_bytes(run_toy(tmp_path / "o", pp, m, "1f1b", dp=2))
    assert sorted(dual) == list(range(pp))
    for r in range(pp):
        assert dual[r] == pytest.approx(one[r] + one[pp - 1 - r], rel=1e-12)


def test_dualpipe_mixture_of_experts_overlaps_pairs(tmp_path):
    """An MoE toy with EP: DualPipe's paired chunks hide all-to-all time, so its exposed EP
    time is below plain 1F1B's on the same workload, and the step is shorter."""
    out = {}
    for sched in ("1f1b", "dualpipe"):
        work = {"name": "moe", "model": MOE_MODEL,
                "training": {"global_batch": 64, "micro_batch": 1},
                "parallelism": {"pp": 2, "dp": 4, "tp": 2, "ep": 4, "zero": 1,
                                "sequence_parallel": True, "pp_schedule": sched}}  # fmt: skip
        (tmp_path / sched).mkdir()
        path = write_case(tmp_path / sched, work, small_topology(2, 8, nics_per_node=8))
        out[sched] = simulate(load_workload(path)).summary
    assert out["dualpipe"]["breakdown_s"]["ep_comm"] < out["1f1b"]["breakdown_s"]["ep_comm"]
    assert out["dualpipe"]["step_time_s"] < out["1f1b"]["step_time_s"]


@pytest.mark.parametrize(
    "par,batch,field,words",
    [
        ({"pp": 2, "tp": 1, "dp": 4}, 12, "training.global_batch", ("at least 2 pp = 4", "3")),
        ({"pp": 2, "tp": 2, "dp": 2}, 10, "training.global_batch", ("even", "(got 5)")),
        ({"pp": 1, "tp": 2, "dp": 4}, 8, "parallelism.pp", ("even pp", "got 1")),
        ({"pp": 2, "tp": 2, "dp": 2, "zero": 3}, 8, "parallelism.zero", ("zero 0, 1 or 2",)),
        ({"pp": 2, "tp": 2, "dp": 2, "pp_schedule": "dualpipev"}, 8,
         "parallelism.virtual_stages", ("virtual_stages: 2", "got 1")),
        ({"pp": 2, "tp": 2, "dp": 2, "pp_schedule": "dualpipev", "virtual_stages": 2}, 6,
         "training.global_batch", ("at least 2 pp = 4", "got 3")),
    ],
)
def test_bad_dualpipe_input_is_one_line(tmp_path, capsys, par, batch, field, words):
    work = changed("parallelism", **{"pp_schedule": "dualpipe", **par})
    work["training"]["global_batch"] = batch
    p = write(tmp_path, work)
    expect(fails(capsys, tmp_path, "run", str(p)), p, field, *words)


@pytest.mark.parametrize("schedule", ["dualpipe", "dualpipev"])
def test_full_detail_agrees_with_folded(tmp_path, schedule):
    """Every GPU and every collective step simulated (DualPipe's mirrored reduction's group
    spans both ranks' replicas) gives the folded step."""
    v = 2 if schedule == "dualpipev" else 1
    work = {"name": "x", "model": SMALL_MODEL, "training": {"global_batch": 32, "micro_batch": 1},
            "parallelism": {"pp": 4, "dp": 2, "tp": 1, "zero": 1, "pp_schedule": schedule,
                            "virtual_stages": v}}
    lw = load_workload(write_case(tmp_path, work, small_topology(1, 8, nics_per_node=8)))
    folded, full = simulate(lw).summary, simulate(lw, detail="full").summary
    assert full["step_time_s"] == pytest.approx(folded["step_time_s"], rel=1e-3)
    assert full["memory_gib"]["total"] == pytest.approx(folded["memory_gib"]["total"], rel=1e-9)
