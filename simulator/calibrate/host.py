"""Refit the host's time per kernel of eager model code, per collective call, to resume after
a synchronisation, per kernel of MoE token routing and per FSDP2 collective call with its
hook and per parameter tensor in each such call (``host_op_s``, ``host_collective_s``,
``host_sync_s``, ``host_moe_op_s``, ``host_fsdp_call_s``, ``host_fsdp_tensor_s`` in gpus.yaml),
and per kernel Megatron-Core's MoE layer launches (``host_fused_op_s``,
``host_fused_collective_s``).

Two kinds of measurement on 4x H100, and one on 2x H100, each with its README:

* ``data/measured/host-ops-h100x4/``: micro-benchmarks of one kind of call at a time
  (``benchmarks/device/host_ops.py``): chains of the measured training scripts' collective
  wrappers on tiny tensors, timed on the host clock. ``host_collective_s`` is the median host
  time one collective call adds (forward and backward of its wrapper, with its copies), over
  the four wrappers, ranks and chain lengths; ``host_sync_s`` the median time of an MoE count
  synchronisation (an all-to-all of the counts, then ``.tolist()``) less that of a bare
  collective call (which the count all-to-all is charged as).
* ``data/measured/tiny-h100x4/`` and ``tiny3-h100x4/``: training steps of
  ``benchmarks/device/steps.py`` run with ``--tiny`` (each case's layers, scheme, micro-batches and
  layout at hidden 256 and 128-token sequences), where the GPU work is negligible and the step
  time is the host's time to run the eager code. Each dense case (DDP, TP with and without
  sequence parallelism, TP x DP, pipelines) is simulated at the same tiny configuration; its
  kernels (one part each in the events table of GPU 0) and its collective calls are counted,
  and ``host_op_s`` is fitted by least squares on relative error to
  ``step = host_op_s x kernels + host_collective_s x collectives`` with ``host_collective_s``
  from the micro-benchmarks. ``host_moe_op_s`` is then fitted the same way, the others fixed,
  on the uniform-routing MoE steps (their token-routing kernels counted apart,
  :func:`simulator.model.moe.routing_op`); skewed routing (more host time, not modelled) and
  FSDP2 (per-unit hooks) are left out. The MoE kernels no Python line launches (each expert
  parameter's autocast cast and gradient work, the backward of the experts' input slices:
  :func:`simulator.model.moe.engine_op`) count at ``host_engine_op_s`` (half the
  micro-benchmarked ``y * 1.0001`` under autograd: one kernel from Python, one from its
  backward node; :func:`engine_rate`). The counts are the simulator's op lists (``simulator/model/eager.py``),
  so a change to them changes the refit: ``tests/test_calibration.py`` then asks for a new one.
* ``data/measured/fsdp-units-h100x2/``: FSDP2's cost per unit (``benchmarks/device/fsdp_units.py``
  on 2x H100): the same 64 Linear(4096, 4096) layers (64 parameter tensors) split into 2..64
  ``fully_shard`` units, and (``fsdp_units_tensors.jsonl``, ``--tensors 4``) 16 and 64 units
  with one and with four parameter tensors a layer. ``host_fsdp_call_s`` is the host's time
  of one FSDP2 collective call with its hook (:data:`simulator.engine.host.FSDP_CALLS`: an
  all-gather in forward, an all-gather and a reduce-scatter in backward) and
  ``host_fsdp_tensor_s`` its time per parameter tensor of the unit in each call, fitted
  jointly by least squares on relative error, through zero, to ``step - alone = units x
  (3 host_fsdp_call_s + host_op_s) + 3 x tensors x host_fsdp_tensor_s`` (``host_op_s``: the
  gradient cast before each reduce-scatter, a kernel the simulator already prices) on the
  rows the host sets (8 to 64 units at 512 tokens; :func:`fit_fsdp`).
* ``data/measured/gemm-shape-host-h100x2/``: the host time of a GEMM whose row count the
  process has not launched before (``benchmarks/device/gemm_shape_host.py`` on one H100):
  ``host_gemm_new_shape_{fwd,dgrad,wgrad}_s`` (:func:`fit_new_shape`), what eager MoE expert
  GEMMs with learned routes pay (:func:`simulator.model.moe.new_shape_share`).
* ``data/measured/dtensor-host-h100x2/``: PyTorch DTensor tensor parallelism per unit of its
  plan (``benchmarks/device/dtensor_host.py`` on 2x H100): chains of one unit at hidden 256,
  timed on the host clock beside the same work on plain tensors with the collective wrappers
  of ``steps.py``. ``host_dtensor`` is, for each unit of
  :data:`simulator.hardware.catalog.DTENSOR_UNITS`, the mean over the ranks of the unit's
  forward and backward time less its plain equivalent's (:func:`fit_dtensor`; none below zero).
* ``data/measured/dtensor-step-host-h200x4/``: the host time DTensor adds to the optimizer
  step (``benchmarks/device/dtensor_step_host.py`` on 2 and 4 of 4x H200: ``steps_alt.py``'s
  DTensor TP + SP step at 2 and 24 layers, AdamW (foreach) on the DTensor parameters less the
  same AdamW on plain tensors of the same local shapes). ``host_dtensor_opt_step_s`` and
  ``host_dtensor_opt_tensor_s`` (per DTensor parameter tensor) are fitted by least squares on
  relative error over the rank means (:func:`fit_dtensor_opt`), with SP (the plan every
  case of that benchmark runs). ``host_dtensor_opt_tensor_nosp_s``, the rate without SP, from
  the ``block`` rows of ``dtensor_host.py`` (2 and 6 layers, with and without SP) in that
  folder and in ``dtensor-host-h100x2`` (:func:`fit_dtensor_opt_nosp`).
* ``data/measured/megatron-moe-host-h100x2/``: Megatron-Core 0.19.2's MoE layer on its host
  (``benchmarks/device/megatron_moe_host.py`` on 2x H100, EP 2, hidden 256: the GPU idles),
  with the kernels each pass launches counted by the profiler. ``host_fused_op_s`` (and
  ``host_fused_collective_s``, the same rate: an NCCL call is one more launch of the same
  Python) is the host's time per kernel launched, fitted by least squares on relative error,
  through zero, to ``fwd_s + bwd_s = rate x kernels + host_sync_s`` on the whole-layer rows
  (4, 16 and 64 local experts: 285 to 1,614 kernels; :func:`fit_fused`). See that function
  for why the rate is per kernel launched and not per part of the simulator's program.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile

import numpy as np
import pandas as pd

from simulator.calibrate import REPO, host_spread, jsonl
from simulator.engine.host import FSDP_CALLS
from simulator.engine.records import parse_parts
from simulator.hardware.catalog import DTENSOR_UNITS, default_kernel_params
from simulator.model.moe import engine_op, routing_op
from simulator.model.sync import host_group_factor, host_group_size

DATA = (REPO / "data/measured/tiny-h100x4/steps.jsonl", REPO / "data/measured/tiny3-h100x4/steps.jsonl")
FSDP_UNITS = REPO / "data/measured/fsdp-units-h100x2/fsdp_units.jsonl"
FSDP_TENSORS = REPO / "data/measured/fsdp-units-h100x2/fsdp_units_tensors.jsonl"
FSDP_LAYERS = 64  # fsdp_units.py: Linear(4096, 4096) layers, split evenly into the units
OPS = sorted((REPO / "data/measured/host-ops-h100x4").glob("host_ops_k*.jsonl"))
DTENSOR = REPO / "data/measured/dtensor-host-h100x2/dtensor_host.jsonl"
DTENSOR_STEP = tuple(REPO / f"data/measured/dtensor-step-host-h200x4/dtensor_step_host_w{n}.jsonl"
                     for n in (2, 4))
DTENSOR_BLOCK = tuple(REPO / f"data/measured/dtensor-step-host-h200x4/dtensor_host_w{n}.jsonl"
                      for n in (2, 4))
NEW_SHAPE = REPO / "data/measured/gemm-shape-host-h100x2/gemm_shape_host.jsonl"
MCORE = REPO / "data/measured/megatron-moe-host-h100x2/megatron_moe_host.jsonl"
MULTIHOT = sorted((REPO / "data/measured/multihot-host-h100x4").glob("multihot-rank*.jsonl"))
#: collective calls in one chain element of each wrapper of host_ops.py
WRAPPER_CALLS = {"copy_to_tp": 1, "reduce_from_tp": 1, "gather_scatter_seq": 4,
                 "all_to_all_pair": 4}
# measured case -> its workload (the full-size validation case the tiny run shrinks)
DENSE = {
    "h2_tp4sp_D": "validation/heldout2/h2_tp4sp_D.yaml",
    "h2_ddp4_D": "validation/heldout2/h2_ddp4_D.yaml",
    "h2_tp2dp2_D": "validation/heldout2/h2_tp2dp2_D.yaml",
    "ho_tp4sp_B": "validation/heldout/ho_tp4sp_B.yaml",
    "ho_tp4_B": "validation/heldout/ho_tp4_B.yaml",
    "h2_pp4_1f1b_D": "validation/heldout2/h2_pp4_1f1b_D.yaml",
    "h3_tp4sp_E": "validation/heldout3/h3_tp4sp_E.yaml",
    "h3_tp4_E": "validation/heldout3/h3_tp4_E.yaml",
    "h3_tp2dp2_E": "validation/heldout3/h3_tp2dp2_E.yaml",
    "h3_ddp4_E": "validation/heldout3/h3_ddp4_E.yaml",
    "h3_pp2dp2_E": "validation/heldout3/h3_pp2dp2_E.yaml",
}
# steps.py --tiny: hidden 256, FFN 512, 8 heads (4 KV heads), vocabulary 1,024, 128 tokens
TINY = ("model.hidden=256", "model.ffn_hidden=512", "model.heads=8", "model.kv_heads=4",
        "model.vocab=1024", "model.seq_len=128")
COMM = ("tp_", "~tp_", "ep_", "moe_dispatch", "moe_combine", "cp_")
#: the host synchronisations of an eager MoE forward (simulator/model/moe_layer.py _moe_body)
SYNCS = ("moe_counts_sync", "moe_bincount_sync", "moe_regroup_sync")
# uniform-routing MoE cases -> workloads (skewed routing costs more host time, not modelled)
MOE = {"h2_moe_ep4_N_uniform": "validation/heldout2/h2_moe_ep4_N_uniform.yaml",
       "moe_ep4_uniform": "validation/measured-moe/moe_ep4_uniform.yaml",
       "h2_moe_ep2dp2_N_uniform": "validation/heldout2/h2_moe_ep2dp2_N_uniform.yaml",
       "h3_moe_ep4_P_uniform": "validation/heldout3/h3_moe_ep4_P_uniform.yaml"}
MOE_TINY = ("model.moe.ffn_hidden=512",)  # steps.py --tiny: the experts' FFN too
WAITS = ("host_bound_wait", "host_launch_wait")


def simulate_tiny(workload: str, out_dir: str, extra: tuple[str, ...] = ()
                  ) -> tuple[float, int, int]:
    """(simulated step time, kernels, collective calls) of GPU 0 in one step of ``workload``
    at the tiny widths (``extra``: more ``--set`` overrides, e.g. the MoE expert FFN)."""
    step, names = _tiny_parts(workload, out_dir, extra)
    comm = sum(1 for n in names if n.startswith(COMM))
    return step, len(names) - comm, comm


def _tiny_parts(workload: str, out_dir: str, extra: tuple[str, ...]) -> tuple[float, list[str]]:
    """(simulated step time, names of GPU 0's parts, host waits excluded) at the tiny widths."""
    cmd = [sys.executable, "-m", "simulator", "run", str(REPO / workload), "--out", out_dir,
           "--json"]
    for s in TINY + extra:
        cmd += ["--set", s]
    p = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
    ev = pd.read_parquet(f"{out_dir}/events.parquet", columns=["gpu", "parts"])
    names = [q.name for p in ev[ev.gpu == 0].parts for q in parse_parts(p)]
    return json.loads(p.stdout)["step_time_s"], [n for n in names if n not in WAITS]


def moe_counts(workload: str, out_dir: str, extra: tuple[str, ...] = ()
               ) -> tuple[float, int, int, int, int, int]:
    """(simulated step, other kernels, token-routing kernels, collective calls,
    synchronisations, kernels no Python line launches: :func:`simulator.model.moe.engine_op`)
    of GPU 0 in one step of an MoE ``workload`` at the tiny widths."""
    step, names = _tiny_parts(workload, out_dir, extra)
    comm = sum(1 for n in names if n.startswith(COMM))
    sync = sum(1 for n in names if n in SYNCS)
    k_moe = sum(1 for n in names if routing_op(n) and n not in SYNCS and not n.startswith(COMM))
    k_eng = sum(1 for n in names if engine_op(n))
    return step, len(names) - comm - sync - k_moe - k_eng, k_moe, comm, sync, k_eng


def measured() -> dict[str, float]:
    """{case: one host's step time} of the tiny steps: the measured step (the slowest rank's)
    over the factor its ranks' slowest host costs (:func:`paced`), so that the rates fitted on
    it are one process's, which the engine scales to each job's own group."""
    return {r["case"]: r["step_time_s"] / paced(r["gpus"]) for f in DATA for r in jsonl(f)}


def paced(gpus: int) -> float:
    """How much longer a host-bound step of ``gpus`` ranks took than one process's time
    (:func:`simulator.model.sync.host_group_factor`, the refitted ``host_jitter``)."""
    return host_group_factor(host_group_size(gpus), host_spread.fit())


def engine_rate() -> float:
    """``host_engine_op_s``: half the median host time of ``y * 1.0001`` under autograd (one
    kernel forward from Python, one from its backward node), over ranks and chain lengths of
    the micro-benchmarks: an upper bound for a kernel autograd's engine issues with no Python
    around it."""
    rows = [r for f in OPS for r in jsonl(f) if r["kind"] == "mul"]
    return float(np.median([r["per_call_s"] for r in rows])) / 2


def micro() -> tuple[float, float]:
    """(host_collective_s, host_sync_s) from the micro-benchmarks (module docstring)."""
    rows = [r for f in OPS for r in jsonl(f)]
    coll = [r["per_call_s"] / WRAPPER_CALLS[r["kind"]] for r in rows if r["kind"] in WRAPPER_CALLS]
    sync = [r["per_call_s"] for r in rows if r["kind"] == "count_sync"]
    bare = [r["per_call_s"] for r in rows if r["kind"] == "dist_all_reduce"]
    return float(np.median(coll)), float(np.median(sync) - np.median(bare))


@functools.lru_cache(maxsize=1)
def fit() -> tuple[float, float, dict[str, tuple[float, int, int]]]:
    """(host_op_s, host_collective_s, {case: (measured step, kernels, collectives)})."""
    meas = measured()
    coll_s, _ = micro()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="calibrate_host_") as tmp:
        for case, workload in DENSE.items():
            _, k, c = simulate_tiny(workload, f"{tmp}/{case}")
            rows[case] = (meas[case], k, c)
    # least squares on relative error, host_collective_s fixed: sum (op k / m + coll c / m - 1)^2
    kk = np.array([k / m for m, k, _ in rows.values()])
    rest = np.array([1.0 - coll_s * c / m for m, _, c in rows.values()])
    return float(kk @ rest / (kk @ kk)), coll_s, rows


