"""GPU hardware catalog: one immutable description per GPU model.

Every figure lives in ``data/gpus.yaml`` next to its source (datasheet, whitepaper or a measured
file under ``data/<GPU>/``); this module only loads, overrides and validates them. The same
description serves every workload: the kernel-time model in :mod:`simulator.hardware.compute`
reads its calibrated parameters (``gemm``, ``attention``) from here and nothing else.

Units are in the field names and are decimal for rates (``hbm_TBps``: 1e12 B/s,
``nvlink_GBps``: 1e9 B/s) and binary for capacity (``hbm_GiB``: 2**30 B), as the vendors and
``nvidia-smi`` print them.

A GPU is named three ways (:func:`load_gpu`):

* a catalog name: ``"H100-SXM-80GB"``;
* a base plus overrides: ``{"base": "H100-SXM-80GB", "hbm_GiB": 94, "gemm": {"eta": 0.7}}``
  (mappings such as ``peak_tflops``, ``sources``, ``gemm`` merge key by key);
* a full inline mapping with every required field (``gemm``/``attention`` default to the
  catalog's generic parameters, ``sm_count`` to 132).
"""

from __future__ import annotations

import difflib
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from simulator.config.yaml_safe import read_package_yaml
from simulator.errors import ConfigError

DATA_DIR = Path(__file__).parent / "data"
CATALOG_FILE = DATA_DIR / "gpus.yaml"

DTYPES = ("bf16", "fp16", "fp8", "mxfp8", "nvfp4", "tf32")


#: the units of PyTorch DTensor tensor parallelism whose host time gpus.yaml ``host_dtensor``
#: gives (benchmarks/device/dtensor_host.py): a ``ColwiseParallel`` Linear taking a local input
#: as Replicate (its backward all-reduces the input's gradient), a ``RowwiseParallel`` Linear
#: with its output all-reduced (``rowwise``) or reduce-scattered along the sequence
#: (``rowwise_rs``), the front of a sequence-parallel region (a ``SequenceParallel`` norm, the
#: ``PrepareModuleInput`` all-gather, a ``ColwiseParallel`` Linear) and ``loss_parallel``'s
#: cross-entropy
DTENSOR_UNITS = ("colwise", "rowwise", "rowwise_rs", "sp_colwise", "loss_parallel")

#: the all-to-all call kinds of ``host_events_peer_s``: without and with split lists
EVENTS_PEER_KINDS = ("all_to_all", "all_to_all_splits")

#: GEMM operand formats that run at the per-tensor FP8 GEMM's efficiency (``eta_fp8``): FP8 e4m3
#: and MXFP8. Blackwell's tensor cores apply MXFP8's E8M0 block scales inside the MMA
#: (``tcgen05.mma`` ``kind::mxf8f6f4.block_scale``) at the FP8 MMA rate; the scales add 1/32 of
#: the operand bytes. Published B200 timings agree: cuDNN's MXFP8 and per-tensor FP8 batched
#: GEMMs of one shape run 2,348 and 2,369 TFLOP/s (flashinfer-ai/flashinfer PR #2256), and
#: ``calibrate blackwell_gemm``'s procedure on the published MXFP8 rows of three libraries gives
#: an eta within 2 % of B200's ``eta_fp8`` (data/published/mxfp8-gemm-b200). NVFP4 keeps
#: ``eta`` (not published per shape here).
FP8_RATE_DTYPES = ("fp8", "mxfp8")


