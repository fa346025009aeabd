"""Host time of ``steps_alt.py``'s DTensor TP + SP model per layer, tiny and at full size, on
2 or 4 ranks (issue 12 item 4: why full-size DTensor steps run slower than the per-unit host
rates of ``dtensor_host.py`` say).

Run on one host (NCCL)::

    python3 -m torch.distributed.run --standalone --nproc_per_node=N \
        benchmarks/device/dtensor_block_host.py --out DIR

``--quick`` runs the same on the CPU with gloo (a dry run; the numbers mean nothing).

``gpus.yaml`` ``host_dtensor`` comes from chains of one unit at hidden 256, and
``dtensor_host.py`` checked the per-unit sum on the whole tiny model (2 and 6 layers). The
eighth held-out batch's full-size steps (shape Z: 20 layers of 2560, 4 x 1024 tokens) took
11-19 ms a layer where those rates give 12.4. Here the same model, built by ``steps_alt.py``'s
own ``build_tp`` with ``sp=True``, runs a whole training step at two widths with the same 20
layers and the same op sequence:

- ``tiny``: hidden 256, 4 heads, vocabulary 1024, 4 x 256 tokens (the GPU does next to nothing,
  so the host clock is the cost, as in ``dtensor_host.py``);
- ``Z``: hidden 2560, 20 heads, vocabulary 50304, 4 x 1024 tokens (the held-out shape).

Per run (started with the GPU drained and the ranks at a barrier) the host clock is read after
the forward, after ``backward()`` and after ``opt.step()`` (no synchronisation inside: kernel
and NCCL launches are asynchronous, so these are the host's own times unless it blocks), then
once more after ``torch.cuda.synchronize()`` (the step's wall time). Each width runs with
Python's cyclic garbage collector on (as the scripts run) and off (``gc.disable()`` after a
``gc.collect()``), 3 warm-up and ``--runs`` timed runs each, and counts the collections by
generation inside each run (``gc.callbacks``). Every rank's rows are kept: the spread between
ranks of the same run is the other thing to see (a host-bound TP group runs at its slowest
rank). Rank 0 writes ``dtensor_block_host.jsonl`` (one line per rank, width, gc mode and run)
and prints ``DTBLOCK`` lines (medians).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(__file__))
import steps_alt  # noqa: E402

LAYERS = 20
WIDTHS = {
    "tiny": dict(layers=LAYERS, hidden=256, heads=4, vocab=1024, seq=256),
    "Z": dict(layers=LAYERS, hidden=2560, heads=20, vocab=50304, seq=1024),
}
MB, WARM = 4, 3


class GcCount:
    """Collections (and their seconds) by generation while armed."""

    def __init__(self):
        self.n, self.s, self._t = [0, 0, 0], [0.0, 0.0, 0.0], 0.0
        gc.callbacks.append(self._cb)

    def reset(self):
        self.n, self.s = [0, 0, 0], [0.0, 0.0, 0.0]

    def _cb(self, phase, info):
        if phase == "start":
            self._t = time.perf_counter()
        else:
            g = info["generation"]
            self.n[g] += 1
            self.s[g] += time.perf_counter() - self._t


def run_width(name: str, rank: int, world: int, dev, runs: int, counter: GcCount) -> list[dict]:
    from torch.distributed.tensor.parallel import loss_parallel
    m = dict(WIDTHS[name])
    m["ffn"] = 4 * m["hidden"]
    c = dict(model=m, scheme="tp", sp=True, mb=MB, n_mb=1, ac=False, straggler=None, world=world)
    model, _, _ = steps_alt.build_tp(c, rank, world, dev)
    x, y = steps_alt.make_data(c, 0, dev, 1)[0]
    dps = [p for p in model.parameters() if hasattr(p, "to_local")]
    pls = [p for p in model.parameters() if not hasattr(p, "to_local")]
    opt = steps_alt.adamw([{"params": dps}, {"params": pls}], dev)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def one() -> tuple[float, float, float, float]:
        sync()
        if world > 1:
            dist.barrier()
        sync()
        counter.reset()
        t0 = time.perf_counter()
        with loss_parallel():
            with steps_alt.amp(dev):
                loss = steps_alt.ce(model(x), y)
            t1 = time.perf_counter()
            loss.backward()
        dist.all_reduce(model.wpe.weight.grad)  # as steps_alt.build_tp's step with SP
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        sync()
        return t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - t0

    rows = []
    for mode in ("on", "off"):
        gc.collect()
        if mode == "off":
            gc.disable()
        for _ in range(WARM):
            one()
        for i in range(runs):
            f, b, o, wall = one()
            rows.append({"rank": rank, "world": world, "width": name, "gc": mode, "run": i,
                         "fwd_host_s": f, "bwd_host_s": b, "opt_host_s": o, "wall_s": wall,
                         "gc_collections": list(counter.n), "gc_s": list(counter.s)})
        gc.enable()
    del model, opt
    if cuda:
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="CPU and gloo, a dry run")
    ap.add_argument("--only", default="", help="comma-separated widths (default: tiny,Z)")
    a = ap.parse_args()
    rank, world, dev = steps_alt.setup(a.quick)
    if a.quick:  # a dry run of the code path: two small layers
        for k in WIDTHS:
            WIDTHS[k] = dict(layers=2, hidden=64, heads=2, vocab=256, seq=64)
        a.runs = 1
    counter = GcCount()
    rows = []
    for name in (a.only.split(",") if a.only else list(WIDTHS)):
        rows += run_width(name, rank, world, dev, a.runs, counter)
    allrows = [None] * world
    dist.all_gather_object(allrows, rows)
    if rank == 0:
        flat = [r for rr in allrows for r in rr]
        env = {"kind": "env", "torch": torch.__version__, "python": sys.version.split()[0],
               "world": world, "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda"
               else "cpu", "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "layers": LAYERS, "micro_batch": MB, "widths": WIDTHS, "warmup": WARM,
               "runs": a.runs, "script": "dtensor_block_host.py"}
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"dtensor_block_host_w{world}.jsonl"), "w") as f:
            f.write(json.dumps(env) + "\n")
            for r in flat:
                f.write(json.dumps(r) + "\n")
        _summary(flat, world)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _summary(rows: list[dict], world: int) -> None:
    """Medians per width and gc mode: per-layer host time (the slowest rank and the rank
    mean), the wall time, and the collections per run."""
    keys = sorted({(r["width"], r["gc"]) for r in rows})
    for width, mode in keys:
        sel = [r for r in rows if r["width"] == width and r["gc"] == mode]
        by_rank = {}
        for r in sel:
            by_rank.setdefault(r["rank"], []).append(r["fwd_host_s"] + r["bwd_host_s"])
        layers = WIDTHS[width]["layers"]
        per_rank = [statistics.median(v) / layers for v in by_rank.values()]
        wall = statistics.median(r["wall_s"] for r in sel if r["rank"] == 0)
        opt = statistics.median(r["opt_host_s"] for r in sel)
        gcn = [sum(r["gc_collections"][g] for r in sel) / len(sel) for g in range(3)]
        print(f"DTBLOCK w{world} {width} gc={mode}: host fwd+bwd per layer "
              f"{max(per_rank) * 1e3:.2f} ms slowest rank, {statistics.mean(per_rank) * 1e3:.2f}"
              f" ms rank mean; opt host {opt * 1e3:.1f} ms; wall {wall * 1e3:.1f} ms; "
              f"gc per run {gcn[0]:.1f}/{gcn[1]:.1f}/{gcn[2]:.2f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
