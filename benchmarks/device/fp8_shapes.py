"""FP8 GEMMs at DeepSeek-V3's expert and MLA shapes on one H100: forward, dgrad and wgrad, as
per-tensor torch._scaled_mm and (where this PyTorch supports it) blockwise 1x128 / 128x128 and
1x128 / 1x128 scaling; cold burst (30 calls after idle) and sustained (after 3 s of the same
GEMM back to back). CUDA events around 30 back-to-back calls; median of 3 such windows.
Writes one JSON line per (shape, scaling, phase) to the path in argv[1]."""
import json
import sys
import time

import torch

out = open(sys.argv[1], "w")
dev = "cuda"
torch.manual_seed(0)
E4 = torch.float8_e4m3fn
# (label, m, k, n): [m,k] @ [k,n]; expert rows 4,096 (EP 64, TP 2 SP: 2,048 tokens x 8 / 4 experts)
SHAPES = [
    ("expert_fc1_fwd", 4096, 7168, 4096), ("expert_fc2_fwd", 4096, 2048, 7168),
    ("expert_fc1_dgrad", 4096, 4096, 7168), ("expert_fc2_dgrad", 4096, 7168, 2048),
    ("expert_fc1_wgrad", 7168, 4096, 4096), ("expert_fc2_wgrad", 2048, 4096, 7168),
    ("out_proj_fwd", 4096, 8192, 7168), ("out_proj_wgrad", 8192, 4096, 7168),
    ("q_up_fwd", 4096, 1536, 12288), ("q_up_wgrad", 1536, 4096, 12288),
    ("square8192", 8192, 8192, 8192),
]

def operands(m, k, n):
    a = torch.randn(m, k, device=dev).to(E4)
    b = torch.randn(n, k, device=dev).to(E4).t()  # column-major [k, n]
    return a, b

def runners(m, k, n):
    a, b = operands(m, k, n)
    one = torch.ones((), device=dev)
    yield "tensor", lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)
    # blockwise: A 1x128 (scale [m, k/128]), B 128x128 ([k/128, n/128]) or 1x128 along k ([k/128, n])
    kb = k // 128
    sa = torch.rand(m, kb, device=dev) + 0.5
    for name, sb in (("block_1x128_128x128", torch.rand(kb, n // 128, device=dev) + 0.5),
                     ("block_1x128_1x128", torch.rand(kb, n, device=dev) + 0.5)):
        for lay in ("outer/outer", "plain/plain", "outer/plain", "plain/outer"):
            la, lb = lay.split("/")
            sa_l = sa.t().contiguous().t() if la == "outer" else sa
            sb_l = sb.t().contiguous().t() if lb == "outer" else sb
            def f(sa_l=sa_l, sb_l=sb_l):
                return torch._scaled_mm(a, b, sa_l, sb_l, out_dtype=torch.bfloat16)
            try:
                f()
                torch.cuda.synchronize()
                yield f"{name}/{lay}", f
                break
            except Exception as e:  # noqa: BLE001
                out.write(json.dumps({"scaling": name, "layout": lay, "error": str(e)[:300]}) + "\n")

def window(f, n=30):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        f()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / 1e3 / n

for label, m, k, n in SHAPES:
    for scaling, f in runners(m, k, n):
        f()
        torch.cuda.synchronize()
        time.sleep(1.0)  # idle: clocks recover
        cold = sorted(window(f) for _ in range(3))[1]
        t0 = time.time()
        while time.time() - t0 < 3.0:
            for _ in range(20):
                f()
            torch.cuda.synchronize()
        hot = sorted(window(f) for _ in range(3))[1]
        fl = 2.0 * m * k * n
        out.write(json.dumps({"label": label, "m": m, "k": k, "n": n, "scaling": scaling,
                              "cold_s": cold, "sustained_s": hot, "cold_tflops": fl / cold / 1e12,
                              "sustained_tflops": fl / hot / 1e12,
                              "torch": torch.__version__}) + "\n")
        out.flush()