@functools.lru_cache(maxsize=1)
def fit_moe() -> tuple[float, dict[str, tuple[float, int, int, int, int]]]:
    """(host_moe_op_s, {case: (measured step, other kernels, routing kernels, collectives,
    synchronisations, slice-backward kernels)}): the host time per kernel of MoE token
    routing, fitted by least squares on relative error to the uniform-routing MoE steps at
    host-bound widths, with ``host_op_s``, ``host_collective_s``, ``host_sync_s`` and
    ``host_engine_op_s`` as fitted and measured above."""
    op_s, coll_s, _ = fit()
    sync_s, eng_s = micro()[1], engine_rate()
    meas = measured()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="calibrate_host_moe_") as tmp:
        for case, workload in MOE.items():
            _, k, km, c, y, ke = moe_counts(workload, f"{tmp}/{case}", MOE_TINY)
            rows[case] = (meas[case], k, km, c, y, ke)
    km = np.array([r[2] / r[0] for r in rows.values()])
    rest = np.array([1.0 - (op_s * k + coll_s * c + sync_s * y + eng_s * ke) / m
                     for m, k, _, c, y, ke in rows.values()])
    return float(km @ rest / (km @ km)), rows


def fsdp_rows() -> tuple[list[tuple[int, int, float]], dict[int, float]]:
    """FSDP2's unit micro-benchmark: ([(units, parameter tensors, excess)] at 512 tokens,
    {units: excess} at 16,384), the excess being the step less the same layers' step
    unsharded on one GPU; the default rows have one tensor a layer, the ``--tensors`` rows
    one and four."""
    rows = [r for f in (FSDP_UNITS, FSDP_TENSORS) for r in jsonl(f)]
    short, hidden = [], {}
    for r in rows:
        excess = r["step_s"] - r["alone_compute_s"]
        if r["tokens"] == 512:
            short.append((r["units"], r["layers"] * r.get("tensors", 1), excess))
        elif r.get("tensors", 1) == 1:
            hidden[r["units"]] = excess
    return short, hidden


