"""Refit the kernel bands per octave of rows of an eager expert backward
(:data:`simulator.model.kernel_first.BANDS_PER_OCTAVE`): how many distinct cuBLAS kernels the
data-gradient GEMMs pick per octave of row counts above 64 rows.

Data: ``data/measured/gemm-drain-h100x4/drain-lazy.json`` (``benchmarks/device/gemm_drain.py``,
4x H100, cuBLAS 13, default settings): ``steps_alt.py``'s expert GEMMs at 160 row counts drawn
log-uniform in [1, 32768] for two expert widths (2304 x 4096 and 1792 x 3072), each call's
kernels named by a profiled replay. Used: the two data-gradient GEMMs (``b1x``, ``b2x``: the
``mm`` of each expert backward, whose first launches are the drains the model places), both
widths: four series.

The host's time after a drain (``DRAIN_S``): the median, over the calls of that file that
waited for the 8 ms spin kernel queued before them, of their host time beyond it.

The host's own work at a first launch (``FIRST_LAUNCH_S``, ``FIRST_LAUNCH_BEFORE``) from
``data/measured/gemm-first-launch-h100x4`` (the same sweeps with the GPU idle before every call,
four processes side by side, two seeds: the median host time of the calls of ``f1``, ``f2``,
``b2x``, ``b1x`` that launched a kernel new to the process, less the median of those at a new
row count that did not; the process's first call left out), and the share of it before the
wait: ``1 - (h3 - DRAIN_S) / FIRST_LAUNCH_S``, ``h3`` the median host time beyond a 3 ms spin
of the same calls behind one. ``KERNELS_PER_PASS``: in ``drain-lazy.json``, the first launches
of the forward pair (``f1``, ``f2``) and of the data-gradient pair (``b2x``, ``b1x``) over the
row counts at which the pair launched at least one (both widths).

Per series the sampled row counts ascending; a count *brings a kernel* if one of its kernels
(memsets aside) was not launched at a smaller sampled count. Bands of density ``c`` per octave
with a random phase put a band edge between two neighbouring samples ``log2`` apart by ``g``
with probability ``min(1, c g)``; so per octave ``o`` (by the upper sample of each pair) the
density is the ``c`` for which the expected edges equal the counts that brought a kernel,
pooled over the four series (bisection; 0 where none did). Kernels that reappear at higher
counts (above about 4,096 rows cuBLAS alternates among tiles it used below) bring nothing, so
the fitted densities there are low: what a process meets for the first time.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from functools import lru_cache

from simulator.calibrate import REPO
from simulator.model import kernel_first

DATA = REPO / "data/measured/gemm-drain-h100x4/drain-lazy.json"
IDLE = REPO / "data/measured/gemm-first-launch-h100x4"
PAIRS = (("f1", "f2"), ("b2x", "b1x"))
KINDS = ("b1x", "b2x")
OCTAVES = len(kernel_first.BANDS_PER_OCTAVE)


@lru_cache(maxsize=1)
def series() -> dict[tuple[str, str], list[tuple[int, frozenset]]]:
    """{(shape, kind): [(rows, kernels)] ascending by rows}, one entry per distinct count."""
    with open(DATA) as f:
        calls = json.load(f)["calls"]
    out: dict[tuple[str, str], dict[int, frozenset]] = defaultdict(dict)
    for c in calls:
        if c["op"] in KINDS and c["m"] >= 1:
            ks = frozenset(k for k in c["kernels"] if not k.startswith("Memset"))
            out[(c["shape"], c["op"])].setdefault(int(c["m"]), ks)
    return {k: sorted(v.items()) for k, v in sorted(out.items())}


def pairs() -> dict[int, list[tuple[float, bool]]]:
    """{octave: [(log2 gap, brought a kernel)]} over neighbouring samples above the fine
    range (octave of the upper sample)."""
    out: dict[int, list[tuple[float, bool]]] = defaultdict(list)
    lim = kernel_first.FINE_LIMIT
    for rows in series().values():
        seen: set[str] = set()
        prev = None
        for m, ks in rows:
            new = bool(ks - seen)
            seen |= ks
            if prev is not None and m > lim:
                o = min(int(math.floor(math.log2(m / lim))), OCTAVES - 1)
                out[o].append((math.log2(m / max(prev, lim)), new))
            prev = m
    return dict(out)


def density(gaps: list[tuple[float, bool]]) -> float:
    """The ``c`` with ``sum min(1, c g) = `` the pairs that brought a kernel."""
    target = sum(1 for _, n in gaps if n)
    if target == 0:
        return 0.0
    if target >= len(gaps):
        return 1.0 / min(g for g, _ in gaps)
    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if sum(min(1.0, mid * g) for g, _ in gaps) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def fit() -> tuple[float, ...]:
    """Bands per octave, rounded as shipped (3 decimals)."""
    p = pairs()
    return tuple(round(density(p.get(o, [])), 3) for o in range(OCTAVES))


def drain_s() -> float:
    """Median host time beyond the spin of the calls that waited for it (over half the spin,
    under twice: the process's first GEMM, cuBLASLt's start, left out), seconds, 3 digits."""
    with open(DATA) as f:
        d = json.load(f)
    spin = d["sleep_ms"]
    x = sorted(c["host_ms"] - spin for c in d["calls"] if spin / 2 < c["host_ms"] < 2 * spin)
    mid = len(x) // 2
    med = x[mid] if len(x) % 2 else 0.5 * (x[mid - 1] + x[mid])
    return float(f"{med * 1e-3:.3g}")


def _classed(path) -> list[tuple[dict, bool]]:
    """Every call of a ``gemm_drain.py`` file (the process's first left out) with whether it
    launched a kernel (memsets aside) the process had not launched before."""
    with open(path) as f:
        calls = json.load(f)["calls"]
    seen: set[str] = set()
    out = []
    for i, c in enumerate(calls):
        ks = {k for k in c["kernels"] if not k.startswith("Memset")}
        if i > 0:
            out.append((c, bool(ks - seen)))
        seen |= ks
    return out


def _median(x: list[float]) -> float:
    x = sorted(x)
    mid = len(x) // 2
    return x[mid] if len(x) % 2 else 0.5 * (x[mid - 1] + x[mid])


def first_launch_s() -> float:
    """The host's own work at a first launch beyond a call at a new row count (seconds, 3
    digits): the idle sweeps' medians (module docstring)."""
    ops = {o for p in PAIRS for o in p}
    new, plain = [], []
    for tag in ("idle", "idle-s1"):
        for c, n in _classed(IDLE / f"drain-{tag}.json"):
            if c["op"] in ops and c["phase"] == "new":
                (new if n else plain).append(c["host_ms"])
    return float(f"{(_median(new) - _median(plain)) * 1e-3:.3g}")


