"""Where the host time of ``steps_alt.py``'s eager expert backward goes with 4 processes
(issue 12, helper emoe5).

One MoE case of ``steps_alt.py`` built and stepped by the script's own ``build_moe`` and step
function, its ``MoE.forward`` replaced by a copy of the same operations with marks
(``moe_phases.py``'s ``Clock`` / ``Tap``: host clock and a CUDA event; ``Tap`` marks the
backward when autograd reaches it), plus one mark per local expert in the backward
(``b_y{j}``: the gradient reaches expert j's output, after the split's backward cat;
``b_x{j}``: expert j's backward issued, before its input cat's backward and the slices').

Variants (``--a2a``):

- ``nccl``: as the script runs it (the count exchange, its host read, the rows dispatched and
  combined by ``torch.distributed.nn.functional.all_to_all_single``).
- ``local``: no collective in the MoE layer: the counts read on the host without an exchange
  (``got`` = this rank's own counts as [destination][local expert], so every local expert runs
  the rows this rank routed to the experts of that index on every rank: the same mean rows),
  the row exchanges replaced by an autograd function that copies the rows into a new buffer
  (forward and backward alike, as the exchange's output is a new buffer). The step's final
  all-reduce of the replicated gradients stays.
- ``--emulate-ep N`` with one process: ``local`` with N-way expert sharding in one process
  (the layer of one rank of an EP N run, no other process on the box).

Per launch: ``--warmup`` untimed steps, ``--steps`` timed (synchronise, barrier, step,
synchronise), each thread's CPU time and context switches over the timed steps
(``/proc/self/task/*/stat`` and ``status``, with the thread's name), the process's CPU
affinity; then ``--prof`` steps under ``torch.profiler`` (CPU and CUDA), summarised per window
(``bwd_experts``: b_experts -> b_dispatch on the autograd thread; ``bwd_combine``: b_combine ->
b_experts, the combine's backward exchange; ``bwd_dispatch``: b_dispatch -> b_dispatched;
``fwd_experts``: the forward's expert loop on the main thread) as every event that starts inside
the window on the window's thread, by name: count and total duration (us). Writes
``OUT/bwdhost-TAG-rR.json``.

Usage: ``torchrun --standalone --nproc_per_node=4 benchmarks/device/moe_bwd_host.py --case
h14_moe_ep4_AF --a2a nccl --tag nccl4 --out DIR``; one process: ``python
benchmarks/device/moe_bwd_host.py --case h14_moe_ep4_AF --a2a local --emulate-ep 4 --tag local1
--out DIR``. ``--quick``: CPU, gloo, tiny shapes (a dry run).

``--prewarm`` (helper emoe6): before the warm-up steps, ``gemm_drain.prewarm`` runs the
expert MLP's six GEMMs at a grid of row counts (1..512, every 8th to 4096, every 64th to
32768) with the GPU left idle now and then: the kernels cuBLAS picks there are loaded before
the first step; its host seconds are written as ``prewarm``.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name: str):
    path = os.path.join(HERE, f"{name}.py")
    if not os.path.exists(path):
        path = os.path.join(os.getcwd(), "benchmarks", "device", f"{name}.py")
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


PH = _load("moe_phases")
GD = _load("gemm_drain")
CLOCK = PH.CLOCK
WINDOWS = {"b_experts": ("bwd_experts", "b_dispatch"), "b_combine": ("bwd_combine", "b_experts"),
           "b_dispatch": ("bwd_dispatch", "b_dispatched")}
PROF = {"on": False, "open": {}}


def _rf_enter(name):
    return torch.ops.profiler._record_function_enter_new(name, None)


def _rf_exit(h):
    torch.ops.profiler._record_function_exit._RecordFunction(h)


class RTap(torch.autograd.Function):
    """``moe_phases.Tap`` that also opens / closes a profiler range in the backward."""

    @staticmethod
    def forward(ctx, x, call, phase):
        ctx.call, ctx.phase = call, phase
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        CLOCK.mark(ctx.call, ctx.phase)
        if PROF["on"]:
            for name, (_, end) in WINDOWS.items():
                if end == ctx.phase and name in PROF["open"]:
                    _rf_exit(PROF["open"].pop(name))
            if ctx.phase in WINDOWS:
                PROF["open"][ctx.phase] = _rf_enter(WINDOWS[ctx.phase][0])
        return g, None, None


class LocalA2A(torch.autograd.Function):
    """The exchange's shape without the exchange: a new buffer, the rows copied into it."""

    @staticmethod
    def forward(ctx, out, x):
        ctx.n = x.shape[0]
        k = min(out.shape[0], x.shape[0])
        out[:k].copy_(x[:k])
        return out

    @staticmethod
    def backward(ctx, g):
        gi = g.new_empty(ctx.n, g.shape[1])
        k = min(ctx.n, g.shape[0])
        gi[:k].copy_(g[:k])
        return None, gi


