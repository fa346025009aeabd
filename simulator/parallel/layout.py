"""Rank layout: which GPU plays which (tp, dp, pp) role, and the process groups.

Global rank ``r`` runs on GPU ``r`` (GPU ``g`` sits in node ``g // gpus_per_node``). The rank is
a mixed-radix number over the parallel dimensions, innermost (fastest varying) first. With the
default order ``(tp, dp, pp)`` -- Megatron-LM's ``tp-dp-pp`` -- ::

    r = t + tp * (d + dp * p)

so a TP group is ``tp`` consecutive GPUs (inside one NVLink domain when ``tp <= gpus_per_node``),
a DP group strides by ``tp`` and a PP group by ``tp * dp``. Another order permutes the radices.

Pipeline stage ``p`` holds model chunks ``c = 0..v-1``; chunk ``c`` of stage ``p`` is virtual
stage ``c * pp + p`` (Megatron's interleaved assignment), which holds the layers given by
``stage_layers[c * pp + p]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Layout:
    """A (tp, dp, pp) layout over ``tp * dp * pp`` GPUs."""

    tp: int
    dp: int
    pp: int
    order: tuple[str, ...] = ("tp", "dp", "pp")
    virtual_stages: int = 1
    stage_layers: tuple[int, ...] | None = None  # per virtual stage

    @property
    def n_gpus(self) -> int:
        return self.tp * self.dp * self.pp

    @cached_property
    def _strides(self) -> dict[str, int]:
        sizes = {"tp": self.tp, "dp": self.dp, "pp": self.pp}
        strides, acc = {}, 1
        for dim in self.order:
            strides[dim] = acc
            acc *= sizes[dim]
        return strides

    def rank(self, t: int, d: int, p: int) -> int:
        """Global rank (= GPU index) of TP rank ``t``, DP replica ``d``, stage ``p``."""
        s = self._strides
        return t * s["tp"] + d * s["dp"] + p * s["pp"]

    def coords(self, gpu: int) -> tuple[int, int, int]:
        """Inverse of :meth:`rank`: ``(t, d, p)``."""
        s = self._strides
        return (
            (gpu // s["tp"]) % self.tp,
            (gpu // s["dp"]) % self.dp,
            (gpu // s["pp"]) % self.pp,
        )

    def tp_group(self, d: int, p: int) -> tuple[int, ...]:
        return tuple(self.rank(t, d, p) for t in range(self.tp))

    def dp_group(self, t: int, p: int) -> tuple[int, ...]:
        return tuple(self.rank(t, d, p) for d in range(self.dp))

    def pp_group(self, t: int, d: int) -> tuple[int, ...]:
        return tuple(self.rank(t, d, p) for p in range(self.pp))

    def layers_of(self, stage: int, chunk: int = 0) -> range:
        """Global layer indices held by chunk ``chunk`` of pipeline stage ``stage``."""
        sl = self.stage_layers
        assert sl is not None
        vs = chunk * self.pp + stage
        start = sum(sl[:vs])
        return range(start, start + sl[vs])

    def virtual_stage(self, stage: int, chunk: int) -> int:
        return chunk * self.pp + stage

    @property
    def n_virtual(self) -> int:
        return self.pp * self.virtual_stages
