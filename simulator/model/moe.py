"""Mixture-of-experts layers: parameters (total and active), routing, token dispatch volumes,
expert load per EP rank, and the per-rank kernels of an MoE block.

Pure functions, no SimPy. Conventions follow Megatron-Core's MoE (``megatron/core/
transformer/moe``) and MoE Parallel Folding (Liu et al. 2025, arXiv:2504.14960):

* An MoE layer's MLP is ``experts`` routed experts (each a SwiGLU or GELU MLP of
  ``moe.ffn_hidden``) and ``shared_experts`` always-active ones (``moe.shared_ffn``), chosen per
  token by a router ``h x experts`` (softmax top-k, as Mixtral and Qwen; or sigmoid scores with
  group-limited top-k, as DeepSeek-V3, arXiv:2412.19437, Section 2.1.2). The first
  ``dense_layers`` layers keep a dense MLP of ``model.ffn_hidden`` (DeepSeek-V3: 3).
* Layout (Parallel Folding): the MoE block of a stage runs on the same ``tp*cp*dp`` GPUs as its
  attention, regrouped ``etp x ep x edp``. Megatron requires sequence parallelism with TP in
  MoE models, so ``tokens = b*s/(tp*cp)`` tokens of a micro-batch enter the router on each
  rank. Each EP rank holds ``experts/ep`` experts (expert ``e`` on rank ``e // (experts/ep)``),
  each split ``etp`` ways along its inner width.
* Dispatch (``moe_dispatcher: alltoall``; ``deepep`` the same path with DeepEP's node-aware
  exchange, :mod:`simulator.model.moe_routing`): every rank permutes its ``tokens*top_k`` token copies
  by expert, exchanges the per-expert counts, sends each EP peer the copies routed to its
  experts (``all_to_all``), all-gathers them over ETP, runs its experts, and reverses the path
  (reduce-scatter over ETP, ``all_to_all`` combine, unpermute with the routing weights).
  Backward repeats both exchanges with gradients. ``allgather``: every rank all-gathers the
  EP group's tokens, computes its experts on the ones routed to them, and reduce-scatters the
  outputs back (Megatron's ``MoEAllGatherTokenDispatcher``).
* Load: ``moe_expert_load`` gives each expert's share of the routed copies (default uniform).
  An all-to-all and the expert GEMMs after it wait for the busiest EP rank, so the kernels
  below are those of the busiest rank. ``capacity_factor`` caps each expert at
  ``capacity_factor * copies / experts`` copies (Fedus et al. 2021, arXiv:2101.03961, eq. 3;
  Megatron's ``moe_expert_capacity_factor``); the rest are dropped.

GELU experts carry no biases here (every MoE model shipped is SwiGLU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from simulator.config.schema import ROUTE_WIDENING_PER_HIDDEN2, ModelConfig, TrainingConfig
from simulator.model import kernel_first, route_skew, shape_cache
from simulator.model.ops import (
    DTYPE_BYTES,
    FP32,
    HOST_SYNC,
    Op,
    accumulate_op,
    gemm_grads,
    gemm_op,
    mem_op,
)
from simulator.network.interference import extra_fraction

#: int64 indices (token ids, permutations)
I64 = 8
#: eager ops whose backward runs no kernel (views, constants, integer bookkeeping)
NO_BACKWARD = ("expert_cat", "combine_zeros", "perm_cat", "inv_arange", "inv_scatter",
               "shared_add")
#: kernels of the unfused router whose backward runs none (name prefixes): random logits'
#: straight-through gradient, the integer routing map and counts, the loss's scale, logging
ROUTER_NO_BACKWARD = ("router_random", "router_map", "router_tokens", "router_aux_scale",
                      "router_aux_log")
#: eager kernels whose backward runs none (name prefixes): integer index work, and the
#: experts' input concatenations (``regroup: concat``), whose backward is views
NO_BACKWARD_PREFIXES = ("perm_arange", "perm_ids", "perm_sort", "expert_cat_in",
                        *ROUTER_NO_BACKWARD)
#: Megatron-Core's alltoall dispatcher's bookkeeping on integer tensors (fused code,
#: :func:`_alltoall_preprocess_ops`): the count kernels, the split sizes' device-to-host
#: copies and the un-sort's split sizes; plain aten calls, no backward (host time per call:
#: the plain-aten rate measured on ``_indices_to_multihot``, gpus.yaml ``host_multihot_s``)
PLAIN_ATEN_PREFIXES = ("a2a_counts_", "a2a_dtoh_", "unsort_sizes")
#: Transformer Engine's row map of its fused permutation (two Triton kernels, no backward)
ROW_MAP_PREFIX = "te_row_map"

#: The collective of a node-aware dispatch or combine (``moe_dispatcher: deepep``): ``nbytes``
#: is one vector per token of the rank, spread as :func:`simulator.model.moe_routing.
#: node_aware_split` says (the engine prices it with that split).
#: Kernels of the token routing around the experts (router, top-k, count exchange,
#: permutation and its index arithmetic, combine): in eager code each comes with Python over
#: ranks and experts (lists, splits, aranges), so it costs its host more than a model kernel
ROUTING_OPS = ("router", "permute", "unpermute", "moe_counts", "perm_", "sort_chunks",
               "unsort_chunks", "expert_cat", "inv_", "combine_")


def new_shape_share(model: ModelConfig, training: TrainingConfig, loc: MoELocal | None = None,
                    calls: int = 1, sources: int = 1) -> float:
    """The expected share of an eager MoE step's expert GEMMs whose shape (row count: the
    expert's tokens in this micro-batch) the process has not launched before, so cuBLAS
    runs its heuristic query on the host (a miss of its heuristics cache; gpus.yaml
    ``host_gemm_new_shape_*`` measures what one costs). ``loc``: the busiest EP rank's
    experts; ``calls``: MoE layer calls per step on that rank (its MoE layers times the
    micro-batches); ``sources``: the ranks whose tokens an expert takes (``ep x etp``).

    * ``training.moe_routes: replayed`` (the same forced routes every step): the shapes repeat
      from the second step on, 0.
    * learned routes, ``training.measured_steps: [first, last]`` set (a benchmark of a fresh
      process): the expected share of the calls of those steps whose row count is new
      (:func:`simulator.model.shape_cache.new_share` over :func:`expert_row_streams`; the
      GEMM kinds of a layer all see the same counts, so one share serves forward, data and
      weight gradients).
    * learned routes, a long run's steady state (``measured_steps`` null): 0, the cache
      (8,192 entries by default, cuBLAS's ``CUBLASLT_HEURISTICS_CACHE_CAPACITY``) holds
      every count seen. Optimistic where the shares keep drifting over more counts than that.

    Fused code (grouped GEMM) and dense models: 0 (every GEMM shape repeats)."""
    fresh = _fresh_process_streams(model, training, loc, calls, sources)
    return shape_cache.new_share(*fresh) if fresh else 0.0


def first_launch_drains(model: ModelConfig, training: TrainingConfig,
                        loc: MoELocal | None = None, calls: int = 1, sources: int = 1) -> float:
    """The expected expert backwards a step (on the busiest EP rank) whose data-gradient GEMM
    launches a cuBLAS kernel new to the process, which makes its host wait until the GPU has
    run everything queued (:mod:`simulator.model.kernel_first`; data/measured/gemm-drain-h100x4).
    Arguments as :func:`new_shape_share`. Only eager code with learned routes, measured in a
    window of a fresh process (``training.measured_steps``): replayed routes repeat their counts
    from the second step on, grouped GEMMs (fused code) have fixed shapes, and a long run's
    steady state has met every kernel; 0 for each."""
    fresh = _fresh_process_streams(model, training, loc, calls, sources)
    return kernel_first.first_launches(*fresh) if fresh else 0.0


def _fresh_process_streams(model: ModelConfig, training: TrainingConfig, loc: MoELocal | None,
                           calls: int, sources: int
                           ) -> tuple[list[shape_cache.Stream], int, int] | None:
    """The busiest EP rank's expert row-count streams with the measured window ``(streams,
    first, last)`` where the shapes an expert GEMM meets change from step to step in a fresh
    process (eager code, learned routes, ``training.measured_steps`` set); None otherwise."""
    if model.moe is None or training.kernels != "eager" or training.moe_routes == "replayed":
        return None
    if training.measured_steps is None or loc is None:
        return None
    first, last = training.measured_steps
    widen = route_widening(model, training, sources * loc.tokens)
    return expert_row_streams(training, loc, calls, sources, widen), first, last


def route_widening(model: ModelConfig, training: TrainingConfig, tokens: int) -> float:
    """How fast a stable learning router's correlation grows with the step (``widen`` of
    :class:`~simulator.model.shape_cache.Stream`, ``rho + widen (s - 1)^2`` at step ``s``) for
    a call of ``tokens`` tokens: ``training.moe_route_widening x (seq_len / tokens) x
    hidden^2 / global_batch``, where null :data:`~simulator.config.schema.ROUTE_WIDENING_PER_HIDDEN2`
    while ``moe_route_correlation`` is left at its default (a router set to its own
    correlation, collapsing or at initialization, keeps it: 0).

    From first principles: AdamW moves each of an expert's ``h`` router weights by about
    ``lr`` a step in the direction of the step's mean gradient, a sum over the
    ``global_batch`` sequences of the step; the part of it that favours one sequence's tokens
    is ``1 / sqrt(global_batch)`` of it, so a sequence's mean logit for an expert drifts by
    ``lr`` times an L1 norm of order ``h / sqrt(global_batch)`` a step, and the variance of a
    sequence's share of an expert grows as ``(h (s - 1))^2 / global_batch``. Tokens of one
    sequence share that drift; a call of ``tokens / seq_len`` sequences adds ``seq_len /
    tokens`` of it to the correlation of two of its tokens. Doubling EP doubles both the
    call's sequences and the step's, a quarter of the growth: the logged EP 2 / EP 4 pairs of
    ``steps_third.py`` (B, AD, AH) grow 5.3, 4.2 and 2.5 times as fast at EP 2
    (data/measured/expert-rows2-h100x4). ``simulator.calibrate.routes.fit_widening`` fits the
    constant on the logged rows."""
    per = training.moe_route_widening
    if per is None:
        if "moe_route_correlation" in training.model_fields_set:
            return 0.0
        per = ROUTE_WIDENING_PER_HIDDEN2
    return (per * model.seq_len / max(tokens, 1) * float(model.hidden) ** 2
            / training.global_batch)


def expert_row_streams(training: TrainingConfig, loc: MoELocal, calls: int,
                       sources: int, widen: float = 0.0) -> list[shape_cache.Stream]:
    """The row counts of the busiest EP rank's expert GEMMs, one
    :class:`~simulator.model.shape_cache.Stream` per local expert (experts of equal load
    merged), ``calls`` draws a step: each of the ``sources x tokens`` tokens sends the expert a
    copy with its mean probability (its copies over the tokens), tokens correlated by
    ``training.moe_route_correlation`` (a learning router's variation from call to call)."""
    n = sources * loc.tokens
    by: dict[float, int] = {}
    for m in loc.expert_tokens:
        if m >= 1.0:
            by[m] = by.get(m, 0) + calls
    return [shape_cache.Stream(n, min(1.0, m / n), training.moe_route_correlation, c, widen)
            for m, c in sorted(by.items())]


#: kernels autograd's engine issues for the backward of eager MoE code's input slices
#: (:func:`_slice_grad_ops`): no Python runs for them
SLICE_GRAD = "expert_slice_"
#: the backward of ``steps_alt.py``'s split of each expert's output per source
#: (``regroup: concat``): ``split_with_sizes_backward`` cats the pieces' gradients, one copy
#: of the expert's rows (PyTorch ``FunctionsManual.cpp``); no Python runs for it
SPLIT_GRAD = "expert_split_grad_"
#: eager MoE kernels no Python line launches (name prefixes): the slices' backward, and each
#: expert parameter's autocast cast, bias gradient, gradient cast and ``.grad`` addition
#: (:func:`simulator.model.moe_layer._eager_expert_params`), issued by the dispatcher inside
#: the expert's ``nn.Linear`` call or by autograd's engine
ENGINE_OPS = (SLICE_GRAD, SPLIT_GRAD, "expert_wcast_", "expert_bcast_", "expert_bgrad_", "expert_gcast_",
              "expert_gacc_", "expert_bgcast_", "expert_bgacc_")


def engine_op(name: str) -> bool:
    """Whether kernel ``name`` is one of :data:`ENGINE_OPS` (its host time:
    gpus.yaml ``host_engine_op_s``)."""
    return name.startswith(ENGINE_OPS)


def routing_op(name: str) -> bool:
    """Whether kernel ``name`` (forward or backward) is one of :data:`ROUTING_OPS`."""
    return name.startswith(ROUTING_OPS)


DEEPEP = "deepep"

#: SMs DeepEP's dispatch and combine kernels occupy while they run: Megatron-Core sets
#: ``set_deepep_num_sms(moe_flex_dispatcher_num_sms or 20)`` (``token_dispatcher.py``,
#: ``_DeepepManager``: "DeepEP's historical mcore default"); DeepSeek-V3 kept 20 of 132 SMs
#: for communication (arXiv:2412.19437, Section 3.2.2)
DEEPEP_SMS = 20


def beside_ep_slowdown(interference: float, dispatcher: str, sm_count: int) -> float:
    """How much slower kernels run beside an EP collective (combined 1F1B, DualPipe): the
    machine's measured slowdown beside an NCCL kernel, or for DeepEP at least what its
    :data:`DEEPEP_SMS` SMs take away from them, ``sms / (sm_count - sms)`` (20 of 132 SMs:
    17.9 %)."""
    if dispatcher != DEEPEP or sm_count <= DEEPEP_SMS:
        return interference
    return max(interference, DEEPEP_SMS / (sm_count - DEEPEP_SMS))

def ep_comm_extra(nccl, gpu_name: str, ep: int, dispatcher: str, sm_count: int,
                  deepep_copies: float = 1.0):
    """``f(part)``: ``(extra, beside)`` of an EP collective (``part``: a priced comm part of
    dimension ``ep``) that combined 1F1B or DualPipe pairs with the other micro-batch's
    kernels (:mod:`simulator.engine.combined`): the all-to-all's extra fraction of its time
    while kernels run beside it, and those kernels' extra fraction of theirs, as measured for
    an all-to-all over ``ep`` GPUs of the part's bytes beside loops of expert GEMMs
    (``nccl.ep_pair_beside_experts``, :func:`simulator.calibrate.interference.ep_pair_table`;
    interpolated as :func:`simulator.network.interference.extra_fraction`). DeepEP's dispatch
    and combine are taken as the same kind of kernel (an all-to-all whose copies run on SMs
    the GEMMs share; NCCL's measured, DeepEP is not installed on the lent GPUs), at the bytes
    its kernels send (the part's tokens times ``deepep_copies``, the vectors a rank sends per
    token: :func:`simulator.engine.dispatch.routed_copies`, as an all-to-all's bytes count
    its ``top_k`` copies), the kernels beside them slowed at least by the SMs DeepEP holds
    (:func:`beside_ep_slowdown`).
    ``(0, -1)`` (taken at its own cost, the schedule's interference) for another part or a
    GPU without the table."""
    tables = nccl.get("ep_pair_beside_experts") or {}
    own = tables.get(gpu_name) or tables.get(tables.get("inherit", ""), {})
    share = beside_ep_slowdown(0.0, dispatcher, sm_count)

    def f(part) -> tuple[float, float]:
        if not own or part.op not in ("all_to_all", DEEPEP):
            return 0.0, -1.0
        n = part.nbytes * (deepep_copies if part.op == DEEPEP else 1.0)
        return (extra_fraction(own, "all_to_all", n, ep),
                max(extra_fraction(own, "experts", n, ep), share))

    return f


#: GEMM tile rows a grouped GEMM pads each expert's token count to (a 128-row output tile: an
#: expert's last partial tile costs a whole one).
GROUPED_TILE_M = 128

#: Streams over which Transformer Engine runs a grouped GEMM's per-expert GEMMs. Its
#: ``GroupedLinear`` (Megatron-Core's ``TEGroupedMLP``) calls ``nvte_multi_tensor_gemm``, which
#: issues one cuBLAS GEMM per expert, round-robin over ``nvte_get_num_compute_streams()`` = 4
#: compute streams, unless ``NVTE_USE_CUTLASS_GROUPED_GEMM`` selects the CUTLASS grouped kernel
#: (Hopper, BF16/FP16 only; off by default) (TransformerEngine ``common/gemm/cublaslt_gemm.cu``,
#: ``common/util/multi_stream.cpp``, 2026-08). Measured on H100 (``data/measured/
#: grouped-gemm-h100``: per-expert ``torch.mm`` round-robin over 4 streams, CUDA-graph replay,
#: at the published MoE rows' expert shapes): a round's forward and dgrad GEMMs take what the
#: same GEMMs take one after another (4 streams / 1 stream 0.9-1.1 at 256-4,096 rows an
#: expert), not what one GEMM of their rows together takes (1.1-1.5x that at <= 1,024 rows);
#: the wgrads, each writing its own ``[k, n]``, take what one GEMM of theirs stacked in m
#: takes (0.93-1.10).
TE_GEMM_STREAMS = 4


def router_kernels(training: TrainingConfig) -> str:
    """Which router a fused MoE layer runs: ``fused`` (one kernel for scores, top-k, routing
    map and the aux loss's scores, as Megatron-Core's ``--moe-router-fusion`` does, since
    Megatron-LM c08d89bea0, 2025-08-17), ``unfused`` (its PyTorch router before or without
    that flag, :func:`_unfused_router_ops`), ``unfused_random`` (the same with
    ``--moe-router-force-load-balancing``'s random logits, ``training.moe_routing: random``)."""
    if training.moe_router_fusion or training.kernels != "fused":
        return "fused"
    return "unfused_random" if training.moe_routing == "random" else "unfused"


def _unfused_router_ops(t: int, E: int, k: int, tp: int, d: int, random: bool) -> list:
    """Megatron-Core's PyTorch top-k router after its gating GEMM, one op per kernel it
    launches (Megatron-LM 1e057005, 2025-05-24: ``router.py`` ``TopKRouter.forward``,
    ``aux_loss_load_balancing``, ``apply_load_balancing_loss``; ``moe_utils.py``
    ``topk_softmax_with_capacity`` without capacity, ``switch_load_balancing_loss_func``,
    ``save_to_aux_losses_tracker``, ``RandomSTE``), on the rank's ``t`` tokens' ``[t, E]``
    fp32 logits: random logits (``clone().normal_()``, forced balance only), ``topk``, the
    softmax of the top-k scores, the gates (``zeros_like().scatter``), the routing map
    (``zeros_like().int().scatter().bool()``), the tokens per expert (``sum``), the aux
    loss's full softmax, the all-reduce of the tokens per expert over the TP group (the
    sequence is split over it), the loss (``sum``, product, ``sum``, scale) and its logging
    (``/ coeff``, ``+=``). Names in :data:`ROUTER_NO_BACKWARD` run no kernel backward (random
    logits' straight-through gradient, integer maps, logging). Left out: the casts of the
    input and weight to an fp32 router (``--moe-router-dtype fp32``), z-loss and capacity."""
    x = t * E * FP32
    ops: list = [mem_op("router_random_clone", "moe", 2 * x), mem_op("router_random_normal",
                 "moe", x)] if random else []  # fmt: skip
    ops += [
        mem_op("router_topk", "moe", x + t * k * (FP32 + I64)),
        mem_op("router_softmax_k", "moe", 2 * t * k * FP32),
        mem_op("router_map_gates_zeros", "moe", x),
        mem_op("router_gates", "moe", x + t * k * (FP32 + I64)),
        mem_op("router_map_zeros", "moe", x),
        mem_op("router_map_int", "moe", 2 * x),
        mem_op("router_map_scatter", "moe", t * E * 4 + t * k * I64),
        mem_op("router_map_bool", "moe", t * E * 5),
        mem_op("router_tokens_sum", "moe", t * E + E * I64),
        mem_op("router_aux_softmax", "moe", 2 * x),
    ]
    if tp > 1:
        ops.append(Comm("router_aux_tokens", "all_reduce", "tp", E * I64))
    ops += [
        mem_op("router_aux_probs_sum", "moe", x + E * FP32),
        mem_op("router_aux_mul", "moe", E * (2 * FP32 + I64)),
        mem_op("router_aux_sum", "moe", E * FP32),
        mem_op("router_aux_scale", "moe", 2 * FP32),
        mem_op("router_aux_log_div", "moe", 2 * FP32),
        mem_op("router_aux_log_add", "moe", 3 * FP32),
    ]
    return ops


def multihot_kernels(training: TrainingConfig) -> str:
    """How a fused MoE layer with DeepEP turns the received routes into its local experts'
    routing map: ``fused`` (``fused_indices_to_multihot``, one Triton kernel, which
    Megatron-Core runs only with ``--enable-experimental``, a flag since Megatron-LM
    6782fe457f, 2025-06-12; before it ``ENABLE_EXPERIMENTAL`` was a constant False) or
    ``unfused`` (``_DeepepManager._indices_to_multihot`` in PyTorch, what every version runs
    without the flag, :data:`MULTIHOT_CALLS`). Other dispatchers and eager code:
    ``fused`` (nothing added)."""
    if training.moe_multihot_fusion or training.kernels != "fused" \
            or training.moe_dispatcher != DEEPEP:
        return "fused"
    return "unfused"


def deepep_received_tokens(loc: MoELocal, E: int, k: int, ep: int) -> float:
    """Distinct tokens DeepEP's dispatch delivers to the busiest EP rank (one row per token
    with at least one of its ``k`` experts among the rank's ``E / ep``, each of the ``ep``
    ranks' ``t`` tokens): ``ep t (1 - C(E - E/ep, k) / C(E, k))`` with uniform routes, scaled
    by the busiest rank's share of the copies, at most ``ep t``."""
    t, local = loc.tokens, E // ep
    hit = 1.0 - math.comb(E - local, k) / math.comb(E, k) if E - local >= k else 1.0
    share = sum(loc.expert_tokens) / (k * t * local / E * ep) if t else 1.0
    return min(ep * t, ep * t * hit * share)


#: Kernels of Megatron-Core's ``_indices_to_multihot`` in order, as profiled on H100 (torch
#: 2.11, ``data/measured/multihot-host-h100x4``: 27 kernels, 5 device-to-host copies and 5
#: stream synchronisations a call), by torch call: the ``zeros`` of the int64 map and of the
#: fp32 probabilities, the mask ``!= -1``; ``indices[mask]``: ``nonzero`` (two count
#: reductions, the host reads the count, the compaction's init and select,
#: ``write_indices``) and the gather; ``arange``, the mask's cast and ``sum(1)``;
#: ``repeat_interleave`` of a tensor (its ``cumsum``'s init and scan, the check that every
#: repeat is >= 0 read on the host, the total read on the host, the fill, ``index_select``);
#: the map's ``index_put_`` of the Python scalar 1 (copied to the GPU and waited for first);
#: ``probs[mask]`` (as ``indices[mask]``); the probabilities' ``index_put_``; ``.bool()``.
#: ``None`` marks where the host waits for the GPU.
MULTIHOT_CALLS: tuple[str | None, ...] = (
    "multihot_zeros_map", "multihot_zeros_probs", "multihot_mask",
    "multihot_idx_count", "multihot_idx_count2", None, "multihot_idx_init",
    "multihot_idx_select", "multihot_idx_write", "multihot_idx_gather",
    "multihot_arange", "multihot_mask_cast", "multihot_mask_sum",
    "multihot_rep_scan_init", "multihot_rep_scan", "multihot_rep_check",
    "multihot_rep_all", None, None, "multihot_rep_fill", "multihot_rep_index",
    None, "multihot_put_map",
    "multihot_probs_count", "multihot_probs_count2", None, "multihot_probs_init",
    "multihot_probs_select", "multihot_probs_write", "multihot_probs_gather",
    "multihot_put_probs", "multihot_bool",
)
#: the unfused path's kernels (host time per kernel: gpus.yaml ``host_multihot_s``)
MULTIHOT_KERNELS = frozenset(n for n in MULTIHOT_CALLS if n is not None)
#: host synchronisations of one call
MULTIHOT_SYNCS = sum(n is None for n in MULTIHOT_CALLS)


def _multihot_bytes(name: str, n: float, k: int, L: int, R: float) -> float:
    """HBM bytes of kernel ``name`` of :data:`MULTIHOT_CALLS` over ``n`` received tokens'
    ``[n, k]`` indices (``R`` valid copies, ``L`` local experts): what each reads and writes;
    every one is a few microseconds, launch-bound."""
    if name == "multihot_zeros_map":
        return n * L * I64
    if name == "multihot_zeros_probs":
        return n * L * FP32
    if name == "multihot_bool":
        return n * L * (I64 + 1)
    if name == "multihot_mask":
        return n * k * (I64 + 1)
    if name.endswith(("_count", "_count2", "_init", "_check", "_all", "mask_cast")):
        return n * k
    if name.endswith(("_select", "_write")):
        return n * k + R * I64
    if name in ("multihot_arange", "multihot_mask_sum", "multihot_rep_scan_init",
                "multihot_rep_scan"):
        return n * k + 2 * n * I64
    return 3 * R * I64  # gathers, index_put, fill, index_select


def _deepep_routing_ops(t: int, E: int, k: int, n: float, L: int, R: float,
                        multihot: str) -> tuple[list, list]:
    """Megatron-Core's flex dispatcher with DeepEP around its dispatch (``token_dispatcher.py``
    ``_DeepepManager``, Megatron-LM 1e057005 2025-05-24 and still 2026): before it
    ``setup_metadata``'s ``topk`` of the ``[t, E]`` probabilities; after it the received
    tokens' routing map over the ``L`` local experts from their ``[n, k]`` indices (``R`` valid
    copies): ``fused`` one Triton kernel (``fused_indices_to_multihot``, with
    ``--enable-experimental``), ``unfused`` ``_indices_to_multihot`` in PyTorch, the kernels
    and host synchronisations of :data:`MULTIHOT_CALLS`. Returns (before, after)."""
    before = [mem_op("dispatch_topk", "moe", t * E * FP32 + t * k * (FP32 + I64))]
    if multihot != "unfused":
        return before, [mem_op("multihot_fused", "moe", n * k * (I64 + FP32)
                               + n * L * (1 + FP32))]  # fmt: skip
    after = [Op("multihot_sync", HOST_SYNC, "moe") if name is None
             else mem_op(name, "moe", _multihot_bytes(name, n, k, L, R))
             for name in MULTIHOT_CALLS]  # fmt: skip
    return before, after


def _multihot_backward(t: int, E: int, k: int, n: float, L: int, R: float, what: str
                       ) -> list[Op]:  # fmt: skip
    """The backward of :func:`_deepep_routing_ops` (the probabilities' gradient; the map is
    boolean): ``topk`` its zeros and scatter into ``[t, E]``; ``fused`` the Triton kernel
    back to ``[n, k]``; ``unfused`` the probabilities' ``index_put_`` gathers its values'
    gradient, ``probs[mask]``'s ``IndexBackward`` makes zeros and adds into them with
    ``index_put_(accumulate=True)`` (its linear index, a sort, the scatter)."""
    if what == "topk":
        return [mem_op("dispatch_topk_zeros", "moe", t * E * FP32, True),
                mem_op("dispatch_topk_scatter", "moe", t * k * (FP32 + I64) + t * E * FP32,
                       True)]  # fmt: skip
    if what == "fused":
        return [mem_op("multihot_fused", "moe", n * L * FP32 + n * k * (I64 + FP32), True)]
    return [
        mem_op("multihot_grad_gather", "moe", n * L * FP32 + R * (2 * I64 + FP32), True),
        mem_op("multihot_grad_zeros", "moe", n * k * FP32, True),
        mem_op("multihot_grad_linear", "moe", 2 * R * I64, True),
        mem_op("multihot_grad_sort", "moe", 4 * R * I64, True),
        mem_op("multihot_grad_put", "moe", R * (I64 + 2 * FP32), True),
    ]


def expert_wgrad_acc_bytes(training: TrainingConfig) -> int:
    """Bytes an element of the ``main_grad`` buffers that fused grouped experts' wgrad GEMMs
    add into: Megatron's gradient-accumulation fusion (default on) hands Transformer Engine
    each expert's ``main_grad``, in the gradient-reduction dtype (fp32 unless
    ``--grad-reduce-in-bf16``: bf16 training accumulates and reduces in fp32, Megatron-LM
    ``arguments.py``); 0 where the wgrads write fresh outputs (eager code, the fusion off,
    fp32 working weights)."""
    t = training
    if t.kernels != "fused" or not t.grad_accumulation_fusion or t.param_dtype != "bf16":
        return 0
    return DTYPE_BYTES[t.grad_reduce_dtype]


def _mats(model: ModelConfig) -> int:
    return 3 if model.activation == "swiglu" else 2


def expert_params(model: ModelConfig, ffn: int) -> int:
    """One expert MLP of inner width ``ffn``: ``3 h ffn`` (SwiGLU) or ``2 h ffn`` (GELU)."""
    return _mats(model) * model.hidden * ffn


def router_params(model: ModelConfig) -> int:
    """The router's ``h x experts`` matrix."""
    return model.hidden * model.moe.experts


def moe_mlp_params(model: ModelConfig) -> int:
    """Parameters of one MoE layer's MLP: routed and shared experts and the router.
    Mixtral 8x7B (h 4096, 8 experts of 14336): 1,409,318,912 + 32,768."""
    moe = model.moe
    return (
        moe.experts * expert_params(model, moe.ffn_hidden)
        + moe.shared_experts * expert_params(model, moe.shared_ffn)
        + router_params(model)
    )


def moe_mlp_active_params(model: ModelConfig) -> int:
    """Parameters one token uses in an MoE layer's MLP: ``top_k`` routed experts, the shared
    experts and the router."""
    moe = model.moe
    return (
        moe.top_k * expert_params(model, moe.ffn_hidden)
        + moe.shared_experts * expert_params(model, moe.shared_ffn)
        + router_params(model)
    )


def routed_expert_params(model: ModelConfig) -> int:
    """Parameters of one MoE layer's routed experts (the part sharded over EP)."""
    return model.moe.experts * expert_params(model, model.moe.ffn_hidden)


# --------------------------------------------------------------------------------------------
# Load and dispatch


@dataclass(frozen=True)
class MoELocal:
    """One micro-batch's MoE block on the busiest EP rank (see the module docstring)."""

    tokens: int  # tokens entering the router on each rank: b*s/(tp*cp)
    local_experts: int  # experts per EP rank
    ffn: int  # each local expert's inner width on this rank: ffn_hidden / etp
    expert_tokens: tuple[float, ...]  # copies each local expert computes (after ETP gather)
    sent: float  # token copies each rank sends to other EP ranks (the busiest rank's inflow)
    received: float  # token copies the busiest rank receives from other EP ranks
    imbalance: float  # busiest rank's copies / the mean rank's
    dropped: float  # fraction of routed copies dropped by the capacity factor
    busiest_share: float  # fraction of every rank's kept copies routed to the busiest rank
    #: standard deviation of each expert's copies from micro-batch to micro-batch (random
    #: routes; 0: the counts are exact)
    expert_spread: float = 0.0
    #: with ``model.moe.pad_to_capacity``: the rows each rank sends every expert (its
    #: capacity of that rank's tokens); 0: not padded
    pad_capacity: int = 0

    @property
    def uniform(self) -> bool:
        """Every EP rank gets the same share (the all-to-all is even)."""
        return abs(self.imbalance - 1.0) < 1e-9


#: ``load`` value of :func:`moe_local` for random routes (``training.moe_routing: random``)
RANDOM = "random"


@dataclass(frozen=True)
class Learned:
    """``load`` of :func:`moe_local` for a learned router (``training.moe_routing:
    learned``): mean shares ``means`` (None: uniform), rank correlation ``rho``
    (``training.moe_rank_correlation``); ``calls``: the busiest rank of the average of that
    many independent calls (1: of each call, what the step waits for; a stage's MoE layers:
    what its memory holds)."""

    means: tuple[float, ...] | None
    rho: float
    calls: int = 1


def load_spec(training: TrainingConfig, calls: int = 1) -> tuple[float, ...] | str | Learned | None:
    """What :func:`moe_local` takes as ``load`` for a workload: its ``moe_expert_load``,
    :data:`RANDOM` for random routes, :class:`Learned` for a learned router's shares (its
    busiest rank over ``calls`` calls), or None (balanced and uniform)."""
    if training.moe_routing == RANDOM:
        return RANDOM
    if training.moe_routing == "learned":
        return Learned(training.moe_expert_load, training.moe_rank_correlation, calls)
    return training.moe_expert_load


@lru_cache(maxsize=64)
def expected_max_normal(n: int) -> float:
    """``E[max]`` of ``n`` independent standard normal draws, by quadrature of
    ``x n phi(x) Phi(x)^(n-1)`` (0 for one draw; 1/sqrt(pi) for two; 1.0294 for four)."""
    if n < 2:
        return 0.0
    x = np.linspace(-12.0, 12.0, 48_001)
    cdf = 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
    f = x * n * pdf * cdf ** (n - 1)
    return float(np.sum((f[1:] + f[:-1]) * 0.5 * np.diff(x)))


def random_busiest_excess(experts: int, top_k: int, ep: int, routed_tokens: float) -> float:
    """Expected relative excess of the busiest of ``ep`` EP ranks over the mean rank when
    each of ``routed_tokens`` tokens picks ``top_k`` distinct experts of ``experts`` uniformly
    at random (Megatron-Core's forced load balancing: i.i.d. normal logits per token,
    ``RandomSTE`` in ``moe_utils.py``).

    A rank holds ``p = experts/ep`` experts; a token sends it a hypergeometric number of
    copies, mean ``k p/E`` and variance ``v = k (p/E)(1 - p/E)(E - k)/(E - 1)``. Over ``T``
    tokens a rank's count has mean ``mu = T k p/E`` and variance ``T v``; the counts add up to
    ``T k`` exactly, so they are exchangeable with correlation ``-1/(ep - 1)``, which is
    ``sqrt(T v ep/(ep - 1))`` times the deviations of ``ep`` independent standard normals
    from their mean (normal approximation of the sum), whose maximum has the expectation
    :func:`expected_max_normal` ``(ep)``. So ``E[max]/mu - 1 =
    sqrt(T v ep/(ep - 1)) e_ep / mu``."""
    if ep < 2 or routed_tokens <= 0:
        return 0.0
    E, k, q = experts, top_k, 1.0 / ep
    v = k * q * (1.0 - q) * (E - k) / (E - 1)
    mu = routed_tokens * k * q
    return math.sqrt(routed_tokens * v * ep / (ep - 1)) * expected_max_normal(ep) / mu


def expert_shares(model: ModelConfig, load: tuple[float, ...] | None) -> tuple[float, ...]:
    """Each expert's share of the routed copies (uniform when ``load`` is None)."""
    E = model.moe.experts
    return tuple(load) if load is not None else (1.0 / E,) * E


def _random_shares(model: ModelConfig, ep: int, routed_tokens: float) -> tuple[float, ...]:
    """Shares whose busiest EP rank (rank 0) carries the expected maximum of random routes
    (:func:`random_busiest_excess`), spread evenly over its experts; the other ranks share
    the rest evenly (only the busiest rank is priced)."""
    E = model.moe.experts
    per = E // ep
    if ep < 2:
        return (1.0 / E,) * E
    top = (1.0 + random_busiest_excess(E, model.moe.top_k, ep, routed_tokens)) / ep
    return (top / per,) * per + ((1.0 - top) / (E - per),) * (E - per)


@lru_cache(maxsize=256)
def _learned_shares(model: ModelConfig, ep: int, copies: float, spec: Learned
                    ) -> tuple[float, ...]:
    """Shares whose busiest EP rank carries a learned router's expected busiest share of a
    call's ``copies`` (:func:`simulator.model.route_skew.busiest_share`), that rank being the
    one of the largest mean; its experts keep their mean proportions, the other ranks share
    the rest in theirs (only the busiest rank is priced)."""
    E = model.moe.experts
    mean = expert_shares(model, spec.means)
    per = E // ep
    ranks = [sum(mean[r * per:(r + 1) * per]) for r in range(ep)]
    if ep < 2:
        return mean
    top_r = max(range(ep), key=lambda r: (ranks[r], -r))
    top = route_skew.busiest_share(tuple(ranks), copies, spec.rho, spec.calls)
    out = []
    for r in range(ep):
        scale = top / ranks[r] if r == top_r else (1.0 - top) / (1.0 - ranks[top_r])
        out += [s * scale for s in mean[r * per:(r + 1) * per]]
    return tuple(out)


def moe_local(
    model: ModelConfig,
    micro_batch: int,
    tp: int,
    cp: int,
    ep: int,
    etp: int,
    load: tuple[float, ...] | str | Learned | None = None,
) -> MoELocal:
    """Tokens per rank, the busiest EP rank's expert loads and the dispatch volumes.

    The ``ep*etp`` ranks of an EP x ETP block route ``N = ep*etp*tokens*top_k`` copies; expert
    ``e`` gets ``share_e * N`` (capped at ``capacity_factor * N / experts``). EP rank ``r`` holds
    experts ``r*E/ep .. (r+1)*E/ep - 1``; its ETP ranks all-gather what their EP peers sent, so
    each computes every copy of its experts on ``ffn/etp`` columns. With uniform load a rank
    sends ``tokens*top_k*(ep-1)/ep`` copies to its peers and receives as many. ``load``
    :data:`RANDOM`: random routes, the busiest rank at its expected maximum over the
    ``ep*etp*tokens`` routed tokens (:func:`random_busiest_excess`); :class:`Learned`: a
    learned router, the busiest rank at its expected share of a call's copies
    (:func:`_learned_shares`)."""
    moe = model.moe
    E, k = moe.experts, moe.top_k
    tokens = micro_batch * -(-model.seq_len // (tp * cp))
    if load == RANDOM:
        shares = _random_shares(model, ep, ep * etp * tokens)
    elif isinstance(load, Learned):
        shares = _learned_shares(model, ep, ep * etp * tokens * k, load)
    else:
        shares = expert_shares(model, load)
    N = ep * etp * tokens * k
    kept = [s * N for s in shares]
    if moe.capacity_factor is not None:
        cap = moe.capacity_factor * N / E
        kept = [min(x, cap) for x in kept]
    dropped = 1.0 - sum(kept) / N if N and moe.capacity_factor is not None else 0.0
    if moe.pad_to_capacity:
        # Megatron-Core's drop-and-pad: each rank sends every expert exactly its capacity of
        # that rank's tokens (moe_utils.get_capacity: ceil(tokens top_k / experts x factor)),
        # padded where fewer were routed, so every expert computes the same rows
        pad = math.ceil(tokens * k / E * moe.capacity_factor)
        kept = [float(ep * etp * pad)] * E
        return MoELocal(
            tokens=tokens, local_experts=E // ep, ffn=moe.ffn_hidden // etp,
            expert_tokens=tuple(kept[: E // ep]), sent=pad * E * (ep - 1) / ep,
            received=pad * E * (ep - 1) / ep, imbalance=1.0, dropped=dropped,
            busiest_share=1.0 / ep, pad_capacity=pad,
        )  # fmt: skip
    per = E // ep
    rank_load = [sum(kept[r * per : (r + 1) * per]) for r in range(ep)]
    busiest = max(range(ep), key=lambda r: (rank_load[r], -r))
    mine = tuple(kept[busiest * per : (busiest + 1) * per])
    mean = sum(rank_load) / ep
    # Each rank of the busiest EP rank's ETP slice receives share_r* of every peer's copies.
    share_busiest = rank_load[busiest] / sum(kept) if sum(kept) else 1.0 / ep
    return MoELocal(
        tokens=tokens,
        local_experts=per,
        ffn=moe.ffn_hidden // etp,
        expert_tokens=mine,
        sent=tokens * k * (ep - 1) / ep,
        received=tokens * k * (ep - 1) * share_busiest,
        imbalance=rank_load[busiest] / mean if mean else 1.0,
        dropped=dropped,
        busiest_share=share_busiest,
        expert_spread=math.sqrt(ep * etp * tokens * (k / E) * (1 - k / E)) if load == RANDOM
        else 0.0,
    )


def alltoall_bytes_per_rank(
    tokens: int, top_k: int, hidden: int, dtype_bytes: int, ep: int
) -> float:
    """Bytes one rank sends to the other EP ranks in one all-to-all with uniform routing:
    ``tokens * top_k * hidden * bytes * (ep-1)/ep``. An MoE layer runs two (dispatch and
    combine) in the forward and two in the backward."""
    return tokens * top_k * hidden * dtype_bytes * (ep - 1) / ep


# --------------------------------------------------------------------------------------------
# Kernels


@dataclass(frozen=True)
class Comm:
    """A collective an MoE block issues: ``collective`` over the ``dim`` group (``ep``,
    ``etp`` or ``tp``), ``nbytes`` as nccl-tests counts it (an all-to-all: what one rank sends
    in all, its own share included; an all-gather: the gathered result). ``share``: the
    fraction of every rank's data that goes to the busiest rank, for an uneven all-to-all
    (None: uniform, ``1/ep``)."""

    name: str
    collective: str
    dim: str
    nbytes: float
    share: float | None = None


def padded_rows(mean: float, spread: float = 0.0, tile: int = GROUPED_TILE_M) -> float:
    """Rows an expert's GEMM computes, its count padded to whole ``tile``-row tiles: exact
    counts ``ceil(m / tile) tile``; a count that varies (random routes, normal with
    ``spread``) its expectation, ``tile * sum_j P(X > j tile)`` over ``j >= 0``, so the cost
    of a partial tile does not jump where the mean crosses a tile boundary."""
    if spread <= 0.0:
        return float(-(-round(mean) // tile) * tile)
    out, j = 0.0, 0
    while j * tile < mean + 8.0 * spread:
        out += 0.5 * math.erfc((j * tile - mean) / (spread * math.sqrt(2.0)))
        j += 1
    return tile * out


def _grouped_gemm(name: str, loc: MoELocal, k: int, n: int, d: int) -> list[Op]:
    """The busiest rank's experts as Transformer Engine's grouped GEMM ``[tokens_e, k] @ [k,
    n]``: one cuBLAS GEMM per expert, :data:`TE_GEMM_STREAMS` at a time, so one op per round of
    that many experts, priced as their GEMMs one after another (``Op.serial``: each of the
    round's mean padded rows; measured, :data:`TE_GEMM_STREAMS`). FLOPs and bytes of the real
    tokens; each expert's rows padded to the tile (an expert with 10 tokens costs a 128-row
    tile). With at most :data:`TE_GEMM_STREAMS` local experts this is one op."""
    ops = []
    tok = loc.expert_tokens
    for r0 in range(0, len(tok), TE_GEMM_STREAMS):
        part = tok[r0 : r0 + TE_GEMM_STREAMS]
        real = sum(part)
        padded = sum(padded_rows(m, loc.expert_spread) for m in part)
        ops.append(Op(
            name, "gemm", "moe", m=max(1, int(padded)), k=k, n=n, flops=2.0 * real * k * n,
            bytes=float((real * k + len(part) * k * n + real * n) * d), serial=len(part),
        ))  # fmt: skip
    return ops


def _grouped_wgrads(name: str, loc: MoELocal, k: int, n: int, d: int, acc: int) -> list[Op]:
    """Weight gradients of :func:`_grouped_gemm`'s rounds: each expert's own ``[k, rows] @
    [rows, n]`` with its own ``[k, n]`` output (``GroupedLinear``'s backward issues one wgrad
    GEMM per expert over the same streams), so a round of ``e`` experts is priced as their
    products stacked in ``m`` (``e k`` rows: the output tiles of all ``e``, each over the
    expert's mean rows; the second operands' bytes counted once). ``acc`` > 0: each adds
    into its ``main_grad`` of ``acc`` bytes an element (gradient-accumulation fusion:
    TransformerEngine ``module/grouped_linear.py`` passes the experts' ``main_grad`` as the
    outputs with ``accumulate=True``), read and written in place; with few rows an expert
    this traffic bounds the kernel (DeepGEMM's maintainers on their grouped wgrad: "memory
    bound", deepseek-ai/DeepGEMM issue #125, 2025-07-21). The wgrad of a round priced as one
    ``[k, e rows] @ [e rows, n]`` (the forward's dgrad transpose) would write one output for
    ``e`` experts."""
    ops = []
    tok = loc.expert_tokens
    for r0 in range(0, len(tok), TE_GEMM_STREAMS):
        part = tok[r0 : r0 + TE_GEMM_STREAMS]
        real, e = sum(part), len(part)
        out = e * k * n * (2 * acc if acc else d)
        ops.append(Op(
            f"{name}_wgrad", "gemm", "moe", m=e * k, k=max(1, round(real / e)), n=n,
            flops=2.0 * real * k * n, bytes=float(real * (k + n) * d + out), backward=True,
            acc_bytes=acc,
        ))  # fmt: skip
    return ops


def _expert_ops(model: ModelConfig, loc: MoELocal, d: int, grouped: bool) -> list[Op]:
    """Expert compute of the busiest rank: grouped ``fc1, act, fc2`` (fused kernels), or
    ``fc1, act, fc2`` per expert one after another (eager PyTorch; an expert with no token
    is skipped)."""
    h, f = model.hidden, loc.ffn
    fc1_out = 2 * f if model.activation == "swiglu" else f
    per_tok = (3 if model.activation == "swiglu" else 2) * f * d
    if grouped:
        R = sum(loc.expert_tokens)
        return [
            *_grouped_gemm("expert_fc1", loc, h, fc1_out, d),
            mem_op("expert_act", "moe", R * per_tok),
            *_grouped_gemm("expert_fc2", loc, f, h, d),
        ]
    ops = []
    for i, m in enumerate(loc.expert_tokens):
        m = round(m)
        if m < 1:
            continue
        if model.activation != "swiglu":
            ops += [
                gemm_op(f"expert_fc1_e{i}", "moe", m, h, fc1_out, d),
                mem_op(f"expert_act_e{i}", "moe", m * per_tok),
            ]
        else:  # w2(silu(w1 x) * w3 x): two GEMMs on x, silu, the product (eager modules)
            ops += [
                gemm_op(f"expert_fc1_e{i}", "moe", m, h, f, d),
                gemm_op(f"expert_fc3_e{i}", "moe", m, h, f, d),
                mem_op(f"expert_act_e{i}", "moe", 2 * m * f * d),
                mem_op(f"expert_act_mul_e{i}", "moe", 3 * m * f * d),
            ]
        ops.append(gemm_op(f"expert_fc2_e{i}", "moe", m, f, h, d))
    return ops


def permute_kernels(training: TrainingConfig) -> str:
    """How a fused MoE layer with the alltoall dispatcher permutes its tokens: ``fused``
    (Transformer Engine's permute / unpermute kernels, Megatron-Core's
    ``--moe-permute-fusion``) or ``unfused`` (its PyTorch ``permute`` / ``unpermute``,
    :func:`_unfused_permute_ops`, the flag's default off). Other dispatchers and eager code:
    ``fused`` (their own permutation ops)."""
    if training.moe_permute_fusion or training.kernels != "fused" \
            or training.moe_dispatcher != "alltoall":
        return "fused"
    return "unfused"


def _sent_rows(loc: MoELocal, E: int, k: int, dispatcher: str) -> float:
    """The token copies a rank's permutation writes and its exchange sends (fused code):
    every expert's capacity with ``pad_to_capacity`` (alltoall dispatcher), else ``t k``."""
    if loc.pad_capacity > 0 and dispatcher == "alltoall":
        return float(loc.pad_capacity * E)
    return float(loc.tokens * k)


def _alltoall_preprocess_ops(t: int, E: int, L: int, ep: int, etp: int, capped: bool,
                             fused_permute: bool) -> tuple[list[Op], Comm | None, list[Op]]:
    """Megatron-Core's alltoall dispatcher's ``preprocess`` of a dropless (not padded) layer
    and its device-to-host copies (``token_dispatcher.py`` at Megatron-LM 1e057005,
    2025-05-24; the same kernels in core_v0.11.0 and at main in 2026-08), on ``t`` tokens,
    ``E`` experts, ``L`` local experts: ``(before the count exchange, the exchange, after it)``.

    * ``routing_map.sum(dim=0)`` (the rank's copies per expert), with a capacity factor
      (``capped``: tokens dropped, not padded) their ``.sum()`` (``num_out_tokens``);
    * with ``ep * etp > 1``: the input splits (``reshape(ep, L).sum(axis=1)``), the
      all-gather of the counts over the expert TP x EP group
      (``gather_from_sequence_parallel_region``: ``E`` int64 from each rank), the local
      experts' slice (``.contiguous()``), its sums per rank (the output splits), per TP rank
      and per local expert;
    * the copies to the host, ``non_blocking`` on a side stream (``cuda_dtoh_stream``;
      core_v0.11 on the compute stream), each one ``cudaMemcpyAsync`` of a few int64: the
      tokens per local expert, with ``ep * etp > 1`` the input, output and TP output splits,
      with ``capped`` ``num_out_tokens``, with ``L > 1`` and the PyTorch permutation the
      local experts' counts from every rank (``num_global_tokens_per_local_expert``).

    Each kernel reads and writes a few hundred bytes (a few microseconds each on the GPU);
    they matter as launches (:data:`PLAIN_ATEN_PREFIXES`). ``fused_permute`` adds Transformer
    Engine's row map of the fused permutation (``triton_permutation.make_row_id_map``, TE
    2.1-2.5: two Triton kernels, a block cumulative sum of the ``[t, E]`` map into an int64
    ``[E, t]`` map and its completion), placed after the copies, before the permutation."""
    group = ep * etp
    before = [mem_op("a2a_counts_sum", "moe", t * E + E * I64)]
    if capped:
        before.append(mem_op("a2a_counts_out", "moe", E * I64 + I64))
    comm, after = None, []
    if group > 1:
        before.append(mem_op("a2a_counts_splits", "moe", E * I64 + ep * I64))
        comm = Comm("moe_counts", "all_gather", "ep" if ep > 1 else "etp", group * E * I64)
        after += [mem_op("a2a_counts_slice", "moe", 2 * group * L * I64),
                  mem_op("a2a_counts_rank", "moe", group * (L + 1) * I64),
                  mem_op("a2a_counts_tp", "moe", (group + etp) * I64),
                  mem_op("a2a_counts_local", "moe", (group + 1) * L * I64)]
    copies = [("tokens", L)]
    if group > 1:
        copies += [("input", ep), ("output", ep), ("output_tp", etp)]
    if capped:
        copies.append(("out_tokens", 1))
    if L > 1 and not fused_permute:
        copies.append(("global", group * L))
    after += [mem_op(f"a2a_dtoh_{name}", "moe", n * I64) for name, n in copies]
    if fused_permute:
        m = t * E
        after += [mem_op(f"{ROW_MAP_PREFIX}_1", "moe", m + m * I64),
                  mem_op(f"{ROW_MAP_PREFIX}_2", "moe", 2 * m * I64)]
    return before, comm, after


def _unfused_permute_ops(t: int, E: int, R: float, h: int, d: int, pad: bool) -> list[Op]:
    """Megatron-Core's PyTorch ``permute`` (``moe_utils.py``, core_v0.11.0-0.12, what NeMo
    2.2 / 2.3 ran with ``moe_permute_fusion`` off) of a rank's ``t`` tokens into ``R`` rows
    for ``E`` experts, one op per kernel: with ``pad`` (drop and pad) the ``[t, E]`` routing
    map cast to int8 and transposed, a stable descending ``argsort`` of each expert's row
    (int8 keys, an int64 index written, read and written once more) and the first
    ``capacity`` columns copied; dropless the map transposed, an ``arange`` of the tokens and
    ``masked_select`` of the expanded index (its output size read on the host: the sync
    before the dispatch, :func:`simulator.model.moe_layer._sync_at`); then
    ``tokens.index_select`` (reads ``R`` rows, writes ``R``)."""
    m = t * E
    if pad:
        ops = [mem_op("permute_map_int8", "moe", 2 * m), mem_op("permute_map_t", "moe", 2 * m),
               mem_op("permute_argsort", "moe", m * (I64 + 2 * (1 + I64))),
               mem_op("permute_index_slice", "moe", 2 * R * I64)]
    else:
        ops = [mem_op("permute_map_t", "moe", 2 * m), mem_op("permute_arange", "moe", t * I64),
               mem_op("permute_masked_select", "moe", m * (I64 + 1) + R * I64)]
    return ops + [mem_op("permute_gather", "moe", 2 * R * h * d + R * I64)]


def _unfused_unpermute_ops(t: int, E: int, R: float, h: int, d: int, pad: bool) -> list[Op]:
    """Megatron-Core's PyTorch ``unpermute`` with the routing weights (core_v0.11.0-0.12):
    the ``[t, E]`` weights transposed and gathered into the rows' order (with ``pad`` by an
    index ``expert x t + token``, an int64 multiply and add; dropless by ``masked_select`` of
    the transposed map, which reads its size on the host: ``moe_unpermute_sync`` before it),
    the rows scaled by them (``permuted_tokens * probs``), a zero ``[t, h]`` output and
    ``scatter_add_`` of the ``R`` rows into it (reads them, and an atomic read-modify-write
    of an output row per row added)."""
    m = t * E
    ops = [mem_op("unpermute_probs_t", "moe", 2 * m * d)]
    if pad:
        ops += [mem_op("unpermute_index_mul", "moe", 2 * R * I64),
                mem_op("unpermute_index_add", "moe", 3 * R * I64),
                mem_op("unpermute_probs_gather", "moe", R * (I64 + 2 * d))]
    else:
        ops += [mem_op("unpermute_map_t", "moe", 2 * m),
                Op("moe_unpermute_sync", HOST_SYNC, "moe"),
                mem_op("unpermute_masked_select", "moe", m * (d + 1) + R * d)]
    return ops + [
        mem_op("unpermute_scale", "moe", 2 * R * h * d + R * d),
        mem_op("unpermute_zeros", "moe", t * h * d),
        mem_op("unpermute_scatter_add", "moe", 3 * R * h * d + R * I64),
    ]


def _unfused_permute_backward(name: str, t: int, E: int, R: float, h: int, d: int
                              ) -> list[Op]:
    """The backward of the PyTorch permutation's kernels that carry a gradient: the
    ``scatter_add_``'s is a ``gather`` of the output gradient's rows (``R`` rows read and
    written); the scaling's, autograd's ``MulBackward0``, the rows' gradient (the output
    gradient times the weights) and the weights' (the output gradient times the rows, then
    summed over ``h``: a ``[R, h]`` product written and read back); the weights' gather and
    transpose small copies; ``index_select``'s, a zero ``[t, h]`` gradient and ``index_add_``
    of the ``R`` rows' gradients into it (atomic read-modify-writes)."""
    if name == "unpermute_scatter_add":
        return [mem_op(name + "_grad", "moe", 2 * R * h * d + R * I64, True)]
    if name == "unpermute_scale":
        return [mem_op("unpermute_scale_dx", "moe", 2 * R * h * d + R * d, True),
                mem_op("unpermute_scale_dprobs", "moe", 3 * R * h * d, True),
                mem_op("unpermute_scale_dprobs_sum", "moe", R * h * d + R * d, True)]
    if name in ("unpermute_probs_gather", "unpermute_masked_select"):
        return [mem_op(name, "moe", R * (I64 + 2 * d), True)]
    if name == "unpermute_probs_t":
        return [mem_op(name, "moe", 2 * t * E * d, True)]
    if name == "permute_gather":
        return [mem_op("permute_gather_zeros", "moe", t * h * d, True),
                mem_op("permute_gather_index_add", "moe", 3 * R * h * d + R * I64, True)]
    return []


def moe_forward_ops(
    model: ModelConfig,
    loc: MoELocal,
    *,
    tp: int,
    ep: int,
    etp: int,
    d: int,
    dispatcher: str = "alltoall",
    grouped: bool = True,
    dispatch_bytes: float | None = None,
    router: str = "fused",
    multihot: str = "fused",
    regroup: str = "aranges",
    permute_kind: str = "fused",
    probs_alltoall: bool = True,
) -> list[Op | Comm]:
    """Kernels and collectives of one MoE block's forward on the busiest EP rank, after the
    attention's residual add: ``norm2, router, router_topk, permute, [count exchange,
    dispatch, etp gather], expert fc1, act, fc2, [etp scatter, combine], unpermute, [shared
    expert], residual2``. ``grouped=False`` computes the experts one after another (eager
    PyTorch); the memory-bound kernels read and write the token copies they move.
    ``dispatch_bytes``: bytes per element of the tokens sent towards the experts (FP8
    dispatch, :func:`simulator.hardware.precision.moe_dispatch_bytes`; default ``d``).
    ``router``: :func:`router_kernels` (fused code only; eager code keeps its one kernel).
    ``multihot``: :func:`multihot_kernels` (fused DeepEP only). ``regroup`` (eager code,
    ``training.moe_regroup``): how the received copies are arranged for the local experts
    (:func:`_eager_regroup_ops`). ``permute_kind``: :func:`permute_kernels` (the alltoall
    dispatcher of fused code). With ``model.moe.pad_to_capacity`` each rank sends every expert
    its capacity (``loc.pad_capacity`` rows) and fused code exchanges no counts (Megatron-Core's
    alltoall dispatcher knows them: ``preprocess`` returns before its count gather); dropless
    it runs its count kernels, all-gather and copies (:func:`_alltoall_preprocess_ops`).
    ``probs_alltoall`` (``training.moe_probs_alltoall``, alltoall dispatcher of fused code):
    the copies' routing probabilities (fp32) follow them in a second all-to-all (and
    all-gather over ``etp``) and through the chunk sort."""
    moe, h = model.moe, model.hidden
    q = d if dispatch_bytes is None else dispatch_bytes
    t, k, E = loc.tokens, moe.top_k, moe.experts
    R = sum(loc.expert_tokens)  # copies this rank's experts compute
    R_ep = R / etp  # copies this rank received through the all-to-all (before ETP gather)
    # deepep: node-aware dispatch, each token once per destination GPU and across the network
    # once per destination node (its traffic: simulator.model.moe_routing); nbytes counts the
    # rank's tokens, the collective's split their destinations
    a2a, copies = (DEEPEP, 1) if dispatcher == DEEPEP else ("all_to_all", k)
    t_rows = t  # tokens whose copies the exchange carries (padded: the capacities' rows / k)
    ops: list[Op | Comm] = [
        mem_op("norm2", "moe", 2 * t * h * d),
        gemm_op("router", "moe", t, h, E, d),
    ]
    if grouped and router != "fused":
        ops += _unfused_router_ops(t, E, k, tp, d, router == "unfused_random")
    else:  # scores (fp32 softmax or sigmoid), top-k, the routing map and weights; aux loss
        ops.append(mem_op("router_topk", "moe", t * E * (d + 3 * FP32)))
    if dispatcher == "allgather":
        full = ep * etp * t
        ops += [
            Comm("moe_gather", "all_gather", "ep", full * h * q),
            mem_op("permute", "moe", (full + R) * h * d),
        ]
    else:
        # DeepEP's dispatch and combine kernels read and write the tokens in their own order
        # (Megatron-Core's flex dispatcher permutes only the received tokens, after the
        # dispatch), so fused code has no permutation before it and no un-permutation after
        # the combine; Megatron-Core's alltoall dispatcher exchanges the counts before it
        # permutes (its ``preprocess``), eager code permutes first (benchmarks/device/steps.py)
        fused_deepep = grouped and dispatcher == DEEPEP
        padded = grouped and loc.pad_capacity > 0 and dispatcher == "alltoall"
        if padded:  # the rows a rank sends: every expert's capacity
            t_rows = _sent_rows(loc, E, k, dispatcher) / copies
        if grouped and permute_kind == "unfused" and not fused_deepep:
            permute = _unfused_permute_ops(t, E, t_rows * copies, h, d, padded)
        else:
            permute = [] if fused_deepep else [mem_op("permute", "moe", (1 + k) * t * h * d)]
        counts = [Comm("moe_counts", "all_to_all", "ep", ep * (E // ep) * 8.0)] \
            if ep > 1 and not padded else []
        before, after = [], []
        if fused_deepep and ep > 1:
            before, after = _deepep_routing_ops(
                t, E, k, deepep_received_tokens(loc, E, k, ep), loc.local_experts, R_ep,
                multihot)
        # Megatron-Core's alltoall dispatcher (fused code): its preprocess and copies
        mcore_a2a = grouped and dispatcher == "alltoall"
        probs = mcore_a2a and probs_alltoall
        share = None if loc.uniform else loc.busiest_share
        if mcore_a2a and not padded:
            pre, gather, post = _alltoall_preprocess_ops(
                t, E, loc.local_experts, ep, etp, moe.capacity_factor is not None,
                permute_kind == "fused")
            ops += [*pre, *([gather] if gather is not None else []), *post, *permute]
        else:
            ops += [*before, *counts, *permute] if grouped else [*permute, *counts]
        if ep > 1:
            ops.append(Comm("moe_dispatch", a2a, "ep", t_rows * copies * h * q, share))
            if probs:
                ops.append(Comm("moe_dispatch_probs", "all_to_all", "ep",
                                t_rows * copies * FP32, share))
        ops += after
        if etp > 1:
            ops.append(Comm("moe_etp_gather", "all_gather", "etp", R * h * q))
            if probs:
                ops.append(Comm("moe_etp_gather_probs", "all_gather", "etp", R * FP32))
        if not grouped:
            ops += _eager_regroup_ops(regroup, loc, ep, R_ep, h, d)
        elif ep > 1 and (loc.local_experts > 1 or fused_deepep):
            ops.append(mem_op("sort_chunks", "moe", 2 * R_ep * (h * d + (FP32 if probs else 0))))
    ops += _expert_ops(model, loc, d, grouped)
    if not grouped:  # torch.cat of the experts' outputs
        ops.append(mem_op("expert_cat", "moe", 2 * R * h * d))
    if dispatcher == "allgather":
        ops += [
            mem_op("unpermute", "moe", (R + ep * etp * t) * h * d),
            Comm("moe_scatter", "reduce_scatter", "ep", ep * etp * t * h * d),
        ]
    else:
        if etp > 1:
            ops.append(Comm("moe_etp_scatter", "reduce_scatter", "etp", R * h * d))
        if ep > 1 and not grouped and regroup != "concat":
            ops += _eager_index_ops("inv", 2, R_ep)
        if ep > 1 and (loc.local_experts > 1 or fused_deepep) and (grouped or regroup != "concat"):
            if mcore_a2a and not padded and permute_kind == "fused":
                # the un-sort's split sizes, ``num_global_tokens_per_local_expert.T.ravel()``:
                # a transposed view made contiguous on the GPU
                ops.append(mem_op("unsort_sizes", "moe", 2 * ep * etp * loc.local_experts * I64))
            ops.append(mem_op("unsort_chunks", "moe", 2 * R_ep * h * d))
        if ep > 1:
            ops.append(Comm("moe_combine", a2a, "ep", t_rows * copies * h * d, share))
        if grouped and not fused_deepep and permute_kind == "unfused":
            ops += _unfused_unpermute_ops(t, E, t_rows * copies, h, d, padded)
        elif grouped and not fused_deepep:
            ops.append(mem_op("unpermute", "moe", (k * t * h + t * h) * d + t * k * FP32))
        elif not grouped:
            ops += _eager_combine_ops(t, k, h, d)
    ops += _shared_expert_ops(model, t, tp, d)
    if grouped and moe.shared_experts:
        # Megatron-Core adds the shared experts' output to the combined tokens
        # (``combine_postprocess``: ``output += shared_expert_output``)
        ops.append(mem_op("shared_add", "moe", 3 * t * h * d))
    ops.append(mem_op("residual2", "moe", 3 * t * h * d))
    return ops


def _eager_regroup_ops(regroup: str, loc: MoELocal, ep: int, rows: float, h: int,
                       d: int) -> list[Op]:
    """Eager code's arrangement of the ``rows`` received copies (``h`` wide) for its local
    experts, after the dispatch (``training.moe_regroup``):

    * ``aranges`` (``benchmarks/device/steps.py``): an index of one ``torch.arange`` per
      (local expert, source rank) piece and their ``torch.cat``
      (:func:`_eager_index_ops`), then the gather by it (``sort_chunks``, with more than one
      local expert); nothing at EP 1.
    * ``argsort`` (``steps_third.py``): the pieces' expert ids (``repeat_interleave`` by the
      received counts, which reads their sum on the host: a synchronisation after the
      dispatch, :func:`simulator.model.moe_layer._moe_body`), their stable argsort and the
      gather (``sort_chunks``); nothing at EP 1.
    * ``concat`` (``steps_alt.py``): each expert's input a ``torch.cat`` of its slice of every
      source's piece (``expert_cat_in``, one per local expert, its rows copied), at every EP
      size; its backward is views.

    The output side mirrors it (:func:`moe_forward_ops`: the inverse index and gather, or
    nothing after the experts' ``torch.cat``)."""
    L = loc.local_experts
    if regroup == "concat":
        return [mem_op(f"expert_cat_in_e{i}", "moe", 2 * round(m) * h * d)
                for i, m in enumerate(loc.expert_tokens) if round(m) >= 1]
    if ep == 1:
        return []
    if regroup == "argsort":
        ops = [mem_op("perm_ids", "moe", rows * I64), mem_op("perm_sort", "moe", 2 * rows * I64)]
    else:
        ops = _eager_index_ops("perm", L * ep, rows)
    if L > 1:
        ops.append(mem_op("sort_chunks", "moe", 2 * rows * h * d))
    return ops


def _eager_index_ops(name: str, count: int, rows: float) -> list[Op]:
    """Plain PyTorch's index bookkeeping around the exchange (benchmarks/device/steps.py):
    ``perm``: one ``torch.arange`` per (local expert, source rank) piece and their
    ``torch.cat`` (``count`` = pieces); ``inv``: the inverse permutation, an ``arange`` and an
    index write. ``rows`` int64 indices in all; launched after the counts' host sync."""
    if name == "perm":
        return [*(mem_op(f"perm_arange{i + 1}", "moe", rows / count * I64) for i in range(count)),
                mem_op("perm_cat", "moe", 2 * rows * I64)]  # fmt: skip
    return [mem_op("inv_arange", "moe", rows * I64), mem_op("inv_scatter", "moe", 3 * rows * I64)]


def _eager_combine_ops(t: int, k: int, h: int, d: int) -> list[Op]:
    """Plain PyTorch's combine (steps.py): the routing weights gathered into the received
    order and cast, a zero output, the copies scaled by their weights, and an out-of-place
    ``index_add`` (copy the zeros, read the scaled copies, add into their token rows)."""
    return [
        mem_op("combine_w", "moe", t * k * (FP32 + I64 + FP32 + d)),
        mem_op("combine_zeros", "moe", t * h * d),
        mem_op("combine_weight", "moe", 2 * t * k * h * d + t * k * d),
        mem_op("unpermute", "moe", (t * k * h + 4 * t * h) * d + t * k * I64),
    ]


def _shared_expert_ops(model: ModelConfig, t: int, tp: int, d: int) -> list[Op | Comm]:
    """Shared experts as Megatron's ``SharedExpertMLP``: a TP-split MLP over the micro-batch's
    ``t*tp`` tokens, its input all-gathered and its output reduce-scattered over TP."""
    moe, h = model.moe, model.hidden
    if not moe.shared_experts:
        return []
    f = moe.shared_experts * moe.shared_ffn // tp
    T = t * tp
    fc1_out = 2 * f if model.activation == "swiglu" else f
    ops: list[Op | Comm] = []
    if tp > 1:
        ops.append(Comm("shared_gather", "all_gather", "tp", T * h * d))
    ops += [
        gemm_op("shared_fc1", "moe", T, h, fc1_out, d),
        mem_op("shared_act", "moe", (3 if model.activation == "swiglu" else 2) * T * f * d),
        gemm_op("shared_fc2", "moe", T, f, h, d),
    ]
    if tp > 1:
        ops.append(Comm("shared_scatter", "reduce_scatter", "tp", T * h * d))
    return ops


def moe_backward_ops(
    model: ModelConfig,
    loc: MoELocal,
    *,
    tp: int,
    ep: int,
    etp: int,
    d: int,
    dispatcher: str = "alltoall",
    grouped: bool = True,
    dispatch_bytes: float | None = None,
    wgrad_acc_bytes: int = 0,
    router: str = "fused",
    multihot: str = "fused",
    regroup: str = "aranges",
    permute_kind: str = "fused",
    probs_alltoall: bool = True,
) -> list[Op | Comm]:
    """The forward reversed: each GEMM's dgrad and wgrad, every collective's conjugate (an
    all-to-all stays an all-to-all with the gradients, an all-gather becomes a reduce-scatter
    and back), memory-bound kernels at 1.5x their forward bytes (they read the saved input and
    the incoming gradient), except the permutations, whose backward is the other permutation.
    The count exchange is not repeated. ``dispatch_bytes`` (FP8 dispatch): the combine's
    conjugates send the output gradients towards the experts, quantised as the forward
    dispatch is; the dispatch's conjugates return the input gradients in ``d`` (DeepSeek-V3,
    arXiv:2412.19437 Sec. 3.3.3: the activation gradient before the down-projection in FP8,
    both combines in BF16). A grouped GEMM's wgrad is one per expert
    (:func:`_grouped_wgrads`), adding into ``main_grad`` buffers of ``wgrad_acc_bytes`` (0:
    fresh outputs). Eager code (``grouped=False``) also runs the backward of the slices
    that cut the received copies into the experts' inputs after each expert's
    (:func:`_slice_grad_ops`: one slice per local expert, or per source rank and local
    expert with ``regroup`` ``concat``)."""
    fwd = moe_forward_ops(
        model, loc, tp=tp, ep=ep, etp=etp, d=d, dispatcher=dispatcher, grouped=grouped,
        router=router, multihot=multihot, regroup=regroup, permute_kind=permute_kind,
        probs_alltoall=probs_alltoall,
    )
    h, f = model.hidden, loc.ffn
    fc1_out = 2 * f if model.activation == "swiglu" else f
    wgrads = {  # the grouped GEMMs' wgrads per round, in forward order
        "expert_fc1": _grouped_wgrads("expert_fc1", loc, h, fc1_out, d, wgrad_acc_bytes),
        "expert_fc2": _grouped_wgrads("expert_fc2", loc, f, h, d, wgrad_acc_bytes),
    } if grouped else {}  # fmt: skip
    conj = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather"}
    towards_experts = ("moe_combine", "moe_scatter", "moe_etp_scatter")
    out: list[Op | Comm] = []
    # eager: each expert's input slices, backward (the buffer's first gradient needs no add)
    pieces = (ep if regroup == "concat" else 1) if not grouped else 0
    first = True
    for op in reversed(fwd):
        if isinstance(op, Comm):
            if op.name not in ("moe_counts", "router_aux_tokens"):  # forward only
                nbytes = op.nbytes
                if dispatch_bytes is not None and op.name in towards_experts:
                    nbytes = op.nbytes * dispatch_bytes / d
                out.append(Comm(op.name, conj.get(op.collective, op.collective), op.dim,
                                nbytes, op.share))  # fmt: skip
        elif op.kind == "gemm":
            if regroup == "concat" and not grouped and op.name.startswith("expert_fc2_e"):
                # y.split per source: its backward cats the pieces' gradients (one copy)
                out.append(mem_op(SPLIT_GRAD + op.name[len("expert_fc2_"):], "moe",
                                  2 * op.m * h * d, True))
            # dgrad and wgrad; a grouped GEMM keeps its real tokens' FLOPs
            grads = [
                Op(g.name, g.kind, g.block, m=g.m, k=g.k, n=g.n, flops=op.flops,
                   bytes=g.bytes, backward=True, serial=op.serial if i == 0 else 0)
                for i, g in enumerate(gemm_grads(op, d))
            ]  # fmt: skip
            if op.name in wgrads:  # this round's per-expert wgrads (rounds seen last first)
                grads[1] = wgrads[op.name].pop()
            out += grads
            if op.name.startswith("expert_fc1_e") and any(
                    o.name == "expert_fc3" + op.name[len("expert_fc1"):] for o in fwd):
                # x fed w1 and w3: autograd adds their two input gradients
                out.append(mem_op("expert_dx_add" + op.name[len("expert_fc1"):], "moe",
                                  3 * op.m * op.k * d, True))
            if pieces and op.name.startswith("expert_fc1_e"):
                out += _slice_grad_ops(op.name[len("expert_fc1_"):], pieces, first,
                                       sum(loc.expert_tokens) / etp, op.m, h, d)
                first = False
        elif op.kind == HOST_SYNC:
            continue
        elif op.name in ("dispatch_topk", "multihot_fused", "multihot_put_probs"):
            n = deepep_received_tokens(loc, model.moe.experts, model.moe.top_k, ep)
            what = {"dispatch_topk": "topk", "multihot_fused": "fused"}.get(op.name, "unfused")
            out += _multihot_backward(loc.tokens, model.moe.experts, model.moe.top_k, n,
                                      loc.local_experts, sum(loc.expert_tokens) / etp, what)
        elif op.name.startswith("multihot_"):
            continue  # the map is boolean, the indices integers: no gradient
        elif op.name.startswith(("permute_", "unpermute_")):  # PyTorch's permutation
            rows = _sent_rows(loc, model.moe.experts, model.moe.top_k, dispatcher)
            out += _unfused_permute_backward(op.name, loc.tokens, model.moe.experts, rows, h, d)
        elif op.name in NO_BACKWARD or op.name.startswith(
                (*NO_BACKWARD_PREFIXES, *PLAIN_ATEN_PREFIXES, ROW_MAP_PREFIX)):
            continue
        elif op.name in ("permute", "unpermute", "sort_chunks", "unsort_chunks"):
            out.append(mem_op(op.name, op.block, op.bytes, True))
        else:
            out.append(mem_op(op.name, op.block, op.bytes * 1.5, True))
    return out


def _slice_grad_ops(tag: str, pieces: int, first: bool, rows: float, m: int, h: int,
                    d: int) -> list[Op]:
    """Autograd's backward of the ``pieces`` slices one expert's input was cut from (``m``
    rows of the ``rows``-row buffer of received copies, ``h`` wide): ``slice_backward``
    allocates a zero gradient of the whole buffer (a fill, ``rows x h`` written) and copies
    the slice's gradient into it, and the engine's input buffer adds each such gradient into
    the buffer's (``a + b``, read both and write one), all but the first of the layer. So a
    layer of ``n`` slices moves about ``(4 n - 1) rows h d`` bytes in backward, where the
    gradient itself is ``rows h d``: eager code slicing per (source, expert), as
    ``steps_alt.py`` does, pays it for every expert of the EP group (PyTorch's
    ``slice_backward`` in ``FunctionsManual.cpp``, ``InputBuffer::accumulate``;
    ``data/measured/diagnosis11-h100x4``: ``E - 1`` bf16 adds of the whole buffer per layer
    call)."""
    ops = []
    for j in range(pieces):
        ops += [mem_op(f"{SLICE_GRAD}zero_{tag}_{j}", "moe", rows * h * d, True),
                mem_op(f"{SLICE_GRAD}copy_{tag}_{j}", "moe", 2 * m / pieces * h * d, True)]
        if not (first and j == 0):
            ops.append(accumulate_op(f"{SLICE_GRAD}add_{tag}_{j}", "moe", rows * h, d))
    return ops


# --------------------------------------------------------------------------------------------
# Memory


def moe_activation_bytes(
    model: ModelConfig,
    loc: MoELocal,
    *,
    tp: int,
    d: int,
    recompute: str = "none",
    modules: frozenset[str] = frozenset(),
    gemm_in: int | None = None,
    grouped: bool = True,
) -> float:
    """What an MoE block keeps for its backward on the busiest rank, per micro-batch: the norm
    input and the router's input (``t x h``), the routing weights and map (fp32 and a byte per
    expert), the dispatched copies the expert GEMMs read (``R x h``), the activation's input
    (``R x fc1_out``) and fc2's input (``R x ffn``), and the shared experts' inputs of their
    GEMMs. ``R`` is the busiest rank's copies, ``top_k*t`` with uniform load. ``full``
    recomputation keeps only the layer's input (counted with the attention).

    Where the routing weights are applied: fused kernels (``grouped``) apply them inside the
    experts' activation, on the dispatched copies (Megatron-Core's ``TEGroupedMLP`` passes
    ``permuted_probs`` to ``weighted_bias_swiglu_impl``, whose backward saves only its input
    and the weights; DeepSeek-V3 caches the SwiGLU input and recomputes its output,
    arXiv:2412.19437, Section 3.3.3), so the un-permutation is a plain sum that keeps nothing.
    Eager code (``grouped=False``) scales the combined copies by the weights after the
    exchange, and keeps them (``t*top_k x h``) for the weights' gradient; its SwiGLU experts
    are separate modules, so the product also keeps ``silu``'s output (``R x ffn``, as the
    dense eager layer's ``silu_output``).

    ``modules`` (selective recomputation, Megatron-Core's recompute modules): ``moe_act``
    drops fc2's input (the activation's output, recomputed from its input), ``layernorm`` the
    norm output (the router's input). ``gemm_in``: bytes per element of a cached GEMM input
    where the precision recipe keeps the quantised copy (FP8: 1, as DeepSeek-V3 caches the
    dispatched tokens and the SwiGLU input, arXiv:2412.19437, Section 3.3.3; default ``d``)."""
    if recompute == "full":
        return 0.0
    moe, h = model.moe, model.hidden
    t, k, E, R, f = loc.tokens, moe.top_k, moe.experts, sum(loc.expert_tokens), loc.ffn
    g = d if gemm_in is None else gemm_in
    fc1_out = 2 * f if model.activation == "swiglu" else f
    n = t * h * d + t * E * (FP32 + 1)  # norm input, routing weights and map
    n += 0 if "layernorm" in modules else t * h * g  # norm output: the router's input
    n += R * h * g + R * fc1_out * g  # dispatched copies (fc1 input), activation input
    n += 0 if "moe_act" in modules else R * f * g  # fc2 input
    n += 0 if grouped else t * k * h * d  # the combined copies the weights multiply
    if not grouped and model.activation == "swiglu" and "moe_act" not in modules:
        # eager w2(silu(w1 x) * w3 x): the product saves silu's output beside w3's, silu its
        # input, w2 the product (benchmarks/device/steps.py FeedForward, steps_third.py SwiGLU)
        n += R * f * d
    if moe.shared_experts:
        fs = moe.shared_experts * moe.shared_ffn // tp
        fs1 = 2 * fs if model.activation == "swiglu" else fs
        n += t * tp * (fs1 + (0 if "moe_act" in modules else fs)) * g
    return float(n)