@dataclass(frozen=True)
class GemmParams:
    """Calibrated parameters of the GEMM kernel-time model (see compute.py for the formula).

    eta: fraction of the dtype's dense peak that a full tile's main loop sustains.
    t0_s: fixed time of one GEMM kernel (ramp-up, first loads, last stores).
    write_exposed: fraction of the output write to HBM not hidden behind the main loop.
    overlap_p: exponent of the soft maximum that joins compute time and operand-read time.
    tile_ai0: tile arithmetic intensity (FLOP per byte of bf16 operands loaded from L2) under
        which a tile's main loop is limited by L2->SM bandwidth; a tile Tm x Tn has
        intensity Tm*Tn/(Tm+Tn).
    streamk_overhead: relative cost of spreading a partial last wave over all SMs (stream-K
        with fix-up of partial sums) instead of running it as a whole wave.
    tiles: output tile shapes (Tm, Tn) the GEMM library chooses among.
    eta_fp8: ``eta`` of an FP8 (e4m3, per-tensor scaled) GEMM against the FP8 dense peak, where
        measured; ``None``: assumed equal to ``eta`` (the bf16 figure). An MXFP8 GEMM takes it
        too (:data:`FP8_RATE_DTYPES`).
    """

    eta: float
    t0_s: float
    write_exposed: float
    overlap_p: float
    tile_ai0: float
    streamk_overhead: float
    tiles: tuple[tuple[int, int], ...]
    eta_fp8: float | None = None

    def eta_for(self, dtype: str) -> float:
        """The main-loop efficiency of a GEMM with ``dtype`` operands."""
        if dtype in FP8_RATE_DTYPES and self.eta_fp8 is not None:
            return self.eta_fp8
        return self.eta


@dataclass(frozen=True)
class AttentionPassParams:
    """Calibrated parameters of one flash-attention pass (forward or backward).

    eta: fraction of the dtype's dense peak reached at head_dim 128 with long sequences.
    t0_s: fixed time of the pass (its kernels' ramp-up; the backward has several kernels).
    block: rows of one thread-block tile (queries for the forward, keys for the backward).
    block_overhead: per-tile fixed work, in units of keys (loading Q, writing O, dQ atomics).
    head_dim_overhead: non-matmul work per score (softmax, rescaling) in head-dim units.
    tail: fraction of the longest tile's time left exposed after the last full wave.
    """

    eta: float
    t0_s: float
    block: int
    block_overhead: float
    head_dim_overhead: float
    tail: float


