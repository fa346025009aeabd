"""Issue 12's collective refit: NCCL's protocol choice against NCCL's own log, the protocol's
base latency and the all-to-all's p2p fill in closed form, and how a suite's timing is priced
(device, host-synchronised, or event-timed: the longer of device time and the host's call
interval)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simulator.config.load import load_topology
from simulator.hardware.catalog import load_gpu
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology, load_fabrics
from simulator.validate import run_suite

ROOT = Path(__file__).resolve().parents[1]
DEVICE = ROOT / "data/measured/h100x2-nccl-device"
NCCL = load_fabrics()["nccl"]


def _topo(name: str) -> Topology:
    cfg = load_topology(ROOT / "topologies" / f"{name}.yaml")
    return Topology(cfg, load_gpu(cfg.gpu))


def _choices() -> list[dict]:
    rows = [json.loads(x) for x in (DEVICE / "tuning-choices.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") == "call" and r["op"] in ("all_gather",
                                                                        "reduce_scatter")]


def test_the_protocol_is_the_one_nccl_logged_between_two_h100s():
    """Every all-gather / reduce-scatter NCCL 2.28.9 logged on the pair (24 B - 128 MiB a
    rank): LL up to 512 KiB a rank, Simple above, never LL128, as the model picks it."""
    m = CollectiveModel(_topo("h100x2-nvswitch"))
    logged = _choices()
    assert len(logged) == 19 and {r["protocol"] for r in logged} == {"LL", "SIMPLE"}
    for r in logged:
        total = 2 * r["nccl_bytes"]  # NCCL logs bytes per rank; the model takes the whole buffer
        assert m.algorithm(r["op"], [0, 1], total) == f"ring/{r['protocol'].capitalize()}" \
            .replace("/Ll", "/LL"), r


def test_a_protocol_pays_its_base_latency_beyond_ll():
    """Forcing a protocol on the same call adds NCCL's base latency difference (tuning.cc:
    LL 6.6, LL128 14.0, Simple 8.4 us) to what the steps cost, spread over the steps."""
    m = CollectiveModel(_topo("h200x4-nvswitch"))
    base = NCCL["tuner"]["base_latency_us"]
    g, nbytes = [0, 1, 2, 3], 2.0**20
    for proto in ("LL128", "Simple"):
        c = m.cost("all_gather", [g], nbytes, f"ring/{proto}")
        steps = m.steps("all_gather", g, nbytes, f"ring/{proto}")
        assert len(steps) == 3
        extra = (base[proto] - base["LL"]) * 1e-6
        bare = CollectiveModel(_topo("h200x4-nvswitch"), {**load_fabrics(), "nccl": {
            **NCCL, "tuner": {**NCCL["tuner"], "base_latency_us": {"LL": 0.0, "LL128": 0.0,
                                                                     "Simple": 0.0}}}})
        assert c.time_s - bare.cost("all_gather", [g], nbytes, f"ring/{proto}").time_s == \
            pytest.approx(extra, rel=1e-9)
        assert sum(s.latency_s for s in steps) - sum(
            s.latency_s for s in bare.steps("all_gather", g, nbytes, f"ring/{proto}")) == \
            pytest.approx(extra, rel=1e-9)


@pytest.mark.parametrize("nbytes", [2.0**22, 2.0**28])
def test_the_all_to_all_fill_is_its_own_time_up_to_the_fill_bytes(nbytes):
    """A pair's Simple all-to-all: each rank sends S/2 to the other. Up to
    ``simple_fill_bytes`` of sends the fill adds their time again at the link's rate; beyond,
    ``simple_fill_bytes`` at that rate."""
    topo = _topo("h100x2-nvswitch")
    on, off = CollectiveModel(topo), CollectiveModel(topo)
    off.a2a_fill_bytes = 0.0
    fill, sent = on.a2a_fill_bytes, nbytes / 2
    t_on = on.cost("all_to_all", [[0, 1]], nbytes).time_s
    t_off = off.cost("all_to_all", [[0, 1]], nbytes).time_s
    assert on.algorithm("all_to_all", [0, 1], nbytes) == "direct/Simple"
    # the pair's NVLink at its efficiency (the fill is not scaled by the exchange's share)
    rate = topo.nvlink_Bps * load_fabrics()["links"]["nvlink"]["efficiency"]
    assert t_on - t_off == pytest.approx(min(sent, fill) / rate, rel=1e-6)


@pytest.mark.parametrize("nbytes", [2.0**20 * 3, 2.0**26, 2.0**30])
def test_a_receiver_hot_all_to_all_pays_the_fill_once_at_its_busiest_port(nbytes):
    """comm.py's ``hot`` split in a group of 4 on the H100 box: every rank sends 55 % of S to
    rank 0 and 15 % to each other, so rank 0 receives 3 x 0.55 S = 1.65 S while no rank
    sends more than 0.85 S. The fill is the first ``simple_fill_bytes`` of the busiest
    port's traffic at that port's rate (NVLink x its efficiency), min(1.65 S, F) / rate:
    F / rate from S = 6 MiB on (F = 8.75 MiB), as a uniform exchange's -- not 1.65 / 0.85 of
    it, which a fill in units of the busiest sender's bytes gave. Below, the hot receiver's
    whole receive time again."""
    topo = _topo("h100x4-nvswitch")
    on, off = CollectiveModel(topo), CollectiveModel(topo)
    off.a2a_fill_bytes = 0.0
    hot = [0.55, 0.15, 0.15, 0.15]
    g = [[0, 1, 2, 3]]
    rate = topo.nvlink_Bps * load_fabrics()["links"]["nvlink"]["efficiency"]
    fill = on.a2a_fill_bytes
    got = on.all_to_all_v(g, nbytes, hot).time_s - off.all_to_all_v(g, nbytes, hot).time_s
    assert got == pytest.approx(min(1.65 * nbytes, fill) / rate, rel=1e-6)
    # the same fill as the uniform exchange's once both ports carry more than F
    uni = on.all_to_all_v(g, nbytes, [0.25] * 4).time_s - off.all_to_all_v(
        g, nbytes, [0.25] * 4).time_s
    assert uni == pytest.approx(min(0.75 * nbytes, fill) / rate, rel=1e-6)
    # a sender-hot one by the same rule: rank 0 sends S / 4 to every rank, the others S / 16,
    # so the busiest port is rank 0's send, 3 x S / 4 = 0.75 S (it receives 3 x S / 16)
    send4 = [[0.25] * 4] + [[1 / 16] * 4] * 3
    t = on.all_to_all_v(g, nbytes, send4).time_s - off.all_to_all_v(g, nbytes, send4).time_s
    assert t == pytest.approx(min(0.75 * nbytes, fill) / rate, rel=1e-6)


@pytest.mark.parametrize("nbytes", [256 * 2**20, 2**30])
def test_a_port_loaded_one_way_runs_faster_by_the_reverse_load(nbytes):
    """comm.py's ``hot`` split in a group of 4 (every rank 55 % of S to rank 0, 15 % to each
    other): rank 0's port receives 1.65 S and sends 0.45 S, the others receive 0.45 S and
    send 0.85 S. With reverse load a the busiest port direction carries 1.65 S + 0.45 a S at
    the port's one-way ceiling (NVLink rate x Simple's fraction x bandwidth_fraction): a
    more than without, the rest (launch, fill) the same. A uniform split carries (1 + a) x
    0.75 S both ways. The port alone here (the warps: the tests below)."""
    topo = _topo("h100x4-nvswitch")
    on, off = CollectiveModel(topo), CollectiveModel(topo)
    on.a2a_softness = off.a2a_softness = 0.0
    a = on.a2a_reverse_load = 0.1
    off.a2a_reverse_load = 0.0
    g, hot = [[0, 1, 2, 3]], [0.55, 0.15, 0.15, 0.15]
    rate = topo.nvlink_Bps * load_fabrics()["links"]["nvlink"]["efficiency"]
    simple = next(p for p in on.protocols if p.name == "Simple").fraction
    ceiling = rate * simple * on.a2a_bw_fraction
    got = on.all_to_all_v(g, nbytes, hot).time_s - off.all_to_all_v(g, nbytes, hot).time_s
    assert got == pytest.approx(0.45 * a * nbytes / ceiling, rel=1e-6)
    uni = [0.25] * 4
    got = on.all_to_all_v(g, nbytes, uni).time_s - off.all_to_all_v(g, nbytes, uni).time_s
    assert got == pytest.approx(0.75 * a * nbytes / ceiling, rel=1e-6)


def test_a_pair_is_bound_by_its_port_and_its_warps_together():
    """A uniform exchange of two pairs at once on the H100 box, 256 MiB a rank: NCCL cuts the
    128 MiB to the peer in 16 parts of 8 MiB (kmin 16, a part <= 32 x 512 KiB) on channels
    16-31 (round 1's base, bit reversal of 1 over 5 bits), each alone on its channel, so
    a rank's work there (alone in its channel's thread block) sends 8 MiB and receives 8 MiB on
    its 9 + 10 warps, one side after the other at the rate of the 19: the warps take 16 MiB / (warp_GBps x 19^warp_exponent); the
    port (1 + a) x 128 MiB at its ceiling. The call's data time is (port^p + warps^p)^(1/p),
    p = port_softness, in place of the port's alone."""
    topo = _topo("h100x4-nvswitch")
    on, off = CollectiveModel(topo), CollectiveModel(topo)
    off.a2a_softness = 0.0
    g, S = [[0, 1], [2, 3]], 256 * 2**20
    rate = topo.nvlink_Bps * load_fabrics()["links"]["nvlink"]["efficiency"]
    port = (1 + on.a2a_reverse_load) * S / 2 / (rate * on.a2a_bw_fraction)
    r = on.p2p_rates
    warps = 16 * 2**20 / (r.GBps * 1e9 * 19**r.exponent)
    p = on.a2a_softness
    got = on.cost("all_to_all", g, S).time_s - off.cost("all_to_all", g, S).time_s
    assert got == pytest.approx((port**p + warps**p) ** (1 / p) - port, rel=1e-6)
    # the uneven path prices a uniform split alike
    assert on.all_to_all_v(g, S, [0.5, 0.5]).time_s == pytest.approx(
        on.cost("all_to_all", g, S).time_s, rel=1e-12)


