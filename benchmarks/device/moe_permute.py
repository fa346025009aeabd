"""Megatron-Core's PyTorch (unfused) MoE permutation, as NeMo 2.2/2.3 ran it with
moe_permute_fusion off, written here as plain torch ops (facts from megatron/core/transformer/
moe/moe_utils.py permute / unpermute / topk_softmax_with_capacity, core_r0.11-0.12; own code):
each piece timed forward and backward with CUDA events on one GPU, 30 calls back to back after
5 warm-up calls, beside a bf16 copy of the rows (the streaming reference). A backward piece is
(forward + backward) less the forward. The routing weights carry no gradient here, so
``unpermute_bwd`` is the rows' gradient only (scatter_add_'s gather and the product with the
weights), not the weights' own. Small pieces (the index work on [tokens, experts]) are bound
by the host's launches, not the GPU. Then FP8 (``torch._scaled_mm``, per-tensor scales) and
bf16 GEMMs at the Mixtral expert shapes. One JSON line per (shape, piece) on stdout."""
import json
import sys

import torch

dev = "cuda"
torch.manual_seed(0)


def timeit(fn, reps=30, warm=5):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps * 1e-3


def case(name, T, h, E, k, drop):
    out = []
    cap = T * k // E
    logits = torch.randn(T, E, device=dev, dtype=torch.float32)
    x = torch.randn(T, h, device=dev, dtype=torch.bfloat16, requires_grad=True)

    def router():  # softmax top-k, then (drop) the capacity top-k over tokens
        probs = torch.softmax(logits, dim=-1)
        sc, idx = torch.topk(probs, k=k, dim=1)
        gates = torch.zeros_like(logits).scatter(1, idx, sc)
        rmap = torch.zeros_like(logits).int().scatter(1, idx, 1).bool()
        if drop:
            _, cidx = torch.topk(gates, k=cap, dim=0, sorted=False)
            cmask = torch.zeros_like(logits).scatter(0, cidx, 1).bool()
            rmap = torch.logical_and(rmap, cmask)
            gates = gates * rmap
        return gates, rmap

    gates, rmap = router()
    out.append(("router", timeit(router)))

    def perm_index():
        if drop:
            m = rmap.to(torch.int8).T.contiguous()
            return m.argsort(dim=-1, descending=True, stable=True)[:, :cap].contiguous().view(-1)
        m = rmap.bool().T.contiguous()
        ti = torch.arange(T, device=dev).unsqueeze(0).expand(E, -1)
        return ti.masked_select(m)  # output size read on the host: a synchronisation

    idx = perm_index()
    out.append(("permute_index", timeit(perm_index)))
    R = idx.numel()
    out.append(("permute_gather_fwd", timeit(lambda: x.index_select(0, idx))))
    y = x.index_select(0, idx)
    gy = torch.randn_like(y)

    def perm_bwd():
        x.grad = None
        y2 = x.index_select(0, idx)
        y2.backward(gy)
    tb = timeit(perm_bwd) - timeit(lambda: x.index_select(0, idx))
    out.append(("permute_gather_bwd", tb))

    yp = torch.randn(R, h, device=dev, dtype=torch.bfloat16, requires_grad=True)
    probs_sel = gates  # [T, E]

    def unperm():
        if drop:
            pt = probs_sel.T.contiguous().view(-1)
            i0 = torch.arange(E, device=dev).unsqueeze(-1)
            i1 = idx.view(E, cap)
            p = pt.index_select(0, (i0 * T + i1).view(-1))
        else:
            p = probs_sel.T.contiguous().masked_select(rmap.T.contiguous())
        t = yp * p.unsqueeze(-1).to(yp.dtype)
        o = torch.zeros(T, h, device=dev, dtype=yp.dtype)
        o.scatter_add_(0, idx.unsqueeze(1).expand(-1, h), t)
        return o
    out.append(("unpermute_fwd", timeit(unperm)))
    o = unperm()
    go = torch.randn_like(o)

    def unperm_fb():
        yp.grad = None
        unperm().backward(go)
    out.append(("unpermute_bwd", timeit(unperm_fb) - timeit(unperm)))
    ref = torch.empty(R, h, device=dev, dtype=torch.bfloat16)
    out.append(("copy_Rh_ref", timeit(lambda: ref.clone())))
    for piece, s in out:
        print(json.dumps({"case": name, "tokens": T, "hidden": h, "experts": E, "top_k": k,
                          "drop_and_pad": drop, "rows": R, "piece": piece, "time_s": s}))
        sys.stdout.flush()


def gemms():
    """FP8 (per-tensor scaled, torch._scaled_mm, e4m3 x e4m3 -> bf16) and bf16 GEMMs at the
    Mixtral expert shapes (rows M, K, N), each timed over 30 back-to-back calls."""
    for M, K, N in [(16384, 4096, 28672), (16384, 14336, 4096), (8192, 6144, 32768),
                    (8192, 16384, 6144), (4096, 7168, 4096), (4096, 2048, 7168)]:
        a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        b = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
        one = torch.ones((), device=dev, dtype=torch.float32)
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        t8 = timeit(lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                             out_dtype=torch.bfloat16), reps=30)
        t16 = timeit(lambda: a @ b.t(), reps=30)
        for dt, t in (("fp8", t8), ("bf16", t16)):
            print(json.dumps({"piece": "gemm", "dtype": dt, "m": M, "k": K, "n": N, "time_s": t,
                              "tflops": 2 * M * K * N / t / 1e12}))
            sys.stdout.flush()


if __name__ == "__main__":
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}))
    for args in [("mixtral8x7b_mbs2", 8192, 4096, 8, 2, True),
                 ("mixtral8x22b_cp8_tp2", 4096, 6144, 8, 2, True),
                 ("mixtral8x7b_mbs2_dropless", 8192, 4096, 8, 2, False),
                 ("qwen3_like_dropless", 4096, 4096, 128, 8, False),
                 ("small", 2048, 2048, 8, 2, True)]:
        case(*args)
    gemms()