def fsdp_host(units: int, tensors: int, call_s: float, tensor_s: float, op_s: float) -> float:
    """Modelled host time FSDP2 adds to a step of ``units`` units holding ``tensors``
    parameter tensors in all: per unit its three calls and the gradient cast's kernel, per
    tensor its work in each of the three calls."""
    calls = len(FSDP_CALLS["fwd"]) + len(FSDP_CALLS["bwd"])
    return units * (calls * call_s + op_s) + calls * tensors * tensor_s


def fit_fsdp(op_s: float) -> tuple[float, float, list[tuple[int, int, float]]]:
    """(``host_fsdp_call_s``, ``host_fsdp_tensor_s``, the rows they are fitted on), given
    ``host_op_s``.

    At 512 tokens a step's excess is either what FSDP adds on the GPU (copies, collectives
    not hidden) or, where the host is the slower one, its host time (:func:`fsdp_host`). What
    FSDP adds on the GPU is measured by the 16,384-token row of the same unit count, where
    compute hides the host. A row is host-bound where the modelled host time exceeds that; the
    two rates are fitted jointly (least squares on relative error, through zero) on those rows
    and the selection repeated until it holds (8 to 64 units; the same as fitting
    ``max(host, GPU)`` to every row). The scale vectors of the ``--tensors`` rows launch
    kernels of their own, but the unsharded reference runs them too and is itself host-bound
    there (17-22 ms against about 8 with one tensor a layer), so the excess holds FSDP's work
    only. Two biases are left in: where the reference is GPU-bound (one tensor a layer) its
    step exceeds its host time by a few ms, which lowers those rows' excess; and the excess
    per unit is not flat (more at 64 units than at 16), which the joint fit spreads over both
    rates: the change per added tensor within each run (0.271 and 0.292 ms a step) is above
    the fitted three calls' worth."""
    short, hidden = fsdp_rows()
    # the unit micro-benchmark's steps ran on 2 GPUs, paced by the slower host (:func:`paced`)
    short = [(u, t, e / paced(2)) for u, t, e in short]
    sel = short
    rates = (0.0, 0.0)
    for _ in range(len(short)):
        a = np.array([[fsdp_host(u, 0, 1.0, 0.0, 0.0) / e, fsdp_host(0, t, 0.0, 1.0, 0.0) / e]
                      for u, t, e in sel])
        b = np.array([1.0 - op_s * u / e for u, _, e in sel])
        rates = tuple(float(x) for x in np.linalg.lstsq(a, b, rcond=None)[0])
        new = [r for r in short if fsdp_host(r[0], r[1], *rates, op_s) > hidden[r[0]]]
        if new == sel:
            break
        sel = new
    return rates[0], rates[1], sel