@dataclass(frozen=True)
class AttentionParams:
    """Forward and backward flash-attention parameters."""

    fwd: AttentionPassParams
    bwd: AttentionPassParams


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model. Immutable; build variants with :func:`load_gpu` overrides."""

    name: str
    peak_tflops: Mapping[str, float]  # dense, no sparsity: bf16, fp16, fp8, mxfp8, nvfp4, tf32
    hbm_GiB: float  # usable capacity as the driver reports it
    hbm_TBps: float  # datasheet HBM bandwidth
    hbm_efficiency: float  # achievable fraction of hbm_TBps for streaming kernels
    nvlink_GBps: float  # per GPU per direction
    power_W: float  # TDP
    price_per_gpu_hour: float  # USD, typical on-demand
    kernel_launch_s: float  # per-kernel launch/gap overhead on the GPU stream
    sources: Mapping[str, str]  # field -> citation
    sm_count: int = 132
    gemm: GemmParams | None = None
    attention: AttentionParams | None = None
    #: FlashAttention-2's kernels (``training.attention_backend: fa2``): the passes of
    #: ``attention`` with FA2's own ``eta``; None where the GPU has no FA2 measurement
    attention_fa2: AttentionParams | None = None
    #: bandwidth of each class of memory-bound kernel relative to a streaming copy
    #: (``hbm_efficiency``); see ``memory_access`` in gpus.yaml
    memory_access: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    #: the SM clock a power-limited GPU keeps for a mix of GEMMs and memory-bound kernels
    #: (:func:`simulator.hardware.power.gemm_clock_factor`; empty: not modelled), gpus.yaml
    power_clock: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    #: HBM a training process holds beyond its tensors: CUDA context, NCCL communicators and
    #: buffers, library workspaces, caching-allocator slack (see gpus.yaml)
    runtime_reserved_GiB: float = 0.0
    #: host time per kernel of eager PyTorch model code in a training step, and per collective
    #: call from it (module calls, autocast, autograd recording and its engine, custom autograd
    #: functions, process-group calls): an eager program cannot run faster than its host
    #: issues it (gpus.yaml)
    host_op_s: float = 0.0
    host_collective_s: float = 0.0
    #: host time an MoE count synchronisation (``.tolist()``) adds once the GPU has drained
    host_sync_s: float = 0.0
    #: host time per kernel of an MoE layer's expert block in eager code (0: ``host_op_s``)
    host_moe_op_s: float = 0.0
    #: host time per kernel of eager MoE code that no Python line launches (each expert
    #: parameter's autocast cast and gradient work, the backward of the experts' input
    #: slices: ``simulator.model.moe.ENGINE_OPS``; 0: ``host_op_s``)
    host_engine_op_s: float = 0.0
    #: host time of one FSDP2 collective call of eager ZeRO-3 code with the hook around it
    #: (a unit's all-gather with its copy-in, copy-out and reshard; a reduce-scatter with its
    #: chunk-cat and the sharded gradients' views), beyond its kernels' own rate (gpus.yaml)
    host_fsdp_call_s: float = 0.0
    #: host time FSDP2 spends on each parameter tensor of a unit in each such call (its
    #: all-gather input and output views and module attribute swaps, its sharded gradient's
    #: view), beyond the call's own (gpus.yaml)
    host_fsdp_tensor_s: float = 0.0
    #: spread of a GPU's sustained speed under its power cap, as the scale of the expected
    #: maximum of normals a group meeting at every layer pays (:mod:`simulator.model.sync`)
    sync_jitter: float = 0.0
    #: spread of one process's host speed on eager code between the processes of a box, as the
    #: scale of the expected maximum of normals a host-bound step of ``n`` ranks pays
    #: (:func:`simulator.model.sync.host_group_factor`)
    host_jitter: float = 0.0
    #: what a host read after a collective of ``n`` ranks (an MoE layer's count
    #: synchronisation: a barrier of the hosts) costs beyond one process's, as the scale of the
    #: expected maximum of ``n`` normals (:func:`simulator.model.sync.host_barrier_s`)
    host_barrier_s: float = 0.0
    #: host time PyTorch DTensor adds to ``torch.optim.AdamW(foreach=True)``'s step beyond the
    #: same step on plain tensors: per step and per DTensor parameter tensor of the rank
    #: (gpus.yaml; :func:`simulator.engine.host.dtensor_opt_s`)
    host_dtensor_opt_step_s: float = 0.0
    host_dtensor_opt_tensor_s: float = 0.0
    #: the same per DTensor parameter tensor without sequence parallelism
    host_dtensor_opt_tensor_nosp_s: float = 0.0
    #: host time per kernel and per collective call of fused (Megatron-Core / Transformer
    #: Engine) code; only an MoE model's fused programs use them (Megatron-Core's own rate
    #: per kernel launched, measured; a lower bound for Transformer Engine: see gpus.yaml)
    host_fused_op_s: float = 0.0
    host_fused_collective_s: float = 0.0
    #: host time of one call of Megatron-Core's unfused DeepEP routing map
    #: (``_indices_to_multihot``, measured; spread over its kernels by the engine)
    host_multihot_s: float = 0.0
    #: host time a GEMM whose shape the process has not launched before adds to its call
    #: (cuBLAS's heuristic query on a miss of its heuristics cache), for a forward GEMM, a
    #: data-gradient and a weight-gradient GEMM (gpus.yaml; eager MoE expert GEMMs with
    #: learned routes, :func:`simulator.model.moe.new_shape_share`)
    host_gemm_new_shape_fwd_s: float = 0.0
    host_gemm_new_shape_dgrad_s: float = 0.0
    host_gemm_new_shape_wgrad_s: float = 0.0
    #: the host's interval between two collective calls of a Python loop issuing them back to
    #: back with a CUDA event between them: what an event-timed measurement of a call shorter
    #: than it shows (``validate``'s ``timing: events``; never paid in training, whose host
    #: clock is the step model's). Per box kind: the host is part of the machine (gpus.yaml)
    host_events_call_s: float = 0.0
    #: the same interval for ``all_to_all_single`` (without split lists, before its per-peer
    #: part below): its own figure per box (gpus.yaml ``host_events_a2a_s``); 0 reads as
    #: ``host_events_call_s``
    host_events_a2a_s: float = 0.0
    #: what an all-to-all call adds to that interval per peer of its group beyond the other
    #: collectives', ``{all_to_all: s, all_to_all_splits: s}`` (without and with split lists;
    #: gpus.yaml ``host_events_peer_s``)
    host_events_peer_s: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({}))
    #: what recording a CUDA event after each call adds to that interval (gpus.yaml
    #: ``host_event_record_s``): a loop of calls between one pair of events (``timing: loop``)
    #: shows the event-timed interval less it
    host_event_record_s: float = 0.0
    #: host time PyTorch DTensor tensor parallelism adds to one unit of its plan beyond the
    #: same work on plain tensors, ``{unit: (forward_s, backward_s)}`` for the units of
    #: :data:`DTENSOR_UNITS` (``parallelism.tp_impl: dtensor``; gpus.yaml ``host_dtensor``)
    host_dtensor: Mapping[str, tuple[float, float]] = field(
        default_factory=lambda: MappingProxyType({}))
    #: NVLink generation (3 Ampere, 4 Hopper, 5 Blackwell); None for a GPU without NVLink
    nvlink_generation: int | None = None
    #: NVLink line rate per GPU per direction (links x signalling rate); what a topology uses
    #: unless it sets ``nvlink_bandwidth_GBps`` (default: ``nvlink_GBps``)
    nvlink_line_GBps: float | None = None
    #: scale-out NIC per GPU of the GPU's reference system, Gb/s (a topology default)
    nic_Gbps: float | None = None
    #: GPU <-> NIC PCIe bandwidth per direction, GB/s (a topology default)
    pcie_GBps: float | None = None
    calibration: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)

    def peak_flops(self, dtype: str) -> float:
        """Dense peak of ``dtype`` in FLOP/s (datasheet, no sparsity)."""
        try:
            return self.peak_tflops[dtype] * 1e12
        except KeyError:
            known = ", ".join(self.peak_tflops)
            raise ConfigError(
                f"{self.name} has no {dtype!r} tensor-core peak (it has: {known})",
                field="peak_tflops",
            ) from None

    @property
    def hbm_bytes(self) -> float:
        """Usable HBM capacity in bytes."""
        return self.hbm_GiB * 2**30

    @property
    def hbm_Bps(self) -> float:
        """Achievable streaming HBM bandwidth in bytes/s (datasheet x hbm_efficiency)."""
        return self.hbm_TBps * 1e12 * self.hbm_efficiency

    def __hash__(self) -> int:
        return hash(
            (
                self.name,
                tuple(sorted(self.peak_tflops.items())),
                self.hbm_GiB,
                self.hbm_TBps,
                self.hbm_efficiency,
                self.nvlink_GBps,
                self.nvlink_line_GBps,
                self.kernel_launch_s,
                self.sm_count,
                self.gemm,
                self.attention,
                self.attention_fa2,
            )
        )


_REQUIRED = (
    "peak_tflops",
    "hbm_GiB",
    "hbm_TBps",
    "hbm_efficiency",
    "nvlink_GBps",
    "power_W",
    "price_per_gpu_hour",
    "kernel_launch_s",
)
_FIELDS = tuple(f.name for f in fields(GPUSpec))
_MERGED = ("peak_tflops", "sources", "gemm", "attention", "attention_fa2", "memory_access",
           "host_dtensor")  # overrides merge key by key


# --------------------------------------------------------------------------------------------
# Catalog file


@functools.lru_cache(maxsize=1)
def _catalog_raw() -> dict[str, Any]:
    return read_package_yaml(CATALOG_FILE)


@functools.cache
def _catalog_spec(name: str) -> GPUSpec:
    raw = _catalog_raw()
    entry = dict(raw["gpus"][name])
    return _build(name, entry, file=str(CATALOG_FILE), field=f"gpus.{name}")


def gpu_names() -> list[str]:
    """Names of the catalog's GPUs, in file order."""
    return list(_catalog_raw()["gpus"])