def first_launch_before() -> float:
    """The share of it before the wait for the GPU (2 decimals)."""
    ops = {o for p in PAIRS for o in p}
    x = [c["host_ms"] - 3.0 for c, n in _classed(IDLE / "drain-spin3.json")
         if n and c["op"] in ops and c["phase"] == "new"]
    after = max(0.0, _median(x) * 1e-3 - drain_s())
    return round(1.0 - after / first_launch_s(), 2)


def kernels_per_pass() -> float:
    """First launches an expert pass at a row count that brings a new kernel (3 decimals)."""
    with open(DATA) as f:
        calls = json.load(f)["calls"]
    seen: set[str] = set()
    per: dict[tuple, set] = defaultdict(set)
    for c in calls:
        ks = {k for k in c["kernels"] if not k.startswith("Memset")}
        if c["phase"] == "new" and ks - seen:
            per[(c["shape"], c["m"])].add(c["op"])
        seen |= ks
    hits = [len(v & set(p)) for v in per.values() for p in PAIRS if v & set(p)]
    return round(sum(hits) / len(hits), 3)


def refit() -> dict[str, tuple[float, float]]:
    return {"kernel_first.DRAIN_S": (drain_s(), kernel_first.DRAIN_S),
            "kernel_first.FIRST_LAUNCH_S": (first_launch_s(), kernel_first.FIRST_LAUNCH_S),
            "kernel_first.FIRST_LAUNCH_BEFORE": (first_launch_before(),
                                                 kernel_first.FIRST_LAUNCH_BEFORE),
            "kernel_first.KERNELS_PER_PASS": (kernels_per_pass(),
                                              kernel_first.KERNELS_PER_PASS)} | {f"kernel_first.BANDS_PER_OCTAVE[{o}] ({64 << o}-{128 << o} rows)": (new, old)
            for o, (new, old) in enumerate(zip(fit(), kernel_first.BANDS_PER_OCTAVE,
                                               strict=True))}
