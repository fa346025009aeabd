"""Host cost of new GEMM row counts in steps_alt.py's eager expert section (issue 10/12, emoe3).

One GPU, host clock (GPU drained before every timed piece), torch.cuda.memory_stats() deltas
(cudaMalloc calls ``num_device_alloc``, frees, ``num_alloc_retries``, segments) beside every
timing, so new-shape cost (cuBLAS heuristic query) and allocator cost can be told apart.
Width of h8_moe_ep4_Q (hidden 1024, expert FFN 2048, 4 local experts x 4 sources, 8 layers).
The allocator is pre-warmed once with a section at more rows than any drawn (32,769 an expert).

* ``steps``: the measured routed rows of steps_alt.py h8_moe_ep4_Q (diagnosis9-h100x4
  ``expert_rows-*-rN.json``: layers[l][call][expert]) replayed in the steps' order: per call
  (micro-batch) forward of layers 0..7, then backward of layers 7..0; ``.grad`` set to None at
  each step's first micro-batch. Pass ``first`` (rank 0's then rank 1's 20 calls, in a process
  that has never seen those counts) and pass ``again`` (the same sequence, every count seen).
  Record per layer call: the 4 counts, ``new`` (experts whose count > 0 is new to the process),
  fwd/bwd host us, allocator deltas.
* ``random``: one layer, 40 calls alternating ``fresh`` (4 counts never used, drawn at random
  in 1,000..16,000, not growing) and ``seen`` (4 counts from a used pool).
* ``gemm``: the six GEMMs of an expert alone (bf16 under autocast): fc/proj forward
  ``F.linear`` with bias (addmm), data gradient ``g.mm(W)``, weight gradient ``g.t().mm(x)``,
  each 40 calls alternating fresh / seen counts (random, not growing).

    python moe_shape_host.py --rows-dir DIR --out DIR [--device cpu --quick]
    python moe_shape_host.py --summary moe_shape_host.jsonl   # the README's tables

``--rows-dir``: a folder holding ``expert_rows-h8_moe_ep4_Q-r0.json`` and ``-r1.json``
(``data/measured/diagnosis9-h100x4``).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

H, FF, LOCAL, SRC, LAYERS = 1024, 2048, 4, 4, 8


class MLP(nn.Module):  # steps_alt.py's MLP
    def __init__(self, h, f):
        super().__init__()
        self.c_fc = nn.Linear(h, f)
        self.c_proj = nn.Linear(f, h)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


def section(recv, experts, n):
    """steps_alt.py MoE.forward's expert loop (as benchmarks/device/expert_host.py)."""
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


