"""Achieved HBM bandwidth of memory-bound kernels on one GPU (for the compute model).

    python benchmarks/device/elementwise.py --out DIR [--quick]

Each op runs on tensors of 16 MiB .. 1 GiB (per input), timed nccl-tests style: CUDA events
around N back-to-back launches, median of 5 groups, after warm-up. ``bytes`` counts what the
kernel must read plus write (inputs read once, output written once); ``GBps`` = bytes / time.
Writes ``elementwise.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    import torch
    import torch.nn.functional as F

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rows-only", action="store_true", help="only the row-wise training shapes")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() and not a.quick else "cpu"
    path = os.path.join(a.out, "elementwise.jsonl")
    f = open(path, "a")

    def timeit(fn, n=20):
        for _ in range(3):
            fn()
        if dev == "cuda":
            torch.cuda.synchronize()
            res = []
            for _ in range(5):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(n):
                    fn()
                e.record()
                torch.cuda.synchronize()
                res.append(s.elapsed_time(e) / 1e3 / n)
            return statistics.median(res)
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n

    meta = {"op": "meta", "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
            "timing": "CUDA events around 20 back-to-back launches, median of 5 groups"}
    f.write(json.dumps(meta) + "\n")
    sizes = [2**20] if a.quick else ([] if a.rows_only else [2**22, 2**24, 2**26, 2**28])
    for n in sizes:
        rows = 4096 if n >= 2**22 else 64
        for dt_name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            eb = torch.tensor([], dtype=dt).element_size()
            x = torch.randn(n, device=dev, dtype=dt)
            y = torch.randn(n, device=dev, dtype=dt)
            x2 = x.view(rows, -1)
            w = torch.randn(x2.shape[1], device=dev, dtype=dt)
            cases = {
                "copy": (lambda: x.clone(), 2 * n * eb),
                "add": (lambda: x + y, 3 * n * eb),
                "mul_scalar": (lambda: x * 1.5, 2 * n * eb),
                "silu": (lambda: F.silu(x), 2 * n * eb),
                "gelu": (lambda: F.gelu(x), 2 * n * eb),
                "pow2": (lambda: x.pow(2), 2 * n * eb),
                "mean_lastdim": (lambda: x2.mean(-1, keepdim=True), n * eb),
                "mul_rowvec": (lambda: x2 * w, 2 * n * eb),
                "softmax_lastdim": (lambda: torch.softmax(x2, -1), 2 * n * eb),
                "layer_norm": (lambda: F.layer_norm(x2, (x2.shape[1],), w), 2 * n * eb),
                "cat_halves": (lambda: torch.cat([x2[:, : x2.shape[1] // 2],
                                                  x2[:, x2.shape[1] // 2:]], -1), 2 * n * eb),
                "dropout": (lambda: F.dropout(x, 0.1, True), 2 * n * eb + n),
            }
            if dt == torch.float32:
                cases["cast_to_bf16"] = (lambda: x.to(torch.bfloat16), n * (4 + 2))
            else:
                cases["cast_to_fp32"] = (lambda: x.float(), n * (2 + 4))
            for name, (fn, nbytes) in cases.items():
                try:
                    t = timeit(fn)
                    rec = {"op": name, "dtype": dt_name, "elements": n, "bytes": nbytes,
                           "time_s": t, "GBps": nbytes / t / 1e9}
                except Exception as e:  # keep going: one unsupported op loses one row
                    rec = {"op": name, "dtype": dt_name, "elements": n, "error": repr(e)[:200]}
                f.write(json.dumps(rec) + "\n")
                f.flush()
            del x, y, x2, w
            if dev == "cuda":
                torch.cuda.empty_cache()
    # Row-wise kernels on training shapes: [tokens, width] for model widths and vocabularies.
    T = 256 if a.quick else 8192
    for width in ([64] if a.quick else [2048, 4096, 8192, 16384, 32000, 51200, 128256]):
        for dt_name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            eb = torch.tensor([], dtype=dt).element_size()
            if T * width * eb > 6 * 2**30:
                continue
            x = torch.randn(T, width, device=dev, dtype=dt)
            w = torch.randn(width, device=dev, dtype=dt)
            tgt = torch.randint(0, width, (T,), device=dev)
            n = T * width
            half = x[:, : width // 2]  # a strided view, as x.chunk(2, -1)[0]
            other = x[:, width // 2 :]
            lo = x.to(torch.bfloat16) if dt == torch.float32 else x
            cases = {
                "strided_silu": (lambda: F.silu(half), n * eb),
                "strided_mul": (lambda: half * other, 3 * n * eb // 2),
                "mixed_add": (lambda: x.float() + lo if dt == torch.float32 else None, 0),
                "row_softmax": (lambda: torch.softmax(x, -1), 2 * n * eb),
                "row_layer_norm": (lambda: F.layer_norm(x, (width,), w), 2 * n * eb),
                "row_rms_norm": (lambda: F.rms_norm(x, (width,), w), 2 * n * eb),
                "row_mul_vec": (lambda: x * w, 2 * n * eb),
                "row_add": (lambda: x + x, 3 * n * eb),
                "cross_entropy": (lambda: F.cross_entropy(x, tgt), n * eb),
            }
            if dt == torch.float32:  # fp32 residual + bf16 branch output -> fp32
                cases["mixed_add"] = (lambda: x + lo, n * (4 + 2 + 4))
            else:
                del cases["mixed_add"]
            for name, (fn, nbytes) in cases.items():
                try:
                    t = timeit(fn)
                    rec = {"op": name, "dtype": dt_name, "rows": T, "width": width,
                           "bytes": nbytes, "time_s": t, "GBps": nbytes / t / 1e9}
                except Exception as e:
                    rec = {"op": name, "dtype": dt_name, "rows": T, "width": width,
                           "error": repr(e)[:200]}
                f.write(json.dumps(rec) + "\n")
                f.flush()
            del x, w, tgt
            if dev == "cuda":
                torch.cuda.empty_cache()
    # A tiny kernel back to back: the per-kernel floor on the GPU stream.
    z = torch.zeros(1, device=dev)
    t = timeit(lambda: z.add_(1.0), n=200)
    f.write(json.dumps({"op": "tiny_kernel", "time_s": t}) + "\n")
    f.close()
    print(open(path).read())


if __name__ == "__main__":
    main()
