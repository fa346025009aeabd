"""Micro-benchmarks for calibrating simulator/hardware/compute.py on one GPU (needs PyTorch).

    python simulator/hardware/data/microbench.py OUT.jsonl [--quick]

Writes JSON lines in the format the fitter reads (see README.md beside this file):

* ``gemm``: bf16 ``[m,k] @ [k,n]`` with ``time_s`` = summed CUDA kernel durations of one call
  (torch.profiler / CUPTI, so host launch overhead is excluded), ``events_s`` = calls back to
  back between CUDA events; ``tag`` is ``calib`` (a fixed grid of shapes) or ``test`` (shapes
  drawn from transformer layers with a fixed seed, for checking the fit on unseen shapes);
* ``sdpa_causal``: ``fwd_s`` and ``bwd_s`` kernel times of
  ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``;
* ``d2d_copy``: ``time_s`` of ``y.copy_(x)``; ``bytes`` counts bytes read plus written;
* ``tiny_kernel``: time per trivial kernel replayed from a CUDA graph (launch gap).

Random normal inputs (zeros run faster); one warm-up call before each measurement.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

DEV = "cuda"
CALIB = [
    (2048, 2048, 2048),
    (2048, 2048, 6144),
    (4096, 2048, 2048),
    (8192, 8192, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (2048, 8192, 2048),
    (16384, 2048, 2048),
    (1024, 1024, 1024),
    (1024, 4096, 4096),
    (1024, 8192, 8192),
    (512, 4096, 4096),
    (256, 4096, 4096),
    (128, 8192, 8192),
    (16, 8192, 8192),
    (8192, 1536, 8192),
    (8192, 1024, 8192),
    (8192, 512, 8192),
    (8192, 256, 8192),
    (4096, 8192, 1024),
    (4096, 8192, 1280),
    (4096, 1024, 8192),
    (4096, 1280, 8192),
    (2048, 12288, 1536),
    (3072, 3072, 3072),
    (5000, 5000, 5000),
    (8192, 8192, 512),
    (8192, 8192, 256),
    (8192, 8192, 128),
    (2048, 2048, 512),
    (512, 512, 512),
    (256, 256, 256),
    (4096, 4096, 11008),
    (12288, 2048, 6144),
]
SDPA = [  # (batch, heads, kv_heads, seq, head_dim)
    (1, 16, 16, 2048, 128),
    (4, 16, 16, 2048, 128),
    (1, 32, 32, 4096, 128),
    (1, 64, 64, 8192, 128),
    (1, 8, 8, 4096, 128),
    (1, 64, 8, 4096, 128),
    (2, 32, 8, 4096, 128),
    (1, 16, 16, 1024, 128),
    (8, 16, 16, 1024, 128),
    (1, 32, 32, 2048, 64),
    (1, 12, 12, 2048, 128),
    (1, 96, 96, 2048, 128),
    (1, 4, 4, 16384, 128),
    (1, 16, 16, 16384, 128),
    (2, 8, 8, 8192, 128),
    (1, 24, 24, 4096, 128),
    (1, 128, 128, 4096, 128),
    (1, 8, 8, 2048, 128),
    (2, 40, 40, 4096, 128),
    (1, 32, 32, 4096, 64),
    (4, 32, 8, 2048, 128),
    (1, 48, 48, 8192, 128),
    (1, 16, 16, 512, 128),
    (16, 16, 16, 512, 128),
    (1, 8, 8, 32768, 128),
]


def kernel_time(fn, iters: int) -> tuple[float, list[str]]:
    """Mean summed CUDA-kernel time of one ``fn()`` call, and the kernel names."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    ks = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.time_range.elapsed_us() for e in ks) * 1e-6
    names = sorted({e.name[:80] for e in ks if not e.name.startswith("Memset")})
    return total / iters, names


def events_time(fn, n: int, groups: int) -> float:
    """Median over ``groups`` of the time per call of ``n`` calls between CUDA events."""
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(groups):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3 / n)
    return statistics.median(ts)