def default_kernel_params() -> dict[str, Any]:
    """The generic ``gemm``/``attention`` parameters used where a GPU gives none (a copy)."""
    return _deep_copy(_catalog_raw()["defaults"])


def load_gpu(spec: str | Mapping, *, file: str | None = None, field: str = "gpu") -> GPUSpec:
    """Resolve a GPU description.

    ``spec`` is a catalog name, a mapping ``{base: <name>, <field>: value, ...}`` that overrides
    fields of a catalog entry, or a full inline mapping. ``file`` and ``field`` only label
    errors: an unknown name raises :class:`ConfigError` with a did-you-mean and the list of
    names; an unknown key raises one naming ``f"{field}.{key}"``.
    """
    if isinstance(spec, GPUSpec):
        return spec
    if isinstance(spec, str):
        return _catalog_spec(_check_name(spec, file=file, field=field))
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"expected a GPU name or a mapping, got {type(spec).__name__} {spec!r} "
            f"(catalog: {', '.join(gpu_names())})",
            file=file,
            field=field,
        )
    spec = dict(spec)
    base_name = spec.pop("base", None)
    if base_name is None:
        name = spec.pop("name", "custom-gpu")
        return _build(str(name), spec, file=file, field=field)
    base_name = _check_name(base_name, file=file, field=f"{field}.base")
    merged = _deep_copy(_catalog_raw()["gpus"][base_name])
    for key, value in spec.items():
        if key in _MERGED and isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    name = str(merged.pop("name", base_name))
    return _build(name, merged, file=file, field=field)


