"""All-to-all's small-message floor, timed two ways, and one-side-narrow pairs.

Run under ``torch.distributed.run`` with one process per GPU::

    python3 -m torch.distributed.run --standalone --nproc_per_node=4 \
        benchmarks/device/a2a_floor.py --out DIR --phases floor,narrow --label a [--pin]

Phase ``floor`` (what an event-timed loop of small ``all_to_all_single`` calls measures). For
``--reps`` repetitions, each group size (4: all ranks; 2: pairs {0,1} and {2,3} at once, as
``comm.py``), each split of ``comm.py`` (uniform without split lists; ``rotated``, ``hot`` with
them) and each size in ``--floor-sizes`` (bytes a rank's send buffer, bf16), one cell:

- ``events``: ``comm.py --timing events`` exactly (5 warm-up calls, barrier, 30 calls with a
  CUDA event after each; a rank's value is the median of its 30 intervals), every interval kept;
- ``loop``: barrier, then ``--loop-calls`` calls between one pair of CUDA events (no event
  between calls): the GPU's mean interval a call; the host clock around the same loop (the
  host's own time a call, ``loop_host_s``);
- per rank, around the ``events`` loop: the main thread's CPU before and after, its on-CPU and
  run-queue nanoseconds (``/proc/self/task/<tid>/schedstat``) against the wall clock, its
  involuntary context switches, the steal ticks of its CPU (``/proc/stat``), and the on-CPU
  nanoseconds of the process's other threads that ran (name: ns), so that a slow rank shows
  whether it waited for a CPU, ran on a slower one, or shared the process with a busy thread.

Phase ``order``: before any all-to-all of the process, all-reduce, all-gather and
reduce-scatter cells (64 KiB, as ``floor``'s), then all-to-all cells (uniform, hot), then the
three collectives again, 3 repetitions each: does the process's loop slow once it has run an
all-to-all (``comm.py`` runs its all-to-alls last)?

Phase ``narrow`` (pairs, both at once, ``--narrow-sizes`` MiB): tables of elements (group rank
``s`` to ``j``) whose one transfer has only its send side or only its receive side off a 16-byte
boundary (a 1-element own part placed first in rank 0's buffers shifts the next part by 2
bytes): ``ow_al`` 1->0 aligned, ``ow_rn`` 1->0 with rank 0 receiving narrow, ``ow_al01`` 0->1
aligned, ``ow_sn`` 0->1 with rank 0 sending narrow, ``tw_al`` both ways aligned, ``tw_n`` both ways
with rank 0 sending and receiving narrow (rank 1 neither), ``hot`` 7:3 (``comm.py``'s receiver-hot
pair) aligned and ``hot_u`` as ``comm.py`` cuts it (parts off 16 bytes). CUDA events between
back-to-back calls as ``comm.py`` (3 warm-up, 10 timed), the slowest rank's median.

``--pin``: each process's main thread pinned to one CPU (``4 + 8 x local rank``) after NCCL's
initialisation (its own threads keep the process's mask). ``--quick``: CPU, gloo, tiny sizes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import threading
import time

import torch
import torch.distributed as dist

ROTATED_W = {2: [3, 1], 4: [4, 3, 2, 1]}
HOT_H = {2: [7, 3], 4: [55, 15, 15, 15]}
UNIT = 64


def splits_for(kind: str, n: int, r: int, elems: int) -> tuple[list[int], list[int]]:
    """comm.py's splits_for: (input_split_sizes, output_split_sizes) of group rank r."""
    if kind == "uniform":
        w = [[1] * n for _ in range(n)]
    elif kind == "rotated":
        w = [[ROTATED_W[n][(j - s) % n] for j in range(n)] for s in range(n)]
    else:
        w = [list(HOT_H[n]) for _ in range(n)]

    def cut(s):
        tot = sum(w[s])
        sizes = [elems * x // tot for x in w[s]]
        sizes[0] += elems - sum(sizes)
        return sizes

    table = [cut(s) for s in range(n)]
    return table[r], [table[s][r] for s in range(n)]


def narrow_table(pattern: str, elems: int) -> list[list[int]]:
    """Elements group rank s sends to j in a pair; ``elems`` a multiple of UNIT."""
    x = elems
    if pattern == "hot":
        u = elems // 10 // UNIT * UNIT
        return [[7 * u, 3 * u], [7 * u, 3 * u]]
    if pattern == "hot_u":  # comm.py's cut of its whole buffer (``elems`` as it counts them)
        b = elems * 3 // 10
        return [[elems - b, b], [elems - b, b]]
    return {"ow_al": [[0, 0], [x, 0]], "ow_rn": [[1, 0], [x, 0]],
            "ow_al01": [[0, x], [0, 0]], "ow_sn": [[1, x], [0, 0]],
            "tw_al": [[0, x], [x, 0]], "tw_n": [[1, x], [x, 0]]}[pattern]


NARROW = ["ow_al", "ow_rn", "ow_al01", "ow_sn", "tw_al", "tw_n", "hot", "hot_u"]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


class Threads:
    """Per-thread scheduler counters of this process (Linux /proc; empty elsewhere)."""

    def __init__(self):
        self.main = threading.get_native_id()

    def snap(self) -> dict:
        out = {}
        for d in glob.glob("/proc/self/task/*"):
            tid = int(d.rsplit("/", 1)[1])
            ss = _read(d + "/schedstat").split()
            if len(ss) < 2:
                continue
            out[tid] = (int(ss[0]), int(ss[1]), _read(d + "/comm").strip())
        st = _read(f"/proc/self/task/{self.main}/stat")
        cpu = int(st.rsplit(")", 1)[1].split()[36]) if st else -1
        inv = 0
        for line in _read(f"/proc/self/task/{self.main}/status").splitlines():
            if line.startswith("nonvoluntary_ctxt_switches"):
                inv = int(line.split()[1])
        steal = -1
        for line in _read("/proc/stat").splitlines():
            if line.startswith(f"cpu{cpu} "):
                steal = int(line.split()[8])
        return {"t": time.perf_counter_ns(), "threads": out, "cpu": cpu, "inv": inv,
                "steal": steal}

    def diff(self, a: dict, b: dict) -> dict:
        wall = b["t"] - a["t"]
        m0 = a["threads"].get(self.main, (0, 0, ""))
        m1 = b["threads"].get(self.main, (0, 0, ""))
        others = {}
        for tid, (on, _, name) in b["threads"].items():
            if tid == self.main:
                continue
            d = on - a["threads"].get(tid, (0, 0, ""))[0]
            if d > 0:
                key = f"{name}:{tid}"
                others[key] = d
        return {"wall_ns": wall, "main_on_ns": m1[0] - m0[0], "main_runq_ns": m1[1] - m0[1],
                "cpu_before": a["cpu"], "cpu_after": b["cpu"], "involuntary": b["inv"] - a["inv"],
                "steal_ticks": (b["steal"] - a["steal"]) if a["steal"] >= 0 else None,
                "others_on_ns": others}


class Floor:
    def __init__(self, args):
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.local = int(os.environ.get("LOCAL_RANK", self.rank))
        self.quick = args.quick or not torch.cuda.is_available()
        if self.quick:
            self.dev = torch.device("cpu")
            dist.init_process_group("gloo")
        else:
            torch.cuda.set_device(self.local)
            self.dev = torch.device("cuda", self.local)
            dist.init_process_group("nccl", device_id=self.dev)
        self.args = args
        self.groups = {}
        for g in (4, 2):
            if g > self.world or self.world % g:
                continue
            mine = None
            for i in range(0, self.world, g):
                pg = dist.new_group(list(range(i, i + g))) if g < self.world else dist.group.WORLD
                if i <= self.rank < i + g:
                    mine = pg
            self.groups[g] = mine
        for pg in self.groups.values():  # every communicator made before any pinning (an
            dist.all_reduce(torch.zeros(4, device=self.dev), group=pg)  # all-reduce: see order)
        self.sync()
        dist.barrier()
        self.pinned = None
        if args.pin and hasattr(os, "sched_setaffinity"):
            cpu = (4 + 8 * self.local) % os.cpu_count()  # distinct cores whether SMT pairs are (i, i+32) or (2i, 2i+1)
            os.sched_setaffinity(0, {cpu})  # this thread only (threads made later inherit)
            self.pinned = cpu
        self.th = Threads()

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def gather(self, obj) -> list:
        out = [None] * self.world
        dist.all_gather_object(out, obj)
        return out

    def write(self, rec: dict):
        if self.rank == 0:
            with open(os.path.join(self.args.out, self.args.file), "a") as f:
                f.write(json.dumps(rec) + "\n")

    def a2a(self, g: int, split: str, nbytes: int):
        pg, gr = self.groups[g], self.rank % g
        el = max(nbytes // 2, g)
        el -= el % g
        dt = torch.bfloat16
        x = torch.randn(el, device=self.dev).to(dt)
        if split == "uniform":
            y = torch.empty(el, device=self.dev, dtype=dt)
            return lambda: dist.all_to_all_single(y, x, group=pg)
        ins, outs = splits_for(split, g, gr, el)
        y = torch.empty(sum(outs), device=self.dev, dtype=dt)
        return lambda: dist.all_to_all_single(y, x, outs, ins, group=pg)

    def cell(self, fn, iters: int, loop_calls: int) -> dict:
        for _ in range(5):
            fn()
        self.sync()
        dist.barrier()
        self.sync()
        a = self.th.snap()
        if self.quick:
            ts = []
            for _ in range(iters):
                s = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - s)
            b = self.th.snap()
        else:
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
            ev[0].record()
            for i in range(iters):
                fn()
                ev[i + 1].record()
            b = self.th.snap()
            self.sync()
            ts = [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(iters)]
        ev_host = (b["t"] - a["t"]) / 1e9 / iters
        sched = self.th.diff(a, b)
        dist.barrier()
        self.sync()
        if self.quick:
            h0 = time.perf_counter()
            for _ in range(loop_calls):
                fn()
            loop_host = (time.perf_counter() - h0) / loop_calls
            loop = loop_host
        else:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            h0 = time.perf_counter()
            e0.record()
            for _ in range(loop_calls):
                fn()
            e1.record()
            loop_host = (time.perf_counter() - h0) / loop_calls
            self.sync()
            loop = e0.elapsed_time(e1) / 1e3 / loop_calls
        dist.barrier()
        return {"events_s": statistics.median(ts), "events_all_s": [round(t, 8) for t in ts],
                "events_host_s": ev_host, "loop_s": loop, "loop_host_s": loop_host,
                "sched": sched}

    def phase_floor(self):
        a = self.args
        sizes = [int(s) for s in a.floor_sizes.split(",")]
        for rep in range(a.reps):
            for g in sorted(self.groups, reverse=True):
                for split in ("uniform", "rotated", "hot"):
                    for nbytes in sizes:
                        fn = self.a2a(g, split, nbytes)
                        mine = self.cell(fn, a.iters, a.loop_calls)
                        allr = self.gather(mine)
                        rec = {"phase": "floor", "label": a.label, "rep": rep, "op": "all_to_all",
                               "group": g, "concurrent_groups": self.world // g, "splits": split,
                               "bytes": nbytes, "dtype": "bf16", "pinned_cpu": self.gather(self.pinned),
                               "iters": a.iters, "loop_calls": a.loop_calls,
                               "time_s": max(r["events_s"] for r in allr),
                               "loop_time_s": max(r["loop_s"] for r in allr),
                               "per_rank": allr}
                        self.write(rec)
                        if self.rank == 0 and rep == 0 and nbytes == sizes[0]:
                            print(f"floor g{g} {split} {nbytes} B: events "
                                  f"{[round(r['events_s'] * 1e6, 1) for r in allr]} loop "
                                  f"{[round(r['loop_s'] * 1e6, 1) for r in allr]} us", flush=True)

    def coll(self, op: str, g: int, nbytes: int):
        pg = self.groups[g]
        el = max(nbytes // 2, g)
        el -= el % g
        dt = torch.bfloat16
        x = torch.randn(el, device=self.dev).to(dt)
        if op == "all_reduce":
            return lambda: dist.all_reduce(x, group=pg)
        if op == "all_gather":
            y = torch.empty(el * g, device=self.dev, dtype=dt)
            return lambda: dist.all_gather_into_tensor(y, x, group=pg)
        y = torch.empty(el // g, device=self.dev, dtype=dt)
        return lambda: dist.reduce_scatter_tensor(y, x, group=pg)

    def phase_order(self):
        """Before any all-to-all of the process: all-reduce, all-gather, reduce-scatter loops
        (64 KiB, groups of 4 and 2); then all-to-all loops (uniform, hot); then the collectives
        again: does an all-to-all change the process's later loops?"""
        a = self.args
        nbytes = 65536
        stages = [("before", ("all_reduce", "all_gather", "reduce_scatter")),
                  ("a2a", ("uniform", "hot")),
                  ("after", ("all_reduce", "all_gather", "reduce_scatter"))]
        for stage, kinds in stages:
            for rep in range(3):
                for g in sorted(self.groups, reverse=True):
                    for kind in kinds:
                        fn = (self.a2a(g, kind, nbytes) if stage == "a2a"
                              else self.coll(kind, g, nbytes))
                        mine = self.cell(fn, a.iters, a.loop_calls)
                        allr = self.gather(mine)
                        op = "all_to_all" if stage == "a2a" else kind
                        rec = {"phase": "order", "stage": stage, "label": a.label, "rep": rep,
                               "op": op, "group": g, "concurrent_groups": self.world // g,
                               "splits": kind if stage == "a2a" else "-", "bytes": nbytes,
                               "dtype": "bf16", "pinned_cpu": self.gather(self.pinned),
                               "iters": a.iters, "loop_calls": a.loop_calls,
                               "time_s": max(r["events_s"] for r in allr),
                               "loop_time_s": max(r["loop_s"] for r in allr), "per_rank": allr}
                        self.write(rec)
                        if self.rank == 0 and rep == 0:
                            print(f"order {stage} g{g} {op} {kind}: events "
                                  f"{[round(r['events_s'] * 1e6, 1) for r in allr]} us",
                                  flush=True)

    def phase_narrow(self):
        a = self.args
        if 2 not in self.groups:
            return
        pg, gr = self.groups[2], self.rank % 2
        sizes = [int(float(s) * 2**20) for s in a.narrow_sizes.split(",")]
        if self.quick:
            sizes = [s // 4096 for s in sizes[:2]]
        dt = torch.bfloat16
        for nbytes in sizes:
            for pattern in NARROW:
                elems = nbytes // 2 if pattern == "hot_u" else nbytes // 2 // UNIT * UNIT
                t = narrow_table(pattern, elems)
                ins, outs = t[gr], [t[s][gr] for s in range(2)]
                x = torch.empty(max(sum(ins), 1), device=self.dev, dtype=dt).normal_()[: sum(ins)]
                y = torch.empty(max(sum(outs), 1), device=self.dev, dtype=dt)[: sum(outs)]

                def fn(y=y, x=x, outs=outs, ins=ins):
                    dist.all_to_all_single(y, x, outs, ins, group=pg)
                big = nbytes > 64 * 2**20
                iters, warm = (3, 1) if self.quick else ((10, 3) if big else (20, 5))
                for _ in range(warm):
                    fn()
                self.sync()
                dist.barrier()
                if self.quick:
                    t0 = time.perf_counter()
                    for _ in range(iters):
                        fn()
                    ts = [(time.perf_counter() - t0) / iters]
                else:
                    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
                    ev[0].record()
                    for i in range(iters):
                        fn()
                        ev[i + 1].record()
                    self.sync()
                    ts = [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(iters)]
                dist.barrier()
                del fn, x, y
                allv = self.gather([statistics.median(ts), min(ts)])
                rec = {"phase": "narrow", "label": a.label, "op": "all_to_all", "splits": "table",
                       "group": 2, "concurrent_groups": self.world // 2, "pattern": pattern,
                       "bytes": nbytes, "table_bytes": [[2 * v for v in row] for row in t],
                       "timing": "events", "time_s": max(v[0] for v in allv),
                       "best_s": max(v[1] for v in allv),
                       "per_rank_median_s": [v[0] for v in allv], "dtype": "bf16"}
                self.write(rec)
                if self.rank == 0:
                    print(f"narrow {pattern} {nbytes >> 20} MiB: {rec['time_s'] * 1e6:.1f} us",
                          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--file", default="a2a_floor.jsonl")
    ap.add_argument("--label", default="a")
    ap.add_argument("--phases", default="order,floor,narrow")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--loop-calls", type=int, default=100)
    ap.add_argument("--floor-sizes", default="4096,65536,1048576,4194304")
    ap.add_argument("--narrow-sizes", default="128,448,1024")
    ap.add_argument("--pin", action="store_true")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    f = Floor(args)
    if args.quick:
        args.reps, args.loop_calls = 1, 10
        args.floor_sizes = "4096,65536"
    for ph in args.phases.split(","):
        getattr(f, f"phase_{ph}")()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
