"""Host time of ``steps_alt.py``'s DTensor TP + SP training step by phase, at two depths and on
2 or 4 ranks (issue 12 item 4: whether DTensor's host cost grows with the TP degree, and what
of a step does not grow with its layers).

Run on one host (NCCL)::

    python3 -m torch.distributed.run --standalone --nproc_per_node=N \
        benchmarks/device/dtensor_step_host.py --out DIR

``--quick`` runs the same on the CPU with gloo (a dry run; the numbers mean nothing).

The model is ``steps_alt.py``'s own ``build_tp(sp=True)`` (TorchTitan's plan) at two widths,
each at ``--layers`` depths (default 2 and 24), so that per layer = the difference / 22 and
the rest (embeddings, LM head, ``loss_parallel``, the optimizer's fixed part, the step's
bookkeeping) is what a step pays whatever its depth:

- ``tiny``: hidden 256, 4 heads, vocabulary 1024, 4 x 256 tokens (the GPU does next to nothing,
  so the host clock is the cost);
- ``N``: hidden 2560, 20 heads, vocabulary 50304, 2 x 2048 tokens (the twelfth held-out batch's
  shape and micro-batch).

One run is one micro-batch and one optimizer step, as ``steps_alt.py``'s step: started with
the GPU drained and the ranks at a barrier; the host clock is read after the forward (the
loss), after ``backward()``, after the all-reduce of ``wpe``'s gradient, after ``opt.step()``
and after ``opt.zero_grad(set_to_none=True)`` (no synchronisation inside: launches are
asynchronous, so these are the host's own times unless it blocks), then after
``torch.cuda.synchronize()`` (the run's wall time). Then the same AdamW (foreach) step and
``zero_grad`` on plain tensors of the same local shapes (``plain_opt_s``, ``plain_zero_s``):
DTensor's share of the optimizer is the difference. 3 warm-up and ``--runs`` timed runs,
garbage collection on (as the scripts run). Rank 0 writes ``dtensor_step_host_w{N}.jsonl``
(every rank's rows) and prints ``DTSTEP`` lines (medians, slowest rank).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks", "device"))
import steps_alt  # noqa: E402

WIDTHS = {
    "tiny": dict(hidden=256, heads=4, vocab=1024, seq=256, mb=4),
    "N": dict(hidden=2560, heads=20, vocab=50304, seq=2048, mb=2),
}
WARM = 3
PHASES = ("fwd_s", "bwd_s", "ar_s", "opt_s", "zero_s")


def run_one(name: str, layers: int, rank: int, world: int, dev, runs: int) -> list[dict]:
    from torch.distributed.tensor.parallel import loss_parallel
    w = dict(WIDTHS[name])
    mb = w.pop("mb")
    m = dict(w, layers=layers, ffn=4 * w["hidden"])
    c = dict(model=m, scheme="tp", sp=True, mb=mb, n_mb=1, ac=False, straggler=None,
             world=world)
    model, _, _ = steps_alt.build_tp(c, rank, world, dev)
    x, y = steps_alt.make_data(c, 0, dev, 1)[0]
    dps = [p for p in model.parameters() if hasattr(p, "to_local")]
    pls = [p for p in model.parameters() if not hasattr(p, "to_local")]
    opt = steps_alt.adamw([{"params": dps}, {"params": pls}], dev)
    # the same optimizer on plain tensors of the same local shapes
    shadow = [torch.nn.Parameter(p.to_local().detach().clone()) for p in dps] + \
             [torch.nn.Parameter(p.detach().clone()) for p in pls]
    popt = steps_alt.adamw([{"params": shadow}], dev)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def start():
        sync()
        if world > 1:
            dist.barrier()
        sync()

    def one() -> dict:
        start()
        t = [time.perf_counter()]
        with loss_parallel():
            with steps_alt.amp(dev):
                loss = steps_alt.ce(model(x), y)
            t.append(time.perf_counter())
            loss.backward()
        t.append(time.perf_counter())
        dist.all_reduce(model.wpe.weight.grad)  # as steps_alt.build_tp's step with SP
        t.append(time.perf_counter())
        opt.step()
        t.append(time.perf_counter())
        opt.zero_grad(set_to_none=True)
        t.append(time.perf_counter())
        sync()
        wall = time.perf_counter() - t[0]
        out = {k: t[i + 1] - t[i] for i, k in enumerate(PHASES)}
        # plain tensors: gradients in place, then the same step and zero_grad
        for s in shadow:
            s.grad = torch.ones_like(s)
        start()
        a = time.perf_counter()
        popt.step()
        b = time.perf_counter()
        popt.zero_grad(set_to_none=True)
        out.update(wall_s=wall, plain_opt_s=b - a, plain_zero_s=time.perf_counter() - b)
        return out

    rows = []
    for _ in range(WARM):
        one()
    for i in range(runs):
        rows.append({"rank": rank, "world": world, "width": name, "layers": layers, "run": i,
                     "dtensor_params": len(dps), "plain_params": len(pls), **one()})
    del model, opt, popt, shadow
    if cuda:
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--layers", default="2,24", help="comma-separated depths")
    ap.add_argument("--only", default="", help="comma-separated widths (default: tiny,N)")
    ap.add_argument("--quick", action="store_true", help="CPU and gloo, a dry run")
    a = ap.parse_args()
    rank, world, dev = steps_alt.setup(a.quick)
    if a.quick:
        for k in WIDTHS:
            WIDTHS[k] = dict(hidden=64, heads=4, vocab=256, seq=64, mb=2)
        a.runs = 2
    depths = [int(v) for v in a.layers.split(",")]
    rows = []
    for name in (a.only.split(",") if a.only else list(WIDTHS)):
        for layers in depths:
            rows += run_one(name, layers, rank, world, dev, a.runs)
    allrows = [None] * world
    dist.all_gather_object(allrows, rows)
    if rank == 0:
        flat = [r for rr in allrows for r in rr]
        env = {"kind": "env", "torch": torch.__version__, "python": sys.version.split()[0],
               "world": world, "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda"
               else "cpu", "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "widths": WIDTHS, "layers": depths, "warmup": WARM, "runs": a.runs,
               "script": "dtensor_step_host.py"}
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"dtensor_step_host_w{world}.jsonl"), "w") as f:
            f.write(json.dumps(env) + "\n")
            for r in flat:
                f.write(json.dumps(r) + "\n")
        summary(flat, world)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def summary(rows: list[dict], world: int) -> None:
    """Per width and depth: the median of each phase on the slowest rank (by median)."""
    for key in sorted({(r["width"], r["layers"]) for r in rows}):
        sel = [r for r in rows if (r["width"], r["layers"]) == key]
        med = {k: max(statistics.median(r[k] for r in sel if r["rank"] == q)
                      for q in range(world))
               for k in (*PHASES, "wall_s", "plain_opt_s", "plain_zero_s")}
        print(f"DTSTEP w{world} {key[0]} L{key[1]}: " +
              ", ".join(f"{k[:-2]} {v * 1e3:.1f}" for k, v in med.items()) + " ms", flush=True)


if __name__ == "__main__":
    sys.exit(main())
