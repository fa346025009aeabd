"""Per-GPU kernel-time model: GEMMs, flash attention and memory-bound kernels.

The times are those of the kernels themselves on a GPU stream (what a profiler shows); the
gap between two kernels is :attr:`GPUSpec.kernel_launch_s`, which the caller adds per kernel.
Every parameter is read from the GPU's catalog entry (``data/gpus.yaml``), calibrated on the
measurements under ``data/<GPU>/`` by :func:`fit_gemm` / :func:`fit_attention` (command line:
``python -m simulator.hardware.compute check|fit``; see docs/ADDING_A_GPU.md).

GEMM ``[m,k] @ [k,n]`` (2mkn FLOPs), after the tiled outer-product picture of NVIDIA's *Matrix
Multiplication Background User's Guide* (DU-09799-001, sections 2.1 and 3: tile and wave
quantization) with a roofline (Williams et al., CACM 2009) for the operand traffic::

    t = t0 + (t_c^p + t_r^p)^(1/p) + write_exposed * t_w
    t_c = min over tiles (Tm,Tn) of  waves * 2 Tm Tn k / (P_sm eta e_tile)
    waves = floor(T / SMs) + min(1, (T mod SMs) / SMs * (1 + streamk_overhead)),
            T = ceil(m/Tm) ceil(n/Tn) output tiles
    e_tile = min(1, Tm Tn / (Tm + Tn) / tile_ai0)            # L2->SM operand bandwidth limit
    t_r = bytes(A) + bytes(B) over achievable HBM bandwidth;  t_w = bytes(C) likewise

A partial last wave either runs as a whole wave or, Stream-K style (Osama et al., PPoPP
2023), is spread over all SMs at a fix-up cost; ``p`` > 1 blends compute and operand reads
(p -> inf is the plain roofline maximum).

``P_sm`` is the dtype's dense peak divided by the SM count. Other dtypes than bf16 scale with
their own peak and the same ``eta``, except FP8 where the GPU gives ``eta_fp8`` (measured on
H100: per-tensor-scaled e4m3 GEMMs through cuBLASLt reach a lower fraction of their peak than
bf16 does, data/H100-SXM-80GB/gemm_fp8.jsonl); MXFP8 and NVFP4 efficiencies are assumed equal to
bf16's (not measured).

Flash attention (one pass), after FlashAttention-2's work partition (Dao 2023, arXiv
2307.08691, section 3.2): ``ceil(s/block)`` row tiles per (batch, head); with a causal mask
tile i sees about (i+1)*block keys. With ``w`` = keys seen plus ``block_overhead``::

    t = t0 + (sum_tiles w / SMs + tail * max_tile w) * 4 block (d + head_dim_overhead) f
             / (P_sm eta (128 + head_dim_overhead)/128)

with ``f`` = 1 forward and 2.5 backward, so that ``eta`` is the efficiency at head_dim 128 and
FLOPs follow the convention 4*b*h*s^2*d forward (halved when causal), 2.5x that backward.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from simulator.hardware.catalog import (
    DATA_DIR,
    AttentionPassParams,
    GemmParams,
    GPUSpec,
    load_gpu,
)

# operand element size, block scales included (MX: an E8M0 byte per 32; NVFP4: 4 bits and an
# E4M3 byte per 16); low-precision GEMMs write bf16
BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "mxfp8": 1 + 1 / 32, "nvfp4": 0.5 + 1 / 16, "tf32": 4}
OUT_BYTES = {"bf16": 2, "fp16": 2, "fp8": 2, "mxfp8": 2, "nvfp4": 2, "tf32": 4}
BWD_FACTOR = 2.5  # backward FLOPs / forward FLOPs (FlashAttention-2 convention)


class ComputeModel:
    """Kernel times of one GPU model. Cheap to call: results are memoised per shape."""

    def __init__(self, gpu: GPUSpec, attention_backend: str = "cudnn"):
        """``attention_backend``: ``cudnn`` prices flash attention with the GPU's calibrated
        ``attention`` kernels (cuDNN's, as PyTorch and Transformer Engine pick on Hopper),
        ``fa2`` with FlashAttention-2's (``attention_fa2``; ValueError where not measured)."""
        self.gpu = gpu
        self._bw = gpu.hbm_Bps
        self._gemm_p = gpu.gemm if gpu.gemm is not None else _default_gpu().gemm
        self._attn_p = gpu.attention if gpu.attention is not None else _default_gpu().attention
        if attention_backend == "fa2":
            if gpu.attention_fa2 is None:
                raise ValueError(f"no FlashAttention-2 parameters for {gpu.name}")
            self._attn_p = gpu.attention_fa2
        elif attention_backend != "cudnn":
            raise ValueError(f"unknown attention backend {attention_backend!r}")
        ai0 = self._gemm_p.tile_ai0
        # per tile: (Tm, Tn, 2 Tm Tn / e_tile) -- FLOP-equivalents of one k step
        self._tiles = tuple(
            (tm, tn, 2.0 * tm * tn / min(1.0, tm * tn / (tm + tn) / ai0))
            for tm, tn in self._gemm_p.tiles
        )
        # memoised per instance (the op graph asks for the same few shapes thousands of times)
        self._gemm_cached = functools.lru_cache(maxsize=1 << 16)(self._gemm_s)
        self._attn_cached = functools.lru_cache(maxsize=1 << 12)(self._attention_s)

    # -- GEMM ---------------------------------------------------------------------------------

    def gemm_s(self, m: int, k: int, n: int, dtype: str = "bf16", acc_bytes: int = 0) -> float:
        """Kernel time of ``[m,k] @ [k,n]`` (2mkn FLOPs) in seconds. ``acc_bytes`` > 0: the
        GEMM adds its output into a buffer of that many bytes an element (cuBLASLt with
        ``beta = 1`` and ``C = D``, as Transformer Engine's wgrad GEMMs accumulate into an fp32
        ``main_grad`` under Megatron's gradient-accumulation fusion): C is read and D
        written in the buffer's dtype, both counted with the operand reads in the roofline
        term (so a kernel never beats that traffic at the achievable HBM rate), beside the
        exposed share of an ordinary output's write that the fit saw."""
        return self._gemm_cached(m, k, n, dtype, acc_bytes)

    def _gemm_s(self, m: int, k: int, n: int, dtype: str = "bf16", acc_bytes: int = 0) -> float:
        if min(m, k, n) < 0:
            raise ValueError(f"negative GEMM dimension in [{m},{k}]@[{k},{n}]")
        if m == 0 or k == 0 or n == 0:
            return 0.0
        p = self._gemm_p
        sms = self.gpu.sm_count
        per_sm = self.gpu.peak_flops(dtype) / sms * p.eta_for(dtype)
        c = p.streamk_overhead
        best = math.inf
        for tm, tn, flop_per_k in self._tiles:
            full, rest = divmod(-(-m // tm) * (-(-n // tn)), sms)
            waves = full + min(1.0, rest / sms * (1.0 + c)) if rest else full
            best = min(best, waves * k * flop_per_k)
        t_c = best / per_sm
        t_r = (BYTES[dtype] * (m * k + k * n) + 2 * acc_bytes * m * n) / self._bw
        t_w = OUT_BYTES[dtype] * m * n / self._bw
        q = p.overlap_p
        return p.t0_s + (t_c**q + t_r**q) ** (1.0 / q) + p.write_exposed * t_w

    def gemm_efficiency(self, m: int, k: int, n: int, dtype: str = "bf16") -> float:
        """Achieved fraction of the dtype's dense peak for ``[m,k] @ [k,n]``."""
        t = self.gemm_s(m, k, n, dtype)
        return 0.0 if t == 0 else 2.0 * m * k * n / t / self.gpu.peak_flops(dtype)

    # -- attention ----------------------------------------------------------------------------

    def attention_s(
        self,
        batch: int,
        heads: int,
        seq: int,
        head_dim: int,
        *,
        kv_heads: int | None = None,
        causal: bool = True,
        backward: bool = False,
        dtype: str = "bf16",
        kv_seq: int | None = None,
        window: int | None = None,
    ) -> float:
        """Time of one flash-attention pass (``scaled_dot_product_attention``) in seconds.

        ``backward=False`` gives the forward kernel, ``backward=True`` the backward pass alone
        (its kernels: dO.O, the main kernel, the dQ conversion). ``kv_heads`` (GQA) changes only
        the bytes read, not the FLOPs. ``kv_seq`` (default ``seq``): keys per sequence, for a
        non-square block (context parallelism); a causal mask is aligned bottom-right (the
        queries are the last ``seq`` positions of the ``kv_seq`` keys). ``window``: a causal
        sliding window of that many keys per query (the kernel skips the tiles outside it;
        priced by the same per-key rule, :func:`_attention_time`).
        """
        kv_seq = seq if kv_seq is None or kv_seq == seq else kv_seq
        if window is not None and window >= kv_seq:
            window = None
        return self._attn_cached(
            batch, heads, seq, head_dim, kv_heads, causal, backward, dtype, kv_seq, window
        )

    def _attention_s(
        self,
        batch: int,
        heads: int,
        seq: int,
        head_dim: int,
        kv_heads: int | None,
        causal: bool,
        backward: bool,
        dtype: str,
        kv_seq: int | None = None,
        window: int | None = None,
    ) -> float:
        kv = heads if kv_heads is None else kv_heads
        kv_seq = seq if kv_seq is None else kv_seq
        if min(batch, heads, seq, head_dim, kv) < 0:
            raise ValueError("negative attention dimension")
        if min(batch, heads, seq, head_dim) == 0:
            return 0.0
        pp = self._attn_p.bwd if backward else self._attn_p.fwd
        t = _attention_time(
            pp,
            self.gpu.sm_count,
            self.gpu.peak_flops(dtype),
            batch * heads,
            seq,
            head_dim,
            causal,
            BWD_FACTOR if backward else 1.0,
            kv_seq,
            window,
        )
        # operands once through HBM: q, o (and dO, dQ) per query head; k, v (dK, dV) per kv head
        nbytes = BYTES[dtype] * batch * head_dim * (2 * heads * seq + 2 * kv * kv_seq)
        return max(t, pp.t0_s + (2 if backward else 1) * nbytes / self._bw)

    def attention_flops(
        self,
        batch: int,
        heads: int,
        seq: int,
        head_dim: int,
        *,
        causal: bool = True,
        backward: bool = False,
    ) -> float:
        """FLOPs of one pass by the convention above (4bhs^2d forward, halved if causal)."""
        f = 4.0 * batch * heads * seq * seq * head_dim * (0.5 if causal else 1.0)
        return f * (BWD_FACTOR if backward else 1.0)

    # -- memory-bound -------------------------------------------------------------------------

    def memory_s(self, nbytes: float, access: str = "stream") -> float:
        """Time of a memory-bound kernel moving ``nbytes`` (read + written) at achievable HBM
        bandwidth: datasheet ``hbm_TBps`` x measured ``hbm_efficiency`` (a streaming copy) x
        the measured relative bandwidth of the kernel's access class (``memory_access``:
        ``stream`` 1.0; row-wise norms, softmax, broadcasts, strided views, up-casts, mixed
        dtypes, concatenation and dropout run slower)."""
        rel = self.gpu.memory_access.get(access, 1.0) if access != "stream" else 1.0
        return max(0.0, float(nbytes)) / (self._bw * rel)


def _attention_time(
    pp: AttentionPassParams,
    sms: int,
    peak: float,
    bh: int,
    s: int,
    d: int,
    causal: bool,
    factor: float,
    kv: int | None = None,
    window: int | None = None,
) -> float:
    """Kernel time of one attention pass over ``bh`` (batch x heads) independent heads, ``s``
    queries against ``kv`` keys (default ``s``; causal: the queries are the last ``s``).
    ``window`` (causal): each query sees its last ``window`` keys, so a row tile sees at most
    ``window + block`` keys (its diagonal block and the window before it): the same cost per
    key seen as a causal kernel's, no source measured otherwise. With ``kv > s`` (a context-
    parallel chunk against the keys its window reaches, bottom-right aligned) tile ``i`` sees
    ``min(kv - s + (i+1) block, window + block)``."""
    blk = pp.block
    kv = s if kv is None else kv
    n = -(-s // blk)
    # keys seen, summed over row tiles: a causal tile sees the prefix and its diagonal
    keys = n * (kv - s) + blk * (n - 1) * n / 2 + s if causal else n * kv
    longest = kv
    if window is not None and causal and kv >= s:
        # tiles 0..k-1 see their whole prefix (kv - s + (i+1) blk keys), the others window + blk
        off = kv - s
        k = min(n, max(0, (window + blk - off) // blk))
        keys = min(keys, off * k + blk * k * (k + 1) / 2 + (n - k) * (window + blk))
        longest = min(kv, window + blk)
    total = bh * (keys + n * pp.block_overhead)
    longest = longest + pp.block_overhead
    unit = 4.0 * blk * (d + pp.head_dim_overhead) * factor  # FLOP-equivalents per key per tile
    rate = peak / sms * pp.eta * (128.0 + pp.head_dim_overhead) / 128.0
    return pp.t0_s + (total / sms + pp.tail * longest) * unit / rate


@functools.lru_cache(maxsize=1)
def _default_gpu() -> GPUSpec:
    return load_gpu("H100-SXM-80GB")


# ============================================================================================
# Calibration: reading measurements and fitting parameters


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines file (a relative path is taken under ``data/``)."""
    p = Path(path)
    if not p.is_absolute() and not p.exists():
        p = DATA_DIR / p
    with open(p) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def gemm_rows(
    records: Iterable[Mapping[str, Any]],
    tag: str | None = None,
    time_key: str = "time_s",
    min_time_s: float = 0.0,
    dtype: str = "bf16",
) -> list[tuple]:
    """``(m, k, n, time)`` of the GEMM records of ``dtype`` (those with ``tag`` when given, and
    a ``time_key`` of at least ``min_time_s``)."""
    return [
        (r["m"], r["k"], r["n"], r[time_key])
        for r in records
        if "m" in r
        and r.get("dtype", "bf16") == dtype
        and (tag is None or r.get("tag") == tag)
        and r[time_key] >= min_time_s
    ]


def attention_rows(records: Iterable[Mapping[str, Any]], backward: bool) -> list[tuple]:
    """``(batch*heads, seq, head_dim, time_s)`` of the causal SDPA records.

    The backward time is ``bwd_s`` where measured alone, else ``fwdbwd_s - fwd_s``.
    """
    out = []
    for r in records:
        if r.get("op") != "sdpa_causal":
            continue
        t = (r["bwd_s"] if "bwd_s" in r else r["fwdbwd_s"] - r["fwd_s"]) if backward else r["fwd_s"]
        out.append((r["batch"] * r["heads"], r["seq"], r["head_dim"], t))
    return out


@dataclass
class Dataset:
    """Measurements of one kind (GEMM, or one attention pass) from one file, for fitting.

    ``timing_overhead_s``: host time included in each measured time (a number, or ``None`` to
    fit it: files timed by synchronising around each call carry tens of microseconds).
    ``own_eta``: fit an ``eta`` for this file alone (a nuisance for a file taken in another
    thermal/clock state), so that it informs only the shape parameters.
    """

    label: str
    gpu: GPUSpec
    rows: Sequence[tuple]
    timing_overhead_s: float | None = 0.0
    own_eta: bool = False


@dataclass
class FitResult:
    """Fitted parameters and the resulting errors (abs % of measured time) per dataset."""

    params: dict[str, float]
    etas: dict[str, float]
    overheads_s: dict[str, float]
    errors: dict[str, dict[str, float]] = field(default_factory=dict)


_BOUNDS = {
    "eta": (0.2, 1.5),
    "t0_s": (0.0, 5e-5),
    "write_exposed": (0.0, 1.5),
    "overlap_p": (1.0, 20.0),
    "tile_ai0": (1.0, 400.0),
    "streamk_overhead": (0.0, 3.0),
    "block_overhead": (0.0, 4096.0),
    "head_dim_overhead": (0.0, 512.0),
    "tail": (0.0, 1.0),
    "overhead": (0.0, 4e-4),
}


def gemm_times(
    gpu: GPUSpec, params: GemmParams, rows: Sequence[tuple], dtype: str = "bf16"
) -> np.ndarray:
    """Model times of ``rows`` ``(m, k, n, ...)``, vectorised; same formula as gemm_s."""
    a = np.asarray([r[:3] for r in rows], dtype=float)
    m, k, n = a[:, 0], a[:, 1], a[:, 2]
    sms = gpu.sm_count
    per_sm = gpu.peak_flops(dtype) / sms * params.eta_for(dtype)
    best = np.full(len(a), np.inf)
    c = params.streamk_overhead
    for tm, tn in params.tiles:
        e = min(1.0, tm * tn / (tm + tn) / params.tile_ai0)
        tiles = np.ceil(m / tm) * np.ceil(n / tn)
        full = np.floor(tiles / sms)
        rest = tiles - full * sms
        waves = full + np.minimum(1.0, rest / sms * (1.0 + c))
        best = np.minimum(best, waves * k * 2.0 * tm * tn / e)
    t_c = best / per_sm
    bw = gpu.hbm_Bps
    t_r = BYTES[dtype] * (m * k + k * n) / bw
    q = params.overlap_p
    return (params.t0_s + (t_c**q + t_r**q) ** (1 / q)
            + params.write_exposed * OUT_BYTES[dtype] * m * n / bw)


def attention_times(
    gpu: GPUSpec, pp: AttentionPassParams, rows: Sequence[tuple], backward: bool
) -> np.ndarray:
    """Model times of ``rows`` ``(batch*heads, seq, head_dim, ...)``, causal bf16."""
    f = BWD_FACTOR if backward else 1.0
    peak = gpu.peak_flops("bf16")
    return np.asarray(
        [_attention_time(pp, gpu.sm_count, peak, bh, s, d, True, f) for bh, s, d, *_ in rows]
    )


def fit_gemm(datasets: Sequence[Dataset], fit: Sequence[str] = ("eta",)) -> FitResult:
    """Least-squares fit (on log time) of GEMM parameters named in ``fit``.

    ``eta`` is fitted per GPU (datasets of one GPU share it) and other names are shared by all
    datasets; each dataset's nuisance parameters (``timing_overhead_s=None``, ``own_eta``) are
    fitted alongside. Starts from, and keeps unfitted values of, each dataset's catalog GPU.
    """
    return _fit(datasets, fit, lambda gpu, p, rows: gemm_times(gpu, p, rows), "gemm")


def fit_gemm_fp8(datasets: Sequence[Dataset], fit: Sequence[str] = ("eta",)) -> FitResult:
    """Fit ``eta_fp8`` per GPU on FP8 GEMM rows (reported as ``eta``), the shape parameters
    kept as calibrated on bf16 (the same tiling, with 1-byte operands); ``fit=()`` only
    evaluates the catalog's value."""
    return _fit(datasets, fit, lambda gpu, p, rows: gemm_times(gpu, p, rows, "fp8"), "gemm_fp8")


def fit_gemm_mxfp8(datasets: Sequence[Dataset], fit: Sequence[str] = ("eta",)) -> FitResult:
    """Like :func:`fit_gemm_fp8` on MXFP8 rows (operands of 1 + 1/32 bytes, the MXFP8 peak):
    the eta they give, starting from the catalog's ``eta_fp8``."""
    return _fit(datasets, fit, lambda gpu, p, rows: gemm_times(gpu, p, rows, "mxfp8"), "gemm_fp8")


def fit_attention(
    datasets: Sequence[Dataset], backward: bool, fit: Sequence[str] = ("eta",)
) -> FitResult:
    """Like :func:`fit_gemm` for one flash-attention pass (rows from :func:`attention_rows`)."""
    return _fit(
        datasets,
        fit,
        lambda gpu, p, rows: attention_times(gpu, p, rows, backward),
        "attention.bwd" if backward else "attention.fwd",
    )


def _params_of(gpu: GPUSpec, kind: str) -> Any:
    if kind == "gemm":
        return gpu.gemm
    if kind == "gemm_fp8":  # the fitted "eta" is the FP8 one
        return replace(gpu.gemm, eta=gpu.gemm.eta_for("fp8"), eta_fp8=None)
    return gpu.attention.bwd if kind.endswith("bwd") else gpu.attention.fwd


def _fit(
    datasets: Sequence[Dataset],
    fit: Sequence[str],
    model: Callable[[GPUSpec, Any, Sequence[tuple]], np.ndarray],
    kind: str,
) -> FitResult:
    base0 = _params_of(datasets[0].gpu, kind)
    allowed = {f.name for f in fields(base0)} - {"tiles", "block"}
    bad = [f for f in fit if f not in allowed]
    if bad:
        raise ValueError(f"cannot fit {bad} (fittable: {sorted(allowed)})")
    shared = [f for f in fit if f != "eta"]
    groups = []  # eta groups: one per GPU, one per own-eta dataset
    for ds in datasets:
        g = ds.label if ds.own_eta else ds.gpu.name
        if g not in groups and (ds.own_eta or "eta" in fit):
            groups.append(g)
    names = [("p", s) for s in shared] + [("eta", g) for g in groups]
    names += [("ov", ds.label) for ds in datasets if ds.timing_overhead_s is None]
    lo = np.array(
        [
            _BOUNDS["overhead" if kd == "ov" else ("eta" if kd == "eta" else nm)][0]
            for kd, nm in names
        ]
    )
    hi = np.array(
        [
            _BOUNDS["overhead" if kd == "ov" else ("eta" if kd == "eta" else nm)][1]
            for kd, nm in names
        ]
    )
    x0 = []
    for kd, nm in names:
        if kd == "p":
            x0.append(getattr(base0, nm))
        elif kd == "eta":
            ds = next(d for d in datasets if (d.label if d.own_eta else d.gpu.name) == nm)
            x0.append(_params_of(ds.gpu, kind).eta)
        else:
            x0.append(2e-5)
    measured = [np.asarray([r[-1] for r in ds.rows]) for ds in datasets]

    def unpack(x: np.ndarray) -> tuple[list[Any], list[float]]:
        vals = dict(zip(names, x, strict=True))
        plist, ovs = [], []
        for ds in datasets:
            p = _params_of(ds.gpu, kind)
            upd = {nm: vals[("p", nm)] for nm in shared}
            g = ds.label if ds.own_eta else ds.gpu.name
            if ("eta", g) in vals:
                upd["eta"] = vals[("eta", g)]
            plist.append(replace(p, **upd))
            ovs.append(vals.get(("ov", ds.label), ds.timing_overhead_s or 0.0))
        return plist, ovs

    def loss(x: np.ndarray) -> float:
        plist, ovs = unpack(x)
        tot, cnt = 0.0, 0
        for ds, p, ov, t in zip(datasets, plist, ovs, measured, strict=True):
            r = np.log((model(ds.gpu, p, ds.rows) + ov) / t)
            tot += float(r @ r)
            cnt += len(r)
        return tot / cnt

    x = _nelder_mead_bounded(loss, np.asarray(x0, float), lo, hi) if names else np.zeros(0)
    plist, ovs = unpack(x)
    res = FitResult(
        params={nm: float(v) for (kd, nm), v in zip(names, x, strict=True) if kd == "p"},
        etas={nm: float(v) for (kd, nm), v in zip(names, x, strict=True) if kd == "eta"},
        overheads_s={ds.label: float(ov) for ds, ov in zip(datasets, ovs, strict=True)},
    )
    for ds, p, ov, t in zip(datasets, plist, ovs, measured, strict=True):
        res.errors[ds.label] = _error_stats((model(ds.gpu, p, ds.rows) + ov) / t - 1.0)
    return res


def _error_stats(rel: np.ndarray) -> dict[str, float]:
    a = np.abs(rel) * 100
    return {
        "n": float(len(a)),
        "mean_abs_pct": float(a.mean()),
        "max_abs_pct": float(a.max()),
        "bias_pct": float(rel.mean() * 100),
    }


def _nelder_mead_bounded(
    f: Callable[[np.ndarray], float],
    x0: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    iters: int = 6000,
    restarts: int = 3,
) -> np.ndarray:
    """Minimise ``f`` within [lo, hi] by Nelder-Mead (Nelder & Mead, Comput. J. 1965) on the
    logit of the box coordinates; restarted from the best point to escape a collapsed simplex."""
    span = hi - lo

    def to_x(u: np.ndarray) -> np.ndarray:
        return lo + span / (1.0 + np.exp(-u))

    z = np.clip((x0 - lo) / span, 1e-4, 1 - 1e-4)
    u = np.log(z / (1 - z))
    g = lambda v: f(to_x(v))  # noqa: E731
    dim = len(u)
    for _ in range(restarts):
        simplex = np.vstack([u] + [u + 0.8 * np.eye(dim)[i] for i in range(dim)])
        vals = np.array([g(s) for s in simplex])
        for _ in range(iters):
            order = np.argsort(vals)
            simplex, vals = simplex[order], vals[order]
            if vals[-1] - vals[0] < 1e-12 and np.ptp(simplex, axis=0).max() < 1e-7:
                break
            centroid = simplex[:-1].mean(axis=0)
            xr = centroid + (centroid - simplex[-1])
            fr = g(xr)
            if fr < vals[0]:
                xe = centroid + 2.0 * (centroid - simplex[-1])
                fe = g(xe)
                simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
            elif fr < vals[-2]:
                simplex[-1], vals[-1] = xr, fr
            else:
                xc = centroid + 0.5 * (simplex[-1] - centroid)
                fc = g(xc)
                if fc < vals[-1]:
                    simplex[-1], vals[-1] = xc, fc
                else:
                    simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                    vals[1:] = [g(s) for s in simplex[1:]]
        u = simplex[int(np.argmin(vals))]
    return to_x(u)


# ============================================================================================
# Calibration sets declared in gpus.yaml, and the command line


def calibration_sets(gpu: GPUSpec, kind: str, role: str = "fit") -> list[Dataset]:
    """Datasets of ``kind`` (``gemm``, ``attention.fwd``, ``attention.bwd``) declared in the
    GPU's ``calibration`` entries with the given ``role`` (``fit`` or ``test``)."""
    out = []
    for c in gpu.calibration:
        if c.get("role", "fit") != role or kind.split(".")[0] not in c.get("use", ("gemm",)):
            continue
        recs = read_jsonl(c["file"])
        if kind in ("gemm", "gemm_fp8"):
            rows = gemm_rows(recs, c.get("tag"), c.get("time_key", "time_s"),
                             c.get("min_time_s", 0.0), "fp8" if kind == "gemm_fp8" else "bf16")
        else:
            rows = attention_rows(recs, kind.endswith("bwd"))
        # timings of a GPU at its burst clocks (one call from an idle GPU): the sustained time
        # under the power cap, which a training step runs at, is the burst time over the rate
        # ratio the entry gives (``sustained_rate``: sustained / burst throughput, cited there)
        r = float(c.get("sustained_rate", 1.0))
        if not 0.0 < r <= 1.0:
            raise ValueError(f"{gpu.name} calibration {c['file']}: sustained_rate {r!r} "
                             "not in (0, 1]")
        if r != 1.0:
            rows = [(*row[:-1], row[-1] / r) for row in rows]
        ov = c.get("timing_overhead_s", 0.0)
        label = f"{gpu.name}:{c['file']}" + (f"[{c['tag']}]" if c.get("tag") else "")
        label += f"({c['time_key']})" if "time_key" in c else ""
        out.append(
            Dataset(
                label, gpu, rows, None if ov == "fit" else float(ov), c.get("eta", "gpu") == "own"
            )
        )
    return out


def check(gpu_names: Sequence[str], out=sys.stdout) -> dict[str, dict[str, dict[str, float]]]:
    """Errors of the catalog parameters on every declared calibration/test file.

    Only each file's nuisance parameters (timing overhead, own eta) are fitted here."""
    report: dict[str, dict[str, dict[str, float]]] = {}
    for name in gpu_names:
        gpu = load_gpu(name)
        for kind in ("gemm", "gemm_fp8", "attention.fwd", "attention.bwd"):
            for role in ("fit", "test"):
                for ds in calibration_sets(gpu, kind, role):
                    if kind == "gemm_fp8":
                        r = fit_gemm_fp8([ds], fit=())
                    elif kind == "gemm":
                        r = fit_gemm([ds], fit=())
                    else:
                        r = fit_attention([ds], kind.endswith("bwd"), fit=())
                    e = r.errors[ds.label]
                    report.setdefault(kind, {})[f"{ds.label} ({role})"] = e
                    extra = f" eta={r.etas[ds.label]:.3f}" if ds.own_eta else ""
                    print(
                        f"{kind:14s} {role:4s} {ds.label:55s} n={e['n']:3.0f} "
                        f"mean {e['mean_abs_pct']:4.1f}% max {e['max_abs_pct']:5.1f}% "
                        f"bias {e['bias_pct']:+5.1f}% overhead "
                        f"{r.overheads_s[ds.label] * 1e6:5.1f} us{extra}",
                        file=out,
                    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``check``: errors of the catalog on its files; ``fit``: refit and print YAML."""
    ap = argparse.ArgumentParser(prog="python -m simulator.hardware.compute")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="errors of the catalog parameters on the measured files")
    c.add_argument("gpus", nargs="*", help="GPU names (default: those with calibration files)")
    f = sub.add_parser("fit", help="fit parameters on the GPUs' declared calibration files")
    f.add_argument("gpus", nargs="+", help="GPU names; eta per GPU, other parameters shared")
    f.add_argument("--kind", choices=["gemm", "gemm_fp8", "attention.fwd", "attention.bwd"],
                   default="gemm")
    f.add_argument("--fit", default="eta", help="comma-separated parameter names")
    args = ap.parse_args(argv)
    if args.cmd == "check":
        from simulator.hardware.catalog import gpu_names

        names = args.gpus or [n for n in gpu_names() if load_gpu(n).calibration]
        check(names)
        return 0
    sets = [ds for n in args.gpus for ds in calibration_sets(load_gpu(n), args.kind)]
    fit = [s for s in args.fit.split(",") if s]
    if args.kind == "gemm":
        res = fit_gemm(sets, fit)
    elif args.kind == "gemm_fp8":
        res = fit_gemm_fp8(sets)
    else:
        res = fit_attention(sets, args.kind.endswith("bwd"), fit)
    print(f"# {args.kind}: shared parameters, then eta per GPU / own-eta file")
    for k, v in res.params.items():
        print(f"{k}: {v:.6g}")
    for k, v in res.etas.items():
        print(f"eta[{k}]: {v:.4f}")
    for k, v in res.overheads_s.items():
        print(f"# timing overhead {k}: {v * 1e6:.1f} us")
    for k, e in res.errors.items():
        print(
            f"# {k}: n={e['n']:.0f} mean {e['mean_abs_pct']:.1f}% max {e['max_abs_pct']:.1f}% "
            f"bias {e['bias_pct']:+.1f}%"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
