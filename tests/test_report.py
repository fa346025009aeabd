"""Report views (trace, plots, tables, atomic writers) on a synthetic but realistic step.

The fixture is a hand-scheduled 1F1B pipeline (Narayanan et al., "Memory-Efficient Pipeline-
Parallel DNN Training", 2021: warm-up of p-s-1 forwards, steady one-forward-one-backward,
cool-down backwards), built without the engine so these tests run while the engine is written.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re

import matplotlib
import numpy as np
import pandas as pd
import pytest

matplotlib.use("Agg")

from simulator.engine.build import EXPERT_STREAMS  # noqa: E402
from simulator.engine.records import (  # noqa: E402
    BREAKDOWN_KEYS,
    EVENT_COLUMNS,
    LINK_COLUMNS,
    MEMORY_COLUMNS,
    parse_parts,
)
from simulator.report import io as rio  # noqa: E402
from simulator.report import plots, table, timeline, trace  # noqa: E402

GIB = float(1 << 30)


# --------------------------------------------------------------------------------------------
# Fixture: a 1F1B step


def one_f_one_b_order(p: int, s: int, m: int) -> list[tuple[str, int]]:
    """Op order of stage ``s`` of ``p`` with ``m`` micro-batches under 1F1B."""
    warm = min(p - s - 1, m)
    order = [("fwd", i) for i in range(warm)]
    f, b = warm, 0
    while f < m:
        order.append(("fwd", f))
        f += 1
        order.append(("bwd", b))
        b += 1
    order += [("bwd", i) for i in range(b, m)]
    return order


def make_step(
    p: int = 4,
    m: int = 8,
    layers_per_stage: int = 2,
    gpus_per_stage: int = 2,
    f_layer: float = 4e-3,
    tp_layer: float = 0.5e-3,
    p2p: float = 0.6e-3,
    recompute: bool = False,
    name: str = "gpt-fixture",
):
    """Events, memory, links and summary of a small 1F1B step (tp=gpus_per_stage, dp=1).

    Each layer's forward is one coalesced compute row (qkv, attn, proj, mlp) followed by a TP
    all-reduce on the tp stream during which compute waits; backward costs twice the forward.
    Activations go stage to stage on the pp stream; the last micro-batch's backward overlaps
    DP bucket all-reduces on the dp stream; the optimizer runs after the last bucket.
    """
    rows: list[dict] = []
    mem: list[dict] = []
    t_free = [0.0] * p
    done: dict[tuple[str, int, int], float] = {}
    orders = [one_f_one_b_order(p, s, m) for s in range(p)]
    ptr = [0] * p
    act_bytes = 1.5 * GIB
    w_bytes = 6.0 * GIB
    mem_total = [0.0] * p

    def add(stage, stream, kind, name, t0, t1, **kw):
        for k in range(gpus_per_stage):
            gpu = stage * gpus_per_stage + k
            rows.append(
                {
                    "gpu": gpu,
                    "proc": f"r0.s{stage}" if gpus_per_stage == 1 else f"g{gpu}",
                    "stage": stage,
                    "stream": stream,
                    "kind": kind,
                    "name": name,
                    "start_s": t0,
                    "end_s": t1,
                    "bytes": kw.get("bytes", 0.0),
                    "flops": kw.get("flops", 0.0),
                    "layer": kw.get("layer", -1),
                    "microbatch": kw.get("mb", -1),
                    "coalesced": kw.get("coalesced", 1),
                    "parts": kw.get("parts", ""),
                }
            )

    def alloc(stage, t, delta, what):
        mem_total[stage] += delta
        for k in range(gpus_per_stage):
            gpu = stage * gpus_per_stage + k
            mem.append(
                {
                    "gpu": gpu,
                    "proc": f"g{gpu}",
                    "t_s": t,
                    "delta_bytes": delta,
                    "total_bytes": mem_total[stage],
                    "what": what,
                }
            )

    for s in range(p):
        alloc(s, 0.0, w_bytes, "weights")
        alloc(s, 0.0, w_bytes, "gradients")
        alloc(s, 0.0, 2 * w_bytes, "optimizer")

    fractions = (("qkv", 0.3), ("attn", 0.25), ("proj", 0.1), ("mlp", 0.35))
    remaining = p * m * 2
    while remaining:
        progressed = False
        for s in range(p):
            if ptr[s] >= len(orders[s]):
                continue
            kind, mb = orders[s][ptr[s]]
            if kind == "fwd":
                dep = 0.0 if s == 0 else done.get(("fwd", s - 1, mb))
                dep = dep if s == 0 or dep is None else dep + p2p
            else:
                dep = done.get(("fwd", p - 1, mb)) if s == p - 1 else done.get(("bwd", s + 1, mb))
                dep = dep if s == p - 1 or dep is None else dep + p2p
            if dep is None:
                continue
            t = max(t_free[s], dep)
            if s > 0 and kind == "fwd":
                add(s, "pp", "pp_comm", f"recv act mb{mb}", dep - p2p, dep, bytes=64e6, mb=mb)
            if s < p - 1 and kind == "bwd":
                add(s, "pp", "pp_comm", f"recv grad mb{mb}", dep - p2p, dep, bytes=64e6, mb=mb)
            scale = 1.0 if kind == "fwd" else 2.0
            if kind == "bwd" and recompute:
                for layer in range(layers_per_stage):
                    lid = s * layers_per_stage + layer
                    add(
                        s,
                        "compute",
                        "recompute",
                        f"L{lid} recompute",
                        t,
                        t + f_layer,
                        layer=lid,
                        mb=mb,
                    )
                    t += f_layer
            for layer in range(layers_per_stage):
                lid = s * layers_per_stage + layer
                d = scale * f_layer
                parts = ";".join(f"{n}:{d * fr!r}" for n, fr in fractions)
                add(
                    s,
                    "compute",
                    kind,
                    f"L{lid} {kind}",
                    t,
                    t + d,
                    layer=lid,
                    mb=mb,
                    flops=d * 400e12,
                    coalesced=len(fractions),
                    parts=parts,
                )
                t += d
                add(
                    s,
                    "tp",
                    "tp_comm",
                    f"all_reduce tp L{lid}",
                    t,
                    t + tp_layer,
                    bytes=32e6,
                    layer=lid,
                    mb=mb,
                )
                t += tp_layer
                if kind == "bwd" and mb == m - 1:
                    add(
                        s,
                        "dp",
                        "dp_comm",
                        f"all_reduce dp bucket {layer}",
                        t,
                        t + 3 * f_layer,
                        bytes=200e6,
                        layer=lid,
                    )
            if kind == "fwd":
                alloc(s, t, act_bytes, "activations")
            else:
                alloc(s, t, -act_bytes, "activations")
            if s < p - 1 and kind == "fwd":
                add(s, "pp", "pp_comm", f"send act mb{mb}", t, t + p2p, bytes=64e6, mb=mb)
            if s > 0 and kind == "bwd":
                add(s, "pp", "pp_comm", f"send grad mb{mb}", t, t + p2p, bytes=64e6, mb=mb)
            done[(kind, s, mb)] = t
            t_free[s] = t
            ptr[s] += 1
            remaining -= 1
            progressed = True
        assert progressed, "fixture schedule deadlocked"

    df_rows = pd.DataFrame(rows)
    for s in range(p):
        dp_end = df_rows[(df_rows.stage == s) & (df_rows.stream == "dp")]["end_s"].max()
        t0 = max(t_free[s], dp_end)
        add(s, "compute", "optimizer", "adam step", t0, t0 + 2e-3, bytes=3 * w_bytes)
    events = pd.DataFrame(rows, columns=list(EVENT_COLUMNS))
    events = events.astype(
        {
            "gpu": "int64",
            "stage": "int64",
            "layer": "int64",
            "microbatch": "int64",
            "coalesced": "int64",
        }
    )
    memory = pd.DataFrame(mem, columns=list(MEMORY_COLUMNS))
    links = pd.DataFrame(
        [
            ("gpu0-nvsw0", "nvlink", "gpu0", "nvsw0", 450.0, 9e9, 0.030, 0.61),
            ("gpu1-nvsw0", "nvlink", "gpu1", "nvsw0", 450.0, 9e9, 0.030, 0.61),
            ("node0-nic0-leaf0", "ib", "node0-nic0", "leaf0", 50.0, 2e9, 0.045, 0.83),
            ("leaf0-spine1", "ib", "leaf0", "spine1", 50.0, 1e9, 0.020, 0.35),
        ],
        columns=list(LINK_COLUMNS),
    )
    step = float(events["end_s"].max())
    n_gpus = p * gpus_per_stage
    model_flops = (
        float(events.loc[events.kind.isin(["fwd", "bwd"]), "flops"].sum()) / gpus_per_stage
    )
    compute = 3 * m * layers_per_stage * f_layer
    tp_c = 2 * m * layers_per_stage * tp_layer
    breakdown = {
        "compute": compute,
        "tp_comm": tp_c,
        "dp_comm": 2 * f_layer,
        "pp_comm": 2 * p2p * (p - 1),
        "pp_imbalance": 0.0,
        "optimizer": 2e-3,
        "other": 0.0,
    }
    breakdown["pp_bubble"] = max(0.0, step - sum(breakdown.values()))
    breakdown = {k: breakdown.get(k, 0.0) for k in BREAKDOWN_KEYS}
    summary = {
        "name": name,
        "step_time_s": step,
        "tokens_per_s": m * 4096 / step,
        "mfu": model_flops / step / (n_gpus * 989e12),
        "tflops_per_gpu": model_flops / step / n_gpus / 1e12,
        "breakdown_s": breakdown,
        "memory_gib": {
            "weights": 6.0,
            "gradients": 6.0,
            "optimizer": 12.0,
            "activations": act_bytes / GIB * min(p, m),
            "total": 24.0 + act_bytes / GIB * min(p, m),
            "capacity": 80.0,
        },
        "fits": True,
        "n_gpus": n_gpus,
        "sim_wall_s": 0.0123,
        "events": len(events),
        "topology": "dgx-h100-fixture",
        "gpu": "H100-SXM-80GB",
        "layout": {
            "tp": gpus_per_stage,
            "pp": p,
            "dp": 1,
            "zero": 1,
            "schedule": "1f1b",
            "micro_batches": m,
        },
        "busiest_links": [
            {"link": "node0-nic0-leaf0", "kind": "ib", "utilization": 0.83, "bytes": 2e9},
            {"link": "gpu0-nvsw0", "kind": "nvlink", "utilization": 0.61, "bytes": 9e9},
        ],
        "warnings": [],
    }
    return events, memory, links, summary


@pytest.fixture(scope="module")
def step():
    return make_step()


def link_series(events: pd.DataFrame) -> pd.DataFrame:
    t = np.linspace(0.0, float(events["end_s"].max()), 9)
    rows = []
    for link, base in (("node0-nic0-leaf0", 0.8), ("gpu0-nvsw0", 0.5)):
        for i, ti in enumerate(t):
            rows.append({"link": link, "t_s": float(ti), "utilization": base * (i % 3) / 2})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Fixture sanity (so the other tests test something realistic)


def test_fixture_is_a_1f1b_schedule(step):
    events, memory, _, summary = step
    p, m = 4, 8
    assert one_f_one_b_order(4, 0, 8)[:4] == [("fwd", 0), ("fwd", 1), ("fwd", 2), ("fwd", 3)]
    assert one_f_one_b_order(4, 3, 8)[:2] == [("fwd", 0), ("bwd", 0)]
    rep = events[events.gpu == 0]
    assert set(rep.stream) == {"compute", "tp", "dp", "pp"}
    # No two ops overlap on one compute stream.
    for _, g in events[events.stream == "compute"].groupby("gpu"):
        g = g.sort_values("start_s")
        assert (g["start_s"].to_numpy()[1:] >= g["end_s"].to_numpy()[:-1] - 1e-12).all()
    # Closed form of the 1F1B step without comm: (m + p - 1) * (f + b) per layer-set.
    assert summary["step_time_s"] > (m + p - 1) * 3 * 2 * 4e-3
    assert abs(sum(summary["breakdown_s"].values()) - summary["step_time_s"]) < 1e-12
    assert (memory.groupby("gpu")["delta_bytes"].sum() > 0).all()


# --------------------------------------------------------------------------------------------
# Trace


def _by_ph(tr: dict, ph: str) -> list[dict]:
    return [e for e in tr["traceEvents"] if e["ph"] == ph]


def test_trace_is_valid_json_with_a_process_per_gpu_and_a_track_per_stream(step):
    events, memory, links, _ = step
    tr = trace.perfetto_trace(events, memory, links, link_series=link_series(events))
    text = json.dumps(tr, allow_nan=False)  # strict JSON: no NaN/inf
    tr = json.loads(text)
    meta = _by_ph(tr, "M")
    procs = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    gpus = sorted(set(events["gpu"]))
    pids = [trace.gpu_pid(g) for g in gpus]
    assert [p for p in procs if p in pids] == pids and 0 not in procs
    for gpu in gpus:
        stage = int(events.loc[events.gpu == gpu, "stage"].iloc[0])
        assert procs[trace.gpu_pid(gpu)] == f"GPU {gpu} (stage {stage})"
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    main = {k: v for k, v in threads.items() if k[1] < trace.LANE_TID_STRIDE}
    expected = {(int(g), s) for g, s in events[["gpu", "stream"]].itertuples(index=False)}
    assert len(main) == len(expected)
    assert {(pid, name) for (pid, _), name in main.items()} == {
        (trace.gpu_pid(g), trace.STREAM_TITLES[s]) for g, s in expected
    }
    # The fixture's DP buckets overlap on the dp stream: the later one gets an overlap track.
    extra = {k: v for k, v in threads.items() if k[1] >= trace.LANE_TID_STRIDE}
    assert set(extra.values()) == {"DP comm (overlap 1)"}
    # Every track is sorted and named; every slice lands on a named track.
    sorted_threads = {(e["pid"], e["tid"]) for e in meta if e["name"] == "thread_sort_index"}
    assert sorted_threads == set(threads)
    xs = _by_ph(tr, "X")
    assert {(e["pid"], e["tid"]) for e in xs} == set(threads)
    assert all(e["dur"] >= 0 for e in xs)
    parents = [e for e in xs if "part_of" not in e["args"]]
    assert len(parents) == len(events)
    # No two ops of one track overlap, so no viewer nests one op inside another.
    for track in set(threads):
        ops = sorted((e["ts"], e["dur"]) for e in parents if (e["pid"], e["tid"]) == track)
        for (t0, d0), (t1, _) in zip(ops, ops[1:], strict=False):
            assert t1 >= t0 + d0 - 1e-3


def test_assign_lanes_uses_fewest_lanes():
    starts = [0.0, 0.5, 1.0, 1.2, 3.0]
    ends = [1.0, 2.0, 1.1, 3.0, 4.0]
    assert trace.assign_lanes(starts, ends) == [0, 1, 0, 0, 0]
    assert trace.assign_lanes([0.0, 0.1, 0.2], [1.0, 1.0, 1.0]) == [0, 1, 2]


def test_trace_times_are_microseconds_with_args():
    events = pd.DataFrame(
        [
            dict(
                gpu=3,
                proc="g3",
                stage=1,
                stream="dp",
                kind="dp_comm",
                name="all_reduce dp",
                start_s=0.001,
                end_s=0.0035,
                bytes=1e9,
                flops=0.0,
                layer=-1,
                microbatch=-1,
                coalesced=1,
                parts="",
            ),
        ],
        columns=list(EVENT_COLUMNS),
    )
    tr = trace.perfetto_trace(events, None)
    (x,) = _by_ph(tr, "X")
    assert x["ts"] == 1000.0 and x["dur"] == 2500.0
    assert x["args"]["bytes"] == 1_000_000_000 and x["args"]["layer"] == -1
    assert x["args"]["coalesced"] == 1 and x["cat"] == "dp_comm"


def test_coalesced_rows_expand_into_children_that_tile_the_parent(step):
    events, memory, _, _ = step
    tr = trace.perfetto_trace(events, memory)
    xs = _by_ph(tr, "X")
    children: dict[tuple, list[dict]] = {}
    for e in xs:
        if "part_of" in e["args"]:
            children.setdefault((e["pid"], e["tid"], e["args"]["part_of"]), []).append(e)
    coalesced = events[events.coalesced > 1]
    assert len(coalesced) > 0
    n_children = sum(len(v) for v in children.values())
    assert n_children == int(coalesced["coalesced"].sum())
    parents = [e for e in xs if "part_of" not in e["args"] and e["args"]["coalesced"] > 1]
    for p in parents:
        kids = [
            k
            for k in children[(p["pid"], p["tid"], p["name"])]
            if p["ts"] <= k["ts"] <= p["ts"] + p["dur"]
        ]
        assert len(kids) == p["args"]["coalesced"]
        kids.sort(key=lambda k: k["ts"])
        assert kids[0]["ts"] == p["ts"]  # back to back from the parent's start
        for a, b in zip(kids, kids[1:], strict=False):
            assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=1e-3)
        assert sum(k["dur"] for k in kids) == pytest.approx(p["dur"], abs=2e-3)
        assert kids[-1]["ts"] + kids[-1]["dur"] <= p["ts"] + p["dur"] + 1e-6
        # names and durations from the parts column, in order
        names = [q.name for q in parse_parts(p["args"]["parts"])]
        assert [k["name"] for k in kids] == names


def _one_row(parts: str, n: int, start_s=1.0, end_s=1.010) -> pd.DataFrame:
    row = dict(
        gpu=0,
        proc="g0",
        stage=0,
        stream="compute",
        kind="fwd",
        name="L0 fwd",
        start_s=start_s,
        end_s=end_s,
        bytes=0.0,
        flops=1e12,
        layer=0,
        microbatch=2,
        coalesced=n,
        parts=parts,
    )
    return pd.DataFrame([row], columns=list(EVENT_COLUMNS))


def test_parts_that_add_up_are_laid_back_to_back():
    tr = trace.perfetto_trace(_one_row("ln:0.001;gemm:a:b:0.006;gelu:0.003", 3), None)
    parent, *kids = _by_ph(tr, "X")
    assert [k["name"] for k in kids] == ["ln", "gemm:a:b", "gelu"]
    assert [k["dur"] for k in kids] == [1000.0, 6000.0, 3000.0]
    assert [k["ts"] for k in kids] == [1_000_000.0, 1_001_000.0, 1_007_000.0]
    assert parent["dur"] == 10_000.0


def test_parts_shorter_than_the_row_get_a_remainder_child():
    # e.g. a straggler at 1.25x: the row lasts longer than its nominal parts
    tr = trace.perfetto_trace(_one_row("a:0.002;b:0.006", 2), None)
    parent, *kids = _by_ph(tr, "X")
    assert [k["name"] for k in kids] == ["a", "b", "(not in parts)"]
    assert [k["dur"] for k in kids] == [2000.0, 6000.0, 2000.0]


def test_parts_longer_than_the_row_are_scaled_to_fit():
    # e.g. a TP all-reduce overlapped with the next GEMM: nominal parts sum to 12 ms in 10 ms
    tr = trace.perfetto_trace(_one_row("gemm:0.004;tp_all_reduce:0.002;gemm2:0.006", 3), None)
    parent, *kids = _by_ph(tr, "X")
    assert sum(k["dur"] for k in kids) == pytest.approx(parent["dur"], abs=1e-3)
    assert kids[-1]["ts"] + kids[-1]["dur"] == pytest.approx(parent["ts"] + parent["dur"])
    assert kids[0]["args"]["scaled_by"] == pytest.approx(10 / 12)
    assert kids[1]["dur"] == pytest.approx(2000.0 * 10 / 12, abs=1e-3)


def test_memory_and_link_counters(step):
    events, memory, links, _ = step
    tr = trace.perfetto_trace(events, memory, links, link_series=link_series(events))
    cs = _by_ph(tr, "C")
    for gpu in sorted(set(memory["gpu"])):
        pid = trace.gpu_pid(gpu)
        total = [c for c in cs if c["pid"] == pid and c["name"] == "HBM used (GiB)"]
        kinds = [c for c in cs if c["pid"] == pid and c["name"] == "HBM by kind (GiB)"]
        assert total and len(total) == len(kinds)
        assert [c["ts"] for c in total] == sorted(c["ts"] for c in total)
        final = memory[memory.gpu == gpu]["total_bytes"].iloc[-1] / GIB
        assert total[-1]["args"]["total"] == pytest.approx(final, abs=1e-5)
        # the categories add up to the total at every instant
        for t, k in zip(total, kinds, strict=True):
            assert sum(k["args"].values()) == pytest.approx(t["args"]["total"], abs=1e-4)
        assert kinds[0]["args"]["weights"] == pytest.approx(6.0)
    # A link's counter is named by the link, with one series (viewers show "<link>
    # utilization"), over time here and as a step average below: one name in both modes.
    net = [c for c in cs if "utilization" in c["args"]]
    assert {c["name"] for c in net} == {"node0-nic0-leaf0", "gpu0-nvsw0"}
    assert all(list(c["args"]) == ["utilization"] for c in net)
    gpu_pids = {trace.gpu_pid(g) for g in events["gpu"]}
    assert len({c["pid"] for c in net}) == 1 and net[0]["pid"] not in gpu_pids
    # Without a series, the links table gives flat step-average tracks of the busiest links.
    tr2 = trace.perfetto_trace(events, memory, links)
    avg = [c for c in _by_ph(tr2, "C") if "utilization" in c["args"]]
    assert avg[0]["name"] == "node0-nic0-leaf0" and avg[0]["args"] == {"utilization": 0.83}
    procs = {e["args"]["name"] for tr in (tr, tr2) for e in tr["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name" and "Network" in e["args"]["name"]}
    assert procs == {"Network (busiest links, over time)", "Network (busiest links, step average)"}
    assert tr2["otherData"]["busiest_links"][0]["link"] == "node0-nic0-leaf0"


def test_trace_is_deterministic_and_written_atomically(step, tmp_path):
    events, memory, links, _ = step
    path = tmp_path / "trace.json"
    trace.write_trace(path, events, memory, links, link_series(events))
    first = path.read_bytes()
    shuffled = events.sample(frac=1.0, random_state=1)
    trace.write_trace(path, shuffled, memory, links, link_series(events))
    assert path.read_bytes() == first  # row order of the input does not matter
    assert json.loads(first)["traceEvents"]
    assert os.listdir(tmp_path) == ["trace.json"]


# --------------------------------------------------------------------------------------------
# Atomic, deterministic writers


def test_write_atomic_replaces_whole_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "out.txt"
    rio.write_atomic(path, "x" * 100_000)
    rio.write_atomic(path, "short")
    assert path.read_text() == "short"
    os.chmod(path, 0o640)
    rio.write_atomic(path, b"bytes")
    assert path.read_bytes() == b"bytes" and (path.stat().st_mode & 0o777) == 0o640
    assert os.listdir(path.parent) == ["out.txt"]


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "summary.json"
    rio.write_json_atomic(path, {"a": 1})
    with pytest.raises(TypeError):
        rio.write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["summary.json"]


def test_json_keeps_order_and_is_strict(tmp_path):
    obj = {
        "z": np.float64(0.1),
        "a": np.int64(3),
        "nan": float("nan"),
        "t": (1, 2),
        "p": tmp_path,
        "b": np.bool_(True),
    }
    text = rio.dumps_json(obj)
    assert list(json.loads(text)) == ["z", "a", "nan", "t", "p", "b"]
    assert json.loads(text) == {
        "z": 0.1,
        "a": 3,
        "nan": None,
        "t": [1, 2],
        "p": str(tmp_path),
        "b": True,
    }
    assert '"z": 0.1,' in text and text.endswith("}\n")
    rio.write_json_atomic(tmp_path / "a.json", obj)
    rio.write_json_atomic(tmp_path / "b.json", dict(obj))
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_parquet_is_byte_identical_and_round_trips(step, tmp_path):
    events = step[0]
    rio.write_parquet_atomic(tmp_path / "a.parquet", events)
    rio.write_parquet_atomic(tmp_path / "b.parquet", events.copy(deep=True).iloc[::1])
    a = (tmp_path / "a.parquet").read_bytes()
    assert a == (tmp_path / "b.parquet").read_bytes()
    back = pd.read_parquet(tmp_path / "a.parquet")
    pd.testing.assert_frame_equal(back, events.reset_index(drop=True))
    # a frame with a non-trivial index is written without it
    rio.write_parquet_atomic(tmp_path / "c.parquet", events.iloc[5:10])
    assert list(pd.read_parquet(tmp_path / "c.parquet").columns) == list(EVENT_COLUMNS)
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet", "c.parquet"]


# --------------------------------------------------------------------------------------------
# Plots


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_timeline_png_is_deterministic(step, tmp_path):
    events, _, _, summary = step
    plots.plot_timeline(events, summary, tmp_path / "a.png")
    plots.plot_timeline(events, summary, tmp_path / "b.png")
    assert _png_size(tmp_path / "a.png") == (1600, 900)
    assert (tmp_path / "a.png").read_bytes() == (tmp_path / "b.png").read_bytes()
    assert b"matplotlib" not in (tmp_path / "a.png").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["a.png", "b.png"]


def test_timeline_uses_the_lowest_gpu_of_each_stage(step):
    events = step[0]
    assert timeline._representatives(events) == {0: 0, 1: 2, 2: 4, 3: 6}
    assert timeline._representatives(events[events.gpu % 2 == 1]) == {0: 1, 1: 3, 2: 5, 3: 7}


def test_stall_segments_split_idle_from_waiting_on_comm():
    rows = [
        ("compute", "fwd", 0.0, 1.0),
        ("tp", "tp_comm", 1.0, 1.5),
        ("dp", "dp_comm", 1.2, 2.0),  # overlaps the TP wait: TP takes priority
        ("compute", "fwd", 2.0, 2.5),
        ("pp", "pp_comm", 3.0, 3.2),
        ("compute", "bwd", 3.2, 4.0),
    ]
    g = pd.DataFrame(rows, columns=["stream", "kind", "start_s", "end_s"])
    seg = timeline._stall_segments(g, 5.0, min_w=1e-9)
    approx = lambda xs: [pytest.approx(x) for x in xs]  # noqa: E731
    assert [tuple(approx(s)) for s in seg["idle"]] == [(2.5, 0.5), (4.0, 1.0)]
    assert [tuple(approx(s)) for s in seg["tp_comm"]] == [(1.0, 0.5)]
    assert [tuple(approx(s)) for s in seg["dp_comm"]] == [(1.5, 0.5)]
    assert [tuple(approx(s)) for s in seg["pp_comm"]] == [(3.0, pytest.approx(0.2))]


def test_a_bucket_prep_inside_the_last_backward_keeps_it_one_block():
    # Overlapped DP reduction prepares a bucket (compute stream, no micro-batch) between the
    # layers of the last backward: that backward is still one labelled block, not slivers.
    rows = [
        ("fwd", 31, 0.0, 1.0),
        ("bwd", 31, 1.0, 1.1),
        ("bwd", -1, 1.1, 1.11),  # bucket 0 prep
        ("bwd", 31, 1.11, 1.2),
        ("bwd", -1, 1.2, 1.21),  # bucket 1 prep
        ("bwd", 31, 1.21, 1.3),
        ("optimizer", -1, 1.5, 1.6),
    ]
    g = pd.DataFrame(rows, columns=["kind", "microbatch", "start_s", "end_s"])
    blocks = [(k, mb, s, e) for k, mb, s, e, *_ in timeline._label_groups(g, join_gap=0.05)]
    assert blocks == [("fwd", 31, 0.0, 1.0), ("bwd", 31, 1.0, 1.3), ("optimizer", -1, 1.5, 1.6)]


def test_timeline_at_scale_16_stages_32_microbatches(tmp_path):
    events, _, _, summary = make_step(
        p=16,
        m=32,
        layers_per_stage=5,
        gpus_per_stage=1,
        recompute=True,
        f_layer=3e-2,
        tp_layer=3e-3,
        p2p=4e-3,
    )
    plots.plot_timeline(events, summary, tmp_path / "big.png")
    assert _png_size(tmp_path / "big.png") == (1600, 900)
    assert (tmp_path / "big.png").stat().st_size > 20_000


def test_compare_plot_keeps_every_label_inside_the_figure(step, tmp_path, monkeypatch):
    """Each bar's annotation (time, MFU, change against a long first label, does not fit) and
    each configuration's label lie inside the image, the bar that ends furthest right too."""
    summary = step[3]
    fast = copy.deepcopy(summary)
    for k in fast["breakdown_s"]:
        fast["breakdown_s"][k] *= 0.8
    fast["step_time_s"] = sum(fast["breakdown_s"].values())
    fast["tokens_per_s"] = summary["tokens_per_s"] / 0.8
    summary = {**summary, "fits": False}  # the widest annotation on the longest bar
    seen = []

    def check(fig, path):
        renderer = fig.canvas.get_renderer()
        w, h = fig.bbox.width, fig.bbox.height
        texts = [*fig.texts, *(t for ax in fig.axes for t in ax.texts)]
        texts += [t for ax in fig.axes for t in ax.get_yticklabels()]
        for t in texts:
            if t.get_text():
                box = t.get_window_extent(renderer=renderer)
                assert box.x0 >= 0 and box.x1 <= w and box.y0 >= 0 and box.y1 <= h, t
                seen.append(t.get_text())
        real_save(fig, path)

    real_save = plots.save_png
    monkeypatch.setattr(plots, "save_png", check)
    labels = ["dgx-h100-ndr-fattree-with-a-long-name", "H100, 800G NIC"]
    plots.plot_compare([fast, summary], labels, tmp_path / "cmp.png", title="NIC")
    assert any(t.startswith("-20.0% tokens/s vs dgx-h100") for t in seen)
    assert "does not fit in GPU memory" in seen and labels[0] in seen


