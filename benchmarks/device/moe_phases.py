"""Per-phase timeline of the eager MoE layer calls inside real training steps (diagnosis for
issue 10): where an EP step of ``steps_alt.py`` / ``steps_third.py`` spends its time, on the
host and on the GPU, call by call and rank by rank.

Runs one case of either measuring script exactly as that script builds and steps it (its
``build_moe``, data, optimizer and step function), with its ``MoE.forward`` replaced by a copy
of the same operations with marks between the phases. A mark records the host clock
(``time.perf_counter``) and a CUDA event on the current stream; an identity autograd function
(``Tap``) records the same in the backward when autograd reaches it. Phases of a call:

forward: ``f_start`` (layer input) -> ``f_counts`` (router, top-k, argsort, bincount, the
gathered copies: the count all-to-all is next) -> ``f_synced`` (after the counts' host read
returns) -> ``f_dispatched`` (dispatch all-to-all issued) -> ``f_experts`` (every local expert
issued) -> ``f_combined`` (combine all-to-all issued) -> ``f_end`` (weights applied, summed);
backward: ``b_start`` (gradient reaches the layer output) -> ``b_combine`` (combine's backward
all-to-all next) -> ``b_experts`` (the experts' backward next) -> ``b_dispatch`` (every
expert's and slice's backward issued: the dispatch's backward all-to-all next) -> ``b_end``
(the gathered copies' and router's backward issued, gradient leaves the layer).

GPU time between two marks is the stream's progress (``Event.elapsed_time``); host time the
host clock's. Steps: ``--warmup`` untimed, then ``--steps`` timed (synchronise, barrier,
step, synchronise, as the scripts time them). ``--tiny``: hidden 16 x heads, expert and
dense FFN 2 x hidden, 128-token sequences (the GPU idles: the host's own time per step).

Output ``OUT/phases-CASE[-tiny]-rR.json``: per timed step its host wall time and its marks
``[step, call, phase, host_s, gpu_s]`` (seconds from the step's start mark), and the rows per
local expert of every call.

Usage: ``torchrun --standalone --nproc_per_node=4 benchmarks/device/moe_phases.py --script alt
--case h11_moe_ep4_M --out DIR``. The marks cost the host about 5 us each (event record) and
a ``Tap`` about 20 us (an autograd function): about 25 marks and 5 taps a call.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))


def load(name: str):
    """The measuring script ``name`` beside this file, else under ``benchmarks/device`` of the
    working directory (a copy of this file run from elsewhere)."""
    path = os.path.join(HERE, f"{name}.py")
    if not os.path.exists(path):
        path = os.path.join(os.getcwd(), "benchmarks", "device", f"{name}.py")
    sys.path.insert(0, os.path.dirname(path))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class Clock:
    def __init__(self, cuda: bool):
        self.cuda, self.on, self.recs, self.step, self.call = cuda, False, [], 0, 0

    def mark(self, call: int, phase: str) -> None:
        if not self.on:
            return
        ev = None
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
        self.recs.append((self.step, call, phase, time.perf_counter(), ev))

    def next_call(self) -> int:
        self.call += 1
        return self.call - 1


CLOCK = Clock(torch.cuda.is_available())


class Tap(torch.autograd.Function):
    """Identity; marks ``phase`` when autograd's backward reaches it."""

    @staticmethod
    def forward(ctx, x, call, phase):
        ctx.call, ctx.phase = call, phase
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        CLOCK.mark(ctx.call, ctx.phase)
        return g, None, None


