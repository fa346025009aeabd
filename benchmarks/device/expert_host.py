"""Host time of steps_alt.py's eager expert section, one GPU (issue 10/12, helper emoe2).

Per MoE layer call steps_alt.py's ``MoE.forward`` runs, on the received buffer, for each local
expert: a slice per source rank, their ``torch.cat``, the expert (``MLP``: Linear with bias,
GELU tanh, Linear with bias; fp32 parameters under bf16 autocast) and a ``split`` of its output
per source; then one ``torch.cat`` of all pieces. Its backward is one autograd engine run.
This script times that section on its own, host clock only (the GPU drained before each
timed section, so the host never waits on the launch queue), forward and backward apart:

* ``section``: the exact loop above, 4 sources x 4 local experts (h11_moe_ep4_M's EP 4 rank),
  row counts ``fixed`` (the same every call), ``pool`` (64 count sets seen before) or ``fresh``
  (counts never launched before in the process: cuBLAS heuristic misses);
* ``expert``: one expert alone on one input (no slices, cat, split), fixed rows;
* ``mul``: ``y * 1.0001`` under autograd, chains of 32 and 64 (the reference of
  gpus.yaml host_engine_op_s: half of the marginal forward + backward call);
each at widths ``tiny`` (hidden 192, FFN 384) and ``M`` (hidden 1536, FFN 1024), with the
parameters' ``.grad`` present (accumulating, as a second micro-batch) or None (the first).
Kernel counts per section (forward, backward) from torch.profiler (CUDA kernels + memsets +
memcpys), one untimed call with ``.grad`` present. Writes expert_host.jsonl: median host us over CALLS calls.

    python expert_host.py --out DIR [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

CALLS, WARM = 30, 6
SRC, LOCAL = 4, 4


class MLP(nn.Module):  # steps_alt.py's MLP, the same two lines
    def __init__(self, h: int, f: int):
        super().__init__()
        self.c_fc = nn.Linear(h, f)
        self.c_proj = nn.Linear(f, h)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def section(recv, experts, n):
    """steps_alt.py MoE.forward's expert loop, verbatim but for names."""
    starts, o = [], 0
    for src in range(len(n)):
        row = []
        for j in range(len(experts)):
            row.append(o)
            o += n[src][j]
        starts.append(row)
    pieces = {}
    for j, expert in enumerate(experts):
        xs = [recv[starts[src][j]: starts[src][j] + n[src][j]] for src in range(len(n))]
        y = expert(torch.cat(xs))
        for src, part in enumerate(y.split([n[src][j] for src in range(len(n))])):
            pieces[(src, j)] = part
    return torch.cat([pieces[(src, j)] for src in range(len(n)) for j in range(len(experts))])


class Counts:
    def __init__(self, base: int):
        self.base, self.i, self.fresh = base, 0, 0
        self.pool = [[[base + ((7 * s + 3 * j + 5 * p) % 64) - 32 for j in range(LOCAL)]
                      for s in range(SRC)] for p in range(64)]

    def get(self, mode):
        if mode == "fixed":
            return [[self.base] * LOCAL for _ in range(SRC)]
        if mode == "pool":
            self.i += 1
            return self.pool[self.i % 64]
        self.fresh += 1  # every expert's total row count new to the process
        return [[self.base + 200 + SRC * LOCAL * self.fresh + s * LOCAL + j for j in range(LOCAL)]
                for s in range(SRC)]


