"""Host time of a GEMM whose shape the host has not seen before (issue 10/12: eager MoE).

An eager MoE layer with a learned router gives each expert a different number of tokens every
micro-batch, so each expert GEMM (forward, and the data- and weight-gradient GEMMs of its
backward) has a row count M the process may never have launched before. Profiles of such steps
(``call_moe_profile.sh``) show ``aten::mm`` / ``aten::addmm`` taking 134 / 207 us of host time
per call against 20 / 38 us in a dense step of the same script. This script measures that
host cost directly, one GPU, the GPU's work kept negligible (or counted apart):

* ``raw``: ``torch.mm`` / ``torch.addmm`` (bf16) in the three shapes of a linear layer
  (forward ``[M,k]x[k,n]``, data gradient ``[M,n]x[n,k]``, weight gradient ``[n,M]x[M,k]``),
  each for M ``fixed`` (one value, warmed), ``fresh`` (a value never used before in this
  process) and ``pool`` (cycling over 64 values used before);
* ``mlp``: an expert MLP (Linear with bias, GELU, Linear) forward and backward under autocast
  over fp32 weights, as eager MoE code runs it, for the same three M modes.

The host time of a call is the host clock around the call with the GPU drained before each
block of calls; the block's GPU time is measured too (CUDA events), and rows where the GPU
time exceeds half the host time are flagged (``gpu_bound``), since there the host waits for the
launch queue. Widths: ``small`` (k=256, n=512, M about 512: GPU negligible) and ``real``
(k=1536, n=4096, M about 2048). Writes ``gemm_shape_host.jsonl`` (one row per width, kind,
mode: median host us per call over 5 blocks of 40 calls, GPU us per call).

    python3 benchmarks/device/gemm_shape_host.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

BLOCKS, CALLS = 5, 40


class Ms:
    """Row counts: fixed, fresh (never used before in the process) or from a used pool."""

    fresh: dict[int, int] = {}  # per base: the last fresh M handed out (process-wide)

    def __init__(self, base: int):
        self.base = base
        Ms.fresh.setdefault(base, base + 1000)
        self.pool = [base - 32 + i for i in range(64)]
        self.i = 0

    def get(self, mode: str) -> int:
        if mode == "fixed":
            return self.base
        if mode == "pool":
            self.i += 1
            return self.pool[self.i % len(self.pool)]
        Ms.fresh[self.base] += 1
        return Ms.fresh[self.base]


def block(fn, ms: Ms, mode: str) -> tuple[float, float]:
    """(host us per call, GPU us per call) of CALLS calls of fn(M)."""
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    args = [ms.get(mode) for _ in range(CALLS)]
    a.record()
    t0 = time.perf_counter()
    for m in args:
        fn(m)
    host = time.perf_counter() - t0
    b.record()
    torch.cuda.synchronize()
    return host / CALLS * 1e6, a.elapsed_time(b) * 1e3 / CALLS


def measure(name: str, width: str, fn, base: int, out) -> None:
    for mode in ("fixed", "pool", "fresh"):
        ms = Ms(base)
        for _ in range(2):  # warm: the fixed shape and the pool are seen before timing
            block(fn, ms, "fixed")
            for _ in range(2):
                block(fn, ms, "pool")
        rows = [block(fn, ms, mode) for _ in range(BLOCKS)]
        host = statistics.median(r[0] for r in rows)
        gpu = statistics.median(r[1] for r in rows)
        rec = {"width": width, "kind": name, "mode": mode, "host_us_per_call": round(host, 2),
               "gpu_us_per_call": round(gpu, 2), "gpu_bound": gpu > 0.5 * host,
               "blocks": BLOCKS, "calls_per_block": CALLS}
        print(json.dumps(rec), flush=True)
        out.write(json.dumps(rec) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/gemm_shape_host")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda")
    with open(os.path.join(args.out, "gemm_shape_host.jsonl"), "w") as out:
        for width, k, n, base in (("small", 256, 512, 512), ("real", 1536, 4096, 2048)):
            big = base + 1000 + 6 * BLOCKS * CALLS + 64  # room for every fresh M
            x = torch.randn(big, k, device=dev, dtype=torch.bfloat16)
            g = torch.randn(big, n, device=dev, dtype=torch.bfloat16)
            w = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
            wt = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            bias = torch.randn(n, device=dev, dtype=torch.bfloat16)
            measure("mm_fwd", width, lambda m: torch.mm(x[:m], w), base, out)
            measure("addmm_fwd", width, lambda m: torch.addmm(bias, x[:m], w), base, out)
            measure("mm_dgrad", width, lambda m: torch.mm(g[:m], wt), base, out)
            measure("mm_wgrad", width, lambda m: torch.mm(g[:m].t(), x[:m]), base, out)
            fc1 = torch.nn.Linear(k, n, device=dev)
            fc2 = torch.nn.Linear(n, k, device=dev)
            xf = torch.randn(big, k, device=dev)

            def mlp(m):
                xi = xf[:m].detach().requires_grad_()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = fc2(F.gelu(fc1(xi), approximate="tanh"))
                y.float().sum().backward()

            measure("mlp_fwd_bwd", width, mlp, base, out)
            out.flush()


if __name__ == "__main__":
    main()