def fit_dtensor() -> dict[str, tuple[float, float]]:
    """{unit: (forward_s, backward_s)}: DTensor's host time per unit beyond plain tensors, the
    mean over ranks of ``dtensor_host.py``'s differences, clamped at zero ({} before the
    measurement exists)."""
    if not DTENSOR.exists():
        return {}
    rows = jsonl(DTENSOR)
    out = {}
    for unit in DTENSOR_UNITS:
        mine = [r for r in rows if r.get("kind") == unit]
        out[unit] = tuple(max(0.0, float(np.mean([r[f"extra_{w}_s"] for r in mine])))
                          for w in ("fwd", "bwd"))
    return out


def dtensor_opt_points() -> list[tuple[int, str, int, int, float]]:
    """(ranks, width, layers, DTensor parameter tensors, seconds) of ``dtensor_step_host.py``:
    per configuration the mean over ranks of the run medians of ``opt_s - plain_opt_s`` (the
    host time DTensor adds to the AdamW step; ``zero_grad`` is timed apart and is under 1.5 ms
    either way); [] before the measurement exists."""
    out = []
    for path in DTENSOR_STEP:
        if not path.exists():
            continue
        rows = [r for r in jsonl(path) if "rank" in r]
        for key in sorted({(r["world"], r["width"], r["layers"]) for r in rows}):
            sel = [r for r in rows if (r["world"], r["width"], r["layers"]) == key]
            ranks = sorted({r["rank"] for r in sel})
            med = [float(np.median([r["opt_s"] - r["plain_opt_s"] for r in sel
                                    if r["rank"] == q])) for q in ranks]
            out.append((*key, sel[0]["dtensor_params"], float(np.mean(med))))
    return out


