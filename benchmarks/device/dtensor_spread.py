"""How far the slowest rank's host is behind the others in ``steps_alt.py``'s DTensor TP + SP
step, beside a plain eager step issued by the same processes in the same launch (issue 12: the
DTensor TP 4 rows are paced by one rank's host; is that spread DTensor's or the box's?).

Run on one host (NCCL)::

    python3 -m torch.distributed.run --standalone --nproc_per_node=N \
        benchmarks/device/dtensor_spread.py --out DIR --label NAME

``--quick`` runs the same on the CPU with gloo (a dry run; the numbers mean nothing).

Per width (``--only``; ``tiny``: hidden 256, the GPU does next to nothing; ``P``: the eleventh
batch's h11_tp4sp_P shape and micro-batch) and ``--layers`` GPT-2 blocks, each run is, in turn:

- ``dt``: one step of ``steps_alt.build_tp(sp=True)``'s model (forward under
  ``loss_parallel``, backward, the all-reduce of ``wpe``'s gradient, ``opt.step()``,
  ``zero_grad``), started with the GPU drained and the ranks at a barrier. Per rank:
  ``issue_s`` (host clock until ``zero_grad`` returns: the host's own time, launches being
  asynchronous), ``wall_s`` (until ``torch.cuda.synchronize()`` returns), ``cpu_s`` (the main
  thread's CPU time over the issue, ``time.thread_time``), ``wait_s`` (the main thread's time
  runnable but not running, from ``/proc/thread-self/schedstat``: what the guest kernel's
  scheduler withheld), ``steal_s`` (the box's steal time over the issue, all CPUs, from
  ``/proc/stat``: what the hypervisor withheld), ``gc`` (collections by generation, from
  ``gc.callbacks``).
- ``plain``: the same rank's one-GPU eager step of the same GPT-2 (``steps_alt.GPT``, tiny
  width, ``--plain-layers`` blocks, no DTensor, no collective; AdamW foreach), timed the same
  way after a barrier: the same processes' host spread on plain eager code.

Per run the penalty of the group, ``max / mean - 1`` of the ranks' ``issue_s``, is what
``simulator.calibrate host_spread`` reads (as ``host_spread.py``'s windows). 3 warm-up runs,
``--runs`` timed, garbage collection on (as the scripts run). Rank 0 writes
``dtensor_spread_<label>.jsonl`` (every rank's rows) and prints ``DTSPREAD`` lines.
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks", "device"))
import steps_alt  # noqa: E402

WIDTHS = {
    "tiny": dict(hidden=256, heads=4, vocab=1024, seq=256, mb=4),
    "P": dict(hidden=3584, heads=28, vocab=50304, seq=1024, mb=4),
}
WARM = 3


class Clocks:
    """The main thread's CPU time, its run-queue wait, the box's steal time, gc collections."""

    def __init__(self):
        self.gcs = [0, 0, 0]
        gc.callbacks.append(self._gc)

    def _gc(self, phase, info):
        if phase == "start":
            self.gcs[info["generation"]] += 1

    @staticmethod
    def _wait_ns() -> int:
        try:
            with open("/proc/thread-self/schedstat") as f:
                return int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            return 0

    @staticmethod
    def _steal_ticks() -> int:
        try:
            with open("/proc/stat") as f:
                fields = f.readline().split()
            return int(fields[8]) if fields[0] == "cpu" and len(fields) > 8 else 0
        except (OSError, ValueError):
            return 0

    def read(self):
        return (time.perf_counter(), time.thread_time(), self._wait_ns(), self._steal_ticks(),
                list(self.gcs))

    @staticmethod
    def diff(a, b) -> dict:
        hz = os.sysconf("SC_CLK_TCK")
        return {"issue_s": b[0] - a[0], "cpu_s": b[1] - a[1], "wait_s": (b[2] - a[2]) * 1e-9,
                "steal_s": (b[3] - a[3]) / hz, "gc": [y - x for x, y in zip(a[4], b[4], strict=True)]}


def run_one(name: str, layers: int, plain_layers: int, rank: int, world: int, dev, runs: int,
            clocks: Clocks) -> list[dict]:
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
    # the plain eager step: tiny GPT-2 on this rank alone
    pt = dict(WIDTHS["tiny"])
    pmb = pt.pop("mb")
    pm = dict(pt, layers=plain_layers, ffn=4 * pt["hidden"])
    pc = dict(model=pm, mb=pmb, n_mb=1)
    torch.manual_seed(0)
    with dev:
        plain = steps_alt.GPT(pm, 0, plain_layers, True, True, tied=True)
    px, py = steps_alt.make_data(pc, rank, dev, 1)[0]
    popt = steps_alt.adamw(plain.parameters(), dev)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def start():
        sync()
        if world > 1:
            dist.barrier()
        sync()

    def dt_step() -> dict:
        start()
        a = clocks.read()
        with loss_parallel():
            with steps_alt.amp(dev):
                loss = steps_alt.ce(model(x), y)
            loss.backward()
        dist.all_reduce(model.wpe.weight.grad)  # as steps_alt.build_tp's step with SP
        opt.step()
        opt.zero_grad(set_to_none=True)
        b = clocks.read()
        sync()
        return dict(Clocks.diff(a, b), wall_s=time.perf_counter() - a[0])

    def plain_step() -> dict:
        start()
        a = clocks.read()
        with steps_alt.amp(dev):
            loss = steps_alt.ce(plain(px), py)
        loss.backward()
        popt.step()
        popt.zero_grad(set_to_none=True)
        b = clocks.read()
        sync()
        return dict(Clocks.diff(a, b), wall_s=time.perf_counter() - a[0])

    rows = []
    for _ in range(WARM):
        dt_step()
        plain_step()
    for i in range(runs):
        base = {"rank": rank, "world": world, "width": name, "layers": layers, "run": i}
        rows.append(dict(base, step="dt", **dt_step()))
        rows.append(dict(base, step="plain", plain_layers=plain_layers, **plain_step()))
    del model, opt, plain, popt
    if cuda:
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--plain-layers", type=int, default=48)
    ap.add_argument("--only", default="tiny,P", help="comma-separated widths")
    ap.add_argument("--quick", action="store_true", help="CPU and gloo, a dry run")
    a = ap.parse_args()
    rank, world, dev = steps_alt.setup(a.quick)
    if a.quick:
        for k in WIDTHS:
            WIDTHS[k] = dict(hidden=64, heads=4, vocab=256, seq=64, mb=2)
        a.runs = 2
    clocks = Clocks()
    rows = []
    for name in a.only.split(","):
        rows += run_one(name, a.layers, a.plain_layers, rank, world, dev, a.runs, clocks)
    allrows = [None] * world
    dist.all_gather_object(allrows, rows)
    if rank == 0:
        flat = [r for rr in allrows for r in rr]
        env = {"kind": "env", "label": a.label, "torch": torch.__version__,
               "python": sys.version.split()[0], "world": world,
               "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
               "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "widths": WIDTHS, "layers": a.layers, "plain_layers": a.plain_layers,
               "warmup": WARM, "runs": a.runs, "ncpu": os.cpu_count(),
               "script": "dtensor_spread.py"}
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"dtensor_spread_{a.label}.jsonl"), "w") as f:
            f.write(json.dumps(env) + "\n")
            for r in flat:
                f.write(json.dumps(r) + "\n")
        summary(flat, world, a.label)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def summary(rows: list[dict], world: int, label: str) -> None:
    """Per width and step kind: the mean over runs of the ranks' mean issue time, of the
    group's penalty (max / mean - 1), and of the slowest rank's CPU share of its issue."""
    for key in sorted({(r["width"], r["step"]) for r in rows}):
        sel = [r for r in rows if (r["width"], r["step"]) == key]
        pens, means, cpu, wait = [], [], [], []
        for i in sorted({r["run"] for r in sel}):
            rr = [r for r in sel if r["run"] == i]
            iss = [r["issue_s"] for r in rr]
            mean = statistics.mean(iss)
            slow = max(rr, key=lambda r: r["issue_s"])
            pens.append(max(iss) / mean - 1)
            means.append(mean)
            cpu.append(slow["cpu_s"] / slow["issue_s"])
            wait.append(slow["wait_s"] / slow["issue_s"])
        print(f"DTSPREAD {label} w{world} {key[0]} {key[1]}: mean issue "
              f"{statistics.mean(means) * 1e3:.1f} ms, penalty {statistics.mean(pens):.3f}, "
              f"slowest cpu share {statistics.mean(cpu):.2f}, run-queue wait "
              f"{statistics.mean(wait):.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
