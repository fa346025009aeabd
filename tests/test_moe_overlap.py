"""Combined 1F1B (training.overlap_moe_expert_parallel_comm): the forward of one micro-batch
beside the backward of another, against hand-worked schedules, the order Megatron-Core runs,
and through the engine."""

from __future__ import annotations

import json
import random

import pytest

from simulator.cli import main
from simulator.engine.combined import Item, chain_items, pair_schedule
from simulator.engine.program import Part
from simulator.parallel.schedules import Work, combined, max_in_flight, schedule
from tests.conftest import small_topology, write_case
from tests.test_moe_engine import WORK


def _chain(c: float, a: float, n: int = 1) -> list[Item]:
    """``n`` layers of GPU work ``c``, an all-to-all ``a``, GPU work ``c``."""
    out = []
    for i in range(n):
        out += [Item(i, False, c, c), Item(i, True, a), Item(i, False, c, c)]
    return out


def test_communication_shorter_than_compute_is_hidden():
    # B: d1 [0,1], b1 on the comm stream [1,2] while F's c1 runs [1,2]; F's a1 [2,3] while
    # B's d2 runs [2,3]; F's c2 [3,4]: 4 = the compute alone (run apart: 6)
    r = pair_schedule(_chain(1, 1), _chain(1, 1), 0.0)
    assert r.total == pytest.approx(4.0)
    assert dict(r.exposed).get("ep", 0.0) == pytest.approx(0.0)
    assert r.bwd_segs == ((0.0, 3.0),) and r.fwd_segs == ((1.0, 4.0),)


def test_communication_longer_than_compute_is_the_critical_path():
    # b1 [1,4], F's c1 [1,2]; F's a1 waits for the stream [4,7], B's d2 [4,5]; F's c2 [7,8]:
    # both all-to-alls back to back plus the first and last GPU work, 8 (apart: 10)
    r = pair_schedule(_chain(1, 3), _chain(1, 3), 0.0)
    assert r.total == pytest.approx(1 + 3 + 3 + 1)
    assert dict(r.exposed)["ep"] == pytest.approx(8 - 4)
    assert r.comp == pytest.approx(4.0)


def test_kernels_beside_a_collective_run_slower():
    # c = 2, a = 1, interference 0.5: F's c1 starts beside b1 [2,3] (2/3 done), ends 2 + 1 +
    # 4/3; B's d2 starts then beside a1 (the same), ends 2 + 2 (1 + 4/3); F's c2 after: 8 + 2/3
    r = pair_schedule(_chain(2, 1), _chain(2, 1), 0.5)
    assert r.total == pytest.approx(8 + 2 / 3)
    assert r.comp == pytest.approx(r.total)  # the GPU never waits


@pytest.mark.parametrize("seed", range(20))
def test_pair_lies_between_the_longer_stream_and_running_apart(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 4)
    f = [Item(i // 3, i % 3 == 1, d, 0.0 if i % 3 == 1 else d)
         for i, d in enumerate(rng.uniform(0.1, 3) for _ in range(3 * n))]  # fmt: skip
    b = [Item(i // 3, i % 3 == 1, d, 0.0 if i % 3 == 1 else d)
         for i, d in enumerate(rng.uniform(0.1, 3) for _ in range(3 * n))]  # fmt: skip
    gpu = sum(x.dur for x in f + b if not x.comm)
    comm = sum(x.dur for x in f + b if x.comm)
    r = pair_schedule(f, b, 0.0)
    assert max(gpu, comm) - 1e-9 <= r.total <= gpu + comm + 1e-9
    assert r.comp == pytest.approx(gpu)
    assert sum(dict(r.exposed).values()) == pytest.approx(r.total - gpu)


def test_chain_splits_segments_at_ep_collectives():
    prog = (Part("a", "compute", 1.0, 5.0), Part("tp_rs", "comm", 0.5, dim="tp"),
            Part("moe_dispatch", "comm", 2.0, dim="ep"), Part("b", "compute", 3.0))  # fmt: skip
    items = chain_items([("L0 fwd", 0, prog), ("L1 fwd", 1, prog)], 1.0, 0.0)
    assert [(x.seg, x.comm, x.dur) for x in items] == [
        (0, False, 1.5), (0, True, 2.0), (0, False, 3.0),
        (1, False, 1.5), (1, True, 2.0), (1, False, 3.0),
    ]  # fmt: skip
    assert items[0].exposed == (("tp", 0.5),)


@pytest.mark.parametrize("name,pp,m,v", [("1f1b", 1, 6, 1), ("1f1b", 4, 8, 1),
                                         ("interleaved", 4, 8, 2), ("interleaved", 2, 6, 3)])
def test_combined_order_pairs_independent_micro_batches(name, pp, m, v):
    for stage in range(pp):
        plain = schedule(name, stage, pp, m, v)
        order = schedule(name, stage, pp, m, v, combine=True)
        assert sorted(order) == sorted(plain)  # the same passes, reordered
        # Megatron-Core's interleaved warm-up, plus one forward (1F1B: one model chunk)
        warmup = min(2 * (pp - stage - 1) + (v - 1) * pp + 1, m * v)
        first_b = next(i for i, w in enumerate(order) if w.phase == "B")
        assert first_b == (warmup + 1 if warmup < m * v else m * v)
        steps = combined(order, m)
        pairs = [s for s in steps if not isinstance(s, Work)]
        assert pairs and all(f.phase == "F" and b.phase == "B" and f.microbatch != b.microbatch
                             for f, b in pairs)  # fmt: skip
        assert max_in_flight(order) >= max_in_flight(plain)


def _run(tmp_path, capsys, overlap: bool, **par) -> dict:
    work = {**WORK, "training": {**WORK["training"], "global_batch": 32,
                                 "overlap_moe_expert_parallel_comm": overlap},
            "parallelism": {**WORK["parallelism"], "tp": 1, "pp": 1, "ep": 8, **par}}  # fmt: skip
    p = write_case(tmp_path, work, small_topology(2, 4))  # EP 8 over two 4-GPU nodes
    assert main(["run", str(p), "--json", "--no-files"]) == 0
    return json.loads(capsys.readouterr().out)


def test_engine_hides_the_all_to_all_in_the_steady_state(tmp_path, capsys):
    off = _run(tmp_path, capsys, False)
    on = _run(tmp_path, capsys, True)
    assert on["step_time_s"] < off["step_time_s"]
    assert on["breakdown_s"]["ep_comm"] < off["breakdown_s"]["ep_comm"]
    assert sum(on["breakdown_s"].values()) == pytest.approx(on["step_time_s"], rel=1e-9)
    assert on["hardware_flops_per_step"] == pytest.approx(off["hardware_flops_per_step"])


def test_overlap_switch_is_refused_where_it_is_not_modelled(tmp_path, capsys):
    work = {**WORK, "training": {**WORK["training"], "overlap_moe_expert_parallel_comm": True,
                                 "moe_dispatcher": "allgather"}}  # fmt: skip
    p = write_case(tmp_path, work, small_topology(2, 8))
    assert main(["run", str(p), "--json", "--no-files"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "training.overlap_moe_expert_parallel_comm" in err