def fit_dtensor_opt() -> tuple[float, float]:
    """(host_dtensor_opt_step_s, host_dtensor_opt_tensor_s): least squares on relative error
    of ``seconds = step_s + tensors x tensor_s`` over :func:`dtensor_opt_points` (both
    degrees, both widths, both depths); (0, 0) before the measurement exists."""
    pts = dtensor_opt_points()
    if not pts:
        return 0.0, 0.0
    a = np.array([[1.0 / s, n / s] for *_, n, s in pts])
    step_s, tensor_s = np.linalg.lstsq(a, np.ones(len(pts)), rcond=None)[0]
    return float(step_s), float(tensor_s)


def fit_dtensor_opt_nosp() -> float:
    """``host_dtensor_opt_tensor_nosp_s``: the host time DTensor adds to the optimizer step per
    DTensor parameter tensor without SP (8 a layer), from ``dtensor_host.py``'s ``block`` rows
    (tiny GPT-2 at 2 and 6 layers): per rank the optimizer step's growth from 2 to 6 layers
    under the TP plan without SP less the single-GPU block's, over 4 x 8 tensors; the mean
    over the ranks of every launch (the 2x H100 file and the 2- and 4-rank launches of
    ``dtensor-step-host-h200x4``), none below zero; 0 before the measurement exists."""
    vals = []
    for path in (DTENSOR, *DTENSOR_BLOCK):
        if not path.exists():
            continue
        rows = [r for r in jsonl(path) if r.get("kind") == "block"]
        single = {r["rank"]: r["opt_6l_s"] - r["opt_2l_s"] for r in rows
                  if r["scheme"] == "single"}
        vals += [(r["opt_6l_s"] - r["opt_2l_s"] - single[r["rank"]]) / (4 * 8) for r in rows
                 if r["scheme"] == "tp" and not r["sp"]]
    return max(0.0, float(np.mean(vals))) if vals else 0.0


