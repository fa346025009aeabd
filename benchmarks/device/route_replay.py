"""A learned-router eager MoE step against the same step with its routes forced (issue 10).

Decides where the learned-router MoE rows' miss lives: in the row counts a learned router
produces (the model's busiest rank / per-expert rows narrower than the real ones) or in a cost
the learned step pays that a forced route does not (the gate GEMM and its backward, top-k,
softmax of the probabilities, weighting the combine, new GEMM shapes, ...).

One process per case (``torchrun --standalone --nproc_per_node=EP``), six variants of the same
step in turn, each timed as the measuring script times its steps (``time_steps`` of the script
itself: warm-up steps, then timed steps between a synchronise + barrier and a synchronise; the
slowest rank's time per step, the median over the timed steps):

1. ``learned``: the script's own MoE step, unchanged (``steps_third.py`` or ``steps_alt.py``
   ``build_moe``), every MoE call's per-expert counts of this rank's token copies logged (the
   ``torch.bincount`` the script calls, kept on the GPU until the variant ends: no extra host
   synchronisation).
2. ``replay``: the same model and step with every MoE layer's routing replaced by the counts
   logged in (1), call by call (the same counts of each source rank, hence the same splits and
   rows of every local expert): no router GEMM, no top-k, no probabilities, the combine an
   unweighted sum of a token's copies; everything after the routing (count exchange and its
   ``.tolist()``, dispatch, regrouping, experts one after another, combine) is the script's own
   code, copied. The routers' gradients are zeros set before the step (so the step's
   reductions, clipping and optimizer run on the same tensors).
3. ``replay_gate``: (2) with the gate kept: the router GEMM, the logits (probabilities) of the
   replayed choices gathered, their softmax (``steps_third.py``) or softmax and
   renormalisation (``steps_alt.py``), and the combine weighted by them (as ``steps.py``'s
   forced routes do; only the top-k kernel is not run).
4. ``learned_again``: the model, data and optimizer built afresh (same seeds) and the learned
   step run again (so is ``learned`` wherever it is not the first variant): the row counts come out (nearly) the same as in (1), but the process has
   launched them already.
5. ``model``: the forced path of (2) with the counts the simulator assumes (``--model-counts``,
   a JSON made by ``benchmarks/route_model_counts.py``: each call's counts per source rank drawn
   from the simulator's distribution for the case).
6. ``replay_end``: (2) once more, last (how far the order of the variants moves a time).
7. ``replay_cold``: (2) with the learned counts of an earlier process (``--replay-from``), run
   first in a fresh one: the same row counts as that process's ``learned``, as new to this
   process as they were to that one.
8. ``prewarm``: ``replay_cold`` with every expert GEMM shape the replayed counts will use run
   once before the first step: each MoE layer's first local expert, forward and backward (an
   input that requires its gradient: the data and weight gradients of the step), at each row
   count that layer's local experts ran in the earlier process's ``learned`` (``local_rows``),
   one call at a time between two synchronisations, then once more (host time of both calls
   kept: the first one's excess over the repeat is what the count cost new); then the
   experts' gradients dropped and the caching allocator emptied
   (``torch.cuda.empty_cache``). So cuBLAS has answered every heuristic query and launched
   every kernel the timed steps will ask for, while the allocator is as cold as a fresh
   process's: ``replay_cold - prewarm`` is what the row counts' GEMM shapes cost the first
   time (heuristic queries, first kernel launches), ``prewarm - replay`` whatever else a
   fresh process pays for them (allocator, other per-size work). Only with ``--replay-from``
   and as the first variant.

Every variant's per-call counts and local rows are written to ``OUT/replay-CASE-rN.json``; the
step records (one per variant) are appended to ``OUT/replay.jsonl`` by rank 0.

``--wait-file F`` / ``--go-file G`` / ``--done-file D`` chain processes of a device call: a
process waits for ``F`` (the previous one's ``D``) before it touches a GPU, touches ``G`` when
it starts, and ``D`` once its last variant is timed and its files written, so the next process's start (``torchrun``,
imports) overlaps this one's timing and its end (files) the next one's setup, while no two
processes time at once.

Usage (from the repository root)::

    torchrun --standalone --nproc_per_node=2 benchmarks/device/route_replay.py \
        --script third --case h15t_moe_ep2_AH --out DIR [--model-counts FILE]

``--quick`` runs the scripts' shrunken models on the CPU with gloo (a dry run).
Only development cases (batches 6-15) are allowed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time

T_START = time.time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

# the measuring scripts: beside this file, or under benchmarks/device of the working directory
# (when this file is run from a copy elsewhere)
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks", "device"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

#: development cases of the two scripts whose MoE router is learned (batches 6-15)
ALLOWED = {
    "third": {"h8t_moe_ep2_B", "h8t_moe_ep4_B", "h11t_moe_ep2_H", "h11t_moe_ep4_H",
              "h12t_moe_ep2_K", "h12t_moe_ep4_K", "h13t_moe_ep2_O", "h13t_moe_ep4_O",
              "h14t_moe_ep2_AD", "h14t_moe_ep4_AD", "h15t_moe_ep2_AH", "h15t_moe_ep4_AH",
              "h10t_moe_ep4_F"},
    "alt": {"h6_moe_ep2_W", "h6_moe_ep4_W", "h7_moe_ep2_Y", "h8_moe_ep2_Q", "h8_moe_ep4_Q",
            "h11_moe_ep4_M", "h12_moe_ep4_L", "h13_moe_ep2_AB", "h13_moe_ep4_AB",
            "h14_moe_ep2_AF", "h14_moe_ep4_AF", "h15_moe_ep2_AJ", "h15_moe_ep4_AJ"},
}

#: what the patched MoE forward does now, and the routes it replays
CTX: dict = {"mode": "learned", "record": None, "routes": None, "i": 0}

_bincount = torch.bincount


def _recording_bincount(*a, **kw):
    out = _bincount(*a, **kw)
    if CTX["record"] is not None:
        CTX["record"].append(out)
    return out


def _next_route():
    flat = CTX["routes"][CTX["i"]]
    CTX["i"] += 1
    return flat


# ----------------------------------------------------------------------------- forced forwards

def replay_third(self, x):
    """``steps_third.py``'s ``MoE.forward`` with the routing replayed (its dispatch and experts,
    ``MoE.dispatch_experts``, unchanged; ``gate``: the router's logits of the replayed choices,
    softmax, weighted combine)."""
    gate = CTX["mode"] == "replay_gate"
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    flat = _next_route()
    if gate:
        logits = self.router(x).float()
        top = logits.gather(1, flat.view(-1, self.k))
        weights = top.softmax(dim=-1).type_as(x)
    back = self.dispatch_experts(x, flat).view(-1, self.k, shape[-1])
    y = (back * weights.unsqueeze(-1)).sum(1) if gate else back.sum(1)
    return y.view(shape)


def replay_alt(self, x):
    """``steps_alt.py``'s ``MoE.forward`` with the routing replayed (as :func:`replay_third`)."""
    gate = CTX["mode"] == "replay_gate"
    b, s, h = x.shape
    flat = _next_route()
    if gate:
        probs = self.router(x.reshape(-1, h)).float().softmax(-1)
        w = probs.gather(1, flat.view(-1, self.k))
        w = w / w.sum(-1, keepdim=True)
    y = self.dispatch_experts(x, flat)
    if gate:
        return (y * w.unsqueeze(-1).to(y.dtype)).sum(1).view(b, s, h)
    return y.sum(1).view(b, s, h)


