"""Measure, on real GPUs, what the simulator must predict; write JSON lines.

One script, one device call. Run with no ``--part`` it is the *driver*: it starts each part as
its own child process (``torchrun``-style, one process per GPU, through
``python -m torch.distributed.run``) under its own time limit, so that a crash or a hang in one
part costs that part alone, and it stops starting parts when the overall budget runs out. Every
measurement is appended to a JSON-lines file under ``--out`` and flushed at once.

Parts (``--part``), in the order the driver runs them:

``env``           GPU name, driver, torch / CUDA / NCCL versions, ``nvidia-smi topo -m``,
                  NCCL-related environment variables (``env.jsonl``, one line).
``train``         measured training steps of a Llama-style decoder, one ``--case`` per child
                  (``train.jsonl``): a = 1 GPU, b = DDP, c = FSDP (ZeRO-3), d = Megatron-style
                  tensor parallel, plus extra cases when time is left. See ``CASES``.
``collectives``   NCCL all_reduce, all_gather, reduce_scatter, all_to_all, broadcast (and
                  send/recv between pairs) on 4 GPUs and on two disjoint pairs at once, 4 KiB to
                  1 GiB, bf16, timed with CUDA events around back-to-back launches
                  (``collectives.jsonl``).
``gemm``          bf16 matrix products on each GPU at once (reported: GPU 0, with every GPU's
                  median alongside), causal flash attention, a device-to-device copy
                  (``gemm.jsonl``).
``interference``  a bf16 8192^3 GEMM loop alone and with a 256 MiB collective loop on another
                  CUDA stream on all 4 GPUs (``interference.jsonl``).

The driver also writes ``phases.jsonl`` (each part's exit status and wall time, and any error
a part caught and survived) and ``log.txt`` (every child's stdout and stderr).

Usage on the device (4 GPUs)::

    python3 benchmarks/device/measure.py --out $OUT --nproc 4 --budget-s 480

CPU smoke test (gloo backend, tiny sizes; the numbers mean nothing)::

    python3 benchmarks/device/measure.py --quick --out /tmp/m --nproc 4

Timing rules (see README.md beside this file): collectives and kernels are timed with CUDA
events recorded between back-to-back launches (median of the per-iteration times after
warm-up; for several GPUs the slowest rank's median); a training step is timed with a host
clock between two ``torch.cuda.synchronize()`` calls at the step boundaries.

NVLink SHARP / multicast stays off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``): the device machines require it, and the shared calibration set
(``../shared/calibration`` beside the checkout) was measured the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import math
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, replace

SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
for _k, _v in SAFE_ENV.items():  # before torch / NCCL are loaded, in every process
    os.environ[_k] = _v

GIB = 1024**3
MIB = 1024**2


# ============================================================================================
# Small utilities
# ============================================================================================


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def append_jsonl(path: str, record: dict) -> None:
    """Append one JSON line and flush it to disk at once (a later crash loses nothing)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def log_error(args, where: str, exc: BaseException) -> None:
    """Record an error a part caught and survived, in phases.jsonl and on stderr."""
    rank = int(os.environ.get("RANK", "0"))
    msg = f"{type(exc).__name__}: {exc}"
    print(f"[rank {rank}] ERROR in {where}: {msg}\n{traceback.format_exc()}", file=sys.stderr)
    append_jsonl(
        os.path.join(args.out, "phases.jsonl"),
        {"error_in": where, "rank": rank, "error": msg[:2000]},
    )


