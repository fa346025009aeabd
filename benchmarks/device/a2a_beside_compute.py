"""How much slower an NCCL all-to-all runs while the same GPUs compute (and the compute beside
it), by size, group and kind of concurrent kernel: the all-to-all counterpart of
``comm_beside_compute.py`` (same method, same JSON fields). Writes JSON lines.

    python3 -m torch.distributed.run --standalone --nproc_per_node=4 \
        benchmarks/device/a2a_beside_compute.py --out DIR [--quick] [--set shapes]

Why: combined 1F1B (Megatron-Core's ``overlap_moe_expert_parallel_comm``) and DualPipe run one
micro-batch's expert-parallel all-to-all on a communication stream while another micro-batch's
GEMMs run on the compute stream. The simulator slows the compute beside it (measured beside
all-reduce / all-gather / reduce-scatter) but takes the all-to-all at its own cost; the
collectives measured beside a GEMM (``data/measured/h100x4/comm_beside_compute-*.jsonl``) ran
5-10 % slower up to 32 MiB and 56-106 % at 256 MiB over 4 GPUs. This measures the all-to-all.

* ``op`` all_to_all (``all_to_all_single``, equal splits); ``bytes`` (a rank's send buffer)
  4, 32, 64, 256 MiB; ``group`` 4 (all GPUs) and 2 (pairs {0,1},{2,3} at once);
* ``neighbour``: ``gemm`` (8192^3 bf16 matmul loop, as comm_beside_compute.py),
  ``gemm_fp8`` (8192^3 FP8 E4M3 ``torch._scaled_mm``, per-tensor scales, bf16 out),
  ``expert_fp8`` (4096 x 7168 x 4096 FP8: a DeepSeek-V3 expert fc1 of 4,096 rows, short
  kernels back to back), ``copy`` (1 GiB device-to-device copy loop: HBM-bound), ``none``;
  ``--set shapes``: the MoE layers' expert GEMMs of :data:`SHAPES` instead, at 16, 32 and
  64 MiB (the published MoE rows' all-to-all sizes).

Method (as comm_beside_compute.py): the collective loop on a side stream and the neighbour
loop on the default stream are launched together and last about as long (counts from their
solo times, the same on every rank); each side's per-iteration time is the median of
CUDA-event intervals; a rank reports its medians and the slowest rank's are written. Lines:
``op, bytes, group, neighbour, comm_alone_s, comm_beside_s, comm_slowdown, neighbour_alone_s,
neighbour_beside_s, neighbour_slowdown, n_comm, n_neighbour, tag``; a neighbour that fails
(no FP8 GEMM in this PyTorch) writes one ``error`` line and is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

MIB = 2**20


def timed(fn, iters: int, stream) -> list:
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    with torch.cuda.stream(stream):
        marks[0].record(stream)
        for i in range(iters):
            fn()
            marks[i + 1].record(stream)
    return marks


def medians(marks) -> float:
    torch.cuda.synchronize()  # every event completed before its elapsed time is read
    return statistics.median(a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:], strict=False))


def slowest(x: float) -> float:
    t = torch.tensor([x], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def fp8_gemm(m: int, k: int, n: int):
    """A per-tensor FP8 GEMM ``[m, k] @ [k, n]`` (B column-major, as cuBLAS takes it)."""
    e4 = torch.float8_e4m3fn
    a = torch.randn(m, k, device="cuda").to(e4)
    b = torch.randn(n, k, device="cuda").to(e4).t()
    one = torch.ones((), device="cuda")
    out = torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)  # noqa: F841 (probe)

    def run():
        return torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16)

    return run


#: ``--set shapes``: GEMMs of the MoE layers combined 1F1B pairs with the all-to-all, as
#: (name, dtype, m, k, n): DeepSeek-V3's expert fc1 / fc2 (4,096 rows an expert at EP 64, TP 2;
#: 2,048 and 8,192 rows beside them) in FP8 and BF16, Qwen3-235B's expert fc1 (4,096 rows,
#: hidden 4,096, 2 x 1,536) in BF16
SHAPES = (("expert_fp8", "fp8", 4096, 7168, 4096), ("expert_bf16", "bf16", 4096, 7168, 4096),
          ("expert_fp8_m2048", "fp8", 2048, 7168, 4096),
          ("expert_fp8_m8192", "fp8", 8192, 7168, 4096),
          ("expert_fc2_fp8", "fp8", 4096, 2048, 7168),
          ("qwen_expert_bf16", "bf16", 4096, 4096, 3072))


def shape_neighbours() -> dict:
    out: dict = {}
    for name, dtype, m, k, n in SHAPES:
        try:
            if dtype == "fp8":
                out[name] = fp8_gemm(m, k, n)
            else:
                a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
                out[name] = (lambda a=a, b=b: torch.matmul(a, b))
        except Exception as e:  # noqa: BLE001 (recorded, the run goes on)
            out[name] = f"error: {type(e).__name__}: {str(e)[:200]}"
    out["none"] = None
    return out


def neighbours(quick: bool) -> dict:
    n = 2048 if quick else 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    src = torch.empty((64 if quick else 1024) * MIB, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    out = {"gemm": lambda: torch.matmul(a, b, out=c)}
    for name, shape in (("gemm_fp8", (n, n, n)),
                        ("expert_fp8", (1024, 1792, 1024) if quick else (4096, 7168, 4096))):
        try:
            out[name] = fp8_gemm(*shape)
        except Exception as e:  # noqa: BLE001 (recorded, the run goes on)
            out[name] = f"error: {type(e).__name__}: {str(e)[:200]}"
    out["copy"] = lambda: dst.copy_(src)
    out["none"] = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tag", default=os.environ.get("NCCL_ALGO", "auto"))
    ap.add_argument("--set", default="basic", choices=("basic", "shapes"))
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    nbs = shape_neighbours() if args.set == "shapes" else neighbours(args.quick)
    groups = {4: [list(range(world))], 2: [list(range(i, i + 2)) for i in range(0, world, 2)]}
    pgs = {g: [dist.new_group(r) for r in rr] for g, rr in groups.items()}
    side = torch.cuda.Stream()
    main_s = torch.cuda.current_stream()
    suffix = args.tag if args.set == "basic" else f"{args.tag}-{args.set}"
    out = open(os.path.join(args.out, f"a2a_beside_compute-{suffix}.jsonl"), "a")
    if rank == 0:
        for name, fn in nbs.items():
            if isinstance(fn, str):
                out.write(json.dumps({"neighbour": name, "error": fn}) + "\n")
    sizes = [4 * MIB] if args.quick else [4 * MIB, 32 * MIB, 64 * MIB, 256 * MIB]
    if args.set == "shapes":
        sizes = [16 * MIB, 32 * MIB, 64 * MIB]
    alone: dict[str, float] = {}
    for g, gl in groups.items():
        pg = pgs[g][next(i for i, r in enumerate(gl) if rank in r)]
        for nbytes in sizes:
            elems = nbytes // 2
            x = torch.randn(elems, device="cuda", dtype=torch.bfloat16)
            y = torch.empty_like(x)

            def comm(x=x, y=y, pg=pg):
                dist.all_to_all_single(y, x, group=pg)

            for _ in range(5):
                comm()
            torch.cuda.synchronize()
            c_alone = slowest(medians(timed(comm, 20, side)))
            for name, fn in nbs.items():
                if isinstance(fn, str):
                    continue
                row = {"op": "all_to_all", "bytes": nbytes, "group": g, "neighbour": name,
                       "comm_alone_s": c_alone, "tag": args.tag}
                if fn is not None:
                    if name not in alone:
                        for _ in range(3):
                            fn()
                        torch.cuda.synchronize()
                        alone[name] = slowest(medians(timed(fn, 20, main_s)))
                    n_alone = alone[name]
                    n_nb = max(20, int(round(20 * c_alone / n_alone)))
                    n_c = int(max(5, round(n_nb * n_alone / c_alone)))
                    dist.barrier()
                    torch.cuda.synchronize()
                    cm = timed(comm, n_c, side)
                    nm = timed(fn, n_nb, main_s)
                    torch.cuda.synchronize()
                    row.update(comm_beside_s=slowest(medians(cm)),
                               neighbour_alone_s=n_alone,
                               neighbour_beside_s=slowest(medians(nm)),
                               n_comm=n_c, n_neighbour=n_nb)
                    row["comm_slowdown"] = row["comm_beside_s"] / c_alone
                    row["neighbour_slowdown"] = row["neighbour_beside_s"] / n_alone
                if rank == 0:
                    out.write(json.dumps(row) + "\n")
                    out.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