# ----------------------------------------------------------------------------- the run

S = None  # the measuring script's module


def routes_from_counts(counts: list[list[int]], k: int, seed: int, dev) -> list[torch.Tensor]:
    """Each call's ``[tokens * k]`` expert ids with the given per-expert counts, in a random
    order (a fixed seed per rank), on the device."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for c in counts:
        ids = torch.repeat_interleave(torch.arange(len(c)), torch.tensor(c, dtype=torch.long))
        out.append(ids[torch.randperm(ids.numel(), generator=g)].to(dev))
    return out


def prewarm(moes, rows_by_layer, dev) -> list[list]:
    """Each layer's first local expert run forward and backward once at each row count of
    ``rows_by_layer`` (``[layer][call][local expert]``) it has not run at yet (a GEMM shape is
    the expert's widths and the row count: one per width signature and count); the experts'
    gradients dropped after, the allocator emptied. Returns ``[layer, rows, host seconds of the
    first call, of a second one at once]`` per count (each call between two
    synchronisations)."""
    done: set = set()
    out = []
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for li, (mo, calls) in enumerate(zip(moes, rows_by_layer, strict=True)):
        expert = mo.experts[0]
        ps = list(expert.parameters())
        sig = tuple((tuple(p.shape), p.dtype) for p in ps)
        h = ps[0].shape[1]
        amp = S.amp(dev) if hasattr(S, "amp") else contextlib.nullcontext()
        dtype = torch.bfloat16 if hasattr(S, "amp") else ps[0].dtype
        for n in sorted({int(r) for call in calls for r in call}):
            if (sig, n) in done:
                continue
            done.add((sig, n))
            x = torch.randn(n, h, device=dev, dtype=dtype, requires_grad=True)
            took = []
            for _ in range(2):  # the first call at the count, and a repeat (the warm price)
                sync()
                t0 = time.perf_counter()
                with amp:
                    y = expert(x)
                y.backward(torch.randn_like(y))  # a dense gradient, as the step's
                sync()
                took.append(round(time.perf_counter() - t0, 6))
            out.append([li, n, *took])
    for mo in moes:
        for p in mo.experts.parameters():
            p.grad = None
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return out


def _wait_for(path: str, limit_s: float = 180.0) -> None:
    t0 = time.time()
    while path and not os.path.exists(path) and time.time() - t0 < limit_s:
        time.sleep(0.05)


MARKS: dict = {}


def _mark(name: str) -> None:
    """Seconds since the process started (imports included), kept in the per-rank file and
    printed by local rank 0: where a device call's time goes."""
    MARKS[name] = round(time.time() - T_START, 3)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(f"MARK {name} {MARKS[name]:.3f} s", flush=True)


def _touch(path: str) -> None:
    if path and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        with open(path, "w") as f:
            f.write(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")


def build(args, c, rank, world, dev):
    if args.script == "third":
        mods, step = S.build_moe(c, rank, world, dev)
        moes = [m for mod in mods for m in mod.modules() if isinstance(m, S.MoE)]
    else:
        model, step, _info, moes = S.build_moe(c, rank, world, dev)
        mods = [model]
    return mods, step, moes


def main() -> int:
    global S
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--script", choices=("third", "alt"), required=True)
    ap.add_argument("--case", required=True)
    ap.add_argument("--out", default="/tmp/route_replay")
    ap.add_argument("--model-counts", default="", help="JSON of route_model_counts.py")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tag", default="", help="added to the per-rank file's name and the records")
    ap.add_argument("--replay-from", default="",
                    help="a folder with an earlier run's replay-CASE[-TAG]-rN.json (--from-tag): "
                         "its learned counts, for replay_cold (replayed first in a fresh process)")
    ap.add_argument("--from-tag", default="")
    ap.add_argument("--wait-file", default="", help="wait for this file before touching a GPU")
    ap.add_argument("--go-file", default="", help="touched when this process starts its setup")
    ap.add_argument("--done-file", default="", help="touched once the last variant is timed")
    ap.add_argument("--wait-at", choices=("setup", "run"), default="setup",
                    help="wait for --wait-file before the process group and the model are set "
                         "up (setup), or after, before the first variant (run: only where the "
                         "previous process runs on other GPUs)")
    ap.add_argument("--variants",
                    default="learned,replay,replay_gate,learned_again,model,replay_end")
    args = ap.parse_args()
    if args.case not in ALLOWED[args.script]:
        ap.error(f"--case {args.case}: not a development learned-router case of {args.script}")
    if args.script == "third":
        import steps_third as mod
        forward = replay_third
    else:
        import steps_alt as mod
        forward = replay_alt
    S = mod
    torch.bincount = _recording_bincount
    learned_forward = S.MoE.forward

    def dispatch(self, x):
        if CTX["mode"] in ("learned", "learned_again"):
            return learned_forward(self, x)
        return forward(self, x)

    S.MoE.forward = dispatch
    _mark("imported")
    if args.wait_at == "setup":
        _wait_for(args.wait_file)
        _mark("waited")
        _touch(args.go_file)
    rank, world, dev = S.setup(args.quick)
    _mark("setup")
    c = S.case_config(args.case, args.quick)
    assert c["world"] == world, f"{args.case} needs {c['world']} ranks, got {world}"
    m = c["model"]
    warmup, timed = args.warmup, args.steps
    mods, step, moes = build(args, c, rank, world, dev)
    _mark("built")
    if args.wait_at == "run":
        _wait_for(args.wait_file)
        _mark("waited")
        _touch(args.go_file)
        if world > 1:
            dist.barrier()  # (before reading an earlier process's files: they are written)
    calls_per_step = c["n_mb"] * len(moes)
    total = (warmup + timed) * calls_per_step
    model_counts = None
    if args.model_counts:
        with open(args.model_counts) as f:
            mc = json.load(f)[args.case]
        # [step][call][source] -> this rank's counts per call, in call order
        model_counts = [call[rank] for st in mc["counts"] for call in st][:total]
        assert len(model_counts) == total, (len(model_counts), total)
    run_step = None
    variants = [v for v in args.variants.split(",") if v and (v != "model" or model_counts)]
    logged: dict = {"script": args.script, "case": args.case, "rank": rank, "world": world,
                    "warmup": warmup, "timed": timed, "calls_per_step": calls_per_step,
                    "variants": {}}
    learned_counts = learned_rows = None
    suffix = lambda tag: f"-{tag}" if tag else ""  # noqa: E731
    if args.replay_from:
        with open(os.path.join(args.replay_from,
                               f"replay-{args.case}{suffix(args.from_tag)}-r{rank}.json")) as f:
            earlier = json.load(f)["variants"]["learned"]
        learned_counts, learned_rows = earlier["counts"], earlier["local_rows"]
        assert len(learned_counts) == total, (len(learned_counts), total)
    if "prewarm" in variants:
        assert variants[0] == "prewarm" and learned_rows is not None, \
            "prewarm: the first variant, with --replay-from"
    for j, v in enumerate(variants):
        if v == "prewarm":
            t0 = time.time()
            logged["prewarm"] = prewarm(moes, learned_rows, dev)
            logged["prewarm_wall_s"] = round(time.time() - t0, 3)
            if world > 1:
                dist.barrier()
        if v in ("learned", "learned_again") and j > 0:  # a fresh model: the same routes
            run_step, CTX["routes"] = None, None
            del mods, step, moes
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
            mods, step, moes = build(args, c, rank, world, dev)
        CTX["mode"], CTX["i"], CTX["record"] = v, 0, []
        run_step = step
        if v in ("replay", "replay_gate", "model", "replay_end", "replay_cold", "prewarm"):
            counts = learned_counts if v != "model" else model_counts
            CTX["routes"] = routes_from_counts(counts, m["top_k"], 7 + rank, dev)
            if v != "replay_gate":  # no gate: the routers' gradients are zeros set each step
                zeros = [torch.zeros_like(mo.router.weight) for mo in moes]

                def run_step(step=step, zeros=zeros):
                    for mo, z in zip(moes, zeros, strict=True):
                        mo.router.weight.grad = z
                    step()
        first_rows = [len(mo.rows) for mo in moes]
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if world > 1:
            dist.barrier()
        t0 = time.time()
        r = S.time_steps(run_step, dev, warmup, timed, world)
        wall = time.time() - t0
        rec_counts = [t.tolist() for t in CTX["record"]]
        CTX["record"] = None
        if v == "learned" and not args.replay_from:
            learned_counts = rec_counts
            assert len(learned_counts) == total, (len(learned_counts), total)
        rows = [mo.rows[first_rows[j]:] for j, mo in enumerate(moes)]
        logged["variants"][v] = {"counts": rec_counts, "local_rows": rows}
        if rank == 0:
            rec = {"op": "route_replay", "script": args.script, "case": args.case,
                   "variant": v, "tag": args.tag, "gpus": world, "wall_s": round(wall, 3),
                   "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                   "env": {"torch": torch.__version__,
                           "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda"
                           else "cpu"}}
            if v == "prewarm":
                rec["prewarm_calls"] = len(logged["prewarm"])
                rec["prewarm_wall_s"] = logged["prewarm_wall_s"]
            rec.update(r)
            print(f"RESULT {args.case}{suffix(args.tag)} {v}: step {r['step_time_s']:.4f} s "
                  f"(min {r['step_time_min_s']:.4f}, max {r['step_time_max_s']:.4f})",
                  flush=True)
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "replay.jsonl"), "a") as f:
                f.write(json.dumps(rec) + "\n")
    _mark("timed")
    logged["marks"] = MARKS
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"replay-{args.case}{suffix(args.tag)}-r{rank}.json"),
              "w") as f:
        json.dump(logged, f)
    if world > 1:
        dist.barrier()
    _touch(args.done_file)  # the files written: the next process may read them
    _mark("written")
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
