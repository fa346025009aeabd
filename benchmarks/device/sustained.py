"""Does a GPU hold its GEMM rate under sustained load? (issue 12: published runs come out fast)

The kernel-time model's GEMM and attention rates are fitted on short bursts (``measure.py``:
5 warm-up and 30 timed iterations of each shape, tens of milliseconds of load). A training
step keeps the tensor cores busy for seconds and a training run for hours; if the GPU's power
or thermal limit pulls its clock down under sustained load, every rate fitted on bursts is
optimistic by the same ratio.

One process per GPU (run all of a box's GPUs at once, as training does; ``CUDA_VISIBLE_DEVICES``
picks the GPU). Phases, each timed with CUDA events, in this order:

1. ``burst_cold``: each form below, 5 warm-up and 30 timed iterations (``measure.py``'s method).
2. ``sustained``: the bf16 GEMM back to back for ``--sustain-s`` seconds; one event every
   ``--window`` iterations, so each window's rate is known with its time since the start.
3. ``burst_hot``: phase 1 again, at once.
4. ``burst_rested``: phase 1 again after ``--rest-s`` seconds idle.
5. ``sustained_fp8``: the fp8 GEMM (``torch._scaled_mm``, e4m3, per-tensor scales) the same way
   for ``--fp8-s`` seconds.
6. ``mixed``: ``--mixed-s`` seconds of a training-like duty cycle, each bf16 GEMM followed by
   a memory-bound kernel (a bf16 add over 128 M elements, about a third of the GEMM's time);
   the GEMM's own events give its rate inside the mix.

Operands are standard-normal (a GEMM's power draw depends on its data; zeros would draw
less). Writes ``OUT/sustained-gpuN.jsonl`` (one JSON object per phase and window). Run
``nvidia-smi --query-gpu=... -lms 100`` beside it for the clocks, power and throttle reasons.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

SHAPES = [(8192, 8192, 8192), (16384, 8192, 3584)]  # square; a Llama-70B TP8 down-projection


def _flops(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n


def _forms(dev: torch.device) -> dict:
    """name -> (fn, flops) for each form of each shape."""
    out = {}
    one = torch.ones((), device=dev, dtype=torch.float32)
    for m, k, n in SHAPES:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        c = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        out[f"bf16_{m}x{k}x{n}"] = (lambda a=a, w=w, c=c: torch.matmul(a, w.t(), out=c),
                                    _flops(m, k, n))
        try:
            a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)

            def fn(a8=a8, w8=w8):
                return torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one,
                                        out_dtype=torch.bfloat16)
            fn()
            out[f"fp8_{m}x{k}x{n}"] = (fn, _flops(m, k, n))
        except Exception as e:  # noqa: BLE001 (a build without fp8 GEMMs)
            print(f"fp8 {m}x{k}x{n} skipped: {type(e).__name__}", flush=True)
    return out


def _burst(fn, warmup: int = 5, iters: int = 30) -> list[float]:
    for _ in range(warmup):
        fn()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(iters)]


def _sustain(fn, seconds: float, window: int, between=None) -> list[dict]:
    """Run ``fn`` (and ``between`` after each call) for ``seconds``; one row per window."""
    rows, t0 = [], time.time()
    start = torch.cuda.Event(enable_timing=True)
    start.record()
    while time.time() - t0 < seconds:
        evs = []
        for _ in range(window):
            b = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            b.record()
            fn()
            e.record()
            evs.append((b, e))
            if between is not None:
                between()
        torch.cuda.synchronize()
        gemm = [b.elapsed_time(e) / 1e3 for b, e in evs]
        rows.append({"t_s": start.elapsed_time(evs[-1][1]) / 1e3, "n": window,
                     "gemm_median_s": statistics.median(gemm), "gemm_sum_s": sum(gemm),
                     "window_s": evs[0][0].elapsed_time(evs[-1][1]) / 1e3})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sustain-s", type=float, default=40.0)
    p.add_argument("--fp8-s", type=float, default=20.0)
    p.add_argument("--mixed-s", type=float, default=20.0)
    p.add_argument("--rest-s", type=float, default=5.0)
    p.add_argument("--window", type=int, default=40)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    dev = torch.device("cuda")
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "0")
    path = os.path.join(a.out, f"sustained-gpu{gpu}.jsonl")
    forms = _forms(dev)
    square = f"bf16_{SHAPES[0][0]}x{SHAPES[0][1]}x{SHAPES[0][2]}"
    square8 = square.replace("bf16", "fp8")
    x = torch.randn(128 * 2**20, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)

    def write(row: dict) -> None:
        row.update(gpu=gpu, name=torch.cuda.get_device_name(0), utc=time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), wall_s=round(time.time() - t_start, 3))
        fo.write(json.dumps(row) + "\n")
        fo.flush()

    def bursts(phase: str) -> None:
        for name, (fn, fl) in forms.items():
            ts = _burst(fn)
            med = statistics.median(ts)
            write({"phase": phase, "form": name, "time_s": med, "tflops": fl / med / 1e12,
                   "min_s": min(ts), "max_s": max(ts)})
            print(f"gpu{gpu} {phase} {name}: {fl / med / 1e12:.0f} TFLOP/s", flush=True)

    def sustained(phase: str, name: str, seconds: float, between=None) -> None:
        fn, fl = forms[name]
        rows = _sustain(fn, seconds, a.window, between)
        for r in rows:
            r.update(phase=phase, form=name, tflops=fl / r["gemm_median_s"] / 1e12)
            write(r)
        first, last = rows[0]["tflops"], statistics.median(x["tflops"] for x in rows[-5:])
        print(f"gpu{gpu} {phase} {name}: first window {first:.0f}, last five {last:.0f} "
              f"TFLOP/s over {rows[-1]['t_s']:.1f} s", flush=True)

    t_start = time.time()
    with open(path, "w") as fo:
        bursts("burst_cold")
        sustained("sustained", square, a.sustain_s)
        bursts("burst_hot")
        time.sleep(a.rest_s)
        bursts("burst_rested")
        if square8 in forms:
            sustained("sustained_fp8", square8, a.fp8_s)
        sustained("mixed", square, a.mixed_s, between=lambda: torch.add(x, 1.0, out=y))


if __name__ == "__main__":
    main()
