"""``plan``'s analytic estimate and the engine choose the same all-reduce algorithm (NVLS where
the NVSwitch reduces in the switch), so they rank layouts alike on an NVLS-capable fabric.

Two H100 nodes (NVSwitch 3rd generation: NVLS on by default), TP 8 on a wide layer: without
sequence parallelism TP all-reduces; with it, reduce-scatter and all-gather (which NVLS does not
shorten). With NVLS the all-reduce is the faster of the two and without it the slower, so an
estimate that priced a ring where the engine runs NVLS would rank the pair the other way round.
"""

from __future__ import annotations

import pytest

from simulator.config.checks import resolve
from simulator.config.load import load_workload
from simulator.plan import candidate_of
from simulator.plan_estimate import Estimator
from simulator.run import make_machine, simulate
from tests.conftest import small_topology, write_case

#: Llama-2-70B's layer (hidden 8,192, SwiGLU 28,672, GQA 64/8), four of them.
WIDE = {"layers": 4, "hidden": 8192, "ffn_hidden": 28672, "heads": 64, "kv_heads": 8,
        "vocab": 32000, "seq_len": 4096, "activation": "swiglu"}  # fmt: skip


def _both(tmp_path, nvls: bool, sp: bool) -> tuple[dict, object]:
    """(simulated summary, estimate) of TP 8 x DP 2 with ``sequence_parallel = sp``."""
    work = {"name": "nvls", "model": WIDE, "training": {"global_batch": 8, "micro_batch": 1},
            "parallelism": {"tp": 8, "pp": 1, "dp": 2, "zero": 1, "sequence_parallel": sp}}
    d = tmp_path / f"nvls{int(nvls)}-sp{int(sp)}"
    d.mkdir()
    loaded = load_workload(write_case(d, work, small_topology(2, 8, nvls=nvls)))
    machine = make_machine(loaded)
    res = resolve(loaded.workload, loaded.topology, file=str(loaded.workload_path))
    est = Estimator(loaded.workload, loaded.topology, machine)
    return simulate(loaded, machine=machine).summary, est.estimate(
        candidate_of(loaded.workload, res), res)


@pytest.mark.parametrize("nvls", [True, False], ids=["nvls", "ring"])
def test_estimate_ranks_all_reduce_and_sequence_parallel_as_the_engine(tmp_path, nvls):
    (sim_ar, est_ar), (sim_sp, est_sp) = (_both(tmp_path, nvls, sp) for sp in (False, True))
    # the same order in the estimate and in the simulated step ...
    assert (est_ar.step_time_s < est_sp.step_time_s) == (
        sim_ar["step_time_s"] < sim_sp["step_time_s"])
    # ... which NVLS decides: in the switch the all-reduce wins, as a ring it loses
    assert (sim_ar["step_time_s"] < sim_sp["step_time_s"]) == nvls
    # and the estimate prices the TP all-reduce as the engine does (the same algorithm)
    assert est_ar.breakdown_s["tp_comm"] == pytest.approx(sim_ar["breakdown_s"]["tp_comm"],
                                                          rel=0.05)  # fmt: skip


def test_estimate_uses_nvls_where_the_fabric_has_it(tmp_path):
    """With NVLS the estimate's exposed TP all-reduce is shorter, by the engine's factor."""
    (sim_on, est_on), (sim_off, est_off) = (_both(tmp_path, nvls, False) for nvls in (True, False))
    est_ratio = est_on.breakdown_s["tp_comm"] / est_off.breakdown_s["tp_comm"]
    sim_ratio = sim_on["breakdown_s"]["tp_comm"] / sim_off["breakdown_s"]["tp_comm"]
    assert est_ratio < 0.9 and sim_ratio < 0.9
    assert est_ratio == pytest.approx(sim_ratio, rel=0.03)