def test_timeline_subtitle_stays_inside_the_figure(step, tmp_path, monkeypatch):
    """A long layout and breakdown line (an interleaved MoE run on a long-named topology)
    shrinks to the figure's width; it ran off the right edge."""
    events, _, _, summary = step
    summary = {**summary, "topology": "dgx-h100-ndr-32node-" + "x" * 60,
               "layout": {**summary["layout"], "pp_schedule": "interleaved",
                          "virtual_stages": 4, "ep": 8}}  # fmt: skip
    seen = []

    def check(fig, path):
        renderer = fig.canvas.get_renderer()
        for t in fig.texts:
            if "exposed time" in t.get_text():
                seen.append(t.get_text())
                assert t.get_window_extent(renderer=renderer).x1 <= fig.bbox.width, t
        real_save(fig, path)

    real_save = timeline.save_png
    monkeypatch.setattr(timeline, "save_png", check)
    timeline.plot_timeline(events, summary, tmp_path / "t.png")
    assert seen and "x" * 60 in seen[0]


def test_every_engine_stream_has_a_readable_timeline_label():
    for stream in (*timeline.COMM_STREAMS, *EXPERT_STREAMS):
        assert timeline.STREAM_LABELS.get(stream, stream) != stream, stream


def test_compare_and_sweep_plots(step, tmp_path):
    summary = step[3]
    slow = copy.deepcopy(summary)
    slow["breakdown_s"]["dp_comm"] *= 5
    slow["step_time_s"] = sum(slow["breakdown_s"].values())
    slow["fits"] = False
    plots.plot_compare([summary, slow], ["400G", "100G"], tmp_path / "cmp.png", title="NIC")
    assert (tmp_path / "cmp.png").stat().st_size > 5_000

    df = pd.DataFrame(
        {
            "parallelism.tp": [1, 1, 2, 2, 4, 4],
            "parallelism.pp": [1, 2, 1, 2, 1, 2],
            "step_time_s": [np.nan, 9.0, 8.0, 7.5, 7.0, 7.2],
            "status": ["infeasible", "ok", "ok", "ok", "ok", "ok"],
            "reason": ["OOM: 112 GiB > 80 GiB", "", "", "", "", ""],
        }
    )
    df["topology.nodes"] = [2, 4, 2, 4, 2, 4]
    for keys in (
        ["parallelism.tp"],
        ["parallelism.tp", "parallelism.pp"],
        ["parallelism.tp", "parallelism.pp", "topology.nodes"],
    ):
        sub = df.drop_duplicates(keys) if len(keys) == 1 else df
        out = tmp_path / f"sweep{len(keys)}.png"
        plots.plot_sweep(sub, keys, "step_time_s", out, title="tp x pp")
        assert out.stat().st_size > 5_000
    with pytest.raises(ValueError, match="no column"):
        plots.plot_sweep(df, ["parallelism.cp"], "step_time_s", tmp_path / "x.png", title="x")