def fit_new_shape() -> dict[str, float]:
    """{fwd, dgrad, wgrad}: the host time a GEMM of a shape the process has not launched adds
    to the call (``gemm_shape_host.py``: fresh row count less the same call at a fixed one),
    the mean over the two widths (and, forward, over ``mm`` and ``addmm``); {} before the
    measurement exists."""
    if not NEW_SHAPE.exists():
        return {}
    host = {(r["width"], r["kind"], r["mode"]): r["host_us_per_call"] * 1e-6
            for r in jsonl(NEW_SHAPE)}
    widths = sorted({w for w, _, _ in host})

    def extra(kinds):
        return float(np.mean([host[w, k, "fresh"] - host[w, k, "fixed"]
                              for w in widths for k in kinds]))

    return {"fwd": extra(("mm_fwd", "addmm_fwd")), "dgrad": extra(("mm_dgrad",)),
            "wgrad": extra(("mm_wgrad",))}


def fused_rows(kind: str = "layer") -> list[dict]:
    """Rows of Megatron-Core's MoE host micro-benchmark of ``kind`` (``layer``: attention and
    MoE block; ``moe``: the block alone; ``dense``) at the host-bound width, alltoall
    dispatcher, every rank."""
    return [r for r in jsonl(MCORE) if r.get("layer") == kind and r["hidden"] == 256
            and r["dispatcher"] == "alltoall"]