def _suite(tmp_path: Path, timing: str, rows: list[dict]) -> Path:
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    suite = {"kind": "collectives", "name": "t", "role": "development", "timing": timing,
             "data": "m.jsonl", "topology": str(ROOT / "topologies/h100x2-nvswitch.yaml"),
             "ops": ["all_gather"], "bands": [{"name": "all", "tolerance_mape": 10.0}]}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(suite))
    return p


def test_event_timed_rows_are_the_longer_of_device_time_and_the_host_interval(tmp_path):
    m = CollectiveModel(_topo("h100x2-nvswitch"))
    rows = [{"op": "all_gather", "group": 2, "bytes": b, "time_s": 1e-4, "timing": t}
            for b in (4096.0, 2.0**28) for t in ("events", "cuda_events", "device")]
    res = {c.extra["bytes"]: c.predicted for c in run_suite(_suite(tmp_path, "events", rows))
           .cases}
    # the device rows are not read; each events row once per spelling
    assert len(run_suite(_suite(tmp_path, "events", rows)).cases) == 4
    small, big = (m.cost("all_gather", [[0, 1]], b).time_s for b in (4096.0, 2.0**28))
    host = m.topology.gpu.host_events_call_s  # the H100 box's (gpus.yaml)
    assert small < host < big
    assert res[4096] == pytest.approx(host)
    assert res[2**28] == pytest.approx(big)
    dev = {c.extra["bytes"]: c.predicted for c in run_suite(_suite(tmp_path, "device", rows))
           .cases}
    assert dev[4096] == pytest.approx(small) and dev[2**28] == pytest.approx(big)
    sync = run_suite(_suite(tmp_path, "host_sync", [dict(r, timing=None) for r in rows[:1]]))
    assert sync.cases[0].predicted == pytest.approx(small + NCCL["host_sync_overhead_us"] * 1e-6)