# --------------------------------------------------------------------------------------------
# Tables


def _render(r, width=120) -> str:
    buf = io.StringIO()
    from rich.console import Console

    Console(file=buf, width=width, color_system=None).print(r)
    return buf.getvalue()


def test_run_table_shows_headline_breakdown_memory_and_warnings(step):
    summary = copy.deepcopy(step[3])
    text = _render(table.run_table(summary))
    assert table.format_seconds(summary["step_time_s"]) in text
    assert f"{summary['mfu']:.1%}" in text
    bd = summary["breakdown_s"]
    share = bd["pp_bubble"] / summary["step_time_s"]
    assert re.search(rf"pipeline bubble\s+\S+ ms\s+{share:.1%}", text)
    assert "DOES NOT FIT" not in text and "node0-nic0-leaf0" in text
    summary.update(
        fits=False, warnings=["activations exceed HBM"], time_to_train_days=12.5, cost_usd=1.5e6
    )
    summary["memory_gib"]["total"] = 95.0
    text = _render(table.run_table(summary))
    assert "DOES NOT FIT in GPU memory (15.0 GiB over)" in text
    assert "warning: activations exceed HBM" in text
    assert "12.5 days" in text and "$1,500,000" in text


def test_breakdown_hides_only_the_dimensions_the_layout_does_not_use(step):
    summary = copy.deepcopy(step[3])
    summary["layout"] = dict(summary["layout"], tp=8, cp=1, ep=1, etp=1, dp=4, pp=2)
    summary["breakdown_s"] = dict(summary["breakdown_s"], cp_comm=0.0, ep_comm=0.0, etp_comm=0.0,
                                  tp_comm=0.0)
    summary["training"] = dict(summary.get("training") or {}, tokens=2e12)
    summary["time_to_train_days"] = 25.0
    text = _render(table.run_table(summary))
    assert "TP communication" in text  # used by the layout, shown even at 0 s
    for label in ("CP communication", "EP all-to-all", "expert TP communication"):
        assert label not in text
    assert "time to train 2T tokens" in text
    summary["layout"]["ep"] = 8
    summary["breakdown_s"]["ep_comm"] = 0.25
    assert "EP all-to-all" in _render(table.run_table(summary))


