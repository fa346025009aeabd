"""The memory ``torch.distributed.pipelining``'s runtime holds beside the saved activations
(``parallelism.pp_runtime: torch``; :mod:`simulator.model.pipeline_memory` says what and
why), a mixin of :class:`~simulator.engine.sim.Engine`: the receive buffers of every
micro-batch and autocast's weight copies from the step's start to the end of its schedule, each
micro-batch's kept stage output from its forward to its backward, and the last stage's logits
from their forward to the end of the step."""

from __future__ import annotations


class TorchPipelineMemoryEvents:
    """Memory records of torch's pipeline runtime (uses the engine's ``plan``, ``env``,
    ``mem``)."""

    def _torch_mem_open(self, p) -> float:
        """Record what the rank holds for the whole schedule; return the weight copies that the
        schedule's end releases."""
        plan, tm = self.plan, self.plan.torch_memory
        last_vs = plan.pp * plan.virtual_stages - 1
        held = casts = 0.0
        for c in range(plan.chunks):
            vs = plan.vs_of(p.stage, c)
            held += tm.buffers(vs == 0, vs == last_vs)
            casts += tm.casts(len(plan.layers_of(p.stage, c)), vs == last_vs)
        if held + casts:
            self.mem.append((self.env.now, p.pid, held + casts, "activations"))
        return casts

    def _torch_mem_pass(self, p, vs: int, phase: str) -> None:
        """Record, at the end of a forward (``"F"``) or backward pass of virtual stage ``vs``,
        the kept stage output less the input that is a receive buffer, and in a forward of
        the last stage its logits (kept to the end of the step)."""
        plan, tm = self.plan, self.plan.torch_memory
        last = vs == plan.pp * plan.virtual_stages - 1
        d = tm.per_microbatch(vs == 0, last)
        if phase == "F":
            d += tm.logits if last else 0.0
        else:
            d = -d
        if d:
            self.mem.append((self.env.now, p.pid, d, "activations"))

    def _torch_mem_close(self, p, casts: float) -> None:
        """The schedule has returned: autocast's region ends and its weight copies go."""
        if casts:
            self.mem.append((self.env.now, p.pid, -casts, "activations"))