def alt_forward(mod):
    dist_nn = mod.dist_nn

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
            got = torch.empty_like(counts)
            dist.all_to_all_single(got, counts, group=self.group)
            host = torch.cat([counts, got]).cpu()
            C.mark(call, "f_synced")
            sent, got = host[: self.E].view(self.ep, -1), host[self.E:].view(self.ep, -1)
            in_splits, out_splits = sent.sum(1).tolist(), got.sum(1).tolist()
            recv = dist_nn.all_to_all_single(send.new_empty(sum(out_splits), h), send,
                                             out_splits, in_splits, group=self.group)
        else:
            got = counts.cpu().view(1, -1)
            C.mark(call, "f_synced")
            recv = send
        C.mark(call, "f_dispatched")
        recv = Tap.apply(recv, call, "b_dispatch")
        self.load.append(float(got.sum()) / max(1, flat.numel()))
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
            y = expert(torch.cat(xs))
            for src, part in enumerate(y.split([n[src][j] for src in range(len(n))])):
                pieces[(src, j)] = part
        out = torch.cat([pieces[(src, j)] for src in range(len(n)) for j in range(self.local)])
        out = Tap.apply(out, call, "b_experts")
        C.mark(call, "f_experts")
        if self.ep > 1:
            out = dist_nn.all_to_all_single(out.new_empty(send.shape[0], h), out, in_splits,
                                            out_splits, group=self.group)
        C.mark(call, "f_combined")
        out = Tap.apply(out, call, "b_combine")
        y = out.new_empty(out.shape).index_copy(0, order, out).view(-1, self.k, h)
        y = (y * w.unsqueeze(-1).to(y.dtype)).sum(1).view(b, s, h)
        C.mark(call, "f_end")
        return Tap.apply(y, call, "b_start")

    return forward


