"""Which expert GEMM at a new row count makes the host wait for the GPU to drain (issue 12,
helper emoe6; follow-up of ``moe_bwd_host.py``'s drains).

One process, one GPU. The six GEMMs of ``steps_alt.py``'s expert MLP (``c_fc`` / ``c_proj``,
bf16 as under its autocast): forward ``addmm`` with bias (``f1``: x[M,h] W1^T + b1, ``f2``:
a[M,f] W2^T + b2) and the four ``mm`` of their ``AddmmBackward0`` (``b2x``: g[M,h] W2,
``b2w``: g[M,h]^T a[M,f], ``b1x``: ga[M,f] W1, ``b1w``: ga[M,f]^T x[M,h]), the inputs row
slices of preallocated buffers (no allocation but each result's).

Every timed call: synchronise, queue a spin kernel of ``--sleep-ms`` (``torch.cuda._sleep``,
cycles calibrated first), then the GEMM; the host time of the GEMM's call is recorded. A
call that returns while the spin kernel still runs took its ordinary host time (well under
2 ms); one that waited for the GPU to drain took about the spin's length or more.

Passes, per shape ``HxF`` of ``--shapes``: ``new``: ``--count`` distinct row counts drawn
log-uniform in [1, 32768] (seeded), in random order, each with the six GEMMs (every call at a
row count new to the process); ``seen``: ``--repeat`` of those counts again, shuffled. Then
every call of the passes is replayed once under ``torch.profiler`` (CUDA), a 1-cycle spin
kernel between two calls as a separator, to name the kernels each call launches (cuBLAS's
choice for a shape is fixed once made). Per call: the caching allocator's segment count
before / after (``segment.all.allocated``: a cudaMalloc) and its reserved bytes.

``--blas cublaslt``: ``torch.backends.cuda.preferred_blas_library("cublaslt")`` (mm through
cuBLASLt too). ``--backtrace SO``: a native backtrace of the main thread while a call has run
longer than 3 ms (``SO``: ``gemm_drain_bt.c`` compiled, a SIGUSR2 handler calling glibc's
``backtrace``; a watcher thread sends the signal; up to ``--bt-max`` samples), written to
``OUT/drain-TAG-bt.txt``. ``--quick``: CPU, tiny shapes, no spin (a dry run of the code).

Output ``OUT/drain-TAG.json``. Usage: ``python benchmarks/device/gemm_drain.py --tag lazy
--out DIR``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import random
import signal
import sys
import threading
import time

import torch

OPS = ("f1", "f2", "b2x", "b2w", "b1x", "b1w")


class Shape:
    """The expert MLP's tensors for hidden ``h`` and expert width ``f``, ``mmax`` rows."""

    def __init__(self, h: int, f: int, mmax: int, dev, dt):
        g = torch.Generator(device="cpu").manual_seed(h * 7 + f)

        def r(*s):
            return (torch.randn(*s, generator=g) * 0.02).to(dev, dt)

        self.h, self.f = h, f
        self.x, self.a = r(mmax, h), r(mmax, f)
        self.gy, self.ga = r(mmax, h), r(mmax, f)
        self.w1, self.b1 = r(f, h), r(f)
        self.w2, self.b2 = r(h, f), r(h)

    def call(self, op: str, m: int):
        if op == "f1":
            return torch.addmm(self.b1, self.x[:m], self.w1.t())
        if op == "f2":
            return torch.addmm(self.b2, self.a[:m], self.w2.t())
        if op == "b2x":
            return torch.mm(self.gy[:m], self.w2)
        if op == "b2w":
            return torch.mm(self.gy[:m].t(), self.a[:m])
        if op == "b1x":
            return torch.mm(self.ga[:m], self.w1)
        return torch.mm(self.ga[:m].t(), self.x[:m])


