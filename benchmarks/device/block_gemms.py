"""The GEMMs of one Llama block and of the LM head, as steps_third.py runs them, timed on one GPU.

Issue 12, fourteenth batch: the third script's dense steps on shape AC (width 3584, 28/4 heads
of 128, SwiGLU 9728, vocabulary 65536, 2K sequences) came out faster in the model than measured
(about -10 %) where shape I (4096, 32/8, 11008, 32000) was within a few per cent. This script
measures, in bf16 without autocast, exactly the matrix products of one block of each shape and
of the head, with the layouts of ``F.linear`` and its autograd backward (forward ``x @ W^T``,
input gradient ``dy @ W``, weight gradient ``dy^T @ x``), each by CUDA events around ``reps``
calls back to back (median of ``groups`` groups), plus:

- ``sweep``: ``[2048, k] @ [k, n]^T`` forward over widths around 3584 / 4096 (multiples of 128
  and of 256) -- tile and wave quantisation on the SMs;
- ``module``: one whole ``Block`` forward + backward and the tail (final RMSNorm, head,
  ``F.cross_entropy`` on fp32 logits) forward + backward of steps_third.py, by CUDA events;
- ``kernels``: the same block and tail under ``torch.profiler`` (kernel names and CUPTI
  durations, one iteration after warm-up), to see which GEMM kernels (tiles) cuBLAS picks;
- ``train_step``: whole single-GPU steps of steps_third.py (``--steps``), by events, and one
  of each under the profiler (every kernel of the step).

Writes JSON lines to ``--out``. Runs on the CPU too (tiny repetition counts), to test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

# steps_third.py beside this file, or under benchmarks/device of the working directory
for _d in (os.path.dirname(os.path.abspath(__file__)), os.path.join(os.getcwd(), "benchmarks", "device")):
    sys.path.insert(0, _d)
import steps_third as S  # noqa: E402

SHAPES = {
    "AC": dict(hidden=3584, heads=28, kv_heads=4, ffn=9728, vocab=65536, seq=2048),
    "I": dict(hidden=4096, heads=32, kv_heads=8, ffn=11008, vocab=32000, seq=2048),
    "J": dict(hidden=3072, heads=24, kv_heads=8, ffn=8192, vocab=32000, seq=2048),
}


def timer(dev, reps: int, groups: int):
    def run(fn):
        for _ in range(2):
            fn()
        if dev.type != "cuda":
            t = []
            for _ in range(groups):
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                t.append((time.perf_counter() - t0) / reps)
            return statistics.median(t)
        torch.cuda.synchronize()
        t = []
        for _ in range(groups):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            b.synchronize()
            t.append(a.elapsed_time(b) / 1e3 / reps)
        return statistics.median(t)
    return run


def linears(m: dict) -> list[tuple[str, int, int]]:
    """(name, in, out) of the block's Linears and the head, as steps_third.py builds them."""
    h, hd = m["hidden"], m["hidden"] // m["heads"]
    return [("wq", h, m["heads"] * hd), ("wk", h, m["kv_heads"] * hd),
            ("wv", h, m["kv_heads"] * hd), ("wo", m["heads"] * hd, h),
            ("w1", h, m["ffn"]), ("w3", h, m["ffn"]), ("w2", m["ffn"], h),
            ("head", h, m["vocab"])]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="AC,I,J")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--groups", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--steps", default="h14t_single_AC,h13t_single_I",
                    help="steps_third.py single-GPU cases to time and profile whole")
    ap.add_argument("--quick", action="store_true", help="CPU test: tiny sizes")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dt = torch.bfloat16
    run = timer(dev, a.reps, a.groups)
    out = open(a.out, "w")

    def emit(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()
        print(json.dumps(rec), flush=True)

    emit({"op": "meta", "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
          "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "timing": f"CUDA events around {a.reps} calls back to back, median of {a.groups} groups",
          "script": "benchmarks/device/block_gemms.py"})
    shapes = {k: dict(SHAPES[k]) for k in a.shapes.split(",")}
    T = a.tokens
    if a.quick:
        for m in shapes.values():
            for key in ("hidden", "ffn", "vocab"):
                m[key] //= 32
            m["heads"] //= 4
            m["kv_heads"] = max(1, m["kv_heads"] // 4)
            m["seq"] = 64
        T = 64

    # 1. the Linears' three products each
    for sname, m in shapes.items():
        for name, fin, fout in linears(m):
            x = torch.randn(T, fin, device=dev, dtype=dt)
            w = torch.randn(fout, fin, device=dev, dtype=dt) * 0.02
            dy = torch.randn(T, fout, device=dev, dtype=dt)
            for kind, fn, (mm, kk, nn) in (
                ("fwd", lambda: F.linear(x, w), (T, fin, fout)),
                ("dgrad", lambda: dy.mm(w), (T, fout, fin)),
                ("wgrad", lambda: dy.t().mm(x), (fout, T, fin)),
            ):
                t = run(fn)
                emit({"op": "gemm", "shape": sname, "linear": name, "pass": kind, "m": mm,
                      "k": kk, "n": nn, "dtype": "bf16", "time_s": t,
                      "tflops": 2 * mm * kk * nn / t / 1e12})
            del x, w, dy

    # 2. sweep: forward [T, k] @ [n, k]^T and wgrad-like [n, T] @ [T, k]
    widths = [2560, 2816, 3072, 3328, 3584, 3840, 4096, 4352, 4608, 5120]
    if a.quick:
        widths = [96, 128]
    for k in (3584, 4096) if not a.quick else (96,):
        for n in widths + ([8192, 9728, 10240, 11008, 11264, 12288] if not a.quick else []):
            x = torch.randn(T, k, device=dev, dtype=dt)
            w = torch.randn(n, k, device=dev, dtype=dt)
            t = run(lambda: F.linear(x, w))
            emit({"op": "gemm", "shape": "sweep", "pass": "fwd", "m": T, "k": k, "n": n,
                  "dtype": "bf16", "time_s": t, "tflops": 2 * T * k * n / t / 1e12})
            del x, w

    # 3. cross entropy on fp32 logits (the head's tail), forward + backward
    for sname, m in shapes.items():
        V = m["vocab"]
        y = torch.randint(0, V, (T,), device=dev)
        lg = torch.randn(T, V, device=dev, dtype=dt, requires_grad=True)

        def ce():
            loss = F.cross_entropy(lg.float(), y)
            loss.backward()
        t = run(ce)
        emit({"op": "cross_entropy_fp32", "shape": sname, "tokens": T, "vocab": V,
              "pass": "fwd+bwd (cast, log_softmax, nll, backward, cast back)", "time_s": t})

    # 4. whole modules by events; 5. their kernels under the profiler
    for sname, m in shapes.items():
        mm = dict(m, layers=1)
        torch.manual_seed(0)
        blk = S.Block(mm).to(device=dev, dtype=dt)
        cos, sin = S.rope_tables(m["seq"], m["hidden"] // m["heads"])
        cos, sin = cos.to(dev, dt), sin.to(dev, dt)
        b = max(1, T // m["seq"])
        x = torch.randn(b, m["seq"], m["hidden"], device=dev, dtype=dt, requires_grad=True)
        g = torch.randn_like(x)

        def block():
            blk(x, cos, sin).backward(g)
        norm = S.RMSNorm(m["hidden"]).to(device=dev, dtype=dt)
        head = torch.nn.Linear(m["hidden"], m["vocab"], bias=False).to(device=dev, dtype=dt)
        y = torch.randint(0, m["vocab"], (b, m["seq"]), device=dev)

        def tail():
            S.loss_fn(head(norm(x)), y).backward()
        for name, fn in (("block", block), ("tail", tail)):
            t = run(fn)
            emit({"op": "module", "shape": sname, "module": name, "tokens": b * m["seq"],
                  "pass": "fwd+bwd", "time_s": t})
            if dev.type == "cuda":
                from torch.profiler import ProfilerActivity, profile
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    fn()
                    torch.cuda.synchronize()
                ks = [(e.name, e.time_range.elapsed_us() * 1e-6) for e in prof.events()
                      if e.device_type == torch.autograd.DeviceType.CUDA]
                emit({"op": "kernels", "shape": sname, "module": name,
                      "kernels": [[n_, round(d, 9)] for n_, d in ks],
                      "sum_s": sum(d for _, d in ks)})
        del blk, head, norm, x, g
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    # 6. whole single-GPU steps of steps_third.py (build_plain), by events, then one profiled
    for case in [c for c in a.steps.split(",") if c]:
        c = S.case_config(case, a.quick)
        _, step = S.build_plain(c, 0, 1, dev)
        t = timer(dev, 1, 5 if not a.quick else 1)(step)
        emit({"op": "train_step", "case": case, "time_s": t,
              "timing": "CUDA events around one step, median of 5 after 2 warm-ups"})
        if dev.type == "cuda":
            from torch.profiler import ProfilerActivity, profile
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            ks = [(e.name, e.time_range.elapsed_us() * 1e-6) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA]
            emit({"op": "kernels", "case": case, "module": "step",
                  "kernels": [[n_, round(d, 9)] for n_, d in ks], "sum_s": sum(d for _, d in ks)})
        del step
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    out.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