def fit_fused(sync_s: float) -> float:
    """``host_fused_op_s``: Megatron-Core's host time per kernel launched in an MoE layer,
    given ``host_sync_s`` (the one count synchronisation of a forward the simulator charges
    apart), fitted on :func:`fused_rows` (module docstring).

    Per kernel launched, not per part of the simulator's fused program (the convention of
    ``host_op_s``): the measured layer is Megatron-Core's own (``get_gpt_layer_local_spec``,
    no Transformer Engine, unfused permutation, ``SequentialMLP`` experts one after another),
    which launches 6-12 times the kernels of the simulator's fused program of the same layer
    (285 against 44 at 4 local experts, 1,614 against 134 at 64), and its host time tracks
    the kernels launched (59-63 us each from 285 to 1,614 kernels, 5.6 times as many); the
    growth with local experts is ``SequentialMLP``'s 22 kernels per expert, not a separate
    cost. A fused run launches roughly one kernel per part of the simulator's program
    (Transformer Engine's fused norms, attention and permutation; its grouped GEMM launches
    each expert's GEMM from C++, which the simulator charges as one part per round of four
    experts), so the rate per kernel is what carries over. It is a lower bound for a
    Transformer Engine run, whose modules add their own Python per call (TE was not
    measured); the forward's kernels cost more host than the backward's (about 80 against
    47 us), which one rate averages; CUDA graphs, where a run uses them, remove the host
    time of what they capture (not modelled)."""
    rows = fused_rows()
    kk = np.array([(r["fwd_kernels"] + r["bwd_kernels"]) / (r["fwd_s"] + r["bwd_s"])
                   for r in rows])
    rest = np.array([1.0 - sync_s / (r["fwd_s"] + r["bwd_s"]) for r in rows])
    return float(kk @ rest / (kk @ kk))