def row_counts(count: int, seed: int, lo: int = 1, hi: int = 32768) -> list[int]:
    rng = random.Random(seed)
    out: set[int] = set()
    while len(out) < count:
        out.add(int(round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))
    lst = sorted(out)
    rng.shuffle(lst)
    return lst


def prewarm(shapes: list[tuple[int, int]], dev, dt=torch.bfloat16, quick: bool = False) -> dict:
    """Every GEMM of the expert MLP at a grid of row counts (all of 1..512, every 8th to 4096,
    every 64th to 32768), the GPU left to run: loads the kernels cuBLAS picks on that grid.
    Returns the host seconds it took and the row counts' number."""
    hi = 64 if quick else 32768
    grid = sorted(set(list(range(1, min(hi, 512) + 1)) + list(range(512, min(hi, 4096) + 1, 8))
                      + list(range(4096, hi + 1, 64))))
    t0 = time.perf_counter()
    with torch.no_grad():
        for h, f in shapes:
            s = Shape(h, f, hi, dev, dt)
            for i, m in enumerate(grid):
                for op in OPS:
                    s.call(op, m)
                if i % 64 == 63 and dev.type == "cuda":
                    torch.cuda.synchronize()
            del s
    if dev.type == "cuda":
        torch.cuda.synchronize()
    return {"prewarm_s": time.perf_counter() - t0, "prewarm_counts": len(grid)}