def test_stage_imbalance_note_keeps_each_figure_with_its_unit(step):
    """The note on what makes the heaviest stage heavier is one line at the console's width:
    wrapped to the breakdown table's, it split '46.6 ms' over two lines (llama70b)."""
    summary = copy.deepcopy(step[3])
    summary["pp_imbalance_from"] = {
        "heaviest_stage": 3, "parts_s": {"compute": 0.0466, "tp_comm": 0.00643}}  # fmt: skip
    lines = _render(table.run_table(summary)).splitlines()
    note = [x for x in lines if x.startswith("stage imbalance: the heaviest stage (3)")]
    assert note and note[0].rstrip().endswith("compute 46.6 ms, TP communication 6.43 ms")


def test_compare_and_sweep_tables(step):
    base = step[3]
    slow = copy.deepcopy(base)
    slow["step_time_s"] = base["step_time_s"] * 1.25
    slow["mfu"] = base["mfu"] / 1.25
    text = _render(table.compare_table([base, slow], ["A", "B"]))
    assert "(+25.0%)" in text and "(-20.0%)" in text
    df = pd.DataFrame(
        {
            "tp": [1, 2, 4],
            "mfu": [0.3, 0.41, np.nan],
            "status": ["ok", "ok", "failed"],
            "error": ["", "", "timeout"],
        }
    )
    text = _render(table.sweep_table(df, ["tp"], "mfu"))
    assert "41.0% ★ best" in text and "failed: timeout" in text


