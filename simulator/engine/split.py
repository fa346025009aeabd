"""A backward pass split into input gradients and weight gradients (DualPipe's ``I`` and
``W``; zero-bubble pipeline schedules, Qi et al. 2023, arXiv:2401.10241).

A layer's backward program lists each GEMM's ``_dgrad`` and ``_wgrad`` kernels
(:func:`simulator.model.ops.gemm_grads`). The input-gradient pass runs everything but the
``_wgrad`` kernels (recomputation, the dgrads, attention's and the norms' backward, the EP
all-to-alls), so the gradient for the previous stage can be sent as soon as it is done; the
weight-gradient pass runs the ``_wgrad`` kernels later, in the order the schedule puts it. A
segment without any ``_wgrad`` kernel (the embedding's gradient, a scatter-add) stays whole
in the input-gradient pass.

Segment labels say which is which: ``L<i> dgrad`` / ``head dgrad`` in the input pass,
``L<i> wgrad`` / ``head wgrad`` in the weight pass; a unit's gradients are complete after its
full backward (``L<i> bwd``, ``head``, ``embed``) or its weight pass (:func:`grads_done`).
What it leaves out: the activations a deferred W still needs (its layer inputs and output
gradients) are freed with the input pass, as a full backward frees them.
"""

from __future__ import annotations

from simulator.engine.program import Program


def unit_of(label: str) -> str:
    """The unit a segment label belongs to: ``L3``, ``head``, ``embed``."""
    return label.split(" ", 1)[0]


def grads_done(label: str) -> bool:
    """Whether a backward segment completes its unit's weight gradients (not a recompute,
    not an input-gradient pass whose weight pass comes later)."""
    return "recompute" not in label and not label.endswith(" dgrad")


def is_wgrad(name: str) -> bool:
    """Whether a kernel computes weight gradients (deferred to the W pass)."""
    return name.endswith("_wgrad")


def split_segments(segs) -> tuple[list, list]:
    """A backward pass's ``(label, layer, program)`` segments as (input-gradient pass,
    weight-gradient pass) (module docstring)."""
    inputs, weights = [], []
    for label, layer, prog in segs:
        w: Program = tuple(q for q in prog if is_wgrad(q.name))
        if "recompute" in label or not w:
            inputs.append((label, layer, prog))
            continue
        unit = unit_of(label)
        inputs.append((f"{unit} dgrad", layer, tuple(q for q in prog if not is_wgrad(q.name))))
        weights.append((f"{unit} wgrad", layer, w))
    return inputs, weights


class SplitBackward:
    """The engine's segments per pass (a mixin of :class:`~simulator.engine.sim.Engine`: it
    uses ``_chunk_segments``, ``_segs_cache``, ``_segs_comm``, ``_has_comm`` and ``derived``)."""

    def _phase_segments(self, p, chunk: int, phase: str) -> list:
        """The segments of pass ``phase`` (``F``, ``B``, or DualPipe's ``I`` and ``W``) of
        model chunk ``chunk`` on ``p`` (built once per process, chunk and pass)."""
        if phase in ("F", "B"):
            return self._chunk_segments(p, chunk, phase)
        key = (p.pid, chunk, phase)
        hit = self._segs_cache.get(key)
        if hit is None:
            inputs, weights = split_segments(self._chunk_segments(p, chunk, "B"))
            for segs, ph in ((inputs, "I"), (weights, "W")):
                self._segs_cache[(p.pid, chunk, ph)] = segs
                self._segs_comm[id(segs)] = self._has_comm(segs)
                for _, _, prog in segs:
                    self.derived[(p.pid, id(prog))] = prog
            hit = self._segs_cache[key]
        return hit