def fit_multihot() -> float:
    """``host_multihot_s``: the host time of one call of Megatron-Core's unfused
    ``_indices_to_multihot`` (0.19.2, torch 2.11, one H100 a process, the GPU idle, shapes
    of the ModelZoo Qwen3 TP 4 / EP 8 row: about 5,470 received tokens, top 8, 16 local
    experts), the mean over the four processes (run at once) of each one's median over 100
    calls (``benchmarks/device/multihot_host.py``, ``data/measured/multihot-host-h100x4``):
    one process's rate, as the other host rates."""
    meds = [r["host_med_s"] for f in MULTIHOT for r in jsonl(f)
            if r.get("fn") == "unfused" and r.get("mode") == "idle"]
    return float(np.mean(meds))


def refit() -> dict[str, tuple[float, float]]:
    """{constant: (refitted, shipped)}, the refit rounded as shipped (0.01 us, 0.1 us)."""
    op_s, coll_s, _ = fit()
    sync_s = micro()[1]
    moe_s = fit_moe()[0]
    call_s, tensor_s, _ = fit_fsdp(op_s)
    fused_s = round(fit_fused(sync_s) * 1e8) / 1e8
    d = default_kernel_params()
    shipped, fitted, nan = d.get("host_dtensor") or {}, fit_dtensor(), float("nan")
    dt = {f"defaults.host_dtensor.{u}.{w}_s": (round(v * 1e7) / 1e7,
                                               shipped.get(u, {}).get(f"{w}_s", nan))
          for u in sorted(set(fitted) | set(shipped))
          for w, v in zip(("fwd", "bwd"), fitted.get(u, (nan, nan)), strict=True)}
    o_step, o_tensor = fit_dtensor_opt()
    dt["defaults.host_dtensor_opt_step_s"] = (round(o_step * 1e6) / 1e6,
                                              d["host_dtensor_opt_step_s"])
    dt["defaults.host_dtensor_opt_tensor_s"] = (round(o_tensor * 1e7) / 1e7,
                                                d["host_dtensor_opt_tensor_s"])
    dt["defaults.host_dtensor_opt_tensor_nosp_s"] = (
        round(fit_dtensor_opt_nosp() * 1e7) / 1e7, d["host_dtensor_opt_tensor_nosp_s"])
    shape = {f"defaults.host_gemm_new_shape_{k}_s": (round(v * 1e7) / 1e7,
                                                      d[f"host_gemm_new_shape_{k}_s"])
             for k, v in fit_new_shape().items()}
    return dt | shape | {"defaults.host_op_s": (round(op_s * 1e8) / 1e8, d["host_op_s"]),
            "defaults.host_collective_s": (round(coll_s * 1e7) / 1e7, d["host_collective_s"]),
            "defaults.host_sync_s": (round(sync_s * 1e7) / 1e7, d["host_sync_s"]),
            "defaults.host_moe_op_s": (round(moe_s * 1e8) / 1e8, d["host_moe_op_s"]),
            "defaults.host_engine_op_s": (round(engine_rate() * 1e7) / 1e7,
                                          d["host_engine_op_s"]),
            "defaults.host_fsdp_call_s": (round(call_s * 1e7) / 1e7, d["host_fsdp_call_s"]),
            "defaults.host_fsdp_tensor_s": (round(tensor_s * 1e8) / 1e8,
                                            d["host_fsdp_tensor_s"]),
            "defaults.host_fused_op_s": (fused_s, d["host_fused_op_s"]),
            "defaults.host_fused_collective_s": (fused_s, d["host_fused_collective_s"]),
            "defaults.host_multihot_s": (round(fit_multihot() * 1e7) / 1e7,
                                         d["host_multihot_s"])}