def test_print_renderable_plain_and_wide(step):
    buf = io.StringIO()
    table.print_renderable(table.run_table(step[3]), file=buf)
    out = buf.getvalue()
    assert "\x1b[" not in out  # no colour codes when not a terminal
    assert "Where the step time goes" in out
    assert max(len(line) for line in out.splitlines()) <= max(table.MIN_WIDTH, 200)


def test_engine_shaped_events_without_tp_stream_and_with_gather(tmp_path):
    """The engine folds TP collectives into compute rows and runs ZeRO gathers on ``gather``."""
    events, memory, links, summary = make_step(tp_layer=0.0)
    events = events[events.stream != "tp"].copy()
    gathers = events[events.stream == "dp"].copy()
    gathers["stream"] = "gather"
    gathers["kind"] = "zero_gather"
    gathers["start_s"] -= 0.05
    gathers["end_s"] -= 0.05
    events = pd.concat([events, gathers], ignore_index=True)
    tr = trace.perfetto_trace(events, memory, links)
    names = {e["args"]["name"] for e in _by_ph(tr, "M") if e["name"] == "thread_name"}
    assert {"compute", "ZeRO gather", "DP comm", "PP send/recv"} <= names
    assert "TP comm" not in names
    out = tmp_path / "t.png"
    summary = dict(summary, layout=dict(summary["layout"], pp_schedule="1f1b", microbatches=8))
    plots.plot_timeline(events, summary, out)
    assert _png_size(out) == (1600, 900)


def test_memory_table_shows_the_first_steps_row_only_where_they_hold_more(step):
    """``allocated_first_steps`` (eager DDP's constructor buckets, live until the rebuild) is a
    row of its own, in words, only where it exceeds the steady-state allocation: otherwise the
    rows above ``total`` are the parts it is made of."""
    summary = copy.deepcopy(step[3])
    mem = summary["memory_gib"]
    mem.setdefault("allocated", mem["total"] - 2.5)
    mem["allocated_first_steps"] = mem["allocated"]
    text = _render(table.run_table(summary))
    assert "first steps" not in text and "allocated_first_steps" not in text
    mem["allocated_first_steps"] = mem["allocated"] + 1.5
    text = _render(table.run_table(summary))
    assert re.search(rf"allocated, first steps \(DDP rebuild\)\s+{mem['allocated'] + 1.5:.1f}",
                     text)