def per_source(ms):
    return [[m // SRC + (s < m % SRC) for m in ms] for s in range(SRC)]


def summary(path):
    """The README's figures from ``moe_shape_host.jsonl`` (medians; us)."""
    import statistics as st
    rec = [json.loads(x) for x in open(path)]
    gem = [r for r in rec if r["kind"] == "gemm"]
    print("gemm alone: fresh - seen median host us (fresh median, seen median), cudaMallocs")
    for g in sorted({r["gemm"] for r in gem}):
        f = st.median(r["us"] for r in gem if r["gemm"] == g and r["mode"] == "fresh")
        s = st.median(r["us"] for r in gem if r["gemm"] == g and r["mode"] == "seen")
        a = sum(r["alloc"]["num_device_alloc"] for r in gem if r["gemm"] == g)
        print(f"  {g:15s} {f - s:6.1f} ({f:.1f}, {s:.1f}) {a}")
    ran = [r for r in rec if r["kind"] == "random"]
    med = {(m, p): st.median(r[p + "_us"] for r in ran if r["mode"] == m)
           for m in ("fresh", "seen") for p in ("fwd", "bwd")}
    a = sum(r["alloc_fwd"]["num_device_alloc"] + r["alloc_bwd"]["num_device_alloc"] for r in ran)
    print(f"random section, 4 new experts: fwd {med['fresh', 'fwd']:.0f} vs {med['seen', 'fwd']:.0f}"
          f" (+{(med['fresh', 'fwd'] - med['seen', 'fwd']) / 8:.0f} a GEMM of 8), bwd "
          f"{med['fresh', 'bwd']:.0f} vs {med['seen', 'bwd']:.0f} "
          f"(+{(med['fresh', 'bwd'] - med['seen', 'bwd']) / 16:.0f} a GEMM of 16); cudaMallocs {a}")
    stp = [r for r in rec if r["kind"] == "steps"]
    again = {(r["rank"], r["call"], r["layer"]): r for r in stp if r["pass"] == "again"}
    print("steps replay, first pass less the same calls again: extra host ms, per new expert us"
          " (per GEMM: 2 forward, 4 backward), cudaMallocs, alloc retries")
    for rank in (0, 1):
        for lo, hi in ((0, 6), (6, 18), (18, 20)):
            rs = [r for r in stp if r["pass"] == "first" and r["rank"] == rank
                  and lo <= r["call"] < hi]
            nf, nb = sum(r["new"] for r in rs), sum(r["new_bwd"] for r in rs)
            k = [(r["rank"], r["call"], r["layer"]) for r in rs]
            df = sum(r["fwd_us"] for r in rs) - sum(again[x]["fwd_us"] for x in k)
            db = sum(r["bwd_us"] for r in rs) - sum(again[x]["bwd_us"] for x in k)
            al = sum(r["alloc_fwd"]["num_device_alloc"] + r["alloc_bwd"]["num_device_alloc"]
                     for r in rs)
            rt = sum(r["alloc_fwd"]["num_alloc_retries"] + r["alloc_bwd"]["num_alloc_retries"]
                     for r in rs)
            print(f"  rank {rank} calls {lo:2d}-{hi - 1:2d}: new experts {nf}/{nb}; fwd "
                  f"+{df / 1e3:.1f} ms ({df / max(nf, 1) / 2:.0f} a GEMM), bwd +{db / 1e3:.1f} ms "
                  f"({db / max(nb, 1) / 4:.0f} a GEMM); cudaMalloc {al}, retries {rt}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--summary")
    ap.add_argument("--out")
    ap.add_argument("--rows-dir")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.summary:
        summary(a.summary)
        return
    if not a.out or not a.rows_dir:
        ap.error("--out and --rows-dir are required")
    os.makedirs(a.out, exist_ok=True)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dt = torch.bfloat16
    h, f = (H, FF) if not a.quick else (64, 128)
    scale = 1 if not a.quick else 64
    out = open(os.path.join(a.out, "moe_shape_host.jsonl"), "w")

    def emit(rec):
        out.write(json.dumps(rec) + "\n")
        out.flush()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def stats():
        if not cuda:
            return {}
        s = torch.cuda.memory_stats()
        return {k: s.get(k, 0) for k in ("num_device_alloc", "num_device_free", "num_alloc_retries",
                                         "segment.all.current", "num_sync_all_streams")}

    def delta(s1, s0):
        return {k: s1[k] - s0[k] for k in s1}

    seqs = []
    for r in (0, 1):
        d = json.load(open(os.path.join(a.rows_dir, f"expert_rows-h8_moe_ep4_Q-r{r}.json")))
        L = d["layers"]
        seqs.append([[[max(0, m // scale) for m in L[li][c]] for li in range(LAYERS)]
                     for c in range(len(L[0]))])
        if a.quick:
            seqs[-1] = seqs[-1][:4]
    used = {m for s in seqs for c in s for ms in c for m in ms}
    big = 32769 // scale
    torch.manual_seed(0)
    layers = [nn.ModuleList(MLP(h, f) for _ in range(LOCAL)).to(dev) for _ in range(LAYERS)]
    buf = torch.randn(LOCAL * big + 16, h, device=dev, dtype=dt)
    seen = set()  # counts (> 0) launched so far by the forward GEMMs of this process
    seen_b = set()  # ... by the backward GEMMs (other cuBLAS problem descriptions)

    def fresh_count(rng):
        while True:
            m = rng.randint(1000 // scale + 1, 16000 // scale)
            if m not in used and m not in seen and m not in seen_b:
                return m

    def fwd(exps, ms):
        n = per_source(ms)
        rows = sum(ms)
        recv = buf[:rows].detach().requires_grad_()
        sync()
        s0 = stats()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=dt):
            y = section(recv, exps, n)
        t1 = time.perf_counter()
        sync()
        return y, rows, (t1 - t0) * 1e6, delta(stats(), s0) if cuda else {}

    def bwd(y, rows):
        sync()
        s0 = stats()
        t0 = time.perf_counter()
        y.backward(buf[:rows])
        t1 = time.perf_counter()
        sync()
        return (t1 - t0) * 1e6, delta(stats(), s0) if cuda else {}

    def new_of(ms, pool=None):
        pool = seen if pool is None else pool
        return sum(1 for m in set(ms) if m > 0 and m not in pool)

    # warm: CUDA/cuBLAS init at counts outside every drawn set, then the allocator at big
    warm = [c for c in range(3, 60) if c not in used][:LOCAL]
    for _ in range(2):
        for lay in layers:  # every layer once: its first .grad allocations, outside the timing
            y, rows, _, _ = fwd(lay, warm)
            bwd(y, rows)
    seen.update(warm)
    seen_b.update(warm)
    y, rows, _, _ = fwd(layers[0], [big] * LOCAL)
    bwd(y, rows)
    seen.add(big)
    seen_b.add(big)
    del y
    s_start = stats()
    emit({"kind": "start", **s_start})

    # steps: rank 0's then rank 1's calls, then again
    for pas in ("first", "again"):
        for r, seq in enumerate(seqs):
            for c, call in enumerate(seq):
                if c % 2 == 0:
                    for lay in layers:
                        for p in lay.parameters():
                            p.grad = None
                held = []
                for li in range(LAYERS):
                    k = new_of(call[li])
                    y, rows, tf, sf = fwd(layers[li], call[li])
                    seen.update(m for m in call[li] if m > 0)
                    held.append((li, y, rows, k, tf, sf))
                for li, y, rows, k, tf, sf in reversed(held):
                    kb = new_of(call[li], seen_b)
                    tb, sb = bwd(y, rows)
                    seen_b.update(m for m in call[li] if m > 0)
                    emit({"kind": "steps", "pass": pas, "rank": r, "call": c, "layer": li,
                          "M": call[li], "new": k, "new_bwd": kb, "grads": c % 2 == 1,
                          "fwd_us": round(tf, 1), "bwd_us": round(tb, 1),
                          "alloc_fwd": sf, "alloc_bwd": sb})
                del held

    # random: one layer, fresh / seen alternating
    rng = random.Random(1)
    pool = [m for m in sorted(seen) if 1000 // scale < m < 16000 // scale]
    for i in range(40 if not a.quick else 6):
        mode = "fresh" if i % 2 == 0 else "seen"
        ms = [fresh_count(rng) for _ in range(LOCAL)] if mode == "fresh" else rng.sample(pool, LOCAL)
        k, kb = new_of(ms), new_of(ms, seen_b)
        y, rows, tf, sf = fwd(layers[0], ms)
        seen.update(ms)
        tb, sb = bwd(y, rows)
        seen_b.update(ms)
        del y
        emit({"kind": "random", "mode": mode, "M": ms, "new": k, "new_bwd": kb,
              "fwd_us": round(tf, 1),
              "bwd_us": round(tb, 1), "alloc_fwd": sf, "alloc_bwd": sb})

    # gemm: the six GEMMs alone, bf16 under autocast
    wfc = torch.randn(f, h, device=dev, dtype=dt)
    bfc = torch.randn(f, device=dev, dtype=dt)
    wpr = torch.randn(h, f, device=dev, dtype=dt)
    bpr = torch.randn(h, device=dev, dtype=dt)
    xs = torch.randn(big, h, device=dev, dtype=dt)
    hs = torch.randn(big, f, device=dev, dtype=dt)
    gems = {
        "fc_fwd_addmm": lambda m: F.linear(xs[:m], wfc, bfc),
        "proj_fwd_addmm": lambda m: F.linear(hs[:m], wpr, bpr),
        "fc_dgrad_mm": lambda m: hs[:m].mm(wfc),
        "proj_dgrad_mm": lambda m: xs[:m].mm(wpr),
        "fc_wgrad_mm": lambda m: hs[:m].t().mm(xs[:m]),
        "proj_wgrad_mm": lambda m: xs[:m].t().mm(hs[:m]),
    }
    gseen = {}
    for name, fn in gems.items():
        gseen[name] = set()
        for m in rng.sample(pool, 8):  # warm this kind at pool counts
            with torch.autocast(dev.type, dtype=dt):
                fn(m)
            gseen[name].add(m)
        sync()
        for i in range(40 if not a.quick else 6):
            mode = "fresh" if i % 2 == 0 else "seen"
            m = fresh_count(rng) if mode == "fresh" else rng.choice(sorted(gseen[name]))
            seen.add(m)
            sync()
            s0 = stats()
            t0 = time.perf_counter()
            with torch.autocast(dev.type, dtype=dt):
                z = fn(m)
            t1 = time.perf_counter()
            sync()
            emit({"kind": "gemm", "gemm": name, "mode": mode, "M": m, "us": round((t1 - t0) * 1e6, 1),
                  "alloc": delta(stats(), s0) if cuda else {}})
            gseen[name].add(m)
            del z
    emit({"kind": "env", "torch": torch.__version__,
          "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
          "blas": str(torch.backends.cuda.preferred_blas_library()) if cuda else None,
          "end": stats()})


if __name__ == "__main__":
    main()
