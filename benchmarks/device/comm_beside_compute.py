"""How much slower an NCCL collective runs while the same GPUs compute (and the compute beside
it), by operation, size, group and kind of concurrent kernel. Writes JSON lines.

    python3 -m torch.distributed.run --standalone --nproc_per_node=4 \
        benchmarks/device/comm_beside_compute.py --out DIR [--quick]

Why: data/measured/h200x4/interference.jsonl has one size (256 MiB) and one neighbour (an
8192^3 GEMM): an all-reduce ran 1.42x slower beside it, an all-gather or a reduce-scatter only
1.03x, and a GEMM 1.14x slower beside any of them. The simulator models the GEMM side; to model
the collective side from first principles it needs to know what the slowdown follows:

* ``op`` all_reduce, all_gather, reduce_scatter; ``bytes`` 4, 32, 256 MiB; ``group`` 4 (all
  GPUs) and 2 (pairs {0,1},{2,3} at once);
* ``neighbour``: ``gemm`` (8192^3 bf16 matmul loop: tensor cores, little HBM traffic),
  ``copy`` (1 GiB device-to-device copy loop: HBM-bound, no tensor cores), ``none``;
* ``nccl_algo``: the algorithm NCCL picked is not visible from PyTorch, so the all-reduce is
  also run with ``NCCL_ALGO=Ring`` forced in a second invocation (``--tag ring``) to separate
  an algorithm switch (ring vs tree inside a node) from SM/HBM contention.

Method: the collective loop on a side stream and the neighbour loop on the default stream are
launched together and last about as long (counts from their solo times, the same on every
rank); each side's per-iteration time is the median of CUDA-event intervals; a rank reports its
medians and the slowest rank's are written. Lines: ``op, bytes, group, neighbour, comm_alone_s,
comm_beside_s, comm_slowdown, neighbour_alone_s, neighbour_beside_s, neighbour_slowdown,
n_comm, n_neighbour, tag``.
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


def timed(fn, iters: int, stream) -> list[float]:
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    with torch.cuda.stream(stream):
        marks[0].record(stream)
        for i in range(iters):
            fn()
            marks[i + 1].record(stream)
    return marks


def medians(marks) -> float:
    return statistics.median(a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:], strict=False))


def slowest(x: float) -> float:
    t = torch.tensor([x], device="cuda")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tag", default=os.environ.get("NCCL_ALGO", "auto"))
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    n = 2048 if args.quick else 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    src = torch.empty((64 if args.quick else 1024) * MIB, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    neighbours = {"gemm": lambda: torch.matmul(a, b, out=c), "copy": lambda: dst.copy_(src),
                  "none": None}
    groups = {4: [list(range(world))], 2: [list(range(i, i + 2)) for i in range(0, world, 2)]}
    pgs = {g: [dist.new_group(r) for r in rr] for g, rr in groups.items()}
    side = torch.cuda.Stream()
    main_s = torch.cuda.current_stream()
    out = open(os.path.join(args.out, f"comm_beside_compute-{args.tag}.jsonl"), "a")
    sizes = [4 * MIB] if args.quick else [4 * MIB, 32 * MIB, 256 * MIB]
    for g, gl in groups.items():
        pg = pgs[g][next(i for i, r in enumerate(gl) if rank in r)]
        for op in ("all_reduce", "all_gather", "reduce_scatter"):
            for nbytes in sizes:
                elems = nbytes // 2
                x = torch.randn(elems, device="cuda", dtype=torch.bfloat16)
                y = torch.empty(elems // g if op == "reduce_scatter" else elems,
                                device="cuda", dtype=torch.bfloat16)
                xs = x[: elems // g]
                comm = {"all_reduce": lambda: dist.all_reduce(x, group=pg),
                        "all_gather": lambda: dist.all_gather_into_tensor(y, xs, group=pg),
                        "reduce_scatter": lambda: dist.reduce_scatter_tensor(y, x, group=pg)}[op]
                for _ in range(5):
                    comm()
                torch.cuda.synchronize()
                c_alone = slowest(medians(timed(comm, 20, side)))
                for name, fn in neighbours.items():
                    row = {"op": op, "bytes": nbytes, "group": g, "neighbour": name,
                           "comm_alone_s": c_alone, "tag": args.tag}
                    if fn is not None:
                        for _ in range(3):
                            fn()
                        torch.cuda.synchronize()
                        n_alone = slowest(medians(timed(fn, 20, main_s)))
                        n_nb = 20
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
