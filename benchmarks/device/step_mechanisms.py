"""Mechanisms behind a single-GPU eager step's kernel times (issue 12, after acgemm-h100x1).

data/measured/acgemm-h100x1 found the GEMM kernels inside a real step 9-16 % faster than the
same products timed back to back, the fused AdamW (bf16 moments) and the other memory-bound
kernels slower than the model prices them, and more idle GPU time between kernels than the
model's host clock exposes. One phase per question (``--phase``; run phases on different GPUs
at once, one process each, ``CUDA_VISIBLE_DEVICES`` picks the GPU):

- ``clocks``: shape AC's 21 block GEMMs (forward, input and weight gradient of the seven
  Linears, as block_gemms.py builds them) in rounds, each GEMM between CUDA events, under
  conditions held ``--hold-s`` seconds each with ``--rest-s`` idle before: ``b2b`` (GEMMs back
  to back), ``mem_r`` (each GEMM followed by bf16 adds over 16 M elements taking about r times
  the GEMM's own time: memory-bound work between GEMMs), ``idle_r`` (each GEMM followed by
  ``torch.cuda._sleep`` for about r times its time: the GPU idle between GEMMs). Then
  steps_third.py's ``build_plain`` single-GPU step of shape AC back to back for ``--hold-s``,
  and one step under the profiler right after (hot) and one after a rest (rested). Every
  condition records its wall-clock start and end (``t0``/``t1``, ``time.time()``) to align
  with the SM clocks and power that ``nvidia-smi -lms 50`` samples beside it.
- ``adam``: ``torch.optim.AdamW(fused=True)`` on bf16 parameters (moments bf16 too) and
  ``clip_grad_norm_`` (foreach) against the parameter count and the tensor count: AC-shaped
  blocks repeated 1..12 times with and without the embedding and head, and lists of equal
  tensors (64 x 64 Ki, 64 x 1 Mi, 64 x 16 Mi elements); fp32 parameters for two sizes; each by
  CUDA events around one call (median of ``--reps`` after 3 warm-ups), and one step profiled
  (kernel names and durations).
- ``trace``: ``torch.profiler`` chrome traces (CPU ops with shapes, launches and kernels, one
  clock) of one block forward + backward of shapes AC and I and of one whole AC step; and the
  host's issue time of one block: a ``torch.cuda._sleep`` long enough to keep the GPU busy is
  queued first, then the block's forward + backward is issued and timed on the host.

Writes JSON lines to ``--out`` (and traces beside it, gzipped). ``--quick`` runs on the CPU
with tiny sizes, to test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import sys
import time

import torch
import torch.nn.functional as F

for _d in (os.path.dirname(os.path.abspath(__file__)), os.path.join(os.getcwd(), "benchmarks", "device")):
    sys.path.insert(0, _d)
import steps_third as S  # noqa: E402

AC = dict(hidden=3584, heads=28, kv_heads=4, ffn=9728, vocab=65536, seq=2048)
I_ = dict(hidden=4096, heads=32, kv_heads=8, ffn=11008, vocab=32000, seq=2048)
CLOCK_HZ = 1.98e9  # the H100 SXM's boost clock, to size torch.cuda._sleep (cycles)


class Out:
    def __init__(self, path: str):
        self.f = open(path, "w")

    def __call__(self, rec: dict) -> None:
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()
        print(json.dumps(rec)[:300], flush=True)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def shrink(m: dict) -> dict:
    m = dict(m)
    for key in ("hidden", "ffn", "vocab"):
        m[key] //= 32
    m["heads"] //= 4
    m["kv_heads"] = max(1, m["kv_heads"] // 4)
    m["seq"] = 64
    return m


def linears(m: dict) -> list[tuple[str, int, int]]:
    h, hd = m["hidden"], m["hidden"] // m["heads"]
    return [("wq", h, m["heads"] * hd), ("wk", h, m["kv_heads"] * hd),
            ("wv", h, m["kv_heads"] * hd), ("wo", m["heads"] * hd, h),
            ("w1", h, m["ffn"]), ("w3", h, m["ffn"]), ("w2", m["ffn"], h)]


# ------------------------------------------------------------------------------------ clocks
def block_gemms(m: dict, T: int, dev) -> list[tuple[str, object]]:
    dt = torch.bfloat16
    out = []
    for name, fin, fout in linears(m):
        x = torch.randn(T, fin, device=dev, dtype=dt)
        w = torch.randn(fout, fin, device=dev, dtype=dt) * 0.02
        dy = torch.randn(T, fout, device=dev, dtype=dt)
        out += [(f"{name}.fwd", lambda x=x, w=w: F.linear(x, w)),
                (f"{name}.dgrad", lambda dy=dy, w=w: dy.mm(w)),
                (f"{name}.wgrad", lambda dy=dy, x=x: dy.t().mm(x))]
    return out


def timed_alone(fn, dev, reps=20) -> float:
    for _ in range(3):
        fn()
    sync(dev)
    if dev.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3 / reps


def phase_clocks(a, dev, emit) -> None:
    m = shrink(AC) if a.quick else AC
    T = 64 if a.quick else 2048
    gemms = block_gemms(m, T, dev)
    n_add = (1 << 14) if a.quick else (1 << 24)
    xa = torch.randn(n_add, device=dev, dtype=torch.bfloat16)
    xb = torch.randn(n_add, device=dev, dtype=torch.bfloat16)
    xc = torch.empty_like(xa)

    def add():
        torch.add(xa, xb, out=xc)
    # reference times (short bursts, after a rest), to size the fillers
    time.sleep(a.rest_s)
    t_add = timed_alone(add, dev)
    t_g = [timed_alone(fn, dev) for _, fn in gemms]
    emit({"op": "reference", "t0": time.time(), "add_elems": n_add, "add_s": t_add,
          "gemm_s": {nm: t for (nm, _), t in zip(gemms, t_g, strict=True)}, "sum_gemm_s": sum(t_g),
          "timing": "CUDA events around 20 calls back to back after 3 warm-ups"})
    use_sleep = dev.type == "cuda"

    def filler(kind: str, r: float, t: float):
        if kind == "mem":
            k = max(1, round(r * t / t_add))
            return lambda: [add() for _ in range(k)]
        cycles = int(r * t * CLOCK_HZ)
        if use_sleep:
            return lambda: torch.cuda._sleep(cycles)
        return lambda: time.sleep(r * t)

    conds = [("b2b", None, 0.0), ("mem", "mem", 1.0), ("idle", "idle", 1.0),
             ("mem", "mem", 0.5), ("mem", "mem", 2.0), ("idle", "idle", 0.3),
             ("b2b", None, 0.0)]
    for name, kind, r in conds:
        fills = [filler(kind, r, t) if kind else None for t in t_g]
        time.sleep(a.rest_s)
        sync(dev)
        t0 = time.time()
        rounds = []  # per round: [(start_event, end_event) per GEMM], wall time issued
        while time.time() - t0 < a.hold_s:
            evs = []
            for (_nm, fn), fl in zip(gemms, fills, strict=True):
                if dev.type == "cuda":
                    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    e0.record()
                    fn()
                    e1.record()
                    evs.append((e0, e1))
                else:
                    fn()
                if fl is not None:
                    fl()
            rounds.append((time.time() - t0, evs))
        sync(dev)
        t1 = time.time()
        # per round: GEMM seconds summed and each GEMM; the round's wall span (first start to last end)
        per = []
        first = rounds[0][1][0][0] if dev.type == "cuda" else None
        for _, evs in rounds:
            if dev.type != "cuda":
                continue
            g = [e0.elapsed_time(e1) / 1e3 for e0, e1 in evs]
            per.append((first.elapsed_time(evs[0][0]) / 1e3, first.elapsed_time(evs[-1][1]) / 1e3, g))
        rec = {"op": "condition", "cond": f"{name}_{r:g}" if kind else name, "filler": kind, "r": r,
               "t0": t0, "t1": t1, "rounds": len(rounds)}
        if per:
            n = len(per)
            med = [statistics.median(p[2][i] for p in per) for i in range(len(gemms))]
            late = [p for p in per if p[0] >= 0.5 * per[-1][0]]
            rec.update({
                "gemm_sum_s_first_round": sum(per[0][2]),
                "gemm_sum_s_median_round": statistics.median(sum(p[2]) for p in per),
                "gemm_sum_s_median_late_half": statistics.median(sum(p[2]) for p in late),
                "round_span_s_median": statistics.median(p[1] - p[0] for p in per),
                "gemm_s_median": {nm: t for (nm, _), t in zip(gemms, med, strict=True)},
                # time series: (GPU time since the first GEMM, GEMM seconds of the round)
                "series": [[round(p[0], 5), round(sum(p[2]), 7)] for p in per[:: max(1, n // 200)]],
            })
        emit(rec)
        del rounds, per

    # the real step, back to back, then profiled hot and rested
    c = S.case_config("h14t_single_AC", a.quick)
    _, step = S.build_plain(c, 0, 1, dev)
    for _ in range(2):
        step()
    time.sleep(a.rest_s)
    sync(dev)
    t0 = time.time()
    ts = []
    while time.time() - t0 < a.hold_s:
        if dev.type == "cuda":
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            step()
            e1.record()
            ts.append((e0, e1))
        else:
            step()
        if len(ts) % 4 == 0:
            sync(dev)
    sync(dev)
    t1 = time.time()
    emit({"op": "condition", "cond": "step_AC", "t0": t0, "t1": t1, "steps": len(ts),
          "step_s": [round(e0.elapsed_time(e1) / 1e3, 6) for e0, e1 in ts]})
    if dev.type == "cuda":
        from torch.profiler import ProfilerActivity, profile
        for label in ("hot", "rested"):
            if label == "rested":
                time.sleep(a.rest_s)
            else:  # keep it hot: 1 s of back-to-back GEMM rounds first
                t_h = time.time()
                while time.time() - t_h < 1.0:
                    for _, fn in gemms:
                        fn()
            sync(dev)
            t0 = time.time()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                step()
                sync(dev)
            ks = [(e.name, e.time_range.elapsed_us() * 1e-6) for e in prof.events()
                  if e.device_type == torch.autograd.DeviceType.CUDA]
            emit({"op": "kernels", "case": "h14t_single_AC", "module": "step", "state": label,
                  "t0": t0, "t1": time.time(),
                  "kernels": [[n_, round(d, 9)] for n_, d in ks], "sum_s": sum(d for _, d in ks)})


# -------------------------------------------------------------------------------------- adam
def param_lists(quick: bool) -> list[tuple[str, list[tuple[int, ...]]]]:
    m = shrink(AC) if quick else AC
    h = m["hidden"]
    blk = [(o, i) for _, i, o in linears(m)] + [(h,), (h,)]
    emb = [(m["vocab"], h), (m["vocab"], h), (h,)]
    out = []
    for L in (1, 2, 4, 8, 12):
        out.append((f"AC_blocks{L}", blk * L))
    out.append(("AC_blocks12_embed_head", blk * 12 + emb))  # the whole AC model
    for n in ((1 << 16), (1 << 20), (1 << 24)):
        out.append((f"equal64x{n}", [(n // 32 if quick else n,)] * 64))
    out.append(("equal1024x65536", [(64 if quick else 65536,)] * 1024))
    return out


def phase_adam(a, dev, emit) -> None:
    lists = param_lists(a.quick)
    for name, shapes in lists:
        for dtype in (torch.bfloat16, torch.float32):
            if dtype == torch.float32 and name not in ("AC_blocks1", "AC_blocks4"):
                continue
            ps = [torch.nn.Parameter(torch.randn(*s, device=dev, dtype=dtype) * 0.02) for s in shapes]
            for p in ps:
                p.grad = torch.randn_like(p) * 1e-3
            opt = S.make_optimizer(ps, dev)
            n = sum(p.numel() for p in ps)

            def adam():
                opt.step()

            def clip():
                torch.nn.utils.clip_grad_norm_(ps, 1.0)
            for label, fn in (("adamw_fused", adam), ("clip_grad_norm", clip)):
                if dtype == torch.float32 and label == "clip_grad_norm":
                    continue
                for _ in range(3):
                    fn()
                sync(dev)
                ts = []
                for _ in range(a.reps):
                    if dev.type == "cuda":
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        fn()
                        e1.record()
                        e1.synchronize()
                        ts.append(e0.elapsed_time(e1) / 1e3)
                    else:
                        t0 = time.perf_counter()
                        fn()
                        ts.append(time.perf_counter() - t0)
                rec = {"op": label, "params": name, "dtype": str(dtype).split(".")[1],
                       "tensors": len(ps), "numel": n, "time_s": statistics.median(ts),
                       "min_s": min(ts)}
                if dev.type == "cuda" and name in ("AC_blocks4", "equal64x65536",
                                                   "AC_blocks12_embed_head"):
                    from torch.profiler import ProfilerActivity, profile
                    sync(dev)
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        fn()
                        sync(dev)
                    ks = [(e.name, e.time_range.elapsed_us() * 1e-6) for e in prof.events()
                          if e.device_type == torch.autograd.DeviceType.CUDA]
                    rec["kernels"] = [[n_[:120], round(d, 9)] for n_, d in ks]
                emit(rec)
            del ps, opt
            if dev.type == "cuda":
                torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------- trace
def phase_trace(a, dev, emit, outdir: str) -> None:
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    dt = torch.bfloat16
    for sname, m0 in (("AC", AC), ("I", I_)):
        m = shrink(m0) if a.quick else m0
        mm = dict(m, layers=1)
        torch.manual_seed(0)
        blk = S.Block(mm).to(device=dev, dtype=dt)
        cos, sin = S.rope_tables(m["seq"], m["hidden"] // m["heads"])
        cos, sin = cos.to(dev, dt), sin.to(dev, dt)
        x = torch.randn(1, m["seq"], m["hidden"], device=dev, dtype=dt, requires_grad=True)
        g = torch.randn_like(x)

        def block():
            blk(x, cos, sin).backward(g)
        for _ in range(3):
            block()
        sync(dev)
        # host issue time with the GPU kept busy (no host waits on the GPU)
        hs = []
        for _ in range(a.reps):
            if dev.type == "cuda":
                torch.cuda._sleep(int(0.05 * CLOCK_HZ))
            t0 = time.perf_counter()
            block()
            hs.append(time.perf_counter() - t0)
            sync(dev)
        emit({"op": "host_issue", "shape": sname, "module": "block", "host_s": statistics.median(hs),
              "min_s": min(hs), "how": "perf_counter around block fwd+bwd issued behind a 50 ms _sleep"})
        # GPU-bound timing of the same block, and the block issued with the GPU idle
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(a.reps):
            block()
        sync(dev)
        emit({"op": "module_wall", "shape": sname, "module": "block",
              "wall_s": (time.perf_counter() - t0) / a.reps})
        with profile(activities=acts, record_shapes=True) as prof:
            block()
            sync(dev)
        p = os.path.join(outdir, f"trace_block_{sname}.json")
        prof.export_chrome_trace(p)
        with open(p, "rb") as fi, gzip.open(p + ".gz", "wb") as fo:
            shutil.copyfileobj(fi, fo)
        os.remove(p)
        emit({"op": "trace", "shape": sname, "module": "block", "file": os.path.basename(p) + ".gz"})
        del blk, x, g
    c = S.case_config("h14t_single_AC", a.quick)
    _, step = S.build_plain(c, 0, 1, dev)
    for _ in range(3):
        step()
    sync(dev)
    with profile(activities=acts, record_shapes=True) as prof:
        step()
        sync(dev)
    p = os.path.join(outdir, "trace_step_AC.json")
    prof.export_chrome_trace(p)
    with open(p, "rb") as fi, gzip.open(p + ".gz", "wb") as fo:
        shutil.copyfileobj(fi, fo)
    os.remove(p)
    emit({"op": "trace", "case": "h14t_single_AC", "module": "step", "file": "trace_step_AC.json.gz"})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--phase", required=True, choices=("clocks", "adam", "trace"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--hold-s", type=float, default=3.0)
    ap.add_argument("--rest-s", type=float, default=3.0)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    emit = Out(a.out)
    emit({"op": "meta", "phase": a.phase, "t0": time.time(),
          "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
          "torch": torch.__version__, "script": "benchmarks/device/step_mechanisms.py",
          "visible": os.environ.get("CUDA_VISIBLE_DEVICES")})
    if a.phase == "clocks":
        phase_clocks(a, dev, emit)
    elif a.phase == "adam":
        phase_adam(a, dev, emit)
    else:
        phase_trace(a, dev, emit, os.path.dirname(os.path.abspath(a.out)))
    emit({"op": "end", "t1": time.time()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
