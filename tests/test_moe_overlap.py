"""Combined 1F1B (training.overlap_moe_expert_parallel_comm): the forward of one micro-batch
beside the backward of another, against hand-worked schedules, the order Megatron-Core runs,
and through the engine."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from simulator.cli import main
from simulator.engine.combined import (
    EMBED,
    HEAD,
    Item,
    chain_items,
    host_chain_items,
    host_pair_schedule,
    megatron_nodes,
    megatron_order,
    pair_schedule,
)
from simulator.engine.program import Part
from simulator.model.moe import ep_comm_extra
from simulator.network.topology import load_fabrics
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


def test_a_collective_beside_kernels_runs_slower():
    # c = 2, a = 1, extra 0.5: b1 beside F's c1 [2, 3.5] (1.5 s for its 1 s); F's c1 ends at
    # 4; F's a1 [4, 5.5] beside B's d2 [4, 6]; F's c2 [6, 8]: the compute alone, 8 (extra 0:
    # the same, the all-to-all hidden either way). With a = 2 (extra 0: 8 as well): b1 beside
    # c1 [2, 4] does 4/3 of its 2 s, the rest alone to 4 + 2/3, where B's d2 [14/3, 20/3]
    # and F's a1 start (4/3 done beside d2, the rest alone to 22/3); F's c2 [22/3, 28/3]
    ext = [replace(x, extra=0.5) if x.comm else x for x in _chain(2, 1)]
    assert pair_schedule(ext, ext, 0.0).total == pytest.approx(8.0)
    ext = [replace(x, extra=0.5) if x.comm else x for x in _chain(2, 2)]
    assert pair_schedule(_chain(2, 2), _chain(2, 2), 0.0).total == pytest.approx(8.0)
    r = pair_schedule(ext, ext, 0.0)
    assert r.total == pytest.approx(28 / 3)
    assert dict(r.exposed)["ep"] == pytest.approx(28 / 3 - 8)
    # run alone (no kernels beside it) a collective takes its own time
    one = [Item(0, True, 1.0, extra=0.5)]
    assert pair_schedule(one, [], 0.0).total == pytest.approx(1.0)


def test_paired_all_to_all_takes_the_measured_table():
    # nccl.ep_pair_beside_experts as shipped, read back at a measured point and between two
    # (linear in log size), DeepEP's kernels slowed at least by its 20 of 132 SMs
    nccl = load_fabrics()["nccl"]
    pair = nccl["ep_pair_beside_experts"]["H100-SXM-80GB"]
    a2a = dict(map(tuple, pair["all_to_all"][4]))
    gemm = dict(map(tuple, pair["experts"][4]))
    f = ep_comm_extra(nccl, "H100-SXM-80GB", 64, "alltoall", 132)
    part = Part("moe_dispatch", "comm", 1e-3, op="all_to_all", nbytes=32 * 2**20, dim="ep")
    assert f(part) == pytest.approx((a2a[32], gemm[32]))
    mid = replace(part, nbytes=2**20 * (32 * 64) ** 0.5)  # half way in log size
    assert f(mid) == pytest.approx(((a2a[32] + a2a[64]) / 2, (gemm[32] + gemm[64]) / 2))
    d = ep_comm_extra(nccl, "H800", 64, "deepep", 132)  # H800: the H100's table
    dp = replace(part, op="deepep")
    assert d(dp) == pytest.approx((a2a[32], max(gemm[32], 20 / 112)))
    tp = replace(part, name="tp_all_gather", op="all_gather", dim="tp")
    assert f(tp) == (0.0, -1.0)


def test_deepep_sends_a_token_once_per_gpu_of_its_node_and_once_per_other_node():
    # 8 experts, top-2 at random, 2 a GPU: a GPU is hit with 1 - C(6,2)/C(8,2) = 13/28, a
    # node of two GPUs with 1 - C(4,2)/C(8,2) = 22/28. Four GPUs in one node: the three
    # others' hits, 39/28 vectors a token (an all-to-all of top-2 copies sends 2, 1/2 of them
    # to itself). Two nodes of two: its node peer twice (its own and those it forwards,
    # 2 x 13/28) and the other node's GPU of its index once (22/28)
    from simulator.config.schema import MoEConfig
    from simulator.engine.dispatch import routed_copies

    moe = MoEConfig(experts=8, top_k=2, ffn_hidden=8)

    class Nodes:  # (routed_split reads node_of alone)
        def __init__(self, per):
            self.node_of = lambda g: g // per

    assert routed_copies(moe, Nodes(4), (0, 1, 2, 3)) == pytest.approx(39 / 28)
    assert routed_copies(moe, Nodes(2), (0, 1, 2, 3)) == pytest.approx(48 / 28)


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


# ---------------------------------------------------------------- the host of Megatron-Core's order

def _layer(host: float = 0.0, dur: float = 1.0, seg: int = 0) -> list[Item]:
    """One layer as Megatron-Core's nodes: GPU, EP collective, GPU, EP collective, GPU; each
    item one kernel (or call) of ``host`` seconds of host time."""
    return [Item(seg, k % 2 == 1, dur, 0.0 if k % 2 else dur, (), host, host, host + dur)
            for k in range(5)]


def test_megatron_order_of_one_layer_pair():
    # issue order b0 b1 f0 b2 f1 b3 f2 f3 f4 b4; b0 (the residual add's gradient) and f4 (the
    # add after the combine) on the communication stream, as Megatron-Core's combine node
    f, b = _layer(), _layer()
    order = megatron_order(f, b, [0], [0])
    assert [(c, k) for c, k, _ in order] == [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (0, 3),
                                             (1, 2), (1, 3), (1, 4), (0, 4)]  # fmt: skip
    assert [s for _, _, s in order] == [True, True, False, False, True, True, False, True,
                                        True, False]  # fmt: skip
    # by hand (all 1 s): comm b0 [0,1] b1 [1,2] f1 [2,3] b3 [3,4] f3 [4,5] f4 [5,6];
    # compute f0 [0,1] b2 [2,3] f2 [3,4] b4 [4,5]
    r = host_pair_schedule(f, b, order, 0.0, 0.0)
    assert r.total == pytest.approx(6.0)
    assert r.bwd_segs == ((0.0, 5.0),) and r.fwd_segs == ((0.0, 6.0),)
    assert r.host_end == 0.0


def test_megatron_order_with_collectives_slowed_beside_kernels():
    # the one-layer pair above with every collective 1.5x slower beside kernels (b0 and f4,
    # GPU work on the communication stream, are not collectives): b0 [0, 1], b1 [1, 2]
    # alone, f1 [2, 10/3] (2/3 done beside b2 [2, 3]), b3 [10/3, 14/3] (beside f2 [10/3,
    # 13/3]), f3 [14/3, 6] (beside b4 [14/3, 17/3]), f4 [6, 7]
    f, b = _layer(), _layer()
    order = megatron_order(f, b, [0], [0])
    f, b = ([replace(x, extra=0.5) if x.comm else x for x in c] for c in (f, b))
    r = host_pair_schedule(f, b, order, 0.0, 0.0)
    assert r.total == pytest.approx(7.0)
    assert r.bwd_segs == (pytest.approx((0.0, 17 / 3)),)
    assert r.fwd_segs == (pytest.approx((0.0, 7.0)),)


def test_megatron_order_pairs_layer_i_with_the_backward_of_n_minus_1_minus_i():
    f = [*_layer(seg=0), *_layer(seg=1)]
    b = [*_layer(seg=0), *_layer(seg=1)]
    order = megatron_order(f, b, [0, 1], [1, 0])
    # the first five issued: the backward's layer 1 (segment 0) and the forward's layer 0
    assert [(c, k) for c, k, _ in order[:3]] == [(0, 0), (0, 1), (1, 0)]
    assert sorted((c, k) for c, k, _ in order) == [(c, k) for c in (0, 1) for k in range(10)]


def test_host_bound_step_is_the_host_total_plus_the_last_kernel():
    # every item takes the host 1 s to issue and the GPU 1 ms: the host issues ten items back
    # to back and the GPU runs the last one after it (the nine others hide behind the host)
    f, b = _layer(1.0, 1e-3), _layer(1.0, 1e-3)
    order = megatron_order(f, b, [0], [0])
    r = host_pair_schedule(f, b, order, 0.0, 0.0)
    assert r.host_end == pytest.approx(10.0)
    assert r.total == pytest.approx(10.0 + 1e-3)
    assert dict(r.exposed)["host"] == pytest.approx(r.total - 4e-3)  # four GPU items
    # a host 2 s late starts everything 2 s later
    r2 = host_pair_schedule(f, b, order, 0.0, 0.0, host0=2.0)
    assert r2.total == pytest.approx(r.total + 2.0)


def test_a_synchronisation_costs_the_resume_time_when_the_host_is_the_slower():
    # the forward experts (f2) wait on the host for the dispatch (f1) as the count copy does:
    # host-bound, the dispatch is long done, so the wait adds the resume time only
    f, b = _layer(1.0, 1e-3), _layer(1.0, 1e-3)
    f[2] = replace(f[2], wait=1, syncs=2)
    order = megatron_order(f, b, [0], [0])
    r = host_pair_schedule(f, b, order, 0.0, 0.25)
    assert r.total == pytest.approx(10.0 + 2 * 0.25 + 1e-3)


def test_a_synchronisation_waits_for_the_gpu_when_it_is_the_slower():
    # no host time but the resume, GPU-bound: the host waits for the dispatch f1 (ends at 3)
    # and resumes at 3.5, so f2 [3.5, 4.5] (the compute stream idles 0.5 s), then b4 behind it
    # [4.5, 5.5] and f3 [4.5, 5.5], f4 [5.5, 6.5]: the one-layer step of 6 s plus the resume
    f, b = _layer(), _layer()
    f[2] = replace(f[2], wait=1, syncs=1)
    r = host_pair_schedule(f, b, megatron_order(f, b, [0], [0]), 0.0, 0.5)
    assert r.total == pytest.approx(6.5)
    assert r.host_end == pytest.approx(3.5)
    # the compute stream idles [1, 2] for b1 and [5.5, 6.5] beside f4, [3, 3.5] for the host
    assert dict(r.exposed) == pytest.approx({"ep": 2.0, "host": 0.5})


@pytest.mark.parametrize("seed", range(20))
def test_host_clock_never_shortens_the_step(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 3)
    f = [it for i in range(n) for it in _layer(seg=i, dur=rng.uniform(0.1, 2))]
    b = [it for i in range(n) for it in _layer(seg=i, dur=rng.uniform(0.1, 2))]
    hf = [replace(it, host_first=h, host_s=h, host_span=h + it.dur)
          for it, h in zip(f, (rng.uniform(0, 1) for _ in f), strict=True)]  # fmt: skip
    hb = [replace(it, host_first=h, host_s=h, host_span=h + it.dur)
          for it, h in zip(b, (rng.uniform(0, 1) for _ in b), strict=True)]  # fmt: skip
    layers = list(range(n))
    order = megatron_order(f, b, layers, layers[::-1])
    r0 = host_pair_schedule(f, b, order, 0.0, 0.0)
    r = host_pair_schedule(hf, hb, order, 0.0, 0.0)
    gpu = sum(x.dur for x, (_, _, s) in zip([*b, *f], order, strict=False) if not s)
    assert r.total >= r0.total - 1e-9
    assert r.total >= r.host_end - 1e-9
    assert r.host_end == pytest.approx(sum(x.host_s for x in hf + hb))
    assert gpu >= 0.0


def test_host_items_split_at_synchronisations_and_wait_where_megatron_waits():
    from simulator.engine.host import HostRates
    from simulator.model.ops import HOST_SYNC

    prog = (Part("attn", "compute", 1.0), Part("moe_counts", "comm", 0.1, dim="ep"),
            Part("moe_counts_sync", HOST_SYNC, 0.0), Part("permute", "compute", 0.2),
            Part("moe_dispatch", "comm", 2.0, dim="ep"), Part("mh1", "compute", 0.1),
            Part("multihot_sync", HOST_SYNC, 0.0), Part("mh2", "compute", 0.5),
            Part("expert", "compute", 2.0), Part("moe_combine", "comm", 2.0, dim="ep"),
            Part("residual2", "compute", 0.3))  # fmt: skip
    items = host_chain_items([("L0 fwd", 0, prog)], 1.0, 0.0, HostRates(1.0, 1.0, 0.5))
    assert [(x.comm, x.dur, x.wait, x.syncs) for x in items] == [
        (False, pytest.approx(1.1), -1, 0),  # attention and the counts (compute stream)
        (False, 0.2, -1, 0),  # the permutation, issued before the host waits ...
        (True, 2.0, 0, 1),  # ... at the dispatch, for the counts (``before_ep_alltoall``)
        (False, 0.1, -1, 0),
        (False, 2.5, 3, 1),  # after the routing map's synchronisation
        (True, 2.0, -1, 0),
        (False, 0.3, -1, 0),
    ]  # fmt: skip
    # issued at 1 s a kernel: the expert GEMM (2 s) can end no earlier than 2 + 2 s after the
    # host starts on mh2 (and mh2 + expert back to back after 1 s: 3.5)
    assert items[4].host_s == 2.0 and items[4].host_span == pytest.approx(4.0)
    assert items[0].host_span == pytest.approx(max(1 + 1.1, 2 + 0.1))


def test_delayed_weight_gradients_leave_the_chain():
    # --delay-wgrad-compute: the experts' weight gradients (b2w) issued after the forward
    # dispatch, the attention's (b4w; the chunk's last backward layer) last; nothing waits
    # for them. All 1 s, no host. comm: b0 [0,1] b1 [1,2] f1 [2,3] b3 [3,4] (after b2, not
    # b2w) f3 [5,6] f4 [6,7]; compute: f0 [0,1] b2 [2,3] b2w [3,4] f2 [4,5] b4 [5,6] b4w [6,7]
    f = _layer()
    b = _layer()
    b = [*b[:3], replace(b[2], dw=True), *b[3:], replace(b[4], dw=True)]
    order = megatron_order(f, b, [0], [0])
    assert [(c, k) for c, k, _ in order] == [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (0, 3),
                                             (0, 4), (1, 2), (1, 3), (1, 4), (0, 5), (0, 6)]  # fmt: skip
    r = host_pair_schedule(f, b, order, 0.0, 0.0)
    assert r.total == pytest.approx(7.0)
    assert r.bwd_segs == ((0.0, 6.0),)  # the pass's result is ready before b4w


def test_host_items_split_out_weight_gradients_of_layers_only():
    from simulator.engine.host import HostRates

    layer = (Part("residual2", "compute", 0.1), Part("moe_combine", "comm", 1.0, dim="ep"),
             Part("expert_fc2_dgrad", "compute", 1.0), Part("expert_fc2_wgrad", "compute", 1.0),
             Part("expert_fc1_dgrad", "compute", 2.0), Part("expert_fc1_wgrad", "compute", 2.0),
             Part("moe_dispatch", "comm", 1.0, dim="ep"), Part("attn", "compute", 3.0),
             Part("qkv_wgrad", "compute", 0.5))  # fmt: skip
    head = (Part("lm_head_dgrad", "compute", 4.0), Part("lm_head_wgrad", "compute", 4.0))
    segs = [("head", -1, head), ("L0 bwd", 0, layer)]
    items = host_chain_items(segs, 1.0, 0.0, HostRates(0.0, 0.0, 0.0), delay_wgrad=True)
    assert [(x.seg, x.comm, x.dw, x.dur) for x in items] == [
        (0, False, False, 8.0),  # the head is no layer node: its weight gradient stays
        (1, False, False, 0.1), (1, True, False, 1.0), (1, False, False, 3.0),
        (1, False, True, 3.0), (1, True, False, 1.0), (1, False, False, 3.0),
        (1, False, True, 0.5),
    ]  # fmt: skip
    plain = host_chain_items(segs, 1.0, 0.0, HostRates(0.0, 0.0, 0.0))
    assert not any(x.dw for x in plain) and len(plain) == 6


def test_delayed_weight_gradients_need_the_combined_schedule(tmp_path, capsys):
    work = {**WORK, "training": {**WORK["training"], "delay_wgrad_compute": True}}
    p = write_case(tmp_path, work, small_topology(2, 8))
    assert main(["run", str(p), "--json", "--no-files"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "training.delay_wgrad_compute" in err


def test_a_head_with_an_mtp_layer_is_paired_as_a_layer():
    # DeepSeek-V3's last stage: the head segment (layer -1) holds the MTP layer's EP
    # collectives: Megatron-Core schedules that layer like the others, so the two heads pair
    # node by node, but the loss after the forward combine (and its gradient before the
    # backward's) stays on the compute stream
    f, b = _layer(), _layer()
    order = megatron_order(f, b, [HEAD], [HEAD])
    assert [(c, k) for c, k, _ in order] == [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (0, 3),
                                             (1, 2), (1, 3), (1, 4), (0, 4)]  # fmt: skip
    assert [s for _, _, s in order] == [f[k].comm if c else b[k].comm for c, k, _ in order]
    # a head without EP collectives is issued whole: the backward's first, the forward's last
    g = [Item(0, False, 1.0, 1.0)]
    assert megatron_order(g, g, [HEAD], [HEAD]) == [(0, 0, False), (1, 0, False)]
    # the embedding: the forward's first, the backward's last
    assert megatron_order(g, g, [EMBED], [EMBED]) == [(1, 0, False), (0, 0, False)]


def test_shared_experts_run_in_the_experts_node():
    # Megatron-Core's combined 1F1B computes the shared experts in the experts' node (compute
    # stream) and only adds their output in the combine node: before the forward combine,
    # after the backward one
    def parts(*names):
        return tuple(Part(n, "comm" if n.startswith("moe_") else "compute", 1.0,
                          dim="ep" if n.startswith("moe_") else None) for n in names)  # fmt: skip

    fwd = parts("attn", "moe_dispatch", "expert_fc1", "moe_combine", "shared_fc1",
                "shared_fc2", "shared_add", "residual2")  # fmt: skip
    assert [q.name for q in megatron_nodes(fwd, True)] == [
        "attn", "moe_dispatch", "expert_fc1", "shared_fc1", "shared_fc2", "moe_combine",
        "shared_add", "residual2"]  # fmt: skip
    bwd = parts("residual2", "shared_fc2_dgrad", "shared_fc1_dgrad", "moe_combine",
                "expert_fc1_dgrad", "moe_dispatch", "attn")  # fmt: skip
    assert [q.name for q in megatron_nodes(bwd, False)] == [
        "residual2", "moe_combine", "shared_fc2_dgrad", "shared_fc1_dgrad", "expert_fc1_dgrad",
        "moe_dispatch", "attn"]  # fmt: skip
    plain = parts("attn", "moe_dispatch", "expert_fc1", "moe_combine", "residual2")
    assert megatron_nodes(plain, True) is plain
