"""Where torch.distributed.pipelining's memory goes, action by action (issue 12, helper pipe).

``steps_alt.py``'s pipeline cases (its ``GPT`` stage modules, ``PipelineStage``, ``ScheduleGPipe``
/ ``Schedule1F1B``, its ``ce`` loss, ``adamw`` and autocast over fp32 weights), one step
recorded after warm-up: every ``forward_one_chunk``, loss and ``backward_one_chunk`` of the
stage is wrapped to record ``torch.cuda.memory_allocated()`` before and after and the peak
inside it (``reset_peak_memory_stats`` before each call); then the optimizer step and
``zero_grad``. Beside the script's own step (``base``), two variants isolate mechanisms:

- ``nocache``: ``torch.autocast(..., cache_enabled=False)``: autocast's weight-cast cache off,
  so each micro-batch's forward makes its own bf16 copies of the weights (what the simulator
  counted per micro-batch). The difference from ``base`` is what the cache shares.
- ``noout``: ``schedule.step(..., return_outputs=False)`` where this torch accepts it: the last
  stage keeps no output chunks for the merged return value.

Also recorded per rank: the bytes of the stage's persistent receive buffers (activations,
``args_recv_info``; gradients, ``grad_recv_info``), the output chunks kept after the step, and
the plain step's ``max_memory_allocated`` (what steps_alt.py reports). ``--source`` writes the
running torch's source of the functions that decide these (one text file).

Usage: ``torchrun --standalone --nproc_per_node=4 pp_memory_probe.py --out DIR`` (``--quick``:
CPU and gloo, tiny shapes, a dry run).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import steps_alt as A  # noqa: E402

GiB = 2**30


def _bytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def build(c, rank, world, dev, variant):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    m = c["model"]
    per = m["layers"] // world
    torch.manual_seed(rank)
    with dev:
        ch = A.GPT(m, rank * per, (rank + 1) * per, rank == 0, rank == world - 1, tied=False)
    stage = PipelineStage(ch, rank, world, dev)
    kind = Schedule1F1B if c["schedule"] == "1f1b" else ScheduleGPipe
    sched = kind(stage, n_microbatches=c["n_mb"], loss_fn=A.ce)
    data = A.make_data(c, 0, dev, c["n_mb"])
    x = torch.cat([d[0] for d in data])
    y = torch.cat([d[1] for d in data])
    opt = A.adamw(list(ch.parameters()), dev)
    kw = {}
    if variant == "noout" and "return_outputs" in inspect.signature(sched.step).parameters:
        kw["return_outputs"] = False
    cache = variant != "nocache"

    def pipeline():
        with torch.autocast(dev.type, dtype=torch.bfloat16, cache_enabled=cache):
            args = (x,) if stage.is_first else ()
            extra = {"target": y, "losses": []} if stage.is_last else {}
            sched.step(*args, **extra, **kw)

    return ch, stage, sched, opt, pipeline, bool(kw)


def instrument(stage, sched, dev, log):
    def alloc():
        return torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0

    def wrap(obj, name, label, mb_arg):
        fn = getattr(obj, name, None)
        if fn is None:
            return

        def rec(*a, **k):
            before = alloc()
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            out = fn(*a, **k)
            peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
            mb = a[mb_arg] if len(a) > mb_arg else k.get("bwd_chunk_id", k.get("fwd_chunk_id"))
            log.append({"what": label, "mb": mb if isinstance(mb, int) else None,
                        "before_gib": round(before / GiB, 4), "after_gib": round(alloc() / GiB, 4),
                        "peak_gib": round(peak / GiB, 4)})
            return out

        setattr(obj, name, rec)

    wrap(stage, "forward_one_chunk", "F", 0)
    wrap(stage, "backward_one_chunk", "B", 0)
    wrap(sched, "_maybe_compute_loss", "loss", 3)


def buffers(stage) -> dict:
    # (the first stage's entries are placeholders without a buffer: _RootArgPlaceholder in 2.11)
    act = sum(_bytes(getattr(i, "buffer", None))
              for v in getattr(stage, "args_recv_info", {}).values() for i in v)
    grad = sum(_bytes(getattr(i, "buffer", None))
               for v in getattr(stage, "grad_recv_info", {}).values() for i in v)
    outs = 0
    for o in getattr(stage, "output_chunks", []):
        for t in (o if isinstance(o, (tuple, list)) else (o,)):
            outs += _bytes(t)
    return {"act_recv_buffers_gib": round(act / GiB, 4), "grad_recv_buffers_gib": round(grad / GiB, 4),
            "output_chunks_after_step_gib": round(outs / GiB, 4)}


def run(case, variant, rank, world, dev, quick) -> dict:
    c = A.case_config(case, quick)
    if c["world"] != world:
        raise SystemExit(f"{case} needs {c['world']} ranks")
    ch, stage, sched, opt, pipeline, noout = build(c, rank, world, dev, variant)

    def step():
        pipeline()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)
    step()  # the plain step, as steps_alt.py measures it
    plain_peak = torch.cuda.max_memory_allocated(dev) / GiB if dev.type == "cuda" else 0.0
    log: list[dict] = []
    alloc = (lambda: torch.cuda.memory_allocated(dev) / GiB) if dev.type == "cuda" else (lambda: 0.0)
    start = alloc()
    instrument(stage, sched, dev, log)
    pipeline()
    after_sched = alloc()
    try:
        buf = buffers(stage)
    except Exception as e:  # noqa: BLE001 (a layout this torch does not have: record, go on)
        buf = {"buffers_error": f"{type(e).__name__}: {e}"}
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    opt.step()
    opt_peak = torch.cuda.max_memory_allocated(dev) / GiB if dev.type == "cuda" else 0.0
    after_opt = alloc()
    opt.zero_grad(set_to_none=True)
    params = sum(_bytes(p) for p in ch.parameters()) / GiB
    rec = {"case": case, "variant": variant, "rank": rank, "return_outputs_false": noout,
           "params_fp32_gib": round(params, 4), "plain_step_peak_gib": round(plain_peak, 4),
           "start_gib": round(start, 4), "after_schedule_gib": round(after_sched, 4),
           "optimizer_peak_gib": round(opt_peak, 4), "after_optimizer_gib": round(after_opt, 4),
           "after_zero_grad_gib": round(alloc(), 4), **buf, "actions": log}
    del ch, stage, sched, opt, pipeline
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    return rec


SOURCES = ("torch.distributed.pipelining.schedules:ScheduleGPipe._step_microbatches",
           "torch.distributed.pipelining.schedules:Schedule1F1B._step_microbatches",
           "torch.distributed.pipelining.schedules:PipelineScheduleSingle.step",
           "torch.distributed.pipelining.schedules:_PipelineSchedule._maybe_compute_loss",
           "torch.distributed.pipelining.stage:_PipelineStageBase.forward_one_chunk",
           "torch.distributed.pipelining.stage:_PipelineStageBase.backward_one_chunk",
           "torch.distributed.pipelining.stage:_PipelineStageBase.clear_runtime_states",
           "torch.distributed.pipelining.stage:_PipelineStageBase._retrieve_recv_activations",
           "torch.distributed.pipelining.stage:PipelineStage._prepare_forward_infra",
           "torch.distributed.pipelining.stage:PipelineStage._create_grad_recv_info",
           "torch.distributed.pipelining._backward:stage_backward")


def write_sources(path: str) -> None:
    import importlib
    with open(path, "w") as f:
        f.write(f"torch {torch.__version__}\n")
        for spec in SOURCES:
            mod, attr = spec.split(":")
            try:
                obj = importlib.import_module(mod)
                for part in attr.split("."):
                    obj = getattr(obj, part)
                f.write(f"\n##### {spec}\n{inspect.getsource(obj)}")
            except Exception as e:  # noqa: BLE001 (a name this version lacks)
                f.write(f"\n##### {spec}: not found ({type(e).__name__}: {e})\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--cases", default="h10_pp4_gpipe_T,h10_pp4_1f1b_T")
    ap.add_argument("--variants", default="base,nocache,noout")
    ap.add_argument("--source", action="store_true")
    args = ap.parse_args()
    rank, world, dev = A.setup(args.quick)
    os.makedirs(args.out, exist_ok=True)
    if args.source and rank == 0:
        write_sources(os.path.join(args.out, "torch_pipelining_source.txt"))
    for case in args.cases.split(","):
        for variant in args.variants.split(","):
            rec = run(case, variant, rank, world, dev, args.quick)
            recs = [None] * world
            dist.all_gather_object(recs, rec)
            if rank == 0:
                with open(os.path.join(args.out, "pp_memory.jsonl"), "a") as f:
                    for r in recs:
                        f.write(json.dumps(r) + "\n")
                print(f"PROBE {case} {variant}: plain peaks "
                      f"{[r['plain_step_peak_gib'] for r in recs]}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
