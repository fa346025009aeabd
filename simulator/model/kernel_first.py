"""How many cuBLAS kernels an eager expert backward launches for the first time in a process
(issue 12; ``data/measured/gemm-drain-h100x4``).

cuBLAS (13, Hopper: ``nvjet_sm90_tst_*`` kernels run by cuBLASLt) makes the host wait until
the GPU has run everything queued when it launches a kernel the process has not launched
before (315 of 315 drains in 2,400 timed calls; a new row count whose kernel was launched
before never drains). Its heuristics pick the kernel of a GEMM from the row count ``M`` at a
fine grain: for the forward and data-gradient GEMMs a new tile every ``FINE_ROWS`` rows up to
``FINE_LIMIT``, then a number of kernel *bands* per octave of rows; the weight gradients use a
few kernels, met in any warm-up.

**The rule** (width-free, fitted on the data-gradient GEMMs of two expert widths by
``python -m simulator.calibrate kernel_bands``): the row counts ``1..FINE_LIMIT`` fall into
bands of ``FINE_ROWS`` rows; above, octave ``o`` (``FINE_LIMIT * 2^o`` to twice that) holds
``BANDS_PER_OCTAVE[o]`` bands of equal log-width (the last density beyond), each band one
kernel. A band's kernel is taken as new to the process once (kernels that reappear at higher
counts, seen above 4,096 rows, are counted by the fit as bands only where they first
appeared).

**The count.** An expert backward at row count ``M`` drains once if ``M``'s band is new (its
data gradients share ``M``; two new kernels in one expert backward drain once, measured), so
the expected drained expert backwards among steps ``first..last`` of a fresh process are the
expected distinct bands of :mod:`.shape_cache`'s row-count streams, ``D(last) - D(first -
1)``, with the streams' probabilities summed per band. The expert forwards meet their own kernels
(``addmm`` with bias) at as many new bands (:data:`FORWARD`).

**The cost** (``data/measured/gemm-first-launch-h100x4``). A first launch is not only a wait:
cuBLASLt works on the host for :data:`FIRST_LAUNCH_S` (2.4 ms) before it waits for the GPU
to drain, then returns :data:`DRAIN_S` after it. An expert pass at a new band launches
:data:`KERNELS_PER_PASS` new kernels: the first one's work comes before the wait (hidden where
the GPU is far enough behind: a backward with the exchange queued), the others' after it, with
the GPU idle (:func:`launch_work`). The wait itself follows the queued all-to-all, so it ends
when the last rank of the group has issued its own (measured, ``gemm_drain_a2a.py``).

Pure functions, numpy only."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from simulator.model.shape_cache import Stream, count_pmf, step_weights

#: rows a kernel band spans up to :data:`FINE_LIMIT` (kernel-map.txt: ``[1-8] [9-16] ...``)
FINE_ROWS = 8
FINE_LIMIT = 64
#: kernel bands per octave of rows above :data:`FINE_LIMIT` (octaves 64-128, 128-256, ...),
#: refitted by ``python -m simulator.calibrate kernel_bands``
BANDS_PER_OCTAVE = (4.86, 7.946, 9.859, 13.011, 11.259, 5.361, 6.436, 1.682, 0.808)

#: the host's time after the GPU has drained, to the end of the call (median of the drained
#: calls of ``drain-lazy.json``, beyond their 8 ms spin; cuBLASLt's 91-136 ms start excluded)
DRAIN_S = 4.97e-05

#: the host's own work at a kernel's first launch beyond an ordinary call at a new row count
#: (seconds a kernel: cuBLASLt's, inside the call), measured with the GPU idle
#: (data/measured/gemm-first-launch-h100x4: 2.3-2.9 ms a call against 0.15-0.19 ms; an 8 ms
#: spin before the call hid it from gemm-drain-h100x4), and the share of it that comes before
#: the call's wait for the GPU (behind a 1 ms spin the call takes as long as idle, behind a
#: 3 ms spin it returns 0.07 ms after the spin)
FIRST_LAUNCH_S = 2.44e-03
FIRST_LAUNCH_BEFORE = 0.99
#: first launches in an expert pass (forward: ``f1``, ``f2``; backward: ``b2x``, ``b1x``) at
#: a row count that brings a new kernel (gemm-drain-h100x4's sweep, both widths)
KERNELS_PER_PASS = 1.419
#: the expert forwards launch their own kernels (``addmm`` with bias) at a new band as often
#: as the backwards (50-53 first launches each of f1, f2, b2x, b1x in gemm-drain-h100x4's
#: 160 counts): the engine places as many first launches in the layer forwards
FORWARD = True


def launch_work(per_kernel: float | None = None, before: float | None = None,
                kernels: float | None = None) -> tuple[float, float]:
    """(before the wait, after it): the host's first-launch work in one pass at a new band.
    The pass's first kernel's work comes ``before`` before the wait; the other kernels'
    (``kernels - 1`` a pass) follow the drain with the GPU idle."""
    x = FIRST_LAUNCH_S if per_kernel is None else per_kernel
    b = FIRST_LAUNCH_BEFORE if before is None else before
    k = KERNELS_PER_PASS if kernels is None else kernels
    return b * x, (1.0 - b) * x + max(0.0, k - 1.0) * x


def band_of(m: np.ndarray, per_octave: Sequence[float] = BANDS_PER_OCTAVE,
            fine_rows: int = FINE_ROWS, fine_limit: int = FINE_LIMIT) -> np.ndarray:
    """The kernel band of each row count ``m >= 1`` (integers; band ids increase with ``m``)."""
    m = np.asarray(m, dtype=float)
    fine = np.ceil(m / fine_rows)
    x = np.log2(np.maximum(m, fine_limit) / fine_limit)  # octaves above the fine range
    dens = np.asarray(per_octave, dtype=float)
    cum = np.concatenate(([0.0], np.cumsum(dens)))
    o = np.minimum(np.floor(x).astype(int), len(dens) - 1)
    pos = cum[o] + (x - o) * dens[o]  # bands passed since fine_limit
    coarse = math.ceil(fine_limit / fine_rows) + np.floor(pos + 0.5)
    return np.where(m <= fine_limit, fine, np.maximum(coarse, math.ceil(fine_limit / fine_rows)))


def expected_bands(streams: Sequence[Stream], steps: float,
                   per_octave: Sequence[float] = BANDS_PER_OCTAVE) -> float:
    """Expected number of distinct kernel bands among ``steps`` steps' draws of every stream
    (a zero-row call launches no GEMM)."""
    if steps <= 0 or not streams:
        return 0.0
    size = max(s.n for s in streams) + 1
    bands = band_of(np.arange(1, size), per_octave).astype(int)
    nb = int(bands.max()) + 1
    log_miss = np.zeros(nb)
    for s in streams:
        for rho, draws in step_weights(s, steps):
            pmf = count_pmf(s.n, s.p, rho)[1:]
            pb = np.bincount(bands[: s.n], weights=pmf, minlength=nb)
            with np.errstate(divide="ignore"):
                log_miss += draws * np.log1p(-np.minimum(pb, 1.0))
    return float(np.sum(-np.expm1(log_miss)))


def first_launches(streams: Sequence[Stream], first: int, last: int,
                   per_octave: Sequence[float] = BANDS_PER_OCTAVE) -> float:
    """Expected expert backwards a step that launch a kernel new to the process, over steps
    ``first..last`` (1-based) of a fresh process: ``(D(last) - D(first - 1)) / steps``."""
    steps = last - first + 1
    if steps <= 0:
        return 0.0
    return (expected_bands(streams, last, per_octave)
            - expected_bands(streams, first - 1, per_octave)) / steps