def run_cmd(cmd: list[str], timeout: float = 20.0) -> str:
    """stdout of a command, or the error text (the environment part must never fail)."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return p.stdout if p.returncode == 0 else f"(exit {p.returncode}) {p.stdout}{p.stderr}"
    except Exception as e:  # noqa: BLE001 - best effort
        return f"(failed: {e})"


# ============================================================================================
# Distributed set-up and timing
# ============================================================================================


class Ctx:
    """The process's rank, device, backend and clock."""

    def __init__(self, args):
        import torch
        import torch.distributed as dist

        self.torch, self.dist, self.args = torch, dist, args
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.local = int(os.environ.get("LOCAL_RANK", "0"))
        self.cuda = torch.cuda.is_available() and not args.cpu
        timeout = _dt.timedelta(seconds=args.pg_timeout_s)
        if self.cuda:
            torch.cuda.set_device(self.local)
            self.device = torch.device("cuda", self.local)
            dist.init_process_group("nccl", timeout=timeout, device_id=self.device)
        else:
            self.device = torch.device("cpu")
            dist.init_process_group("gloo", timeout=timeout)

    # -- clock: CUDA events on the GPU, the host clock on the CPU (where work is synchronous)
    def mark(self, stream=None):
        if self.cuda:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record(stream)
            return e
        return time.perf_counter()

    def elapsed(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def stream(self):
        return self.torch.cuda.Stream() if self.cuda else None

    def on_stream(self, s):
        return (
            self.torch.cuda.stream(s) if (self.cuda and s is not None) else contextlib.nullcontext()
        )

    def timed_loop(self, fn, warmup: int, iters: int, stream=None) -> list[float]:
        """Per-iteration times of ``fn`` launched back to back (events between launches)."""
        for _ in range(warmup):
            fn()
        self.sync()
        marks = [self.mark(stream)]
        for _ in range(iters):
            fn()
            marks.append(self.mark(stream))
        self.sync()
        return [self.elapsed(a, b) for a, b in zip(marks, marks[1:], strict=False)]

    def allreduce_list(self, vals: list[float], op: str = "max") -> list[float]:
        """Element-wise max/min/sum of a list of floats over all ranks."""
        t = self.torch.tensor(vals, dtype=self.torch.float64, device=self.device)
        ops = {
            "max": self.dist.ReduceOp.MAX,
            "min": self.dist.ReduceOp.MIN,
            "sum": self.dist.ReduceOp.SUM,
        }
        self.dist.all_reduce(t, op=ops[op])
        return t.tolist()

    def all_ok(self, ok: bool) -> bool:
        """True on every rank only if ``ok`` on every rank (to skip a step symmetrically)."""
        return self.allreduce_list([1.0 if ok else 0.0], "min")[0] > 0.5

    def gather_obj(self, obj):
        out = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def write(self, name: str, record: dict) -> None:
        if self.rank == 0:
            append_jsonl(os.path.join(self.args.out, name), record)

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.dist.barrier()
        with contextlib.suppress(Exception):
            self.dist.destroy_process_group()


# ============================================================================================
# Part: environment
# ============================================================================================


def part_env(args) -> None:
    """One JSON line describing the machine and the software."""
    import torch

    rec: dict = {"kind": "env", "measured_utc": now_utc(), "hostname": platform.node()}
    rec["python"] = sys.version.split()[0]
    rec["torch"] = torch.__version__
    rec["torch_cuda"] = torch.version.cuda
    try:
        rec["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
    except Exception as e:  # noqa: BLE001
        rec["nccl"] = f"(unavailable: {e})"
    rec["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available() and not args.cpu:
        gpus = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append(
                {
                    "index": i,
                    "name": p.name,
                    "total_memory_GiB": p.total_memory / GIB,
                    "multiprocessors": p.multi_processor_count,
                    "capability": f"{p.major}.{p.minor}",
                    "l2_cache_MB": getattr(p, "L2_cache_size", 0) / 1e6,
                }
            )
        rec["gpus"] = gpus
        rec["cudnn"] = torch.backends.cudnn.version()
    rec["nvidia_smi_query"] = run_cmd(
        [
            "nvidia-smi",
            "--query-gpu=index,name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,"
            "power.limit,pstate,temperature.gpu,pci.bus_id",
            "--format=csv",
        ]
    )
    rec["nvidia_smi_topo_m"] = run_cmd(["nvidia-smi", "topo", "-m"])
    rec["nvidia_smi_nvlink_status"] = run_cmd(["nvidia-smi", "nvlink", "--status", "-i", "0"])
    rec["env"] = {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(("NCCL_", "TORCH_NCCL", "TORCH_SYMM", "NVSHMEM_", "CUDA_", "OMP_"))
    }
    rec["cpu_count"] = os.cpu_count()
    rec["kernel"] = platform.release()
    append_jsonl(os.path.join(args.out, "env.jsonl"), rec)
    print(json.dumps({k: rec[k] for k in ("torch", "torch_cuda", "nccl")}))
    print(rec["nvidia_smi_query"])
    print(rec["nvidia_smi_topo_m"])


# ============================================================================================
# Part: collectives
# ============================================================================================

# nccl-tests bus-bandwidth factors (NVIDIA/nccl-tests doc/PERFORMANCE.md)
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}


def part_collectives(args) -> None:
    c = Ctx(args)
    torch, dist = c.torch, c.dist
    dtype = torch.bfloat16
    n_world = c.world
    if args.quick:
        sizes = [4096 * 4**i for i in range(3)]
    else:
        sizes = [4096 * 4**i for i in range(10)]  # 4 KiB .. 1 GiB by x4
    # group 2 = disjoint pairs {0,1}, {2,3} running at the same time; every rank must create
    # every group, in the same order.
    pairs = [list(range(i, i + 2)) for i in range(0, n_world - 1, 2)]
    pair_groups = [dist.new_group(p) for p in pairs]
    my_pair = c.rank // 2
    settings = [(n_world, None, list(range(n_world)))]
    if n_world >= 4 and n_world % 2 == 0:
        settings.append((2, pair_groups[my_pair], pairs[my_pair]))

    # correctness check once: all_reduce of the rank index
    try:
        x = torch.full((1024,), float(c.rank), device=c.device, dtype=torch.float32)
        dist.all_reduce(x)
        c.sync()
        ok = bool(torch.all(x == sum(range(n_world))).item())
        c.write("phases.jsonl", {"check": "all_reduce_sum", "ok": ok})
    except Exception as e:  # noqa: BLE001
        log_error(args, "collectives/check", e)

    ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "sendrecv"]
    for g, pg, members in settings:
        for op in ops:
            if op == "sendrecv" and g != 2:
                continue
            for nbytes in sizes:
                where = f"collectives/{op}/g{g}/{nbytes}"
                fn, bufs = None, None
                try:
                    elems = nbytes // 2
                    pos = members.index(c.rank)
                    if op == "all_reduce":
                        bufs = [torch.randn(elems, device=c.device, dtype=dtype)]

                        def fn(b=bufs, pg=pg):
                            dist.all_reduce(b[0], group=pg)
                    elif op == "all_gather":
                        bufs = [
                            torch.randn(elems // g, device=c.device, dtype=dtype),
                            torch.empty(elems, device=c.device, dtype=dtype),
                        ]

                        def fn(b=bufs, pg=pg):
                            dist.all_gather_into_tensor(b[1], b[0], group=pg)
                    elif op == "reduce_scatter":
                        bufs = [
                            torch.randn(elems, device=c.device, dtype=dtype),
                            torch.empty(elems // g, device=c.device, dtype=dtype),
                        ]

                        def fn(b=bufs, pg=pg):
                            dist.reduce_scatter_tensor(b[1], b[0], group=pg)
                    elif op == "all_to_all":
                        bufs = [
                            torch.randn(elems, device=c.device, dtype=dtype),
                            torch.empty(elems, device=c.device, dtype=dtype),
                        ]

                        def fn(b=bufs, pg=pg):
                            dist.all_to_all_single(b[1], b[0], group=pg)
                    elif op == "broadcast":
                        bufs = [torch.randn(elems, device=c.device, dtype=dtype)]

                        def fn(b=bufs, src=members[0], pg=pg):
                            dist.broadcast(b[0], src=src, group=pg)
                    else:  # sendrecv: first of each pair sends to the second
                        bufs = [torch.randn(elems, device=c.device, dtype=dtype)]
                        peer = members[1 - pos]
                        if pos == 0:

                            def fn(b=bufs, peer=peer, pg=pg):
                                dist.send(b[0], dst=peer, group=pg)
                        else:

                            def fn(b=bufs, peer=peer, pg=pg):
                                dist.recv(b[0], src=peer, group=pg)

                    ready = True
                except Exception as e:  # noqa: BLE001
                    log_error(args, where + "/alloc", e)
                    ready = False
                if not c.all_ok(ready):
                    bufs = fn = None
                    c.free()
                    continue
                try:
                    iters = args.coll_iters_small if nbytes <= 64 * MIB else args.coll_iters_large
                    if args.quick:
                        iters = 5
                    dist.barrier()
                    times = c.timed_loop(fn, warmup=args.coll_warmup, iters=iters)
                    med, best = statistics.median(times), min(times)
                    mean = sum(times) / len(times)
                    med_max, best_max, mean_max = c.allreduce_list([med, best, mean], "max")
                    algbw = nbytes / med_max / 1e9
                    c.write(
                        "collectives.jsonl",
                        {
                            "op": op,
                            "group": g,
                            "bytes": nbytes,
                            "time_s": med_max,
                            "best_s": best_max,
                            "mean_s": mean_max,
                            "algbw_GBps": algbw,
                            "busbw_GBps": algbw * BUS_FACTOR[op](g),
                            "dtype": "bf16" if dtype == torch.bfloat16 else str(dtype),
                            "timing": "cuda_events" if c.cuda else "host_clock",
                            "iters": iters,
                            "warmup": args.coll_warmup,
                            "nvls": os.environ.get("NCCL_NVLS_ENABLE"),
                        },
                    )
                    if c.rank == 0:
                        print(
                            f"{op:15s} g{g} {nbytes:>11d} B  {med_max * 1e6:10.1f} us  "
                            f"busbw {algbw * BUS_FACTOR[op](g):7.1f} GB/s",
                            flush=True,
                        )
                except Exception as e:  # noqa: BLE001
                    log_error(args, where, e)
                bufs = fn = None
                c.free()
    c.close()


# ============================================================================================
# Part: GEMMs, attention, copy (one GPU each, all GPUs at once)
# ============================================================================================

OOS_KN = [(8192, 1280), (8192, 7168), (3584, 8192), (1024, 8192), (4096, 3584), (4096, 1536)]
# forward GEMM shapes (k, n) of the measured training steps at m = 4096 tokens:
# unsharded qkv, out, gate+up, down, head; then the TP=4 shards.
TRAIN_KN = [
    (4096, 6144),
    (4096, 4096),
    (4096, 28672),
    (14336, 4096),
    (4096, 32000),
    (4096, 1536),
    (1024, 4096),
    (4096, 7168),
    (3584, 4096),
    (4096, 8000),
]


def part_gemm(args) -> None:
    c = Ctx(args)
    torch = c.torch
    dtype = torch.bfloat16
    jobs: list[tuple[int, int, int, str]] = []
    if args.quick:
        jobs = [(64, 64, 128, "nn"), (64, 128, 64, "nt")]
    else:
        for m in (1024, 4096, 8192):
            for k, n in OOS_KN:
                jobs.append((m, k, n, "nn"))
        for k, n in TRAIN_KN:
            jobs.append((4096, k, n, "nn"))
            jobs.append((4096, k, n, "nt"))
    for m, k, n, layout in jobs:
        where = f"gemm/{m}x{k}x{n}/{layout}"
        res = None
        try:
            a = torch.randn(m, k, device=c.device, dtype=dtype)
            if layout == "nn":  # a @ b, b stored k x n (as the shared calibration set)
                b = torch.randn(k, n, device=c.device, dtype=dtype)
            else:  # a @ w.T, w stored n x k (nn.Linear's layout)
                b = torch.randn(n, k, device=c.device, dtype=dtype).t()
            out = torch.empty(m, n, device=c.device, dtype=dtype)
            times = c.timed_loop(
                lambda a=a, b=b, out=out: torch.matmul(a, b, out=out),
                args.gemm_warmup,
                args.gemm_iters,
            )
            res = [statistics.median(times), min(times)]
            del a, b, out
        except Exception as e:  # noqa: BLE001
            log_error(args, where, e)
        allres = c.gather_obj(res)
        if allres[0] is not None:
            t = allres[0][0]
            by_gpu = [r[0] if r else None for r in allres]
            c.write(
                "gemm.jsonl",
                {
                    "m": m,
                    "k": k,
                    "n": n,
                    "dtype": "bf16",
                    "layout": layout,
                    "time_s": t,
                    "best_s": allres[0][1],
                    "tflops": 2 * m * k * n / t / 1e12,
                    "gpu": 0,
                    "time_s_by_gpu": by_gpu,
                    "timing": "cuda_events" if c.cuda else "host_clock",
                    "iters": args.gemm_iters,
                },
            )
            if c.rank == 0:
                print(
                    f"gemm {m}x{k}x{n} {layout}: {t * 1e6:9.1f} us {2 * m * k * n / t / 1e12:6.1f} TFLOP/s",
                    flush=True,
                )
        c.free()

    # causal attention (GQA as in the training steps), forward and forward+backward, through
    # PyTorch's default dispatch and through each kernel forced in turn
    att = (
        [(1, 64, 8, 4, 16)]
        if args.quick
        else [
            (1, 4096, 32, 8, 128),
            (1, 4096, 8, 2, 128),
            (2, 2048, 32, 8, 128),
            (1, 4096, 32, 32, 128),
        ]
    )
    for b_, s, hq, hkv, d in att:
        for backend in SDPA_BACKENDS:
            where = f"sdpa/{backend}/{b_}x{s}x{hq}x{hkv}x{d}"
            res = None
            sdpa = sdpa_call(backend)
            try:
                q = torch.randn(b_, hq, s, d, device=c.device, dtype=dtype, requires_grad=True)
                k_ = torch.randn(b_, hkv, s, d, device=c.device, dtype=dtype, requires_grad=True)
                v = torch.randn(b_, hkv, s, d, device=c.device, dtype=dtype, requires_grad=True)
                go = torch.randn(b_, hq, s, d, device=c.device, dtype=dtype)

                def fwd(q=q, k_=k_, v=v, sdpa=sdpa):
                    with torch.no_grad():
                        sdpa(q, k_, v)

                def fwdbwd(q=q, k_=k_, v=v, go=go, sdpa=sdpa):  # autograd.grad: no .grad sums
                    o = sdpa(q, k_, v)
                    torch.autograd.grad(o, (q, k_, v), go)

                tf = c.timed_loop(fwd, 3, args.gemm_iters)
                tfb = c.timed_loop(fwdbwd, 3, args.gemm_iters)
                res = [statistics.median(tf), statistics.median(tfb), sdpa.resolved]
                del q, k_, v, go
            except Exception as e:  # noqa: BLE001 - a kernel may not support the shape
                if c.rank == 0:
                    append_jsonl(
                        os.path.join(args.out, "phases.jsonl"),
                        {"skipped": where, "reason": f"{type(e).__name__}: {str(e)[:300]}"},
                    )
            allres = c.gather_obj(res)
            if allres[0] is not None:
                fl = 2 * b_ * hq * s * s * d  # causal forward FLOPs, as the shared set counts
                f_s, fb_s, resolved = allres[0]
                c.write(
                    "gemm.jsonl",
                    {
                        "op": "sdpa_causal",
                        "batch": b_,
                        "seq": s,
                        "heads": hq,
                        "kv_heads": hkv,
                        "head_dim": d,
                        "dtype": "bf16",
                        "fwd_s": f_s,
                        "fwdbwd_s": fb_s,
                        "fwd_tflops": fl / f_s / 1e12,
                        "fwdbwd_tflops": 3.5 * fl / fb_s / 1e12,
                        "backend": backend,
                        "resolved_backend": resolved,
                        "enable_gqa": True,
                        "gpu": 0,
                        "fwd_s_by_gpu": [r[0] if r else None for r in allres],
                        "fwdbwd_s_by_gpu": [r[1] if r else None for r in allres],
                    },
                )
            c.free()

    # device-to-device copy of 1 GiB (bytes counts read + written, as the shared set)
    try:
        nb = (1 * MIB) if args.quick else GIB
        x = torch.empty(nb // 2, device=c.device, dtype=dtype).normal_()
        y = torch.empty_like(x)
        t = statistics.median(c.timed_loop(lambda x=x, y=y: y.copy_(x), 3, args.gemm_iters))
        allres = c.gather_obj(t)
        c.write(
            "gemm.jsonl",
            {
                "op": "d2d_copy",
                "bytes": 2 * nb,
                "time_s": allres[0],
                "GBps": 2 * nb / allres[0] / 1e9,
                "gpu": 0,
                "time_s_by_gpu": allres,
            },
        )
        del x, y
    except Exception as e:  # noqa: BLE001
        log_error(args, "gemm/d2d_copy", e)
    c.close()


# ============================================================================================
# Part: compute / communication interference
# ============================================================================================


def part_interference(args) -> None:
    """GEMM loop on the default stream, collective loop on a side stream, alone and together."""
    c = Ctx(args)
    torch, dist = c.torch, c.dist
    dtype = torch.bfloat16
    n = 256 if args.quick else 8192
    comm_bytes = (64 * 1024) if args.quick else 256 * MIB
    a = torch.randn(n, n, device=c.device, dtype=dtype)
    b = torch.randn(n, n, device=c.device, dtype=dtype)
    out = torch.empty(n, n, device=c.device, dtype=dtype)
    side = c.stream()
    n_gemm = 5 if args.quick else args.interf_gemms

    def gemm():
        torch.matmul(a, b, out=out)

    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        where = f"interference/{op}"
        try:
            elems = comm_bytes // 2
            if op == "all_reduce":
                x = torch.randn(elems, device=c.device, dtype=dtype)

                def comm(x=x):
                    dist.all_reduce(x)
            elif op == "all_gather":
                x = torch.randn(elems // c.world, device=c.device, dtype=dtype)
                y = torch.empty(elems, device=c.device, dtype=dtype)

                def comm(x=x, y=y):
                    dist.all_gather_into_tensor(y, x)
            else:
                x = torch.randn(elems, device=c.device, dtype=dtype)
                y = torch.empty(elems // c.world, device=c.device, dtype=dtype)

                def comm(x=x, y=y):
                    dist.reduce_scatter_tensor(y, x)

            def comm_on_side():
                with c.on_stream(side):
                    comm()

            g_alone = statistics.median(c.timed_loop(gemm, 5, n_gemm))
            dist.barrier()
            with c.on_stream(side):
                c_alone = statistics.median(c.timed_loop(comm, 5, n_gemm, stream=side))
            # make both loops last about as long; every rank must use the same count
            n_comm = int(max(5, round(n_gemm * g_alone / c_alone)))
            n_comm = int(c.allreduce_list([float(n_comm)], "max")[0])
            for _ in range(3):  # warm-up together
                gemm()
                comm_on_side()
            c.sync()
            dist.barrier()
            gm, cm = [c.mark()], [c.mark(side)]
            for i in range(max(n_gemm, n_comm)):
                if i < n_gemm:
                    gemm()
                    gm.append(c.mark())
                if i < n_comm:
                    comm_on_side()
                    cm.append(c.mark(side))
            c.sync()
            g_with = statistics.median([c.elapsed(p, q) for p, q in zip(gm, gm[1:], strict=False)])
            c_with = statistics.median([c.elapsed(p, q) for p, q in zip(cm, cm[1:], strict=False)])
            g_span, c_span = c.elapsed(gm[0], gm[-1]), c.elapsed(cm[0], cm[-1])
            vals = c.allreduce_list([g_alone, g_with, c_alone, c_with, g_span, c_span], "max")
            c.write(
                "interference.jsonl",
                {
                    "op": "interference",
                    "gemm_m": n,
                    "gemm_k": n,
                    "gemm_n": n,
                    "gemm_dtype": "bf16",
                    "comm": op,
                    "comm_bytes": comm_bytes,
                    "group": c.world,
                    "gemm_alone_s": vals[0],
                    "gemm_with_comm_s": vals[1],
                    "comm_alone_s": vals[2],
                    "comm_with_gemm_s": vals[3],
                    "gemm_slowdown": vals[1] / vals[0],
                    "comm_slowdown": vals[3] / vals[2],
                    "n_gemm": n_gemm,
                    "n_comm": n_comm,
                    "gemm_span_s": vals[4],
                    "comm_span_s": vals[5],
                    "timing": "cuda_events" if c.cuda else "host_clock",
                    "note": "slowest rank's median per-iteration time; comm on a side CUDA stream",
                },
            )
            if c.rank == 0:
                print(
                    f"interference {op}: gemm {vals[0] * 1e3:.3f} -> {vals[1] * 1e3:.3f} ms, "
                    f"comm {vals[2] * 1e3:.3f} -> {vals[3] * 1e3:.3f} ms",
                    flush=True,
                )
            del x
        except Exception as e:  # noqa: BLE001
            log_error(args, where, e)
        c.free()
    c.close()


# ============================================================================================
# The Llama-style model (plain PyTorch; tensor-parallel pieces after Megatron-LM)
# ============================================================================================


@dataclass(frozen=True)
class ModelCfg:
    layers: int = 8
    hidden: int = 4096
    ffn: int = 14336
    heads: int = 32
    kv_heads: int = 8
    vocab: int = 32000
    seq: int = 4096
    rope_theta: float = 500000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


QUICK_MODEL = ModelCfg(layers=2, hidden=64, ffn=128, heads=8, kv_heads=4, vocab=256, seq=32)


SDPA_BACKENDS = ("default", "flash", "cudnn", "efficient")


def sdpa_call(backend: str, repeat_kv: bool = False):
    """A causal GQA attention call through ``scaled_dot_product_attention``.

    ``backend`` "default" leaves the kernel to PyTorch's dispatcher; "flash", "cudnn",
    "efficient" force one kernel with ``torch.nn.attention.sdpa_kernel``. K/V carry fewer heads
    than Q: passed as they are with ``enable_gqa=True``, or repeated to Q's head count first
    (``repeat_kv``). The function's ``impl`` names the variant; ``resolved`` is filled on the first
    call with the kernel PyTorch's dispatcher picks for that shape (``torch._fused_sdp_choice``).
    """
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    forced = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }.get(backend)

    def fn(q, k, v):
        gqa = True
        if repeat_kv and k.shape[1] != q.shape[1]:
            r = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
            gqa = False
        if fn.resolved is None:
            try:
                if forced is not None:
                    fn.resolved = forced.name
                else:
                    choice = torch._fused_sdp_choice(
                        q, k, v, None, 0.0, True, scale=None, enable_gqa=gqa
                    )
                    fn.resolved = SDPBackend(choice).name
            except Exception as e:  # noqa: BLE001 - private API, informative only
                fn.resolved = f"unknown ({type(e).__name__})"
        ctx = sdpa_kernel([forced]) if forced is not None else contextlib.nullcontext()
        with ctx:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

    fn.impl = backend + ("_repeat_kv" if repeat_kv else "_gqa")
    fn.resolved = None
    return fn


def make_sdpa(device, dtype):
    """The attention call of the training steps: the first variant that runs forward+backward.

    Order tried: PyTorch's default dispatch with ``enable_gqa``; the flash kernel with
    ``enable_gqa``; flash after repeating K/V heads; default dispatch after repeating.
    """
    import torch

    for backend, rep in (("default", False), ("flash", False), ("flash", True), ("default", True)):
        fn = sdpa_call(backend, rep)
        try:
            q = torch.randn(1, 4, 128, 64, device=device, dtype=dtype, requires_grad=True)
            k = torch.randn(1, 2, 128, 64, device=device, dtype=dtype, requires_grad=True)
            v = torch.randn(1, 2, 128, 64, device=device, dtype=dtype, requires_grad=True)
            fn(q, k, v).sum().backward()
            fn.resolved = None  # resolve again at the real shape
            return fn
        except Exception:  # noqa: BLE001 - try the next one
            continue
    raise RuntimeError("no scaled_dot_product_attention variant ran")


def build_model_classes():
    """Define the model classes (torch is imported lazily so the driver stays light)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn

    class CopyToTP(torch.autograd.Function):
        """Megatron's f: identity forward, all-reduce of the input gradient in backward."""

        @staticmethod
        def forward(ctx, x, group):
            ctx.group = group
            return x

        @staticmethod
        def backward(ctx, g):
            g = g.contiguous()
            dist.all_reduce(g, group=ctx.group)
            return g, None

    class ReduceFromTP(torch.autograd.Function):
        """Megatron's g: all-reduce (sum) in forward, identity in backward."""

        @staticmethod
        def forward(ctx, x, group):
            dist.all_reduce(x, group=group)
            ctx.mark_dirty(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g, None

    class VocabParallelCE(torch.autograd.Function):
        """Cross-entropy over logits split by vocabulary (Megatron's _VocabParallelCrossEntropy):
        all-reduce of the row max, of the target logit and of the sum of exponentials."""

        @staticmethod
        def forward(ctx, logits, target, start, group):
            logits = logits.float()
            vmax = logits.max(dim=-1).values
            dist.all_reduce(vmax, op=dist.ReduceOp.MAX, group=group)
            logits = logits - vmax.unsqueeze(-1)
            local = target - start
            mask = (local < 0) | (local >= logits.shape[-1])
            local = local.masked_fill(mask, 0)
            picked = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(mask, 0.0)
            dist.all_reduce(picked, group=group)
            exp = logits.exp_()
            sum_exp = exp.sum(dim=-1)
            dist.all_reduce(sum_exp, group=group)
            loss = sum_exp.log() - picked
            exp.div_(sum_exp.unsqueeze(-1))  # softmax, kept for backward
            ctx.save_for_backward(exp, local, mask)
            return loss

        @staticmethod
        def backward(ctx, gloss):
            soft, local, mask = ctx.saved_tensors
            grad = soft
            grad.scatter_add_(-1, local.unsqueeze(-1), -(~mask).to(grad.dtype).unsqueeze(-1))
            grad.mul_(gloss.unsqueeze(-1))
            return grad, None, None, None

    class RMSNorm(nn.Module):
        def __init__(self, dim: int, eps: float = 1e-5):
            super().__init__()
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(dim))

        def forward(self, x):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return y * self.weight

    def rope_tables(seq: int, d: int, theta: float, device):
        inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
        f = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
        e = torch.cat([f, f], dim=-1)
        return e.cos(), e.sin()

    def apply_rope(x, cos, sin):
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    class Attention(nn.Module):
        def __init__(self, cfg: ModelCfg, tp: int, sdpa):
            super().__init__()
            self.hq, self.hkv, self.d = cfg.heads // tp, cfg.kv_heads // tp, cfg.head_dim
            self.qkv = nn.Linear(cfg.hidden, (self.hq + 2 * self.hkv) * self.d, bias=False)
            self.o = nn.Linear(self.hq * self.d, cfg.hidden, bias=False)
            self.sdpa = sdpa

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).split(
                [self.hq * self.d, self.hkv * self.d, self.hkv * self.d], -1
            )
            q = q.view(b, s, self.hq, self.d).transpose(1, 2)
            k = k.view(b, s, self.hkv, self.d).transpose(1, 2)
            v = v.view(b, s, self.hkv, self.d).transpose(1, 2)
            cos, sin = cos.to(q.dtype), sin.to(q.dtype)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            o = self.sdpa(q, k, v)
            return self.o(o.transpose(1, 2).reshape(b, s, self.hq * self.d))

    class MLP(nn.Module):
        def __init__(self, cfg: ModelCfg, tp: int):
            super().__init__()
            f = cfg.ffn // tp
            self.gate_up = nn.Linear(cfg.hidden, 2 * f, bias=False)  # [gate; up]
            self.down = nn.Linear(f, cfg.hidden, bias=False)

        def forward(self, x):
            g, u = self.gate_up(x).chunk(2, dim=-1)
            return self.down(F.silu(g) * u)

    class DecoderLayer(nn.Module):
        """Pre-norm block. With tp > 1: f before the column-parallel qkv / gate_up, g after the
        row-parallel o / down (Megatron-LM, Shoeybi et al. 2019, Fig. 3)."""

        def __init__(self, cfg: ModelCfg, tp: int, group, sdpa, cdtype):
            super().__init__()
            self.tp, self.group, self.cdtype = tp, group, cdtype
            self.attn_norm, self.mlp_norm = RMSNorm(cfg.hidden), RMSNorm(cfg.hidden)
            self.attn, self.mlp = Attention(cfg, tp, sdpa), MLP(cfg, tp)

        def forward(self, x, cos, sin):
            a = self.attn_norm(x).to(self.cdtype)
            if self.tp > 1:
                a = CopyToTP.apply(a, self.group)
            a = self.attn(a, cos, sin)
            if self.tp > 1:
                a = ReduceFromTP.apply(a, self.group)
            x = x + a
            m = self.mlp_norm(x).to(self.cdtype)
            if self.tp > 1:
                m = CopyToTP.apply(m, self.group)
            m = self.mlp(m)
            if self.tp > 1:
                m = ReduceFromTP.apply(m, self.group)
            return x + m

    class VocabParallelEmbedding(nn.Module):
        def __init__(self, cfg: ModelCfg, tp: int, rank: int, group):
            super().__init__()
            self.per = cfg.vocab // tp
            self.start, self.group = rank * self.per, group
            self.weight = nn.Parameter(torch.empty(self.per, cfg.hidden))

        def forward(self, ids):
            local = ids - self.start
            mask = (local < 0) | (local >= self.per)
            out = F.embedding(local.masked_fill(mask, 0), self.weight)
            out = out.masked_fill(mask.unsqueeze(-1), 0.0)
            return ReduceFromTP.apply(out, self.group)

    class Llama(nn.Module):
        """Embedding, ``layers`` decoder blocks, final RMSNorm, untied LM head, cross-entropy.
        ``forward(tokens, labels)`` returns the mean loss over tokens."""

        def __init__(self, cfg: ModelCfg, sdpa, cdtype, tp: int = 1, rank: int = 0, group=None):
            super().__init__()
            self.cfg, self.tp, self.rank, self.group, self.cdtype = cfg, tp, rank, group, cdtype
            if tp == 1:
                self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
                self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
            else:
                self.embed = VocabParallelEmbedding(cfg, tp, rank, group)
                self.head = nn.Linear(cfg.hidden, cfg.vocab // tp, bias=False)
            self.layers = nn.ModuleList(
                DecoderLayer(cfg, tp, group, sdpa, cdtype) for _ in range(cfg.layers)
            )
            self.norm = RMSNorm(cfg.hidden)
            cos, sin = rope_tables(cfg.seq, cfg.head_dim, cfg.rope_theta, self.norm.weight.device)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)
            for p in self.parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, tokens, labels):
            x = self.embed(tokens)
            s = tokens.shape[1]
            cos, sin = self.cos[:s], self.sin[:s]
            for layer in self.layers:
                x = layer(x, cos, sin)
            h = self.norm(x).to(self.cdtype)
            if self.tp > 1:
                h = CopyToTP.apply(h, self.group)
            logits = self.head(h)
            if self.tp > 1:
                loss = VocabParallelCE.apply(
                    logits.flatten(0, 1), labels.flatten(), self.embed.start, self.group
                )
                return loss.mean()
            return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

    return Llama, DecoderLayer


def shard_full_into_tp(full, tpm, cfg: ModelCfg, tp: int, r: int) -> None:
    """Copy a full (tp = 1) model's weights into rank ``r``'s tensor-parallel model."""
    import torch

    d, hq, hkv = cfg.head_dim, cfg.heads // tp, cfg.kv_heads // tp
    f = cfg.ffn // tp
    H, KV, F_ = cfg.heads * d, cfg.kv_heads * d, cfg.ffn
    per_v = cfg.vocab // tp
    with torch.no_grad():
        tpm.embed.weight.copy_(full.embed.weight[r * per_v : (r + 1) * per_v])
        tpm.head.weight.copy_(full.head.weight[r * per_v : (r + 1) * per_v])
        tpm.norm.weight.copy_(full.norm.weight)
        for lf, lt in zip(full.layers, tpm.layers, strict=True):
            w = lf.attn.qkv.weight
            q = w[r * hq * d : (r + 1) * hq * d]
            k = w[H + r * hkv * d : H + (r + 1) * hkv * d]
            v = w[H + KV + r * hkv * d : H + KV + (r + 1) * hkv * d]
            lt.attn.qkv.weight.copy_(torch.cat([q, k, v]))
            lt.attn.o.weight.copy_(lf.attn.o.weight[:, r * hq * d : (r + 1) * hq * d])
            gu = lf.mlp.gate_up.weight
            lt.mlp.gate_up.weight.copy_(
                torch.cat([gu[r * f : (r + 1) * f], gu[F_ + r * f : F_ + (r + 1) * f]])
            )
            lt.mlp.down.weight.copy_(lf.mlp.down.weight[:, r * f : (r + 1) * f])
            lt.attn_norm.weight.copy_(lf.attn_norm.weight)
            lt.mlp_norm.weight.copy_(lf.mlp_norm.weight)


def tp_check(c: Ctx) -> dict:
    """Tiny fp32 check that the TP model computes the full model's loss and gradients."""
    torch = c.torch
    import torch.nn.functional as F

    def sdpa(q, k, v):  # default dispatch (the flash kernel has no fp32), K/V heads repeated
        r = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    Llama, _ = build_model_classes()
    tp = c.world
    cfg = ModelCfg(layers=2, hidden=64, ffn=128, heads=8, kv_heads=4, vocab=64 * tp, seq=32)
    torch.manual_seed(0)
    with torch.device(c.device):
        full = Llama(cfg, sdpa, torch.float32)
        tpm = Llama(cfg, sdpa, torch.float32, tp=tp, rank=c.rank, group=None)
    shard_full_into_tp(full, tpm, cfg, tp, c.rank)
    g = torch.Generator().manual_seed(1)
    tok = torch.randint(0, cfg.vocab, (2, cfg.seq), generator=g).to(c.device)
    lab = torch.randint(0, cfg.vocab, (2, cfg.seq), generator=g).to(c.device)
    lf, lt = full(tok, lab), tpm(tok, lab)
    lf.backward()
    lt.backward()
    d = cfg.head_dim
    r, hq = c.rank, cfg.heads // tp
    g_full = full.layers[0].attn.qkv.weight.grad[r * hq * d : (r + 1) * hq * d]
    g_tp = tpm.layers[0].attn.qkv.weight.grad[: hq * d]
    res = {
        "loss_full": lf.item(),
        "loss_tp": lt.item(),
        "loss_rel_err": abs(lf.item() - lt.item()) / abs(lf.item()),
        "q_grad_rel_err": ((g_full - g_tp).norm() / g_full.norm()).item(),
        "norm_grad_rel_err": (
            (full.layers[1].mlp_norm.weight.grad - tpm.layers[1].mlp_norm.weight.grad).norm()
            / full.layers[1].mlp_norm.weight.grad.norm()
        ).item(),
        "embed_grad_rel_err": (
            (full.embed.weight.grad[r * 64 : (r + 1) * 64] - tpm.embed.weight.grad).norm()
            / full.embed.weight.grad[r * 64 : (r + 1) * 64].norm()
        ).item(),
    }
    errs = c.allreduce_list(
        [
            res["loss_rel_err"],
            res["q_grad_rel_err"],
            res["norm_grad_rel_err"],
            res["embed_grad_rel_err"],
        ],
        "max",
    )
    res["max_rel_err_all_ranks"] = max(errs)
    res["ok"] = max(errs) < 1e-4
    return res


# ============================================================================================
# Part: training steps
# ============================================================================================


@dataclass(frozen=True)
class Case:
    name: str
    parallel: str  # single | ddp | fsdp (FSDP1) | fsdp2 (fully_shard) | tp
    micro_batch: int = 1
    microbatches: int = 4
    seq: int | None = None  # default: the model's
    tp: int = 0  # parallel "tp": tensor-parallel size (0 = all GPUs); the rest is DDP over dp
    extra: bool = False  # run only when time is left
    about: str = ""


CASES = {
    c.name: c
    for c in [
        Case(
            "a_1gpu",
            "single",
            about="one GPU (each of the 4 GPUs runs its own copy at once; GPU 0 reported)",
        ),
        Case(
            "b_ddp4",
            "ddp",
            about="DDP on 4 GPUs, bucket_cap_mb 25, fp32 grads, no_sync for the first 3 micro-batches",
        ),
        Case(
            "c_fsdp4",
            "fsdp",
            about="FSDP FULL_SHARD on 4 GPUs, one unit per decoder layer, bf16 params / fp32 reduce",
        ),
        Case(
            "d_tp4", "tp", about="Megatron-style tensor parallel on 4 GPUs, no sequence parallelism"
        ),
        Case(
            "h_fsdp2_4",
            "fsdp2",
            extra=True,
            about="ZeRO-3 through FSDP2 (fully_shard per decoder layer + root), bf16 params / fp32 reduce",
        ),
        Case(
            "e_ddp4_mb2_seq2048",
            "ddp",
            micro_batch=2,
            seq=2048,
            extra=True,
            about="DDP, micro_batch 2 of 2048 tokens",
        ),
        Case(
            "f_tp4_mb2",
            "tp",
            micro_batch=2,
            microbatches=2,
            extra=True,
            about="tensor parallel, micro_batch 2, 2 micro-batches",
        ),
        Case(
            "i_tp2_dp2",
            "tp",
            tp=2,
            extra=True,
            about="tensor parallel 2 (GPUs {0,1}, {2,3}) x DDP 2 ({0,2}, {1,3}), 4 micro-batches",
        ),
        Case(
            "g_fsdp4_mb2",
            "fsdp",
            micro_batch=2,
            microbatches=2,
            extra=True,
            about="FSDP, micro_batch 2, 2 micro-batches",
        ),
    ]
}


def model_flops_per_microbatch(cfg: ModelCfg, b: int, s: int) -> float:
    """Model FLOPs (forward + backward = 3x forward) of one micro-batch of the full model.

    Matrix products 2*T*params (qkv, o, gate_up, down, head); causal attention scores and
    weighted sum 2*b*heads*s^2*head_dim forward per layer (half of the 4*b*s^2*h of full
    attention, as the shared calibration counts it). Norms, rotary, softmax, loss: ignored."""
    d = cfg.head_dim
    per_layer = cfg.hidden * (cfg.heads + 2 * cfg.kv_heads) * d + cfg.heads * d * cfg.hidden
    per_layer += 3 * cfg.hidden * cfg.ffn
    tokens = b * s
    fwd = 2 * tokens * (cfg.layers * per_layer + cfg.hidden * cfg.vocab)
    fwd += cfg.layers * 2 * b * cfg.heads * s * s * d
    return 3.0 * fwd


def part_train(args) -> None:
    c = Ctx(args)
    torch, dist = c.torch, c.dist
    case = CASES[args.case]
    cfg = QUICK_MODEL if args.quick else ModelCfg()
    if case.seq and not args.quick:
        cfg = replace(cfg, seq=case.seq)
    cdtype = torch.bfloat16
    sdpa = make_sdpa(c.device, cdtype)
    Llama, DecoderLayer = build_model_classes()
    dev_type = "cuda" if c.cuda else "cpu"
    rec: dict = {
        "op": "train_step",
        "case": case.name,
        "about": case.about,
        "measured_utc": now_utc(),
    }

    check = None
    if case.parallel == "tp":
        try:
            check = tp_check(c)
        except Exception as e:  # noqa: BLE001
            log_error(args, f"train/{case.name}/tp_check", e)
            check = {"ok": False, "error": str(e)[:500]}
        rec["tp_check"] = check
        c.free()

    # ---------------------------------------------------------------- build model + optimizer
    tp = (case.tp or c.world) if case.parallel == "tp" else 1
    dp = {"single": 1, "tp": c.world // tp}.get(case.parallel, c.world)
    dp_rank = c.rank // tp  # TP innermost: ranks 0..tp-1 form the first TP group
    torch.manual_seed(1234 + dp_rank)
    group_size = 1 if case.parallel == "single" else c.world
    use_no_sync = case.parallel == "ddp"
    if case.parallel == "tp":
        tp_group = dp_group = None
        if tp < c.world:  # every rank creates every group, in the same order
            tp_groups = [dist.new_group(list(range(i, i + tp))) for i in range(0, c.world, tp)]
            dp_groups = [dist.new_group(list(range(j, c.world, tp))) for j in range(tp)]
            tp_group, dp_group = tp_groups[c.rank // tp], dp_groups[c.rank % tp]
        with torch.device(c.device):
            model = Llama(cfg, sdpa, cdtype, tp=tp, rank=c.rank % tp, group=tp_group)
        train_model = model
        if dp > 1:
            from torch.nn.parallel import DistributedDataParallel as DDP

            train_model = DDP(
                model,
                device_ids=[c.local] if c.cuda else None,
                bucket_cap_mb=25,
                process_group=dp_group,
            )
            use_no_sync = True
    else:
        with torch.device(c.device):
            model = Llama(cfg, sdpa, cdtype)
        if case.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            train_model = DDP(model, device_ids=[c.local] if c.cuda else None, bucket_cap_mb=25)
        elif case.parallel == "fsdp":
            from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            train_model = FSDP(
                model,
                sharding_strategy=ShardingStrategy.FULL_SHARD,
                mixed_precision=MixedPrecision(
                    param_dtype=torch.bfloat16, reduce_dtype=torch.float32
                ),
                auto_wrap_policy=ModuleWrapPolicy({DecoderLayer}),
                backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                forward_prefetch=False,
                limit_all_gathers=True,
                use_orig_params=False,
                device_id=c.device if c.cuda else None,
            )
        elif case.parallel == "fsdp2":
            try:
                from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            except ImportError:  # older layout
                from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for layer in model.layers:
                fully_shard(layer, mp_policy=mp, reshard_after_forward=True)
            fully_shard(model, mp_policy=mp, reshard_after_forward=True)
            train_model = model
        else:
            train_model = model
    params_local = sum(
        (p.to_local() if hasattr(p, "to_local") else p).numel() for p in train_model.parameters()
    )
    fused = c.cuda
    opt = torch.optim.AdamW(
        train_model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=fused
    )
    params_full = float(params_local)
    if case.parallel in ("tp", "fsdp", "fsdp2"):  # shards: sum over ranks, once per replica
        params_full = c.allreduce_list([params_full], "sum")[0] / (
            dp if case.parallel == "tp" else 1
        )

    # ---------------------------------------------------------------- data (fixed, on device)
    g = torch.Generator().manual_seed(99 + dp_rank)  # TP ranks of one group see the same data
    shape = (case.microbatches, case.micro_batch, cfg.seq)
    tokens = torch.randint(0, cfg.vocab, shape, generator=g).to(c.device)
    labels = torch.randint(0, cfg.vocab, shape, generator=g).to(c.device)

    # ---------------------------------------------------------------- steps
    if c.cuda:
        torch.cuda.reset_peak_memory_stats()
    warmup, timed = (1, 2) if args.quick else (args.train_warmup, args.train_steps)
    steps, fb_s, opt_s, losses = [], [], [], []
    dist.barrier()
    for step in range(warmup + timed):
        c.sync()
        t0 = time.perf_counter()
        e0 = c.mark()
        tot = 0.0
        for i in range(case.microbatches):
            ctx = (
                train_model.no_sync()
                if use_no_sync and i < case.microbatches - 1
                else contextlib.nullcontext()
            )
            with ctx:
                with torch.autocast(dev_type, dtype=cdtype):
                    loss = train_model(tokens[i], labels[i])
                (loss / case.microbatches).backward()
            tot += loss.detach()
        e1 = c.mark()
        opt.step()
        opt.zero_grad(set_to_none=True)
        e2 = c.mark()
        c.sync()
        t1 = time.perf_counter()
        if step >= warmup:
            steps.append(t1 - t0)
            fb_s.append(c.elapsed(e0, e1))
            opt_s.append(c.elapsed(e1, e2))
        losses.append(float(tot) / case.microbatches)
        if c.rank == 0:
            print(f"{case.name} step {step}: {t1 - t0:.4f} s loss {losses[-1]:.4f}", flush=True)

    peak = torch.cuda.max_memory_allocated() / GIB if c.cuda else 0.0
    reserved = torch.cuda.max_memory_reserved() / GIB if c.cuda else 0.0
    per_rank = c.gather_obj(
        {
            "steps": steps,
            "fb": fb_s,
            "opt": opt_s,
            "peak": peak,
            "reserved": reserved,
            "params": params_local,
        }
    )
    if case.parallel == "single":  # independent copies: report GPU 0's steps
        step_t = per_rank[0]["steps"]
        fb, op_ = per_rank[0]["fb"], per_rank[0]["opt"]
    else:  # lock-step ranks: a step lasts as long as its slowest rank
        step_t = [max(r["steps"][i] for r in per_rank) for i in range(timed)]
        fb = [max(r["fb"][i] for r in per_rank) for i in range(timed)]
        op_ = [max(r["opt"][i] for r in per_rank) for i in range(timed)]
    med = statistics.median(step_t)
    n_gpus = group_size
    tokens_step = dp * case.microbatches * case.micro_batch * cfg.seq
    flops = dp * case.microbatches * model_flops_per_microbatch(cfg, case.micro_batch, cfg.seq)
    par = {
        "single": {"tp": 1, "pp": 1, "dp": 1, "zero": 0},
        "ddp": {"tp": 1, "pp": 1, "dp": c.world, "zero": 0},
        "fsdp": {"tp": 1, "pp": 1, "dp": c.world, "zero": 3},
        "fsdp2": {"tp": 1, "pp": 1, "dp": c.world, "zero": 3},
        "tp": {"tp": tp, "pp": 1, "dp": dp, "zero": 0, "sequence_parallel": False},
    }[case.parallel]
    rec.update(
        {
            "gpus": n_gpus,
            "gpu_name": torch.cuda.get_device_name(c.device) if c.cuda else "cpu",
            "model": {
                **asdict(cfg),
                "head_dim": cfg.head_dim,
                "norm": "rmsnorm",
                "activation": "swiglu",
                "tied_embeddings": False,
                "bias": False,
            },
            "parallelism": {"kind": case.parallel, **par},
            "training": {
                "micro_batch": case.micro_batch,
                "microbatches": case.microbatches,
                "global_batch_seqs": dp * case.microbatches * case.micro_batch,
                "seq_len": cfg.seq,
                "compute_dtype": "bf16 (torch.autocast)",
                "param_dtype": "fp32"
                if case.parallel not in ("fsdp", "fsdp2")
                else "fp32 sharded master, bf16 gathered (FSDP mixed precision)",
                "grad_dtype": "fp32",
                "grad_reduce_dtype": {
                    "single": None,
                    "ddp": "fp32",
                    "fsdp": "fp32",
                    "fsdp2": "fp32",
                    "tp": "fp32" if dp > 1 else None,
                }[case.parallel],
                "tp_comm_dtype": "bf16 (embedding output all-reduce fp32)"
                if case.parallel == "tp"
                else None,
                "optimizer": f"torch.optim.AdamW(fused={fused}, lr=1e-4, betas=(0.9,0.95), weight_decay=0.1)",
                "attention": f"scaled_dot_product_attention(is_causal=True), {sdpa.impl}, "
                f"kernel {sdpa.resolved}",
                "recompute": "none",
                "ddp": {
                    "bucket_cap_mb": 25,
                    "gradient_as_bucket_view": False,
                    "no_sync_microbatches": case.microbatches - 1,
                    "group": "all GPUs" if case.parallel == "ddp" else "GPUs of equal TP rank",
                }
                if use_no_sync
                else None,
                "fsdp": {
                    "sharding": "FULL_SHARD",
                    "wrap": "one unit per decoder layer + root (embedding, final norm, head)",
                    "mixed_precision": "param bf16, reduce fp32, buffers unchanged",
                    "backward_prefetch": "BACKWARD_PRE",
                    "forward_prefetch": False,
                    "limit_all_gathers": True,
                    "use_orig_params": False,
                    "grad_accumulation": "reduce-scatter every micro-batch (no no_sync)",
                }
                if case.parallel == "fsdp"
                else None,
                "fsdp2": {
                    "api": "torch.distributed.fsdp.fully_shard",
                    "units": "each decoder layer, then the root",
                    "reshard_after_forward": True,
                    "mp_policy": "param bf16, reduce fp32",
                    "prefetch": "FSDP2 defaults (implicit, one unit ahead)",
                    "grad_accumulation": "reduce-scatter every micro-batch",
                }
                if case.parallel == "fsdp2"
                else None,
            },
            "params_full": params_full,
            "params_per_rank": [r["params"] for r in per_rank],
            "step_time_s": med,
            "step_time_min_s": min(step_t),
            "step_time_max_s": max(step_t),
            "step_time_spread": (max(step_t) - min(step_t)) / med,
            "step_times_s": step_t,
            "fwd_bwd_s": statistics.median(fb),
            "optimizer_s": statistics.median(op_),
            "step_time_s_by_gpu": [statistics.median(r["steps"]) for r in per_rank],
            "peak_memory_gib": max(r["peak"] for r in per_rank)
            if case.parallel != "single"
            else per_rank[0]["peak"],
            "peak_memory_gib_by_gpu": [r["peak"] for r in per_rank],
            "peak_reserved_gib": max(r["reserved"] for r in per_rank),
            "tokens_per_step": tokens_step,
            "tokens_per_s": tokens_step / med,
            "model_flops_per_step": flops,
            "tflops_per_gpu": flops / med / n_gpus / 1e12,
            "losses": losses,
            "warmup_steps": warmup,
            "timed_steps": timed,
            "timing": "host clock between torch.cuda.synchronize() at step boundaries; fwd_bwd_s / optimizer_s from CUDA events",
        }
    )
    if not math.isfinite(losses[-1]):
        rec["warning"] = "non-finite loss"
    c.write("train.jsonl", rec)
    if c.rank == 0:
        print(
            f"{case.name}: step {med:.4f} s, peak {rec['peak_memory_gib']:.2f} GiB, "
            f"{rec['tokens_per_s']:.0f} tok/s, {rec['tflops_per_gpu']:.1f} TFLOP/s/GPU",
            flush=True,
        )
    del opt, train_model, model
    c.free()
    c.close()


# ============================================================================================
# Driver
# ============================================================================================


def run_child(args, part: str, extra: list[str], limit_s: float, log) -> dict:
    """Run one part as its own process group under a time limit; kill the group if it overruns."""
    me = os.path.abspath(__file__)
    common = (
        ["--out", args.out] + (["--quick"] if args.quick else []) + (["--cpu"] if args.cpu else [])
    )
    if part == "env":
        cmd = [sys.executable, me, "--part", "env"] + common
    else:
        cmd = (
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc_per_node={args.nproc}",
                me,
                "--part",
                part,
            ]
            + extra
            + common
        )
    env = dict(os.environ, PYTHONUNBUFFERED="1", **SAFE_ENV)
    label = part + (f":{extra[1]}" if extra else "")
    log.write(f"\n===== {label} ({now_utc()}) limit {limit_s:.0f} s: {' '.join(cmd)}\n")
    log.flush()
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    timed_out = False
    try:
        rc = p.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        try:
            rc = p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            rc = p.wait()
    wall = time.time() - t0
    rec = {
        "phase": label,
        "rc": rc,
        "wall_s": round(wall, 2),
        "timed_out": timed_out,
        "limit_s": round(limit_s),
    }
    append_jsonl(os.path.join(args.out, "phases.jsonl"), rec)
    print(
        f"[driver] {label:28s} rc={rc} {wall:6.1f} s{' TIMED OUT' if timed_out else ''}", flush=True
    )
    return rec


def summary(args) -> None:
    """Print the key numbers (the device reply shows the end of stdout)."""

    def rows(name):
        p = os.path.join(args.out, name)
        if not os.path.exists(p):
            return []
        return [json.loads(x) for x in open(p) if x.strip()]

    print("\n== training steps ==")
    for r in rows("train.jsonl"):
        print(
            f"{r['case']:22s} gpus {r['gpus']} step {r['step_time_s']:.4f} s "
            f"(min {r['step_time_min_s']:.4f} max {r['step_time_max_s']:.4f}) fwdbwd {r['fwd_bwd_s']:.4f} "
            f"opt {r['optimizer_s']:.4f} peak {r['peak_memory_gib']:.2f} GiB {r['tokens_per_s']:.0f} tok/s "
            f"{r['tflops_per_gpu']:.0f} TF/GPU"
            + (f" tp_check ok={r['tp_check'].get('ok')}" if r.get("tp_check") else "")
        )
    print("== collectives (1 GiB / 256 MiB / 4 KiB) ==")
    for r in rows("collectives.jsonl"):
        if r["bytes"] in (4096, 256 * MIB, GIB):
            print(
                f"{r['op']:15s} g{r['group']} {r['bytes']:>11d} {r['time_s'] * 1e6:10.1f} us busbw {r['busbw_GBps']:.1f}"
            )
    print("== interference ==")
    for r in rows("interference.jsonl"):
        print(f"{r['comm']:15s} gemm x{r['gemm_slowdown']:.3f} comm x{r['comm_slowdown']:.3f}")
    g = rows("gemm.jsonl")
    print(f"== gemm: {len(g)} rows ==")
    for r in g:
        if r.get("op") or (r.get("m") == 8192 and r.get("layout") == "nn"):
            print(json.dumps({k: v for k, v in r.items() if not k.endswith("by_gpu")}))
    errs = [r for r in rows("phases.jsonl") if "error_in" in r or r.get("rc") not in (0, None)]
    print(f"== {len(errs)} errors / failed phases ==")
    for r in errs[:20]:
        print(json.dumps(r)[:300])


def driver(args) -> None:
    os.makedirs(args.out, exist_ok=True)
    t_start = time.time()
    deadline = t_start + args.budget_s
    log = open(os.path.join(args.out, "log.txt"), "a", buffering=1)
    append_jsonl(
        os.path.join(args.out, "phases.jsonl"),
        {
            "driver_start_utc": now_utc(),
            "argv": sys.argv,
            "nproc": args.nproc,
            "budget_s": args.budget_s,
            "safe_env": SAFE_ENV,
        },
    )
    plan: list[tuple[str, list[str], float, float]] = [("env", [], 60, 0)]
    main_cases = [n for n, cs in CASES.items() if not cs.extra]
    extra_cases = [n for n, cs in CASES.items() if cs.extra]
    only = set(args.only.split(",")) if args.only else None
    for n in main_cases:
        plan.append(("train", ["--case", n], args.case_limit_s, 0))
    plan += [
        ("collectives", [], args.coll_limit_s, 0),
        ("gemm", [], 120, 0),
        ("interference", [], 90, 0),
    ]
    for n in extra_cases:
        plan.append(("train", ["--case", n], args.case_limit_s, 75))  # only with >= 75 s left
    for part, extra, limit, need in plan:
        name = extra[1] if extra else part
        if only and part not in only and name not in only:
            continue
        left = deadline - time.time()
        if left < max(need, 20):
            append_jsonl(
                os.path.join(args.out, "phases.jsonl"),
                {"phase": name, "skipped": "budget", "left_s": left},
            )
            print(f"[driver] skip {name}: {left:.0f} s left", flush=True)
            continue
        run_child(args, part, extra, min(limit, left), log)
    print(f"[driver] total {time.time() - t_start:.1f} s", flush=True)
    log.close()
    summary(args)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out", default=os.environ.get("OUT", "out"), help="folder for the JSONL files"
    )
    ap.add_argument(
        "--part",
        choices=["env", "collectives", "gemm", "interference", "train"],
        help="run one part in this process (the driver sets this); default: the driver",
    )
    ap.add_argument(
        "--case", default="a_1gpu", choices=sorted(CASES), help="training case (--part train)"
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes for a CPU smoke test")
    ap.add_argument("--cpu", action="store_true", help="force CPU + gloo even where CUDA exists")
    ap.add_argument("--nproc", type=int, default=4, help="processes (GPUs) per part")
    ap.add_argument(
        "--budget-s", type=float, default=480, help="driver: stop starting parts after this"
    )
    ap.add_argument("--only", default="", help="driver: comma-separated parts or case names to run")
    ap.add_argument(
        "--case-limit-s", type=float, default=100, help="driver: time limit of one training case"
    )
    ap.add_argument(
        "--coll-limit-s", type=float, default=150, help="driver: time limit of the collectives part"
    )
    ap.add_argument(
        "--pg-timeout-s", type=float, default=120, help="process-group (NCCL watchdog) timeout"
    )
    ap.add_argument("--coll-warmup", type=int, default=5)
    ap.add_argument(
        "--coll-iters-small", type=int, default=50, help="timed iterations up to 64 MiB"
    )
    ap.add_argument(
        "--coll-iters-large", type=int, default=20, help="timed iterations above 64 MiB"
    )
    ap.add_argument("--gemm-warmup", type=int, default=5)
    ap.add_argument("--gemm-iters", type=int, default=30)
    ap.add_argument("--interf-gemms", type=int, default=40, help="GEMMs in the interference loop")
    ap.add_argument("--train-warmup", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=8)
    args = ap.parse_args(argv)
    args.out = os.path.abspath(args.out)
    os.makedirs(args.out, exist_ok=True)
    if args.quick:
        args.coll_warmup, args.gemm_warmup, args.gemm_iters = 2, 2, 5
    parts = {
        "env": part_env,
        "collectives": part_collectives,
        "gemm": part_gemm,
        "interference": part_interference,
        "train": part_train,
    }
    if args.part is None:
        driver(args)
    else:
        try:
            parts[args.part](args)
        except Exception as e:
            log_error(args, f"{args.part}" + (f"/{args.case}" if args.part == "train" else ""), e)
            raise


if __name__ == "__main__":
    main()