def gemm(m: int, k: int, n: int, tag: str) -> dict:
    a = torch.randn(m, k, device=DEV, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=DEV, dtype=torch.bfloat16)
    big = 2.0 * m * k * n > 2e12
    t, names = kernel_time(lambda: torch.matmul(a, b), 3 if big else 15)
    te = events_time(lambda: torch.matmul(a, b), 3 if big else 20, 3 if big else 5)
    return {
        "op": "gemm",
        "tag": tag,
        "m": m,
        "k": k,
        "n": n,
        "dtype": "bf16",
        "time_s": t,
        "tflops": round(2.0 * m * k * n / t / 1e12, 2),
        "events_s": te,
        "kernels": names,
    }


def training_shapes(count: int, seed: int = 20261126) -> list[tuple[int, int, int]]:
    """GEMM shapes of transformer layers (QKV, out-proj, MLP up/down, weight gradients)."""
    rng = random.Random(seed)
    hid = [2048, 2560, 3072, 4096, 5120, 6144, 8192, 12288, 16384]
    ffn = [5504, 8192, 11008, 13824, 14336, 20480, 28672, 49152, 53248]
    toks = [1024, 2048, 3072, 4096, 6144, 8192, 16384]
    shapes: set[tuple[int, int, int]] = set()
    while len(shapes) < count:
        h, f, tp, m = rng.choice(hid), rng.choice(ffn), rng.choice([1, 2, 4, 8]), rng.choice(toks)
        kind = rng.choice(["qkv", "proj", "up", "down", "wgrad"])
        s = {
            "qkv": (m, h, 3 * h // tp),
            "proj": (m, h // tp, h),
            "up": (m, h, f // tp),
            "down": (m, f // tp, h),
            "wgrad": (h, m, f // tp),
        }[kind]
        if 2.0 * s[0] * s[1] * s[2] < 4e13:
            shapes.add(s)
    return sorted(shapes)


def sdpa(b: int, h: int, kvh: int, s: int, d: int) -> dict:
    q = torch.randn(b, h, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, kvh, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, kvh, s, d, device=DEV, dtype=torch.bfloat16, requires_grad=True)
    go = torch.randn(b, h, s, d, device=DEV, dtype=torch.bfloat16)
    gqa = kvh != h

    def fwd():
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    tf, nf = kernel_time(fwd, 5)
    tb, nb = kernel_time(lambda: torch.autograd.grad(o, (q, k, v), go, retain_graph=True), 5)
    return {
        "op": "sdpa_causal",
        "batch": b,
        "heads": h,
        "kv_heads": kvh,
        "seq": s,
        "head_dim": d,
        "fwd_s": tf,
        "bwd_s": tb,
        "fwd_kernels": nf,
        "bwd_kernels": nb,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--quick", action="store_true", help="a few shapes only (smoke test)")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = [
        {
            "op": "meta",
            "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "sms": torch.cuda.get_device_properties(0).multi_processor_count,
        }
    ]
    calib, test = CALIB, training_shapes(48)
    sdpa_cfgs = SDPA
    if args.quick:
        calib, test, sdpa_cfgs = calib[:4], test[:4], SDPA[:3]
    rows += [gemm(*s, "calib") for s in calib] + [gemm(*s, "test") for s in test]
    rows += [sdpa(*c) for c in sdpa_cfgs]
    for nbytes in (64 * 2**20, 256 * 2**20, 2**30):
        x = torch.randn(nbytes // 2, device=DEV, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        t, _ = kernel_time(lambda x=x, y=y: y.copy_(x), 10)
        rows.append({"op": "d2d_copy", "bytes": 2 * nbytes, "time_s": t})
    x = torch.zeros(1, device=DEV)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(200):
            x.add_(1.0)
    rows.append({"op": "tiny_kernel", "cuda_graph_s": events_time(g.replay, 5, 5) / 200})
    with open(args.out, "w") as fh:
        for r in rows:
            fh.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
