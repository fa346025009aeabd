"""The SM clock of a power-limited GPU, for a mix of GEMMs and memory-bound kernels.

A GPU's board power is capped (``power_W``; the H100 SXM at 700 W). Dense bf16 GEMMs back to
back would draw more than the cap at the boost clock, so the power limiter lowers the SM clock
until they fit (data/measured/sustained-h100x4: 1,350-1,650 MHz of 1,980); the GEMM model's
``eta`` is fitted on such runs (simulator/hardware/data/README.md), i.e. at that clock. A
training step interleaves its GEMMs with memory-bound kernels that draw less: when the mix's
mean power at the boost clock stays under the cap the clock stays at boost, and the GEMMs run
faster than back to back (data/measured/stepmech-h100x4: shape AC's block GEMMs 2,630 us a
round back to back at 1,610 MHz, 2,375 us at 1,980 MHz with adds or idle time between them;
eager PyTorch steps at 1,926 MHz).

The power balance over a step's kernels (``power_clock`` in gpus.yaml, fitted by
simulator/calibrate/power.py), with ``g`` the share of the GPU's busy time in GEMMs and
attention (tensor cores) and ``1 - g`` in memory-bound kernels::

    P(f) = g P_gemm(f) + (1 - g) P_mem,     P_gemm(f) = P_gemm_max - slope (f_max - f)

The clock is ``f_max`` where ``P(f_max) <= power_W``, else the ``f`` where ``P(f) =
power_W``; GEMMs back to back (``g = 1``) give the clock ``f_s`` of the GEMM calibration. A
GEMM's time is ``(1 - c) + c f_max / f`` of its time at ``f_max`` (``c``, ``clock_share``: the
part of a GEMM that scales with the SM clock), so relative to the calibration it is
:func:`gemm_clock_factor`. Time the GPU idles or runs collectives is not counted (it would
lower the mean power further: a conservative bound)."""

from __future__ import annotations

from collections.abc import Mapping


def clock_mhz(pc: Mapping[str, float], power_w: float, gemm_share: float) -> float:
    """The SM clock (MHz) of a mix with ``gemm_share`` of its busy time in tensor-core
    kernels and the rest memory-bound, under a ``power_w`` cap."""
    f_max, p_max, p_mem, slope = (pc["clock_max_MHz"], pc["P_gemm_max_W"], pc["P_mem_W"],
                                  pc["slope_W_per_MHz"])
    g = min(1.0, max(0.0, gemm_share))
    if g == 0.0 or g * p_max + (1.0 - g) * p_mem <= power_w:
        return f_max
    p_gemm = (power_w - (1.0 - g) * p_mem) / g
    return f_max - (p_max - p_gemm) / slope


def gemm_clock_factor(pc: Mapping[str, float], power_w: float, gemm_share: float) -> float:
    """A GEMM's time in a mix of ``gemm_share`` relative to its time back to back (the
    calibration's clock); 1 where ``pc`` is empty (not measured)."""
    if not pc:
        return 1.0
    f_max, c = pc["clock_max_MHz"], pc["clock_share"]
    f = clock_mhz(pc, power_w, gemm_share)
    f_s = clock_mhz(pc, power_w, 1.0)

    def t(clock: float) -> float:
        return (1.0 - c) + c * f_max / clock

    return min(1.0, t(f) / t(f_s))