def third_forward(mod):
    _AllToAll = mod._AllToAll

    def forward(self, x):  # steps_third.py MoE.forward with marks
        C, call = CLOCK, CLOCK.next_call()
        shape = x.shape
        x = Tap.apply(x, call, "b_end")
        C.mark(call, "f_start")
        x = x.reshape(-1, shape[-1])
        logits = self.router(x).float()
        top, idx = logits.topk(self.k, dim=-1)
        weights = top.softmax(dim=-1).type_as(x)
        flat = idx.reshape(-1)
        order = flat.argsort(stable=True)
        sent = x[order // self.k]
        counts = torch.bincount(flat, minlength=self.E)
        sent = Tap.apply(sent, call, "b_dispatched")
        C.mark(call, "f_counts")
        if self.world > 1:
            got = torch.empty_like(counts)
            dist.all_to_all_single(got, counts)
            send = counts.view(self.world, self.local).sum(1).tolist()
            got_l = got.tolist()
            C.mark(call, "f_synced")
            recv = [sum(got_l[s * self.local:(s + 1) * self.local]) for s in range(self.world)]
            rows = _AllToAll.apply(sent, recv, send)
            C.mark(call, "f_dispatched")
            local_ids = torch.arange(self.local, device=x.device).repeat(self.world)
            local_ids = local_ids.repeat_interleave(got)
            C.mark(call, "f_regrouped")
            by_exp = local_ids.argsort(stable=True)
            rows = rows[by_exp]
            runs = got.view(self.world, self.local).sum(0).tolist()
        else:
            rows, runs, by_exp = sent, counts.tolist(), None
            C.mark(call, "f_synced")
            C.mark(call, "f_dispatched")
        rows = Tap.apply(rows, call, "b_dispatch")
        self.rows.append(list(runs))
        outs, start = [], 0
        for e, n in enumerate(runs):
            outs.append(self.experts[e](rows[start:start + n]))
            start += n
        y = torch.cat(outs, dim=0)
        y = Tap.apply(y, call, "b_experts")
        C.mark(call, "f_experts")
        if self.world > 1:
            undo = torch.empty_like(by_exp)
            undo[by_exp] = torch.arange(by_exp.numel(), device=x.device)
            y = _AllToAll.apply(y[undo], send, recv)
        C.mark(call, "f_combined")
        y = Tap.apply(y, call, "b_combine")
        back = torch.empty_like(y)
        back[order] = y
        y = (back.view(-1, self.k, shape[-1]) * weights.unsqueeze(-1)).sum(1)
        C.mark(call, "f_end")
        return Tap.apply(y.view(shape), call, "b_start")

    return forward


def steps_forward(mod):
    """``steps.py``'s ``MoE.forward`` (forced routes, ``.tolist()`` of the exchanged counts,
    one ``torch.arange`` per (source, local expert) piece, out-of-place ``index_add``) with
    marks: ``f_routed`` after the router, softmax, gate weights, argsort and the gathered
    copies; ``f_counts`` after ``bincount`` (which reads the ids' range on the host);
    ``f_synced`` after the counts' host read (EP > 1: their all-to-all first);
    ``f_dispatched``, ``f_regrouped`` (the aranges, their cat and the index gather),
    ``f_experts``, ``f_combined`` (inverse permutation, index, combine), ``f_end``. Backward:
    ``b_start`` -> ``b_combine`` -> ``b_experts`` (the experts' backward next) -> ``b_regroup``
    (every expert's backward issued) -> ``b_dispatch`` -> ``b_dispatched`` -> ``b_end``."""
    _AllToAll, CHECK = mod._AllToAll, mod.CHECK

    def forward(self, x):
        C, call = CLOCK, CLOCK.next_call()
        b, s, h = x.shape
        x = Tap.apply(x, call, "b_end")
        C.mark(call, "f_start")
        xt = x.reshape(b * s, h).to(torch.float32 if CHECK["on"] else torch.bfloat16)
        probs = torch.softmax(self.router(xt).float(), dim=-1)
        topi = self.forced if self.forced is not None else probs.topk(self.k, dim=-1).indices
        topv = probs.gather(1, topi)
        topv = topv / topv.sum(-1, keepdim=True)
        flat = topi.reshape(-1)
        order = torch.argsort(flat, stable=True)
        tok = order // self.k
        xs = xt[tok]
        xs = Tap.apply(xs, call, "b_dispatched")
        C.mark(call, "f_routed")
        counts = torch.bincount(flat, minlength=self.E)
        C.mark(call, "f_counts")
        if self.ep > 1:
            recv_counts = torch.empty_like(counts)
            dist.all_to_all_single(recv_counts, counts, group=self.group)
            c_send = counts.view(self.ep, self.L).sum(1).tolist()
            rc = recv_counts.view(self.ep, self.L).tolist()
            C.mark(call, "f_synced")
            c_recv = [sum(r) for r in rc]
            xr = _AllToAll.apply(xs, c_recv, c_send, self.group)
            C.mark(call, "f_dispatched")
            xr = Tap.apply(xr, call, "b_dispatch")
            offs, o = [], 0
            for r in rc:
                offs.append(o)
                o += sum(r)
            pieces, per_expert = [], []
            for e in range(self.L):
                n = 0
                for j in range(self.ep):
                    st = offs[j] + sum(rc[j][:e])
                    pieces.append(torch.arange(st, st + rc[j][e], device=x.device))
                    n += rc[j][e]
                per_expert.append(n)
            perm = torch.cat(pieces)
            xr = xr[perm]
        else:
            per_expert = counts.tolist()
            C.mark(call, "f_synced")
            C.mark(call, "f_dispatched")
            xr = Tap.apply(xs, call, "b_dispatch")
        xr = Tap.apply(xr, call, "b_regroup")
        C.mark(call, "f_regrouped")
        self.loads.append(sum(per_expert))
        self.rows.append(list(per_expert))
        outs, st = [], 0
        for e, n in enumerate(per_expert):
            outs.append(self.experts[e](xr[st:st + n]))
            st += n
        yr = torch.cat(outs)
        yr = Tap.apply(yr, call, "b_experts")
        C.mark(call, "f_experts")
        if self.ep > 1:
            inv = torch.empty_like(perm)
            inv[perm] = torch.arange(perm.numel(), device=x.device)
            yr = _AllToAll.apply(yr[inv], c_send, c_recv, self.group)
        yr = Tap.apply(yr, call, "b_combine")
        C.mark(call, "f_combined")
        w = topv.reshape(-1)[order].to(yr.dtype)
        out = torch.zeros(b * s, h, device=x.device, dtype=yr.dtype)
        out = out.index_add(0, tok, yr * w[:, None])
        out = out.view(b, s, h).type_as(x)
        C.mark(call, "f_end")
        return Tap.apply(out, call, "b_start")

    return forward


def run_kind(args, c, mod, step, layers, rank, world, dev, cuda, kind):
    """Warm-up and timed steps of one routing; writes OUT/phases-CASE[-kind][-tiny]-rR.json."""
    def sync():
        if cuda:
            torch.cuda.synchronize()

    for mo in layers:
        mo.rows = []
    steps = []
    for i in range(args.warmup + args.steps):
        timed = i >= args.warmup
        sync()
        if world > 1:
            dist.barrier()
        sync()
        CLOCK.on, CLOCK.step, CLOCK.call, CLOCK.recs = timed, i - args.warmup, 0, []
        t0 = time.perf_counter()
        CLOCK.mark(-1, "step_start")
        step()
        CLOCK.mark(-1, "step_end")
        sync()
        wall = time.perf_counter() - t0
        if timed:
            e0 = CLOCK.recs[0]
            marks = [[s, call, ph, h - e0[3], (e0[4].elapsed_time(ev) / 1e3) if cuda else 0.0]
                     for s, call, ph, h, ev in CLOCK.recs]
            steps.append({"step": i - args.warmup, "wall_s": wall, "marks": marks})
        CLOCK.on = False
    rows = [mo.rows[-args.steps * (len(mo.rows) // (args.warmup + args.steps)):]
            for mo in layers]
    tag = args.case + (f"-{kind}" if kind else "") + ("-tiny" if args.tiny else "")
    name = {"alt": "steps_alt", "third": "steps_third", "steps": "steps"}[args.script]
    rec = {"script": f"{name}.py", "case": args.case, "tiny": args.tiny,
           "rank": rank, "world": world, "model": c["model"], "steps": steps,
           "routing": kind, "rows": rows, "env": {"torch": torch.__version__,
                                 "gpu": torch.cuda.get_device_name(dev) if cuda else "cpu"}}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"phases-{tag}-r{rank}.json"), "w") as f:
        json.dump(rec, f)
    if rank == 0:
        print(f"RESULT {tag}: steps {[round(s['wall_s'], 4) for s in steps]}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--script", choices=("alt", "third", "steps"), required=True)
    ap.add_argument("--routing", default="uniform", help="steps: uniform, skewed or both")
    ap.add_argument("--case", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--quick", action="store_true", help="CPU, gloo, tiny shapes (dry run)")
    args = ap.parse_args()
    name = {"alt": "steps_alt", "third": "steps_third", "steps": "steps"}[args.script]
    mod = load(name)
    mod.MoE.forward = {"alt": alt_forward, "third": third_forward,
                       "steps": steps_forward}[args.script](mod)
    rank, world, dev = mod.setup(args.quick)
    if args.script == "steps":
        mod.TINY["on"] = args.tiny
    if args.script == "third" and args.tiny:
        mod.TINY["on"] = True
    c = mod.case_config(args.case, args.quick)
    if args.script == "alt" and args.tiny and not args.quick:
        m = c["model"]
        m.update(hidden=16 * m["heads"], seq=128)
        m["ffn"], m["expert_ffn"] = 2 * m["hidden"], 2 * m["hidden"]
    assert c["world"] == world, f"{args.case} needs {c['world']} ranks"
    if args.script == "steps":
        c["name"] = args.case
        built = mod.build_moe(c, rank, world, dev, args.quick)
        layers, state = built[4], built[3]
        reduce = mod.bucketed_all_reduce

        def marked_reduce(*a, **k):  # the step's gradient reductions, then its optimizer
            CLOCK.mark(-1, "reduce_start")
            out = reduce(*a, **k)
            CLOCK.mark(-1, "reduce_end")
            return out

        mod.bucketed_all_reduce = marked_reduce
    else:
        built = mod.build_moe(c, rank, world, dev)
        layers = built[3] if args.script == "alt" else [blk.mlp for blk in built[0][0].layers]
    step = built[1]
    cuda = dev.type == "cuda"
    CLOCK.cuda = cuda

    kinds = [None]
    if args.script == "steps":
        kinds = ["uniform", "skewed"] if args.routing == "both" else [args.routing]
    for kind in kinds:
        if kind is not None:
            state["kind"] = kind
        run_kind(args, c, mod, step, layers, rank, world, dev, cuda, kind)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
