"""FP8 GEMMs beside bf16 GEMMs of the same shapes, on one GPU (issue 11: FP8 GEMM efficiency).

For each shape ``[m,k] @ [k,n]`` it times, back to back on one stream with a CUDA event
between launches (nccl-tests style, as ``measure.py``'s GEMM part):

* ``bf16``: ``torch.matmul(a, b, out=out)`` (b stored n x k and transposed: nn.Linear's layout);
* ``fp8`` with a per-tensor scale (Transformer Engine's delayed / current scaling GEMM):
  ``torch._scaled_mm(a8, b8, scale_a, scale_b, out_dtype=bf16)``, e4m3 operands, cuBLASLt;
* ``fp8_rowwise``: the same with a scale per row of A and per column of B (fp32), where the
  build supports it (the nearest cuBLAS form to DeepSeek-V3's fine-grained scaling).

It also times the quantisation kernels an FP8 step adds, in eager PyTorch: the amax of a bf16
tensor (``x.abs().amax()``) and the scaled cast to e4m3 (``(x * s).to(float8_e4m3fn)``), so the
bytes-per-element that ``simulator/hardware/precision.py`` prices can be checked.

Usage: ``python3 benchmarks/device/gemm_fp8.py --out DIR`` writes ``DIR/gemm_fp8.jsonl`` (one line
per shape and format: median and best time of ``--iters`` launches after ``--warmup``) and
``DIR/quant_fp8.jsonl``. ``--quick`` runs tiny shapes (CPU: only checks that it runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

# The bf16 calibration shapes of data/measured/h100x1/gemm.jsonl (m in 1024/4096/8192 against
# the k x n of Llama-class layers) and the FFN / attention projections of 8B-405B models.
KN = [(1024, 8192), (3584, 8192), (4096, 1536), (4096, 3584), (8192, 1280), (8192, 7168),
      (1024, 4096), (4096, 4096), (4096, 6144), (4096, 14336), (14336, 4096), (4096, 28672),
      (8192, 28672), (28672, 8192), (16384, 6656), (6656, 16384), (2048, 2048), (2048, 5632),
      (5632, 2048), (7168, 2048), (2048, 7168)]
MS = [1024, 2048, 4096, 8192, 16384]


def timed(fn, warmup: int, iters: int) -> list[float]:
    for _ in range(warmup):
        fn()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(iters)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=200)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    dev = torch.device("cuda")
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0),
           "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    f8 = torch.float8_e4m3fn
    jobs = [(64, 64, 128)] if args.quick else [(m, k, n) for m in MS for k, n in KN]
    one = torch.ones((), device=dev, dtype=torch.float32)
    with open(os.path.join(args.out, "gemm_fp8.jsonl"), "a") as fo:
        for m, k, n in jobs:
            if time.time() - t_start > args.budget_s:
                print("budget spent, stopping", flush=True)
                break
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
            a8 = a.to(f8)
            w8 = w.to(f8)  # n x k row-major, so w8.t() is k x n column-major (cuBLASLt's TN)
            forms = {
                "bf16": lambda: torch.matmul(a, w.t(), out=out),
                "fp8": lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one,
                                                out_dtype=torch.bfloat16),
            }
            sa = torch.ones(m, 1, device=dev, dtype=torch.float32)
            sb = torch.ones(1, n, device=dev, dtype=torch.float32)
            forms["fp8_rowwise"] = lambda: torch._scaled_mm(
                a8, w8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
            for name, fn in forms.items():
                try:
                    ts = timed(fn, args.warmup, args.iters)
                except Exception as e:  # noqa: BLE001 (a form this build lacks)
                    print(f"{name} {m}x{k}x{n}: skipped ({type(e).__name__}: {str(e)[:120]})",
                          flush=True)
                    continue
                t = statistics.median(ts)
                rec = {"m": m, "k": k, "n": n, "dtype": name, "layout": "nt", "time_s": t,
                       "best_s": min(ts), "tflops": 2 * m * k * n / t / 1e12,
                       "timing": "cuda_events", "iters": args.iters, "env": env}
                fo.write(json.dumps(rec) + "\n")
                fo.flush()
                print(f"{name:12s} {m}x{k}x{n}: {t * 1e6:9.1f} us {rec['tflops']:7.1f} TFLOP/s",
                      flush=True)
            del a, w, out, a8, w8
            torch.cuda.empty_cache()
    # quantisation kernels, eager: amax then scaled cast (what a current-scaling recipe runs)
    sizes = [1 << 12] if args.quick else [1 << s for s in (20, 22, 24, 26, 28)]
    with open(os.path.join(args.out, "quant_fp8.jsonl"), "a") as fo:
        for numel in sizes:
            x = torch.randn(numel, device=dev, dtype=torch.bfloat16)
            s = torch.full((), 2.0, device=dev, dtype=torch.float32)
            kernels = {
                "amax": (lambda: x.abs().amax(), 2 * 2 * numel),  # abs writes bf16, amax reads it
                "scaled_cast": (lambda: (x * s).to(f8), 2 * numel + 2 * 2 * numel + numel),
                "cast": (lambda: x.to(f8), 2 * numel + numel),
            }
            for name, (fn, nbytes) in kernels.items():
                ts = timed(fn, args.warmup, args.iters)
                t = statistics.median(ts)
                rec = {"kernel": name, "elements": numel, "bytes_moved": nbytes, "time_s": t,
                       "best_s": min(ts), "GBps": nbytes / t / 1e9, "timing": "cuda_events",
                       "env": env}
                fo.write(json.dumps(rec) + "\n")
                print(f"{name:12s} {numel:>10d}: {t * 1e6:9.1f} us {rec['GBps']:7.0f} GB/s",
                      flush=True)
            del x
    print(f"done in {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