def prof_count(fn, dev):
    if dev.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            fn()
            sync(dev)
        return sum(1 for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception as exc:  # the count is a side product: never lose the timings for it
        print("profiler:", exc, flush=True)
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--calls", type=int, default=CALLS)
    ap.add_argument("--tiny-only", action="store_true")  # a quick check on the CPU
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.cuda.set_device(0)
    dt = torch.bfloat16
    out = open(os.path.join(a.out, "expert_host.jsonl"), "w")

    def emit(rec):
        print(json.dumps(rec), flush=True)
        out.write(json.dumps(rec) + "\n")

    widths = (("tiny", 192, 384, 256), ("M", 1536, 1024, 1024))
    for width, h, f, base in widths[:1] if a.tiny_only else widths:
        torch.manual_seed(0)
        experts = nn.ModuleList(MLP(h, f) for _ in range(LOCAL)).to(dev)
        big = SRC * LOCAL * (base + 200 + SRC * LOCAL * (8 * a.calls + 64))
        src_buf = torch.randn(big, h, device=dev, dtype=dt)
        cnt = Counts(base)

        def call(mode, grads, timed):
            n = cnt.get(mode)
            rows = sum(map(sum, n))
            if not grads:
                for p in experts.parameters():
                    p.grad = None
            recv = src_buf[:rows].detach().requires_grad_()
            g = src_buf[:rows]
            sync(dev)
            t0 = time.perf_counter()
            with torch.autocast(dev.type, dtype=dt):
                y = section(recv, experts, n)
            t1 = time.perf_counter()
            y.backward(g)
            t2 = time.perf_counter()
            sync(dev)
            return (t1 - t0) * 1e6, (t2 - t1) * 1e6

        for grads in (True, False):
            for mode in ("fixed", "pool", "fresh"):
                for _ in range(WARM):
                    call("fixed", grads, False)
                    call("pool", grads, False)
                r = [call(mode, grads, True) for _ in range(a.calls)]
                kf = kb = None
                if mode == "fixed" and grads:
                    n = cnt.get("fixed")
                    rows = sum(map(sum, n))
                    recv = src_buf[:rows].detach().requires_grad_()
                    holder = {}

                    def fw():
                        with torch.autocast(dev.type, dtype=dt):
                            holder["y"] = section(recv, experts, n)
                    kf = prof_count(fw, dev)
                    kb = prof_count(lambda: holder["y"].backward(src_buf[:rows]), dev)
                emit({"width": width, "kind": "section", "mode": mode, "grads": grads,
                      "sources": SRC, "experts": LOCAL, "rows_per_piece": base,
                      "fwd_host_us": round(statistics.median(x[0] for x in r), 1),
                      "bwd_host_us": round(statistics.median(x[1] for x in r), 1),
                      "fwd_kernels": kf, "bwd_kernels": kb})
            # one expert alone, fixed rows
            e = experts[0]
            rows = SRC * base

            def one():
                if not grads:
                    for p in e.parameters():
                        p.grad = None
                x = src_buf[:rows].detach().requires_grad_()
                sync(dev)
                t0 = time.perf_counter()
                with torch.autocast(dev.type, dtype=dt):
                    y = e(x)
                t1 = time.perf_counter()
                y.backward(src_buf[:rows])
                t2 = time.perf_counter()
                sync(dev)
                return (t1 - t0) * 1e6, (t2 - t1) * 1e6, y
            for _ in range(WARM):
                one()
            r = [one() for _ in range(a.calls)]
            x = src_buf[:rows].detach().requires_grad_()
            holder = {}

            def fw1():
                with torch.autocast(dev.type, dtype=dt):
                    holder["y"] = e(x)
            kf = prof_count(fw1, dev) if grads else None
            kb = prof_count(lambda: holder["y"].backward(src_buf[:rows]), dev) if grads else None
            emit({"width": width, "kind": "expert", "mode": "fixed", "grads": grads,
                  "rows": rows, "fwd_host_us": round(statistics.median(x[0] for x in r), 1),
                  "bwd_host_us": round(statistics.median(x[1] for x in r), 1),
                  "fwd_kernels": kf, "bwd_kernels": kb})
    # the mul chain (host_ops.py's reference call), per call: (T64 - T32) / 32
    xm = torch.randn(1024, device=dev, requires_grad=True)

    def chain(k):
        sync(dev)
        t0 = time.perf_counter()
        y = xm
        for _ in range(k):
            y = y * 1.0001
        t1 = time.perf_counter()
        y.sum().backward()
        t2 = time.perf_counter()
        sync(dev)
        return t1 - t0, t2 - t1
    for _ in range(WARM):
        chain(32), chain(64)
    r32 = [chain(32) for _ in range(a.calls)]
    r64 = [chain(64) for _ in range(a.calls)]
    for i, nm in ((0, "fwd"), (1, "bwd")):
        emit({"kind": "mul", "part": nm,
              "host_us_per_call": round((statistics.median(x[i] for x in r64)
                                         - statistics.median(x[i] for x in r32)) / 32 * 1e6, 2)})
    env = {"torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu"}
    emit({"kind": "env", **env})


if __name__ == "__main__":
    main()