class Watcher:
    """Sends SIGUSR2 to the main thread while a marked call has run longer than ``after_s``
    (twice a call at most, ``limit`` samples in all); the handler in the .so writes the
    main thread's native backtrace."""

    def __init__(self, so: str, path: str, after_s: float = 3e-3, limit: int = 12):
        self.lib = ctypes.CDLL(so)
        rc = self.lib.bt_install(int(signal.SIGUSR2), path.encode())
        if rc != 0:
            raise OSError(f"bt_install: {rc}")
        self.main = threading.main_thread().ident
        self.after, self.limit, self.n = after_s, limit, 0
        self.cur = None  # (call index, t0)
        self.sent: dict[int, int] = {}
        self.stop = False
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        while not self.stop and self.n < self.limit:
            cur = self.cur
            if cur is not None:
                idx, t0 = cur
                k = self.sent.get(idx, 0)
                if k < 2 and time.perf_counter() - t0 > self.after * (1 + 2 * k):
                    self.lib.bt_mark(idx, k)
                    signal.pthread_kill(self.main, signal.SIGUSR2)
                    self.sent[idx] = k + 1
                    self.n += 1
            time.sleep(5e-4)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="2304x4096,1792x3072")
    ap.add_argument("--count", type=int, default=160)
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sleep-ms", type=float, default=8.0)
    ap.add_argument("--blas", choices=("default", "cublas", "cublaslt"), default="default")
    ap.add_argument("--backtrace", default="")
    ap.add_argument("--bt-max", type=int, default=12)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cuda = not args.quick
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dt = torch.bfloat16
    os.makedirs(args.out, exist_ok=True)
    if cuda:
        torch.cuda.set_device(dev)
        if args.blas != "default":
            torch.backends.cuda.preferred_blas_library(args.blas)
        # the handle and the spin kernel loaded; the spin's cycles a millisecond measured
        torch.mm(torch.ones(8, 8, device=dev), torch.ones(8, 8, device=dev))
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        torch.cuda._sleep(20_000_000)
        e1.record()
        torch.cuda.synchronize()
        cyc_ms = 20_000_000 / e0.elapsed_time(e1)
        # a cached segment large enough for every result: no cudaMalloc at a new size
        big = torch.empty(3 * 2**30, dtype=torch.uint8, device=dev)
        del big
    else:
        cyc_ms = 0.0
    spin = int(args.sleep_ms * cyc_ms)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    if args.quick:
        shapes = [(16, 32)]
    mmax = 64 if args.quick else 32768
    watcher = None
    bt_path = os.path.join(args.out, f"drain-{args.tag}-bt.txt")
    if args.backtrace and cuda:
        try:
            watcher = Watcher(args.backtrace, bt_path, limit=args.bt_max)
        except OSError as e:
            print(f"backtrace off: {e}", flush=True)

    def segs():
        if not cuda:
            return 0, 0
        st = torch.cuda.memory_stats(dev)
        return st.get("segment.all.allocated", 0), st.get("reserved_bytes.all.current", 0)

    calls = []
    for si, (h, f) in enumerate(shapes):
        sh = Shape(h, f, mmax, dev, dt)
        ms = row_counts(args.count if not args.quick else 12, args.seed + si, 1, mmax)
        rng = random.Random(args.seed + 100 + si)
        seen = ms[:]
        rng.shuffle(seen)
        for phase, lst in (("new", ms), ("seen", seen[: args.repeat if not args.quick else 4])):
            for m in lst:
                for op in OPS:
                    if cuda:
                        torch.cuda.synchronize()
                    s0, r0 = segs()
                    if cuda:
                        torch.cuda._sleep(spin)
                    idx = len(calls)
                    t0 = time.perf_counter()
                    if watcher:
                        watcher.cur = (idx, t0)
                    out = sh.call(op, m)
                    t1 = time.perf_counter()
                    if watcher:
                        watcher.cur = None
                    del out
                    if cuda:
                        torch.cuda.synchronize()
                    t2 = time.perf_counter()
                    s1, r1 = segs()
                    calls.append({"shape": f"{h}x{f}", "phase": phase, "m": m, "op": op,
                                  "host_ms": round((t1 - t0) * 1e3, 4),
                                  "wall_ms": round((t2 - t0) * 1e3, 4),
                                  "new_segments": s1 - s0, "reserved_delta": r1 - r0})
        del sh
    if watcher:
        watcher.stop = True
    # replay every call once under the profiler: the kernels of each, spin separators between
    kernels: list[list[str]] = [[] for _ in calls]
    if cuda:
        from torch.profiler import ProfilerActivity, profile
        bufs = {}
        for h, f in shapes:
            bufs[f"{h}x{f}"] = Shape(h, f, mmax, dev, dt)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for c in calls:
                torch.cuda._sleep(1)
                bufs[c["shape"]].call(c["op"], c["m"])
            torch.cuda._sleep(1)
            torch.cuda.synchronize()
        evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and e.time_range is not None]
        evs.sort(key=lambda e: (e.time_range.start, e.time_range.end))
        i = -1
        for e in evs:
            if "spin" in e.name.lower() or "sleep" in e.name.lower():
                i += 1
                continue
            if 0 <= i < len(calls):
                kernels[i].append(e.name)
        nsep = sum(1 for e in evs if "spin" in e.name.lower() or "sleep" in e.name.lower())
    else:
        nsep = 0
    for c, k in zip(calls, kernels, strict=True):
        c["kernels"] = k
    rec = {"tag": args.tag, "shapes": args.shapes, "count": args.count, "repeat": args.repeat,
           "seed": args.seed, "sleep_ms": args.sleep_ms, "spin_cycles": spin,
           "cycles_per_ms": cyc_ms, "blas": args.blas, "separators": nsep, "calls": calls,
           "bt_samples": watcher.n if watcher else 0,
           "env": {"torch": torch.__version__, "cuda": torch.version.cuda,
                   "gpu": torch.cuda.get_device_name(dev) if cuda else "cpu",
                   **{k: v for k, v in os.environ.items()
                      if k.startswith(("CUDA_", "CUBLAS", "TORCH_BLAS"))}}}
    with open(os.path.join(args.out, f"drain-{args.tag}.json"), "w") as fh:
        json.dump(rec, fh)
    nd = sum(1 for c in calls if c["host_ms"] > 0.5 * args.sleep_ms)
    print(f"RESULT {args.tag}: {len(calls)} calls, {nd} over {0.5 * args.sleep_ms} ms host, "
          f"separators {nsep}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
