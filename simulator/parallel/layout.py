"""Rank layout: which GPU plays which role in every parallel dimension, and the groups.

A layout is an ordered mapping of named dimensions to sizes, innermost (fastest varying) first.
Global rank ``r`` runs on GPU ``r`` (GPU ``g`` sits in node ``g // gpus_per_node``) and is a
mixed-radix number over the dimensions. With Megatron-LM's default order ``tp-cp-dp-pp``::

    r = t + tp * (c + cp * (d + dp * p))

so a TP group is ``tp`` consecutive GPUs (inside one NVLink domain when ``tp <= gpus_per_node``),
a CP group strides by ``tp`` (inside the domain too when ``tp * cp`` fits), a DP group by
``tp * cp`` and a PP group by ``tp * cp * dp``. Another order permutes the radices.

Nothing here names a dimension except the defaults: the dense part of a model uses
``tp, cp, dp, pp`` (:data:`DENSE_DIMS`), and a mixture-of-experts part can lay ``etp, ep, edp,
pp`` over the same GPUs as a second :class:`Layout` (MoE Parallel Folding). A group is the set
of ranks that differ only in the named dimension(s): :meth:`Layout.group`.

Pipeline stage ``p`` holds model chunks ``c = 0..v-1``; chunk ``c`` of stage ``p`` is virtual
stage ``c * pp + p`` (Megatron's interleaved assignment), which holds the layers given by
``stage_layers[c * pp + p]``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

#: Dimensions of the dense (attention + MLP) part, in Megatron-LM's default order.
DENSE_DIMS = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class Layout:
    """Named parallel dimensions over ``prod(sizes)`` GPUs.

    ``dims`` is the order, innermost first; ``sizes`` the size of each (same length). A
    dimension not in ``dims`` has size 1 (:meth:`size`), so code written for ``cp`` runs
    unchanged on a layout without it.
    """

    dims: tuple[str, ...]
    sizes: tuple[int, ...]
    virtual_stages: int = 1
    stage_layers: tuple[int, ...] | None = None  # per virtual stage

    @classmethod
    def of(
        cls,
        sizes: Mapping[str, int],
        order: Iterable[str] = DENSE_DIMS,
        *,
        virtual_stages: int = 1,
        stage_layers: tuple[int, ...] | None = None,
    ) -> Layout:
        """A layout from ``{dim: size}`` in ``order`` (dims of ``sizes`` missing from
        ``order`` are appended; dims of ``order`` missing from ``sizes`` have size 1)."""
        dims = [d for d in order] + [d for d in sizes if d not in order]
        return cls(tuple(dims), tuple(int(sizes.get(d, 1)) for d in dims), virtual_stages,
                   stage_layers)  # fmt: skip

    def size(self, dim: str) -> int:
        """Size of ``dim`` (1 for a dimension this layout does not have)."""
        return self._size.get(dim, 1)

    @cached_property
    def _size(self) -> dict[str, int]:
        return dict(zip(self.dims, self.sizes, strict=True))

    @property
    def n_gpus(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    @cached_property
    def _strides(self) -> dict[str, int]:
        strides, acc = {}, 1
        for dim, n in zip(self.dims, self.sizes, strict=True):
            strides[dim] = acc
            acc *= n
        return strides

    def rank(self, coords: Mapping[str, int]) -> int:
        """Global rank (= GPU index) of the given coordinates (absent dimensions: 0)."""
        s = self._strides
        return sum(i * s[d] for d, i in coords.items() if i)

    def coords(self, gpu: int) -> dict[str, int]:
        """Inverse of :meth:`rank`: ``{dim: index}`` of every dimension."""
        return {d: (gpu // self._strides[d]) % n for d, n in zip(self.dims, self.sizes, strict=True)}

    def group(self, dims: str | tuple[str, ...], coords: Mapping[str, int]) -> tuple[int, ...]:
        """The ranks that share ``coords`` in every dimension except ``dims``, which vary
        (the first of ``dims`` fastest). ``group("tp", {"dp": 3, "pp": 1})`` is a TP group,
        ``group(("cp", "dp"), c)`` the gradient-reduction group of context x data parallel."""
        dims = (dims,) if isinstance(dims, str) else dims
        base = self.rank({d: i for d, i in coords.items() if d not in dims})
        out = [base]
        for d in dims:
            stride, n = self._strides.get(d, 0), self.size(d)
            out = [r + i * stride for i in range(n) for r in out]
        return tuple(out)

    def groups(
        self, dims: str | tuple[str, ...], over: Mapping[str, Iterable[int]] | None = None
    ) -> list[tuple[int, ...]]:
        """Every group of ``dims`` whose other coordinates range over ``over`` (default:
        all values of every other dimension), in lexicographic order of those coordinates."""
        dims = (dims,) if isinstance(dims, str) else dims
        over = over or {}
        rest = [d for d in self.dims if d not in dims]
        ranges = [tuple(over.get(d, range(self.size(d)))) for d in rest]
        return [self.group(dims, dict(zip(rest, c, strict=True))) for c in itertools.product(*ranges)]

    def layers_of(self, stage: int, chunk: int = 0) -> range:
        """Global layer indices held by chunk ``chunk`` of pipeline stage ``stage``."""
        sl = self.stage_layers
        assert sl is not None
        vs = chunk * self.size("pp") + stage
        start = sum(sl[:vs])
        return range(start, start + sl[vs])

    def virtual_stage(self, stage: int, chunk: int) -> int:
        return chunk * self.size("pp") + stage

    @property
    def n_virtual(self) -> int:
        return self.size("pp") * self.virtual_stages
