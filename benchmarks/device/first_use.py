"""What a GEMM call with a row count new to the process costs its host, pass after pass of new
counts in a fresh process (issue 12, eager MoE): a cuBLAS heuristic query only, or also the
first load of a kernel the process had not used (CUDA's lazy module loading)?

Method. One process, one GPU, bf16. For each width (k, n) and GEMM kind (forward
``[M, k] x [k, n]``, data gradient ``[M, n] x [n, k]``, weight gradient ``[n, M] x [M, k]``):
a warm-up of ``--warm`` row counts (as a script's warm-up steps), then ``--passes`` passes of
``--per`` row counts each never used before in the process (drawn from 1..``--max-rows``), and
after every new call the same call again (a seen count). Each call is timed on the host clock
alone, the GPU drained before it (``synchronize``), so the time is the host's. If new counts
cost only the heuristic query, every pass costs the same; if they also load kernels for the
first time, the first passes cost more and the excess decays as the loaded set covers the
counts. Run once with the default module loading and (a second process) with
``CUDA_MODULE_LOADING=EAGER`` as a control: every kernel loaded at start, only the query left.

Output ``OUT/first_use-{label}.json``: per (width, kind) the new and seen times (us) by pass.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", default="lazy")
    ap.add_argument("--warm", type=int, default=48)
    ap.add_argument("--passes", type=int, default=8)
    ap.add_argument("--per", type=int, default=24)
    ap.add_argument("--max-rows", type=int, default=4096)
    a = ap.parse_args()
    t_start = time.perf_counter()
    dev = torch.device("cuda")
    torch.ones(1, device=dev)
    t_init = time.perf_counter() - t_start
    rnd = random.Random(7)
    widths = [(1536, 1024), (256, 512)]
    out = {"label": a.label, "module_loading": os.environ.get("CUDA_MODULE_LOADING", ""),
           "init_s": t_init, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
           "results": []}
    used: set[int] = set()

    def fresh() -> int:
        while True:
            m = rnd.randint(1, a.max_rows)
            if m not in used:
                used.add(m)
                return m

    warm = [fresh() for _ in range(a.warm)]
    passes = [[fresh() for _ in range(a.per)] for _ in range(a.passes)]
    for k, n in widths:
        x = torch.randn(a.max_rows, k, device=dev, dtype=torch.bfloat16)
        gy = torch.randn(a.max_rows, n, device=dev, dtype=torch.bfloat16)
        w = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        kinds = {
            "fwd": lambda m: x[:m] @ w,
            "dgrad": lambda m: gy[:m] @ w.t(),
            "wgrad": lambda m: gy[:m].t() @ x[:m],
        }
        for name, fn in kinds.items():
            for m in warm:
                fn(m)
            torch.cuda.synchronize()
            rows = []
            for p, ms in enumerate(passes):
                new, seen = [], []
                for m in ms:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fn(m)
                    t1 = time.perf_counter()
                    torch.cuda.synchronize()
                    t2 = time.perf_counter()
                    fn(m)
                    t3 = time.perf_counter()
                    torch.cuda.synchronize()
                    new.append((t1 - t0) * 1e6)
                    seen.append((t3 - t2) * 1e6)
                rows.append({"pass": p, "rows": ms, "new_us": new, "seen_us": seen})
            out["results"].append({"k": k, "n": n, "kind": name, "passes": rows})
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, f"first_use-{a.label}.json"), "w") as f:
        json.dump(out, f)
    med = {}
    for r in out["results"]:
        med[(r["k"], r["kind"])] = [round(sorted(p["new_us"])[len(p["new_us"]) // 2]
                                          - sorted(p["seen_us"])[len(p["seen_us"]) // 2])
                                    for p in r["passes"]]
    print(a.label, f"init {t_init:.1f} s", med, flush=True)


if __name__ == "__main__":
    main()