def with_overrides(gpu: GPUSpec, **changes: Any) -> GPUSpec:
    """A copy of ``gpu`` with some fields replaced (no validation; for programmatic what-ifs)."""
    return replace(gpu, **changes)


# --------------------------------------------------------------------------------------------
# Validation


def _check_name(name: Any, *, file: str | None, field: str) -> str:
    names = gpu_names()
    if isinstance(name, str) and name in names:
        return name
    hint = _closest(str(name), names)
    did = f"; did you mean {hint!r}?" if hint else ""
    raise ConfigError(
        f"unknown GPU {name!r}{did} (catalog: {', '.join(names)})", file=file, field=field
    )


def _closest(name: str, names: list[str]) -> str | None:
    """Case-insensitive: an exact match, then a prefix ('H100' -> 'H100-SXM-80GB'), then a
    substring, then difflib's closest at ratio >= 0.6."""
    low = {n.lower(): n for n in names}
    key = name.lower()
    for test in (
        lambda n: n == key,
        lambda n: n.startswith(key) or key.startswith(n),
        lambda n: key in n or n in key,
    ):
        found = [low[n] for n in low if test(n)]
        if found:
            return found[0]
    close = difflib.get_close_matches(key, list(low), n=1, cutoff=0.6)
    return low[close[0]] if close else None


