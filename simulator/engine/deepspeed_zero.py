"""DeepSpeed's ZeRO stage 3 in the engine (``training.zero_impl: deepspeed``).

A pass (one micro-batch's forward, or its backward with any recomputation) walks its units (a
layer, the embedding, the head) in order. Each unit's parameter-holding modules are gathered by
one all-gather each (:func:`simulator.model.deepspeed.fetches`), on the data-parallel
communicator, in the order the pass uses them; gathers are issued ahead of use while the
gathered bytes stay within ``stage3_max_live_parameters`` (DeepSpeed's trace-based prefetch),
and always for the unit about to run. A unit's gathered parameters are released when its last
use in the pass ends (a recomputed layer keeps them for its backward:
``stage3_max_reuse_distance``). In the backward each unit's gradients, tensor by tensor in the
reverse of the forward order, fill buckets of ``reduce_bucket_size`` elements; a full bucket
is reduce-scattered beside the next kernels, the open one at the end of the pass
(:func:`simulator.model.deepspeed.grad_buckets`). The step's end waits for every reduction,
as for the other ZeRO-3 model.

Not modelled: DeepSpeed's Python hooks on the host (a fetch, a release and a gradient hook per
module; no micro-benchmark here), its prefetch's 5e7-element cap per call (within a layer of
several module fetches the live-parameter cap binds first), quantised gathers (ZeRO++).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import simpy

from simulator.config.schema import TrainingConfig
from simulator.engine.split import unit_of
from simulator.model.deepspeed import fetches, grad_buckets, unit_modules


@dataclass(frozen=True)
class DeepSpeedPlan:
    """What the engine needs of DeepSpeed's ZeRO-3, per unit (a global layer, ``embed`` or
    ``head``) on one rank."""

    #: bytes each module fetch of the unit all-gathers (padded, in the working dtype)
    fetch_bytes: Callable[[int | str], tuple[float, ...]]
    #: elements of the unit's parameter tensors in the order the backward completes them
    grad_tensors: Callable[[int | str], tuple[int, ...]]
    grad_elem_bytes: float  # bytes of a reduced gradient element
    bucket_elems: float  # reduce_bucket_size
    max_live_bytes: float  # stage3_max_live_parameters in gathered bytes


def deepspeed_plan(model, t: TrainingConfig, *, tp: int, world: int, work_bytes: int,
                   grad_bytes: int) -> DeepSpeedPlan:
    """The :class:`DeepSpeedPlan` of a dense model on ``tp`` tensor-parallel ranks, ZeRO over
    ``world`` ranks, gathering ``work_bytes`` and reducing ``grad_bytes`` per element."""
    ds = t.deepspeed
    cache: dict = {}

    def mods(u):
        key = u if isinstance(u, str) else "layer"
        if key not in cache:
            cache[key] = unit_modules(model, u, tp)
        return cache[key]

    return DeepSpeedPlan(
        fetch_bytes=lambda u: tuple(
            n * work_bytes for n in fetches(mods(u), world, ds.param_persistence_threshold)),
        grad_tensors=lambda u: tuple(n for mod in reversed(mods(u)) for n in reversed(mod)),
        grad_elem_bytes=grad_bytes,
        bucket_elems=ds.reduce_bucket_size,
        max_live_bytes=ds.max_live_parameters * work_bytes,
    )


class DeepSpeedZero3:
    """Engine mixin: :meth:`_ds_zero3_pass`."""

    def _ds_zero3_pass(self, p, segs, kind: str, mb: int, mem_after):
        """One pass under DeepSpeed's ZeRO-3 (module docstring)."""
        ds = self.plan.ds
        index: dict = {}  # unit -> its place in the pass
        for label, layer, _ in segs:
            index.setdefault(layer if layer >= 0 else unit_of(label), len(index))
        units = list(index)
        last_use = {}
        for label, layer, _ in segs:
            last_use[layer if layer >= 0 else unit_of(label)] = label
        issued: dict[object, list[simpy.Event]] = {u: [] for u in units}
        queue = [(u, b) for u in units for b in ds.fetch_bytes(u)]
        live = [0.0, 0]  # gathered bytes held, next entry of the queue to issue

        def issue_until(limit_unit: int) -> None:
            """Issue the queue's fetches: those of units up to ``limit_unit`` always, further
            ones while the gathered bytes stay within the live-parameter cap."""
            while live[1] < len(queue):
                u, nbytes = queue[live[1]]
                if index[u] > limit_unit and live[0] + nbytes > ds.max_live_bytes:
                    return
                layer = u if isinstance(u, int) else -1
                spec = self._spec(p, "gather", "zero_gather", "all_gather", nbytes,
                                  f"{_name(u)} module all_gather", layer=layer, mb=mb)
                self.mem.append((self.env.now, p.pid, nbytes, "zero_params"))
                issued[u].append(self._issue(p, spec))
                live[0] += nbytes
                live[1] += 1

        bucket = 0.0
        for seg in segs:
            label, layer, _ = seg
            u = layer if layer >= 0 else unit_of(label)
            issue_until(index[u])
            if issued[u]:
                yield self.env.all_of(issued[u])
                issued[u] = []
            yield self.env.timeout(0)  # the collectives issued now start beside the kernels
            seg_kind = ("recompute" if "recompute" in label else "bwd") if kind == "bwd" else kind
            yield from self._run_segments(p, [seg], seg_kind, mb, mem_after)
            if last_use[u] == label:
                held = sum(ds.fetch_bytes(u))
                if held:
                    self.mem.append((self.env.now, p.pid, -held, "zero_params"))
                    live[0] -= held
            if kind == "bwd" and "recompute" not in label:
                full, left = grad_buckets(list(ds.grad_tensors(u)), ds.bucket_elems, bucket)
                for n in full:
                    yield from self._ds_reduce(p, n * ds.grad_elem_bytes, layer, mb)
                bucket = left
        if kind == "bwd" and bucket:
            yield from self._ds_reduce(p, bucket * ds.grad_elem_bytes, -1, mb)

    def _ds_reduce(self, p, nbytes: float, layer: int, mb: int):
        """Reduce-scatter one gradient bucket beside the next kernels (DeepSpeed's
        ``reduce_and_partition_stream``), after its copy into the flat buffer."""
        yield from self._grad_prep(p, nbytes, "grad bucket prep")
        spec = self._spec(p, "dp", "dp_comm", "reduce_scatter", nbytes,
                          "grad reduce_scatter bucket", layer=layer, mb=mb)
        self._pending[p.pid].append(self._issue(p, spec))
        yield self.env.timeout(0)


def _name(u) -> str:
    return f"L{u}" if isinstance(u, int) else str(u)
