"""All-to-all probes: the host's time per collective call, and uneven splits at large sizes.

Run under ``torch.distributed.run`` with one process per GPU::

    python3 -m torch.distributed.run --standalone --nproc_per_node=4 \
        benchmarks/device/a2a_probe.py --out DIR --phases host,large --label first

Phase ``host`` (the host's side of a Python loop of calls; every buffer 64 KiB a rank, so the GPU
is not what paces the loop). For each group size of the launch (``--groups``: the whole world,
disjoint groups running the same op at once, or ``g<n>solo``: ranks 0..n-1 alone while the others
wait) and each call kind (``HOST_CASES``: all-reduce, all-gather, reduce-scatter, all-to-all
without split lists, with equal split lists, with uneven lists, with zero parts), ``--reps``
times over, interleaved so that drift shows as spread rather than as a kind's difference:

- ``host_bare``: barrier + synchronise, then ``--calls`` calls back to back; the host clock from
  the first call to the return of the last (nothing synchronises: the host's own time a call),
  then the host clock again after a synchronisation (``drain_s``, the GPU's backlog);
- ``host_events``: the same loop with a CUDA event recorded after each call (the loop of
  ``comm.py --timing events``): the host's time an iteration, and the median interval of the
  events (what ``comm.py`` reports, ``events_s``);
- ``device``: the stream first sleeps while the host enqueues ``--device-calls`` calls behind
  it; (last event - first event) / (k - 1) is the GPU's time a call run back to back
  (``host_ahead`` says whether the sleep outlasted the enqueueing).

Every row keeps each rank's value (``per_rank``); ``time_s`` is the slowest rank's.

Phase ``large``: all-to-all (``all_to_all_single`` with split lists) of weight patterns
(``PATTERNS``) at ``--sizes`` MiB a rank, CUDA events between back-to-back calls as
``comm.py`` (5 warm-up calls, 10 timed, the slowest rank's median interval). A pattern gives
weights ``W[s][j]`` (group rank ``s`` to ``j``); the parts are ``u x W[s][j]`` elements with one
unit ``u`` (a multiple of 64 elements, so every part starts on a 16-byte boundary) sized so the
largest row holds the size; ``*_u`` variants add one element to every part (every part
after a buffer's first starts off the boundary). Each row records the whole table in bytes (``table_bytes``).

``--quick``: CPU, gloo, tiny sizes (a dry run of the logic).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

UNIT = 64  # elements: 128 bytes, a multiple of NCCL's 16-byte pack


def _delta(w):  # weights by (j - s) mod n
    n = len(w)
    return [[w[(j - s) % n] for j in range(n)] for s in range(n)]


def _recv(w):  # weights by receiver j
    return [list(w) for _ in range(len(w))]


def _send(w):  # weights by sender s, even over receivers
    return [[w[s]] * len(w) for s in range(len(w))]


PATTERNS = {
    4: {"uniform": _delta([1, 1, 1, 1]), "next5": _delta([1, 5, 1, 1]),
        "across5": _delta([1, 1, 5, 1]), "self5": _delta([5, 1, 1, 1]),
        "mixed": _delta([2, 4, 1, 3]), "recv2": _recv([2, 1, 1, 1]),
        "recv44": _recv([1, 1, 4, 4]), "send4": _send([4, 1, 1, 1]),
        "sparse": _delta([1, 3, 0, 0]), "mixed_u": _delta([2, 4, 1, 3]),
        "recv2_u": _recv([2, 1, 1, 1]), "rot4321": _delta([4, 3, 2, 1])},
    3: {"uniform": _delta([1, 1, 1]), "mixed": _delta([1, 3, 2]), "recv2": _recv([2, 1, 1]),
        "self4": _delta([4, 1, 1]), "mixed_u": _delta([1, 3, 2])},
    2: {"uniform": _delta([1, 1]), "cross3": _delta([1, 3]), "self5": _delta([5, 1]),
        "cross3_u": _delta([1, 3])},
}
# ports (2026-11-27 afternoon): a port loaded one way against both ways at the same bytes
# (incast: every rank sends its whole buffer to rank 0; incast_back: rank 0 also sends one part
# to each; oneway: in a pair, rank 1 to rank 0 only), and comm.py's receiver-hot split (HOT_H
# 55:15:15:15 = 11:3:3:3, pairs 7:3) with 16-byte aligned parts
PATTERNS[4].update({"hot": _recv([11, 3, 3, 3]), "incast": _recv([1, 0, 0, 0]),
                    "incast_back": [[1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]})
PATTERNS[2].update({"hot": _recv([7, 3]), "oneway": [[1, 0], [1, 1]]})

HOST_CASES = ["all_reduce", "all_gather", "reduce_scatter", "a2a_plain", "a2a_equal_lists",
              "a2a_uneven", "a2a_sparse"]


def table_elems(pattern: str, n: int, elems: int) -> list[list[int]]:
    """Elements group rank s sends to j: u x W[s][j], u a multiple of UNIT sized so the
    largest row is at most ``elems`` (at least one unit); ``_u``: +1 on every part."""
    w = PATTERNS[n][pattern]
    u = max(UNIT, elems // max(sum(r) for r in w) // UNIT * UNIT)
    t = [[u * x for x in row] for row in w]
    if pattern.endswith("_u"):
        t = [[v + 1 for v in row] for row in t]
    return t


class Probe:
    def __init__(self, args):
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        self.quick = args.quick or not torch.cuda.is_available()
        if self.quick:
            self.dev = torch.device("cpu")
            dist.init_process_group("gloo")
        else:
            local = int(os.environ["LOCAL_RANK"])
            torch.cuda.set_device(local)
            self.dev = torch.device("cuda", local)
            dist.init_process_group("nccl", device_id=self.dev)
        self.args = args
        # group label -> (size, this rank's group or None when idle, concurrent groups)
        self.groups = {}
        for label in args.groups.split(","):
            solo = label.endswith("solo")
            g = int(label[1:].replace("solo", ""))
            if g > self.world or (not solo and self.world % g):
                continue
            if g == self.world:
                self.groups[label] = (g, dist.group.WORLD, 1)
                continue
            mine = None
            starts = [0] if solo else list(range(0, self.world, g))
            for i in starts:
                pg = dist.new_group(list(range(i, i + g)))
                if i <= self.rank < i + g:
                    mine = pg
            self.groups[label] = (g, mine, len(starts))
        self.cycles_per_s = None
        if not self.quick:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(10**6)
            a.record()
            torch.cuda._sleep(5 * 10**7)
            b.record()
            torch.cuda.synchronize()
            self.cycles_per_s = 5 * 10**7 / (a.elapsed_time(b) / 1e3)

    def sync(self):
        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    def gather(self, vals: list[float]) -> list[list[float]]:
        mine = torch.tensor(vals, dtype=torch.float64, device=self.dev)
        allr = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(allr, mine)
        return [[float(x) for x in a] for a in allr]

    # ------------------------------------------------------------------ calls

    def host_call(self, case: str, g: int, pg, gr: int):
        el = 32768  # 64 KiB of bf16 a rank
        dt = torch.bfloat16
        x = torch.randn(el, device=self.dev).to(dt)
        if case == "all_reduce":
            return lambda: dist.all_reduce(x, group=pg)
        if case == "all_gather":
            y = torch.empty(el * g, device=self.dev, dtype=dt)
            return lambda: dist.all_gather_into_tensor(y, x, group=pg)
        if case == "reduce_scatter":
            y = torch.empty(el // g, device=self.dev, dtype=dt)
            x = x[: (el // g) * g]
            return lambda: dist.reduce_scatter_tensor(y, x, group=pg)
        w = {"a2a_plain": None, "a2a_equal_lists": _delta([1] * g),
             "a2a_uneven": _delta(list(range(g, 0, -1))),
             "a2a_sparse": _delta([1, 3] + [0] * (g - 2))}[case]
        if w is None:
            x = x[: (el // g) * g]
            y = torch.empty_like(x)
            return lambda: dist.all_to_all_single(y, x, group=pg)
        u = el // max(sum(r) for r in w) // UNIT * UNIT
        ins = [u * v for v in w[gr]]
        outs = [u * w[s][gr] for s in range(g)]
        xi = torch.randn(sum(ins), device=self.dev).to(dt)
        y = torch.empty(sum(outs), device=self.dev, dtype=dt)
        return lambda: dist.all_to_all_single(y, xi, outs, ins, group=pg)

    def large_call(self, pattern: str, g: int, pg, gr: int, elems: int):
        t = table_elems(pattern, g, elems)
        ins, outs = t[gr], [t[s][gr] for s in range(g)]
        dt = torch.bfloat16
        x = torch.empty(sum(ins), device=self.dev, dtype=dt).normal_()
        y = torch.empty(sum(outs), device=self.dev, dtype=dt)
        return (lambda: dist.all_to_all_single(y, x, outs, ins, group=pg)), t

    # ------------------------------------------------------------------ timing

    def host_modes(self, fn, calls: int, dcalls: int) -> list[float]:
        """[bare host s/call, drain s, events-loop host s/iter, events median s,
        device s/call, host_ahead]"""
        for _ in range(5):
            fn()
        self.sync()
        dist.barrier()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        self.sync()
        t2 = time.perf_counter()
        bare, drain = (t1 - t0) / calls, t2 - t1
        dist.barrier()
        self.sync()
        if self.quick:
            return [bare, drain, bare, bare, 0.0, 0.0]
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
        t0 = time.perf_counter()
        ev[0].record()
        for i in range(calls):
            fn()
            ev[i + 1].record()
        t1 = time.perf_counter()
        self.sync()
        evhost = (t1 - t0) / calls
        evmed = statistics.median(ev[i].elapsed_time(ev[i + 1]) for i in range(calls)) / 1e3
        dist.barrier()
        self.sync()
        dev = [torch.cuda.Event(enable_timing=True) for _ in range(dcalls + 1)]
        torch.cuda._sleep(int(self.cycles_per_s * (3e-3 + 4e-4 * dcalls)))
        dev[0].record()
        for i in range(dcalls):
            fn()
            dev[i + 1].record()
        ahead = 0.0 if dev[0].query() else 1.0
        self.sync()
        devs = dev[1].elapsed_time(dev[dcalls]) / 1e3 / (dcalls - 1)
        dist.barrier()
        self.sync()
        return [bare, drain, evhost, evmed, devs, ahead]

    def events(self, fn, iters: int, warm: int) -> list[float]:
        for _ in range(warm):
            fn()
        self.sync()
        dist.barrier()
        self.sync()
        if self.quick:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            t = (time.perf_counter() - t0) / iters
            return [t, t]
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        ev[0].record()
        for i in range(iters):
            fn()
            ev[i + 1].record()
        self.sync()
        ts = [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(iters)]
        dist.barrier()
        return [statistics.median(ts), min(ts)]

    # ------------------------------------------------------------------ phases

    def write(self, rec: dict):
        if self.rank == 0:
            with open(os.path.join(self.args.out, self.args.file), "a") as f:
                f.write(json.dumps(rec) + "\n")

    def phase_host(self):
        a = self.args
        names = ["host_bare_s", "drain_s", "host_events_s", "events_s", "device_s",
                 "host_ahead"]
        for rep in range(a.reps):
            for label, (g, pg, conc) in self.groups.items():
                for case in HOST_CASES:
                    if case == "a2a_sparse" and g < 3:
                        continue
                    if pg is not None:
                        fn = self.host_call(case, g, pg, dist.get_rank(pg))
                        vals = self.host_modes(fn, a.calls, a.device_calls)
                    else:  # idle rank of a solo group: keep the barriers in step
                        for _ in range(2 if self.quick else 4):
                            dist.barrier()
                            self.sync()
                        vals = [0.0] * len(names)
                    allv = self.gather(vals)
                    active = [i for i in range(self.world) if i < g or not label.endswith("solo")]
                    rec = {"phase": "host", "label": a.label, "rep": rep, "group": g,
                           "group_label": label, "concurrent_groups": conc, "case": case,
                           "calls": a.calls, "device_calls": a.device_calls,
                           "bytes_per_rank": 65536, "world": self.world}
                    for k, nm in enumerate(names):
                        per = [allv[i][k] for i in active]
                        rec[nm] = max(per)
                        rec[nm + "_per_rank"] = per
                    self.write(rec)
                    if self.rank == 0 and rep == 0:
                        print(f"host {label} {case}: bare {rec['host_bare_s'] * 1e6:.1f} us, "
                              f"events {rec['events_s'] * 1e6:.1f} us, device "
                              f"{rec['device_s'] * 1e6:.1f} us", flush=True)

    def phase_large(self):
        a = self.args
        sizes = [int(float(s) * 2**20) for s in a.sizes.split(",")]
        if self.quick:
            sizes = [s // 256 for s in sizes[:2]]
        t0 = time.time()
        stop = torch.zeros(1, device=self.dev)
        for label, (g, pg, conc) in self.groups.items():
            if label.endswith("solo"):
                continue
            for pattern in (a.patterns.split(",") if a.patterns else PATTERNS[g]):
                if pattern not in PATTERNS[g]:  # in --patterns' order
                    continue
                for nbytes in sizes:
                    stop.fill_(1.0 if time.time() - t0 > a.budget_s else 0.0)
                    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
                    if stop.item():
                        if self.rank == 0:
                            print("budget used up", flush=True)
                        return
                    gr = dist.get_rank(pg)
                    fn, t = self.large_call(pattern, g, pg, gr, nbytes // 2)
                    big = nbytes > 64 * 2**20
                    vals = self.events(fn, 10 if big else 20, 3 if big else 5)
                    del fn
                    allv = self.gather(vals)
                    rec = {"phase": "large", "label": a.label, "op": "all_to_all", "splits": "table",
                           "group": g,
                           "concurrent_groups": conc, "pattern": pattern, "bytes": nbytes,
                           "table_bytes": [[2 * v for v in row] for row in t],
                           "timing": "events", "time_s": max(v[0] for v in allv),
                           "best_s": max(v[1] for v in allv),
                           "per_rank_median_s": [v[0] for v in allv], "dtype": "bf16"}
                    self.write(rec)
                    if self.rank == 0 and nbytes == sizes[-1]:
                        print(f"large g{g} {pattern} {nbytes} B: {rec['time_s'] * 1e6:.1f} us",
                              flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--file", default="a2a_probe.jsonl")
    ap.add_argument("--label", default="first")
    ap.add_argument("--phases", default="host,large")
    ap.add_argument("--groups", default="g4,g2,g3solo")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--device-calls", type=int, default=40)
    ap.add_argument("--sizes", default="2,8,32,128,512")
    ap.add_argument("--patterns", default="", help="comma-separated PATTERNS names (default: all)")
    ap.add_argument("--budget-s", type=float, default=60)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    p = Probe(args)
    if args.quick:
        args.calls, args.device_calls = 20, 5
    for ph in args.phases.split(","):
        getattr(p, f"phase_{ph}")()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