def test_uneven_all_to_all_rows_are_priced_part_by_part(tmp_path):
    """A suite's all-to-all rows with ``comm.py``'s uneven splits are priced with the bytes
    each rank sends each peer (the port's time and NCCL's p2p channels' together, parts laid
    out in rank order), not as a uniform call; ``-`` (comm.py's mark on other operations)
    reads as uniform; an unknown pattern is a one-line error."""
    from simulator.errors import ConfigError
    from simulator.network.p2p import narrow_parts, warp_time

    m = CollectiveModel(_topo("h100x2-nvswitch"))
    b = 2.0**28
    rows = [{"op": "all_to_all", "splits": sp, "group": 2, "bytes": b, "time_s": 1e-3}
            for sp in ("uniform", "rotated", "hot")]
    rows.append({"op": "all_gather", "splits": "-", "group": 2, "bytes": b, "time_s": 1e-3})
    path = _suite(tmp_path, "device", rows)
    raw = yaml.safe_load(path.read_text())
    raw.update(ops=["all_to_all", "all_gather"], splits=["uniform", "rotated", "hot"])
    path.write_text(yaml.safe_dump(raw))
    got = {c.name: c.predicted for c in run_suite(path).cases}
    assert sorted(got) == sorted(f"{x} g2 {int(b)}B" for x in (
        "all_to_all", "all_to_all rotated", "all_to_all hot", "all_gather"))
    # comm.py's weights, worked out by hand: rotated W = [3, 1] by (j - s) mod 2 (a quarter
    # to the peer), hot H = [7, 3] (every rank sends 0.7 to rank 0, 0.3 to rank 1)
    # the port: rotated, each rank 0.25 b in and out, (1 + a) x 0.25 b; hot, rank 0 0.7 b in
    # and 0.3 b out, 0.7 b + a x 0.3 b; at the port's one-way ceiling
    rate = m.topology.nvlink_Bps * load_fabrics()["links"]["nvlink"]["efficiency"]
    ports = m.a2a_bw_fraction * rate
    a, p = m.a2a_reverse_load, m.a2a_softness
    alone = CollectiveModel(_topo("h100x2-nvswitch"))
    alone.a2a_softness = 0.0
    for name, table, port in (
            ("rotated", [[0.75 * b, 0.25 * b], [0.25 * b, 0.75 * b]], (1 + a) * 0.25 * b / ports),
            ("hot", [[0.7 * b, 0.3 * b], [0.7 * b, 0.3 * b]], (0.7 + a * 0.3) * b / ports)):
        share = [[x / b for x in row] for row in table]
        rest = alone.all_to_all_v([[0, 1]], b, share).time_s - port  # launch, latency, fill
        warp = warp_time(table, m.p2p_layout, m.p2p_rates, narrow_parts(table))
        want = rest + (port**p + warp**p) ** (1 / p)
        assert got[f"all_to_all {name} g2 {int(b)}B"] == pytest.approx(want, rel=1e-6)
    uniform = got[f"all_to_all g2 {int(b)}B"]
    assert uniform == pytest.approx(m.cost("all_to_all", [[0, 1]], b).time_s, rel=1e-9)
    # a quarter to the peer is less traffic than a half; hot sends 0.7 into rank 0
    assert got[f"all_to_all rotated g2 {int(b)}B"] < uniform < got[f"all_to_all hot g2 {int(b)}B"]
    rows.append({"op": "all_to_all", "splits": "zipf", "group": 2, "bytes": b, "time_s": 1e-3})
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    raw["splits"].append("zipf")
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="unknown all-to-all splits 'zipf'"):
        run_suite(path)
