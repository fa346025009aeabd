"""Expert wgrads accumulated in place into fp32 main_grad (as Transformer Engine's GroupedLinear
under Megatron's gradient-accumulation fusion: cuBLAS with fp32 C = D, beta 1), one per expert,
loop1 (one stream) and loop4 (4 side streams), CUDA-graph replay; beside it the fp32 copy of the
same buffers (the extra kernel torch.addmm(out_dtype=fp32) runs when out is not self) and the
bf16-output wgrad (measured in grouped_gemm.py). Usage:
python3 benchmarks/device/grouped_wgrad_acc.py --out DIR; records: data/measured/grouped-gemm-h100/wgrad_acc.jsonl."""
import argparse
import json
import os
import statistics
import time

import torch

CONFIGS = [("qwen3_e4_m4096", 4, 4096, 4096, 1536), ("qwen3_e16_m1024", 16, 1024, 4096, 1536),
           ("qwen3_e16_m512", 16, 512, 4096, 1536), ("qwen3_e16_m4096", 16, 4096, 4096, 1536),
           ("qwen3_e16_m256", 16, 256, 4096, 1536), ("dsv3_e4_m4096", 4, 4096, 7168, 2048),
           ("dsv3_e8_m4096", 8, 4096, 7168, 2048), ("qwen2_e16_m1024", 16, 1024, 3584, 2560),
           ("qwen2_e16_m2048_etp2", 16, 2048, 3584, 1280), ("g8t8_e8_m1024", 8, 1024, 6144, 2048),
           ("g8t8_e8_m4096_etp2", 8, 4096, 6144, 1024), ("mix22_e2_m4096_etp2", 2, 4096, 6144, 8192)]


def each(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    ev[0].record()
    for i in range(iters):
        fn()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(iters)]


def graph(fn, warmup, iters):
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
    return each(g.replay, warmup, iters)


def multi(jobs, streams):
    main = torch.cuda.current_stream()
    for s in streams:
        s.wait_stream(main)
    for i, j in enumerate(jobs):
        with torch.cuda.stream(streams[i % len(streams)]):
            j()
    for s in streams:
        main.wait_stream(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    env = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
           "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    streams = [torch.cuda.Stream() for _ in range(4)]
    fo = open(os.path.join(a.out, "wgrad_acc.jsonl"), "a")
    for label, E, M, h, ffn in CONFIGS:
        for gemm, k, n in (("fc1", h, 2 * ffn), ("fc2", ffn, h)):
            x = torch.randn(E * M, k, device=dev, dtype=torch.bfloat16)
            dy = torch.randn(E * M, n, device=dev, dtype=torch.bfloat16)
            mg = torch.zeros(E, n, k, device=dev, dtype=torch.float32)
            mg2 = torch.zeros(E, n, k, device=dev, dtype=torch.float32)
            xs = [x[e * M:(e + 1) * M] for e in range(E)]
            dys = [dy[e * M:(e + 1) * M].t() for e in range(E)]
            mgs = [mg[e] for e in range(E)]
            mg2s = [mg2[e] for e in range(E)]
            inplace = [lambda e=e: torch.addmm(mgs[e], dys[e], xs[e], out_dtype=torch.float32,
                                               out=mgs[e]) for e in range(E)]
            copies = [lambda e=e: mg2s[e].copy_(mgs[e]) for e in range(E)]
            forms = {"inplace_loop1": lambda: [j() for j in inplace],
                     "inplace_loop4": lambda: multi(inplace, streams),
                     "copy_loop1": lambda: [j() for j in copies]}
            for name, fn in forms.items():
                rec = {"config": label, "experts": E, "rows": M, "gemm": gemm, "k": k, "n": n,
                       "pass": "wgrad_acc", "method": name, "env": env}
                try:
                    ts = graph(fn, 3, 15)
                    rec["graph_s"] = statistics.median(ts)
                    rec["graph_best_s"] = min(ts)
                except Exception as ex:  # noqa: BLE001
                    rec["error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
                fo.write(json.dumps(rec) + "\n")
                fo.flush()
                print(label, gemm, name, rec.get("graph_s"), rec.get("error", ""), flush=True)
            del x, dy, mg, mg2, xs, dys, mgs, mg2s
            torch.cuda.empty_cache()
    print("done", flush=True)


if __name__ == "__main__":
    main()