def _build(name: str, entry: dict[str, Any], *, file: str | None, field: str) -> GPUSpec:
    for key in entry:
        if key not in _FIELDS or key == "name":
            close = difflib.get_close_matches(key, _FIELDS, n=1)
            # A near miss names the field meant; else the fields a person writes first (the
            # whole list is over 60 names: gpus.yaml and GPUSpec document them).
            did = (f" (did you mean {close[0]!r}?)" if close else
                   f" (e.g. {', '.join(_REQUIRED)}; every field: GPUSpec in {__name__})")
            raise ConfigError(
                f"unknown GPU field {key!r}{did}",
                file=file,
                field=f"{field}.{key}",
            )
    missing = [k for k in _REQUIRED if k not in entry]
    if missing:
        raise ConfigError(
            f"GPU {name!r} lacks {', '.join(missing)} (give a catalog name, a 'base', or every "
            f"field: {', '.join(_REQUIRED)})",
            file=file,
            field=field,
        )
    peaks = entry["peak_tflops"]
    if not isinstance(peaks, Mapping) or "bf16" not in peaks:
        raise ConfigError(
            f"peak_tflops must map dtypes ({', '.join(DTYPES)}) to TFLOP/s, bf16 included",
            file=file,
            field=f"{field}.peak_tflops",
        )
    for dt, v in peaks.items():
        if dt not in DTYPES:
            raise ConfigError(
                f"unknown dtype {dt!r} (accepted: {', '.join(DTYPES)})",
                file=file,
                field=f"{field}.peak_tflops.{dt}",
            )
        _positive(v, file=file, field=f"{field}.peak_tflops.{dt}")
    values: dict[str, Any] = {"name": name}
    values["peak_tflops"] = MappingProxyType({k: float(v) for k, v in peaks.items()})
    for key in _REQUIRED[1:]:
        values[key] = _positive(entry[key], file=file, field=f"{field}.{key}")
    if values["hbm_efficiency"] > 1:
        raise ConfigError(
            f"hbm_efficiency must be in (0, 1], got {values['hbm_efficiency']}",
            file=file,
            field=f"{field}.hbm_efficiency",
        )
    sources = entry.get("sources", {})
    if not isinstance(sources, Mapping):
        raise ConfigError("sources must map field -> citation", file=file, field=f"{field}.sources")
    values["sources"] = MappingProxyType({str(k): str(v) for k, v in sources.items()})
    sm = entry.get("sm_count", 132)
    if not isinstance(sm, int) or isinstance(sm, bool) or sm <= 0:
        raise ConfigError(
            f"sm_count must be a positive integer, got {sm!r}", file=file, field=f"{field}.sm_count"
        )
    values["sm_count"] = sm
    defaults = _catalog_raw()["defaults"]
    gemm = _merge(defaults["gemm"], entry.get("gemm") or {})
    attn = _merge(defaults["attention"], entry.get("attention") or {})
    values["gemm"] = _gemm_params(gemm, file=file, field=f"{field}.gemm")
    values["attention"] = AttentionParams(
        fwd=_attn_params(attn.get("fwd", {}), file=file, field=f"{field}.attention.fwd"),
        bwd=_attn_params(attn.get("bwd", {}), file=file, field=f"{field}.attention.bwd"),
    )
    if not isinstance(entry.get("attention_fa2") or {}, Mapping):
        raise ConfigError("expected a mapping of pass -> parameters (fwd, bwd)", file=file,
                          field=f"{field}.attention_fa2")
    for name, given in (("attention", attn), ("attention_fa2", entry.get("attention_fa2") or {})):
        for key in given:
            if key not in ("fwd", "bwd"):
                raise ConfigError(
                    f"unknown attention pass {key!r} (accepted: fwd, bwd)",
                    file=file,
                    field=f"{field}.{name}.{key}",
                )
    if entry.get("attention_fa2"):  # FA2's efficiency on the GPU's own pass structure
        fa2 = _merge(attn, entry["attention_fa2"])
        values["attention_fa2"] = AttentionParams(
            fwd=_attn_params(fa2["fwd"], file=file, field=f"{field}.attention_fa2.fwd"),
            bwd=_attn_params(fa2["bwd"], file=file, field=f"{field}.attention_fa2.bwd"),
        )
    known = defaults.get("memory_access") or {}
    given = entry.get("memory_access") or {}
    if not isinstance(given, Mapping):
        raise ConfigError(
            "expected a mapping of access class -> relative bandwidth",
            file=file,
            field=f"{field}.memory_access",
        )
    _no_unknown(given, list(known), file=file, field=f"{field}.memory_access")
    access = _merge(known, given)
    for key, val in access.items():
        if not isinstance(val, (int, float)) or not 0 < val <= 1.5:
            raise ConfigError(
                f"a relative bandwidth in (0, 1.5], got {val!r}",
                file=file,
                field=f"{field}.memory_access.{key}",
            )
    values["memory_access"] = MappingProxyType({str(k): float(v) for k, v in access.items()})
    pc = entry.get("power_clock") or {}
    keys = ("clock_max_MHz", "P_idle_W", "P_gemm_max_W", "P_mem_W", "slope_W_per_MHz",
            "clock_share")
    if pc:
        if not isinstance(pc, Mapping):
            raise ConfigError("expected a mapping", file=file, field=f"{field}.power_clock")
        _no_unknown(pc, list(keys), file=file, field=f"{field}.power_clock")
        for key in keys:
            if key not in pc:
                raise ConfigError(f"power_clock lacks {key}", file=file,
                                  field=f"{field}.power_clock")
            _positive(pc[key], file=file, field=f"{field}.power_clock.{key}")
    values["power_clock"] = MappingProxyType({str(k): float(v) for k, v in pc.items()})
    reserved = entry.get("runtime_reserved_GiB", defaults.get("runtime_reserved_GiB", 0.0))
    if not isinstance(reserved, (int, float)) or reserved < 0:
        raise ConfigError(
            f"a non-negative size in GiB, got {reserved!r}",
            file=file,
            field=f"{field}.runtime_reserved_GiB",
        )
    values["runtime_reserved_GiB"] = float(reserved)
    for key in ("host_op_s", "host_collective_s", "host_sync_s", "host_moe_op_s",
                "host_engine_op_s",
                "host_fsdp_call_s", "host_fsdp_tensor_s", "host_fused_op_s",
                "host_fused_collective_s", "host_multihot_s", "host_gemm_new_shape_fwd_s",
                "host_gemm_new_shape_dgrad_s", "host_gemm_new_shape_wgrad_s",
                "host_events_call_s", "host_events_a2a_s", "host_event_record_s",
                "sync_jitter", "host_jitter", "host_barrier_s",
                "host_dtensor_opt_step_s",
                "host_dtensor_opt_tensor_s", "host_dtensor_opt_tensor_nosp_s"):
        values[key] = _positive(entry.get(key, defaults.get(key, 0.0)), file=file,
                                field=f"{field}.{key}", zero_ok=True)
    values["host_dtensor"] = _dtensor_rates(entry, defaults, file=file, field=field)
    peer = entry.get("host_events_peer_s", defaults.get("host_events_peer_s", {}))
    if not isinstance(peer, Mapping) or set(peer) - set(EVENTS_PEER_KINDS):
        raise ConfigError(f"a mapping of {', '.join(EVENTS_PEER_KINDS)} to seconds, got "
                          f"{peer!r}", file=file, field=f"{field}.host_events_peer_s")
    values["host_events_peer_s"] = MappingProxyType({
        str(k): _positive(v, file=file, field=f"{field}.host_events_peer_s.{k}", zero_ok=True)
        for k, v in peer.items()})
    for key in ("nvlink_line_GBps", "nic_Gbps", "pcie_GBps"):
        if entry.get(key) is not None:
            values[key] = _positive(entry[key], file=file, field=f"{field}.{key}")
    gen = entry.get("nvlink_generation")
    if gen is not None:
        if not isinstance(gen, int) or isinstance(gen, bool) or not 1 <= gen <= 9:
            raise ConfigError(
                f"an NVLink generation 1..9, got {gen!r}",
                file=file,
                field=f"{field}.nvlink_generation",
            )
        values["nvlink_generation"] = gen
    calibration = entry.get("calibration", ())
    if not isinstance(calibration, (list, tuple)) or not all(
        isinstance(c, Mapping) for c in calibration
    ):
        raise ConfigError(
            "expected a list of mappings (one per calibration record)",
            file=file,
            field=f"{field}.calibration",
        )
    values["calibration"] = tuple(MappingProxyType(dict(c)) for c in calibration)
    return GPUSpec(**values)