def make_forward(mod, a2a: str):
    dist_nn = mod.dist_nn
    Tap = RTap

    def exchange(out, x, osp, isp, group):
        if a2a == "nccl":
            return dist_nn.all_to_all_single(out, x, osp, isp, group=group)
        return LocalA2A.apply(out, x)

    def forward(self, x):  # steps_alt.py MoE.forward with marks
        C, call = CLOCK, CLOCK.next_call()
        b, s, h = x.shape
        x = Tap.apply(x, call, "b_end")
        C.mark(call, "f_start")
        t = x.reshape(-1, h)
        probs = self.router(t).float().softmax(-1)
        w, e = probs.topk(self.k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        flat = e.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.E)
        cdt = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) \
            else x.dtype
        send = t.to(cdt)[order // self.k]
        send = Tap.apply(send, call, "b_dispatched")
        C.mark(call, "f_counts")
        if self.ep > 1:
            if a2a == "nccl":
                got = torch.empty_like(counts)
                dist.all_to_all_single(got, counts, group=self.group)
            else:
                got = counts
            host = torch.cat([counts, got]).cpu()
            C.mark(call, "f_synced")
            sent, got = host[: self.E].view(self.ep, -1), host[self.E:].view(self.ep, -1)
            in_splits, out_splits = sent.sum(1).tolist(), got.sum(1).tolist()
            recv = exchange(send.new_empty(sum(out_splits), h), send, out_splits, in_splits,
                            self.group)
        else:
            got = counts.cpu().view(1, -1)
            C.mark(call, "f_synced")
            recv = send
        C.mark(call, "f_dispatched")
        recv = Tap.apply(recv, call, "b_dispatch")
        if PROF["on"]:
            rf = _rf_enter("fwd_experts")
        n = got.tolist()
        starts, o = [], 0
        for src in range(len(n)):
            row = []
            for j in range(self.local):
                row.append(o)
                o += n[src][j]
            starts.append(row)
        self.rows.append([sum(n[src][j] for src in range(len(n))) for j in range(self.local)])
        pieces = {}
        for j, expert in enumerate(self.experts):
            xs = [recv[starts[src][j]: starts[src][j] + n[src][j]] for src in range(len(n))]
            xin = Tap.apply(torch.cat(xs), call, f"b_x{j}")
            y = Tap.apply(expert(xin), call, f"b_y{j}")
            for src, part in enumerate(y.split([n[src][j] for src in range(len(n))])):
                pieces[(src, j)] = part
        out = torch.cat([pieces[(src, j)] for src in range(len(n)) for j in range(self.local)])
        if PROF["on"]:
            _rf_exit(rf)
        out = Tap.apply(out, call, "b_experts")
        C.mark(call, "f_experts")
        if self.ep > 1:
            out = exchange(out.new_empty(send.shape[0], h), out, in_splits, out_splits,
                           self.group)
        C.mark(call, "f_combined")
        out = Tap.apply(out, call, "b_combine")
        y = out.new_empty(out.shape).index_copy(0, order, out).view(-1, self.k, h)
        y = (y * w.unsqueeze(-1).to(y.dtype)).sum(1).view(b, s, h)
        C.mark(call, "f_end")
        return Tap.apply(y, call, "b_start")

    return forward


def threads() -> dict:
    """Per thread of this process: name, user + system CPU ticks, context switches."""
    out = {}
    base = "/proc/self/task"
    if not os.path.isdir(base):
        return out
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/stat") as f:
                st = f.read()
            with open(f"{base}/{tid}/status") as f:
                status = f.read()
        except OSError:
            continue
        name = st[st.index("(") + 1: st.rindex(")")]
        fields = st[st.rindex(")") + 2:].split()
        ut, stt, cpu = int(fields[11]), int(fields[12]), int(fields[36])
        vol = nv = 0
        for line in status.splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches"):
                nv = int(line.split()[1])
        out[tid] = {"name": name, "ticks": ut + stt, "vol": vol, "nonvol": nv, "cpu": cpu}
    return out


def thread_delta(a: dict, b: dict) -> list:
    hz = os.sysconf("SC_CLK_TCK")
    rows = []
    for tid, v in b.items():
        u = a.get(tid, {"ticks": 0, "vol": 0, "nonvol": 0})
        rows.append({"tid": int(tid), "name": v["name"], "cpu_s": (v["ticks"] - u["ticks"]) / hz,
                     "vol": v["vol"] - u["vol"], "nonvol": v["nonvol"] - u["nonvol"],
                     "last_cpu": v["cpu"]})
    return sorted(rows, key=lambda r: -r["cpu_s"])


def summarise(prof) -> dict:
    """Per window kind: the windows' durations, and by event name (events that start inside a
    window, on the window's thread, the window's own range excluded) count and total us."""
    evs = [e for e in prof.events() if e.time_range is not None]
    wins = [e for e in evs if e.name in ("bwd_experts", "bwd_combine", "bwd_dispatch",
                                         "fwd_experts")]
    by_thread = collections.defaultdict(list)
    for e in evs:
        by_thread[e.thread].append(e)
    res = {}
    for w in wins:
        r = res.setdefault(w.name, {"windows": [], "ops": {}})
        t0, t1 = w.time_range.start, w.time_range.end
        r["windows"].append(round(t1 - t0, 1))
        for e in by_thread[w.thread]:
            if e is w or e.time_range.start < t0 or e.time_range.start >= t1:
                continue
            d = r["ops"].setdefault(e.name, [0, 0.0])
            d[0] += 1
            d[1] += e.time_range.end - e.time_range.start
    for r in res.values():
        r["total_us"] = round(sum(r["windows"]), 1)
        r["ops"] = {k: [v[0], round(v[1], 1)] for k, v in
                    sorted(r["ops"].items(), key=lambda kv: -kv[1][1])[:60]}
    # the whole profiled steps, by thread: the threads' names are not in the events; count
    # per thread the top names by total duration
    per_thread = {}
    for tid, lst in by_thread.items():
        agg = collections.defaultdict(lambda: [0, 0.0])
        for e in lst:
            agg[e.name][0] += 1
            agg[e.name][1] += e.time_range.end - e.time_range.start
        top = sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]
        per_thread[str(tid)] = {k: [v[0], round(v[1], 1)] for k, v in top}
    res["per_thread"] = per_thread
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", required=True)
    ap.add_argument("--a2a", choices=("nccl", "local"), default="nccl")
    ap.add_argument("--emulate-ep", type=int, default=0)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--prof", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="CPU, gloo, tiny shapes (dry run)")
    ap.add_argument("--prewarm", action="store_true",
                    help="the expert GEMMs at a grid of row counts before the warm-up")
    args = ap.parse_args()
    mod = PH.load("steps_alt")
    mod.MoE.forward = make_forward(mod, args.a2a)
    rank, world, dev = mod.setup(args.quick)
    c = mod.case_config(args.case, args.quick)
    if args.emulate_ep:
        assert world == 1 and args.a2a == "local", "--emulate-ep: one process, --a2a local"
        orig = mod.MoE
        mod.MoE = lambda m, group, ep, r: orig(m, None, args.emulate_ep, 0)
    else:
        assert c["world"] == world, f"{args.case} needs {c['world']} ranks"
    built = mod.build_moe(c, rank, world, dev)
    step, layers = built[1], built[3]
    cuda = dev.type == "cuda"
    CLOCK.cuda = cuda

    def sync():
        if cuda:
            torch.cuda.synchronize()

    pre = {}
    if args.prewarm:
        m = c["model"]
        pre = GD.prewarm([(m["hidden"], m["expert_ffn"])], dev, quick=args.quick)

    steps, th0, th1, cpu0 = [], None, None, None
    for i in range(args.warmup + args.steps):
        timed = i >= args.warmup
        sync()
        if world > 1:
            dist.barrier()
        sync()
        if i == args.warmup:
            th0, cpu0 = threads(), time.process_time()
        CLOCK.on, CLOCK.step, CLOCK.call, CLOCK.recs = timed, i - args.warmup, 0, []
        t0 = time.perf_counter()
        CLOCK.mark(-1, "step_start")
        step()
        CLOCK.mark(-1, "step_end")
        sync()
        wall = time.perf_counter() - t0
        if timed:
            e0 = CLOCK.recs[0]
            marks = [[s, call, ph, round(h - e0[3], 7),
                      round(e0[4].elapsed_time(ev) / 1e3, 7) if cuda else 0.0]
                     for s, call, ph, h, ev in CLOCK.recs]
            steps.append({"step": i - args.warmup, "wall_s": wall, "marks": marks})
        CLOCK.on = False
    th1, cpu1 = threads(), time.process_time()
    prof_sum, prof_walls = {}, []
    if args.prof:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            PROF["on"] = True
            for _ in range(args.prof):
                sync()
                if world > 1:
                    dist.barrier()
                sync()
                t0 = time.perf_counter()
                step()
                sync()
                prof_walls.append(time.perf_counter() - t0)
            PROF["on"] = False
        prof_sum = summarise(prof)
    ntimed = args.warmup + args.steps
    rows = [mo.rows[args.warmup * (len(mo.rows) // (ntimed + args.prof)):
                    ntimed * (len(mo.rows) // (ntimed + args.prof))] for mo in layers]
    rec = {"script": "steps_alt.py", "case": args.case, "tag": args.tag, "a2a": args.a2a,
           "emulate_ep": args.emulate_ep, "prewarm": pre, "rank": rank, "world": world,
           "model": c["model"],
           "steps": steps, "rows": rows, "process_cpu_s": cpu1 - cpu0,
           "threads": thread_delta(th0, th1),
           "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
           "cpu_count": os.cpu_count(), "prof_walls": prof_walls, "prof": prof_sum,
           "env": {"torch": torch.__version__,
                   "gpu": torch.cuda.get_device_name(dev) if cuda else "cpu",
                   **{k: v for k, v in os.environ.items()
                      if k.startswith(("NCCL_", "TORCH_NCCL", "CUDA_", "OMP_"))}}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"bwdhost-{args.tag}-r{rank}.json"), "w") as f:
        json.dump(rec, f)
    if rank == 0:
        print(f"RESULT {args.tag}: steps {[round(s['wall_s'], 4) for s in steps]} "
              f"prof {[round(w, 4) for w in prof_walls]}", flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
