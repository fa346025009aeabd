"""Grouped expert GEMMs at the published MoE rows' shapes, on one GPU (issue 10).

A Megatron-Core MoE layer with Transformer Engine (``TEGroupedMLP`` -> ``GroupedLinear``)
runs each local expert's ``[rows_e, k] @ [k, n]`` as its own cuBLAS GEMM, round-robin over 4
compute streams (``nvte_multi_tensor_gemm``); newer stacks run one grouped kernel. The
simulator prices a round of 4 experts as one GEMM of their rows together. For each expert
configuration (local experts ``E``, rows an expert ``M``, hidden ``h``, expert ffn ``f``;
swiglu so fc1 is ``h -> 2f``, fc2 ``f -> h``) this times, per GEMM (fc1, fc2) and pass:

* ``fwd``: ``y_e = x_e @ W_e`` (W stored ``[n, k]`` as ``nn.Linear``, used transposed);
* ``dgrad``: ``dx_e = dy_e @ W_e^T``;
* ``wgrad``: ``dW_e = x_e^T @ dy_e`` (bf16 output), and ``wgrad_acc``: the same added into an
  fp32 ``main_grad`` per expert (Megatron's gradient-accumulation fusion: cuBLAS with fp32
  C = D and beta 1) through ``torch.addmm(mg, a, b, out_dtype=float32)`` where the build has it
  (else ``mg.add_(mm(a, b))``, two kernels: the record says which);

by these methods:

* ``grouped_mm``: ``torch._grouped_mm`` (one CUTLASS grouped kernel; wgrad as its 2D x 2D
  form with offsets along the rows), where this build has it;
* ``loop1``: one ``torch.mm`` per expert on one stream;
* ``loop4``: one ``torch.mm`` per expert, round-robin over 4 side streams joined to the main
  stream (what Transformer Engine's multi-stream cuBLAS path does);
* ``round``: one dense GEMM per round of 4 experts of their rows together (the simulator's
  picture), and ``dense``: one GEMM of all ``E M`` rows (a reference).

Each is timed two ways: ``eager`` (CUDA events between back-to-back calls as issued by Python:
the longer of the device's time and the host's issue time) and ``graph`` (the same call
captured once in a CUDA graph and replayed: the device's time alone). ``host_issue_s``: the
host's wall time to issue one eager call (no synchronisation), a lower bound on what plain
PyTorch costs the host per call (TE's own Python is not here).

FP8 (per-tensor e4m3, ``torch._scaled_mm`` per expert, ``loop4``; and
``torch._scaled_grouped_mm`` with row-wise scales where the build has it) for the forward of
the FP8 rows' shapes.

Also: the permutation's memory-bound kernels in plain PyTorch (``index_select`` of the routed
copies, ``index_add_`` of the weighted copies back), for the bytes-per-second they reach.

Usage: ``python3 benchmarks/device/grouped_gemm.py --out DIR`` writes ``DIR/grouped_gemm.jsonl``
and ``DIR/permute.jsonl``; ``--quick`` runs tiny shapes (on CPU: checks that it runs; times
there mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

# (label, E local experts, M rows an expert, hidden, expert ffn on this rank, dtype)
CONFIGS = [
    # Qwen3-235B-A22B (ModelZoo H100 rows): EP 32 TP 2 (4 x 4096); EP 8 A2A PP 32 (16 x 1024);
    # EP 8 TP 4 (16 x 512); EP 8 FSDP micro-batch 4 (16 x 4096)
    ("qwen3_e4_m4096", 4, 4096, 4096, 1536, "bf16"),
    ("qwen3_e16_m1024", 16, 1024, 4096, 1536, "bf16"),
    ("qwen3_e16_m512", 16, 512, 4096, 1536, "bf16"),
    ("qwen3_e16_m4096", 16, 4096, 4096, 1536, "bf16"),
    ("qwen3_e16_m256", 16, 256, 4096, 1536, "bf16"),
    # DeepSeek-V3 (h 7168, expert ffn 2048): EP 64 TP 2 (4 x 4096), EP 32 (8 x 4096)
    ("dsv3_e4_m4096", 4, 4096, 7168, 2048, "bf16"),
    ("dsv3_e8_m4096", 8, 4096, 7168, 2048, "bf16"),
    # Qwen2-57B-A14B (Parallel Folding): folded EP 4 (16 x 1024), ETP 2 (16 x 2048, ffn 1280)
    ("qwen2_e16_m1024", 16, 1024, 3584, 2560, "bf16"),
    ("qwen2_e16_m2048_etp2", 16, 2048, 3584, 1280, "bf16"),
    # Mixtral-G8T8 (h 6144, ffn 2048): folded TP 4 EP 8 (8 x 1024), ETP 2 (8 x 4096, ffn 1024)
    ("g8t8_e8_m1024", 8, 1024, 6144, 2048, "bf16"),
    ("g8t8_e8_m4096_etp2", 8, 4096, 6144, 1024, "bf16"),
    # Mixtral 8x22B ETP 2 (2 x 4096, ffn 8192)
    ("mix22_e2_m4096_etp2", 2, 4096, 6144, 8192, "bf16"),
    # FP8 rows: DeepSeek-V3 H100 FP8 (4 x 4096), Qwen3 shapes
    ("dsv3_e4_m4096_fp8", 4, 4096, 7168, 2048, "fp8"),
    ("qwen3_e16_m1024_fp8", 16, 1024, 4096, 1536, "fp8"),
]
QUICK = [("tiny_e4_m64", 4, 64, 128, 64, "bf16"), ("tiny_e4_m64_fp8", 4, 64, 128, 64, "fp8")]
STREAMS = 4


class Timer:
    """CUDA events on the GPU, perf_counter on the CPU (a dry run)."""

    def __init__(self, dev: torch.device):
        self.cuda = dev.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def each(self, fn, warmup: int, iters: int) -> list[float]:
        for _ in range(warmup):
            fn()
        self.sync()
        if not self.cuda:
            out = []
            for _ in range(iters):
                t0 = time.perf_counter()
                fn()
                out.append(time.perf_counter() - t0)
            return out
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        ev[0].record()
        for i in range(iters):
            fn()
            ev[i + 1].record()
        torch.cuda.synchronize()
        return [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(iters)]

    def issue(self, fn, iters: int) -> float:
        """Host seconds to issue one call (median over ``iters``, GPU kept busy ahead)."""
        self.sync()
        out = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
        self.sync()
        return statistics.median(out)

    def graph(self, fn, warmup: int, iters: int) -> list[float] | None:
        if not self.cuda:
            return None
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return self.each(g.replay, warmup, iters)


def multi_stream(jobs, streams):
    """Run ``jobs`` (callables) round-robin on ``streams``, forked from and joined to the
    current stream (Transformer Engine's multi-stream GEMM pattern)."""
    main = torch.cuda.current_stream()
    for s in streams:
        s.wait_stream(main)
    for i, job in enumerate(jobs):
        with torch.cuda.stream(streams[i % len(streams)]):
            job()
    for s in streams:
        main.wait_stream(s)


def offsets(E: int, M: int, dev) -> torch.Tensor:
    return torch.arange(1, E + 1, device=dev, dtype=torch.int32) * M


def gemm_cases(E, M, k, n, dev, dtype, streams):
    """name -> (callable, flops) for fwd / dgrad / wgrad of one expert GEMM ``k -> n``."""
    bf = torch.bfloat16
    x = torch.randn(E * M, k, device=dev, dtype=bf)
    dy = torch.randn(E * M, n, device=dev, dtype=bf)
    w = torch.randn(E, n, k, device=dev, dtype=bf) / k**0.5  # nn.Linear layout per expert
    y = torch.empty(E * M, n, device=dev, dtype=bf)
    dx = torch.empty(E * M, k, device=dev, dtype=bf)
    dw = torch.empty(E, n, k, device=dev, dtype=bf)
    mg = torch.zeros(E, n, k, device=dev, dtype=torch.float32)
    xs = [x[e * M:(e + 1) * M] for e in range(E)]
    dys = [dy[e * M:(e + 1) * M] for e in range(E)]
    ys = [y[e * M:(e + 1) * M] for e in range(E)]
    dxs = [dx[e * M:(e + 1) * M] for e in range(E)]
    offs = offsets(E, M, dev)
    cases = {}
    f = 2.0 * E * M * k * n
    fwd_jobs = [lambda e=e: torch.mm(xs[e], w[e].t(), out=ys[e]) for e in range(E)]
    dgrad_jobs = [lambda e=e: torch.mm(dys[e], w[e], out=dxs[e]) for e in range(E)]
    wgrad_jobs = [lambda e=e: torch.mm(dys[e].t(), xs[e], out=dw[e]) for e in range(E)]
    acc_kind = "addmm_out_dtype"
    try:
        torch.addmm(mg[0], dys[0].t(), xs[0], out_dtype=torch.float32)

        def acc(e):
            return torch.addmm(mg[e], dys[e].t(), xs[e], out_dtype=torch.float32)
    except Exception:  # noqa: BLE001 (the build lacks out_dtype)
        acc_kind = "mm_then_add"

        def acc(e):
            return mg[e].add_(torch.mm(dys[e].t(), xs[e]))
    acc_jobs = [lambda e=e: acc(e) for e in range(E)]
    for pas, jobs in (("fwd", fwd_jobs), ("dgrad", dgrad_jobs), ("wgrad", wgrad_jobs),
                      ("wgrad_acc", acc_jobs)):
        cases[(pas, "loop1")] = (lambda jobs=jobs: [j() for j in jobs], f)
        if streams:
            cases[(pas, "loop4")] = (lambda jobs=jobs: multi_stream(jobs, streams), f)
    if hasattr(torch, "_grouped_mm"):
        wt = w.transpose(-2, -1)  # [E, k, n], column-major per expert
        cases[("fwd", "grouped_mm")] = (lambda: torch._grouped_mm(x, wt, offs=offs), f)
        cases[("dgrad", "grouped_mm")] = (lambda: torch._grouped_mm(dy, w, offs=offs), f)
        cases[("wgrad", "grouped_mm")] = (
            lambda: torch._grouped_mm(dy.t(), x, offs=offs), f)
    # the simulator's picture: a round of STREAMS experts as one GEMM of their rows
    R = min(E, STREAMS) * M
    xr = x[:R]
    wr = w[0]
    yr = y[:R]
    rounds = -(-E // STREAMS)
    cases[("fwd", "round")] = (lambda: [torch.mm(xr, wr.t(), out=yr) for _ in range(rounds)], f)
    cases[("fwd", "dense")] = (lambda: torch.mm(x, wr.t(), out=y), f)
    cases[("dgrad", "dense")] = (lambda: torch.mm(dy, wr, out=dx), f)
    return cases, acc_kind


def fp8_cases(E, M, k, n, dev, streams):
    f8 = torch.float8_e4m3fn
    x = torch.randn(E * M, k, device=dev, dtype=torch.bfloat16).to(f8)
    w = torch.randn(E, n, k, device=dev, dtype=torch.bfloat16).to(f8)
    one = torch.ones((), device=dev, dtype=torch.float32)
    xs = [x[e * M:(e + 1) * M] for e in range(E)]
    f = 2.0 * E * M * k * n
    jobs = [lambda e=e: torch._scaled_mm(xs[e], w[e].t(), scale_a=one, scale_b=one,
                                         out_dtype=torch.bfloat16) for e in range(E)]
    cases = {("fwd", "fp8_loop1"): (lambda: [j() for j in jobs], f)}
    if streams:
        cases[("fwd", "fp8_loop4")] = (lambda: multi_stream(jobs, streams), f)
    cases[("fwd", "fp8_dense")] = (
        lambda: torch._scaled_mm(x, w[0].t(), scale_a=one, scale_b=one,
                                 out_dtype=torch.bfloat16), f)
    if hasattr(torch, "_scaled_grouped_mm"):
        sa = torch.ones(E * M, device=dev, dtype=torch.float32)
        sb = torch.ones(E, n, device=dev, dtype=torch.float32)
        offs = offsets(E, M, dev)
        wt = w.transpose(-2, -1)
        cases[("fwd", "fp8_scaled_grouped_mm_rowwise")] = (
            lambda: torch._scaled_grouped_mm(x, wt, sa, sb, offs=offs,
                                             out_dtype=torch.bfloat16), f)
    return cases


def permute_cases(T, k, h, dev):
    """Plain-PyTorch permutation of ``T`` tokens' ``k`` copies of ``h`` bf16 and its reverse."""
    x = torch.randn(T, h, device=dev, dtype=torch.bfloat16)
    idx = torch.randperm(T * k, device=dev) // k  # each token k times, in expert order
    copies = torch.randn(T * k, h, device=dev, dtype=torch.bfloat16)
    out = torch.zeros(T, h, device=dev, dtype=torch.bfloat16)
    nb = T * k * h * 2
    return {
        "index_select": (lambda: x.index_select(0, idx), 2 * nb),  # read + write the copies
        "index_add": (lambda: out.index_add_(0, idx, copies), nb + 2 * T * h * 2),
        "copy": (lambda: copies.clone(), 2 * nb),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--only", default="", help="comma list of config labels")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    tm = Timer(dev)
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
           "grouped_mm": hasattr(torch, "_grouped_mm"),
           "scaled_grouped_mm": hasattr(torch, "_scaled_grouped_mm"),
           "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    print(json.dumps(env), flush=True)
    streams = [torch.cuda.Stream() for _ in range(STREAMS)] if dev.type == "cuda" else []
    configs = QUICK if args.quick else CONFIGS
    if args.only:
        configs = [c for c in configs if c[0] in args.only.split(",")]
    fo = open(os.path.join(args.out, "grouped_gemm.jsonl"), "a")
    for label, E, M, h, ffn, dtype in configs:
        for gemm, k, n in (("fc1", h, 2 * ffn), ("fc2", ffn, h)):
            if time.time() - t_start > args.budget_s:
                print("budget spent, stopping", flush=True)
                break
            acc_kind = None
            try:
                if dtype == "fp8":
                    cases = fp8_cases(E, M, k, n, dev, streams) if dev.type == "cuda" else {}
                else:
                    cases, acc_kind = gemm_cases(E, M, k, n, dev, dtype, streams)
            except Exception as e:  # noqa: BLE001
                print(f"{label} {gemm}: setup failed ({type(e).__name__}: {str(e)[:160]})",
                      flush=True)
                continue
            for (pas, method), (fn, flops) in cases.items():
                rec = {"config": label, "experts": E, "rows": M, "gemm": gemm, "k": k, "n": n,
                       "pass": pas, "method": method, "dtype": dtype, "flops": flops,
                       "env": env}
                if pas == "wgrad_acc":
                    rec["acc_kind"] = acc_kind
                try:
                    ts = tm.each(fn, args.warmup, args.iters)
                    rec["eager_s"] = statistics.median(ts)
                    rec["eager_best_s"] = min(ts)
                    rec["host_issue_s"] = tm.issue(fn, args.iters)
                    if pas == "wgrad_acc" and acc_kind == "mm_then_add":
                        gs = None  # allocation inside; keep eager only
                    else:
                        gs = tm.graph(fn, args.warmup, args.iters)
                    if gs:
                        rec["graph_s"] = statistics.median(gs)
                        rec["graph_best_s"] = min(gs)
                        rec["graph_tflops"] = flops / rec["graph_s"] / 1e12
                except Exception as e:  # noqa: BLE001 (a form this build lacks)
                    rec["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                fo.write(json.dumps(rec) + "\n")
                fo.flush()
                g = rec.get("graph_s")
                print(f"{label:22s} {gemm} {pas:9s} {method:30s} eager "
                      f"{rec.get('eager_s', float('nan')) * 1e6:9.1f} us graph "
                      f"{(g or float('nan')) * 1e6:9.1f} us issue "
                      f"{rec.get('host_issue_s', float('nan')) * 1e6:7.1f} us "
                      f"{rec.get('error', '')}", flush=True)
            del cases
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    fo.close()
    with open(os.path.join(args.out, "permute.jsonl"), "a") as fp:
        shapes = [(64, 8, 128)] if args.quick else [(2048, 8, 4096), (4096, 8, 4096),
                                                     (1024, 8, 4096), (4096, 8, 7168),
                                                     (8192, 2, 6144)]
        for T, k, h in shapes:
            for name, (fn, nbytes) in permute_cases(T, k, h, dev).items():
                ts = tm.each(fn, args.warmup, args.iters)
                t = statistics.median(ts)
                rec = {"kernel": name, "tokens": T, "top_k": k, "hidden": h,
                       "bytes_moved": nbytes, "time_s": t, "best_s": min(ts),
                       "GBps": nbytes / t / 1e9, "env": env}
                fp.write(json.dumps(rec) + "\n")
                print(f"{name:12s} T{T} k{k} h{h}: {t * 1e6:9.1f} us {rec['GBps']:7.0f} GB/s",
                      flush=True)
    print(f"done in {time.time() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