def _gemm_params(raw: Mapping[str, Any], *, file: str | None, field: str) -> GemmParams:
    names = [f.name for f in fields(GemmParams)]
    _no_unknown(raw, names, file=file, field=field)
    tiles = raw.get("tiles")
    if not tiles or not all(
        isinstance(t, (list, tuple))
        and len(t) == 2
        and all(isinstance(x, int) and x > 0 for x in t)
        for t in tiles
    ):
        raise ConfigError(
            "tiles must be a non-empty list of [rows, cols] positive integers",
            file=file,
            field=f"{field}.tiles",
        )
    kw = {
        n: _positive(raw.get(n), file=file, field=f"{field}.{n}", zero_ok=True)
        for n in names
        if n not in ("tiles", "eta_fp8")
    }
    if raw.get("eta_fp8") is not None:
        kw["eta_fp8"] = _positive(raw["eta_fp8"], file=file, field=f"{field}.eta_fp8")
    for name in ("eta", "eta_fp8"):
        if name in kw and not 0 < kw[name] <= 1:
            raise ConfigError(
                f"{name} is a fraction of peak in (0, 1], got {kw[name]:g}", file=file,
                field=f"{field}.{name}",
            )
    if kw["overlap_p"] < 1:
        raise ConfigError("overlap_p must be >= 1", file=file, field=f"{field}.overlap_p")
    return GemmParams(tiles=tuple((int(a), int(b)) for a, b in tiles), **kw)


def _attn_params(raw: Mapping[str, Any], *, file: str | None, field: str) -> AttentionPassParams:
    names = [f.name for f in fields(AttentionPassParams)]
    _no_unknown(raw, names, file=file, field=field)
    kw = {n: _positive(raw.get(n), file=file, field=f"{field}.{n}", zero_ok=True) for n in names}
    if not 0 < kw["eta"] <= 1:
        raise ConfigError(
            f"eta is a fraction of peak in (0, 1], got {kw['eta']:g}", file=file, field=f"{field}.eta"
        )
    kw["block"] = int(kw["block"])
    if kw["block"] <= 0:
        raise ConfigError("block must be a positive integer", file=file, field=f"{field}.block")
    return AttentionPassParams(**kw)


def _no_unknown(raw: Mapping[str, Any], names: list[str], *, file: str | None, field: str) -> None:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"expected a mapping of {', '.join(names)}", file=file, field=field)
    for key in raw:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            did = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown key {key!r}{did} (accepted: {', '.join(names)})",
                file=file,
                field=f"{field}.{key}",
            )


def _dtensor_rates(entry: Mapping[str, Any], defaults: Mapping[str, Any], *, file: str | None,
                   field: str) -> Mapping[str, tuple[float, float]]:
    """``host_dtensor``: ``{unit: {fwd_s, bwd_s}}`` over :data:`DTENSOR_UNITS` (defaults merged
    with the GPU's own)."""
    given = entry.get("host_dtensor") or {}
    _no_unknown(given, list(DTENSOR_UNITS), file=file, field=f"{field}.host_dtensor")
    rates = _merge(defaults.get("host_dtensor") or {}, given)
    out = {}
    for unit, pair in rates.items():
        f = f"{field}.host_dtensor.{unit}"
        _no_unknown(pair, ["fwd_s", "bwd_s"], file=file, field=f)
        if set(pair) != {"fwd_s", "bwd_s"}:
            raise ConfigError("give fwd_s and bwd_s", file=file, field=f)
        out[unit] = tuple(_positive(pair[k], file=file, field=f"{f}.{k}", zero_ok=True)
                          for k in ("fwd_s", "bwd_s"))
    return MappingProxyType(out)


def _positive(value: Any, *, file: str | None, field: str, zero_ok: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not zero_ok):
        want = "a non-negative number" if zero_ok else "a positive number"
        raise ConfigError(f"expected {want}, got {value!r}", file=file, field=field)
    return float(value)


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = _deep_copy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _deep_copy(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {k: _deep_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_deep_copy(v) for v in obj]
    return obj
