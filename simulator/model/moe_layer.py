"""One layer of an MoE and/or MLA model on one rank: kernels and every dimension's collectives.

The counterpart of :func:`simulator.model.comm.layer_ops` for models with ``model.moe`` or
``attention: mla``. A layer is its attention block (MHA/GQA from
:mod:`simulator.model.transformer`, or MLA from :mod:`simulator.model.mla`) with Megatron's TP
collectives, then its MLP: dense (the first ``moe.dense_layers`` layers) or the MoE block of
:mod:`simulator.model.moe`, whose collectives run over the ``ep`` and ``etp`` groups of the MoE
layout (MoE Parallel Folding) and, for shared experts, over ``tp``.

Megatron-Core requires sequence parallelism with TP in MoE models, so the MoE block sees the
``s/tp`` tokens of its rank and needs no TP collective around it (the attention's reduce-
scatter leaves the tokens scattered, the next layer's all-gather gathers them).

Where the expert load is uneven the dispatch and combine are priced as the busiest receiver
sees them: a uniform all-to-all of ``nbytes * ep * share`` moves, into the busiest rank, what
it receives in the uneven one (:class:`~simulator.model.moe.MoELocal`).

Megatron-Core's ``overlap_moe_expert_parallel_comm`` (and DeepSeek's DualPipe) run one
micro-batch's dispatch and combine beside another's compute: that is a schedule, not a property
of the layer (:mod:`simulator.engine.combined`); here every all-to-all waits for its inputs.
"""

from __future__ import annotations

from simulator.config.schema import ModelConfig
from simulator.hardware.precision import moe_dispatch_bytes
from simulator.model import comm as mc
from simulator.model import mla, moe
from simulator.model import transformer as tf
from simulator.model.ops import FP32, HOST_SYNC, Op, accumulate_op, arch, cast_op, mem_op


def _split(ops: list[Op], start: str) -> int:
    """Index of the first op whose name starts with ``start``."""
    return next(i for i, op in enumerate(ops) if op.name.startswith(start))


def _attn_backward_start(ops: list[Op]) -> int:
    """Index of the first op of a layer backward's attention half: the first residual add's
    gradient kernel (its cast or dropout), or, where the eager code has none (a residual
    stream already in the compute dtype, no dropout), the op after norm2's backward."""
    for start in ("residual1", "resid_dropout1"):
        if any(op.name.startswith(start) for op in ops):
            return _split(ops, start)
    return 1 + max(i for i, op in enumerate(ops) if op.name.startswith("norm2"))


def _mla_tp(ops: list[Op], nbytes: float, sp: bool, backward: bool) -> list[Op]:
    """Megatron's TP collectives around an MLA block: the input gathered before the
    (duplicated) down-projections with SP, ``out_proj`` reduced (or reduce-scattered) after;
    backward the conjugates, the input-gradient reduction overlapping the last weight GEMM."""
    red = "reduce_scatter" if sp else "all_reduce"
    gemms = [i for i, op in enumerate(ops) if op.kind == "gemm"]
    out: list[Op] = []
    for i, op in enumerate(ops):
        if not backward:
            if sp and i == gemms[0]:
                out.append(mc.comm_op("tp_all_gather", "all_gather", "tp", nbytes))
            out.append(op)
            if op.name == "out_proj":
                out.append(mc.comm_op(f"tp_{red}", red, "tp", nbytes))
            continue
        if sp and op.name == "out_proj_dgrad":
            out.append(mc.comm_op("tp_all_gather", "all_gather", "tp", nbytes))
        out.append(op)
        if i == gemms[-2]:  # the last dgrad: its reduction runs beside the last wgrad
            out.append(mc.comm_op(f"tp_{red}", red, "tp", nbytes, overlap=True))
    return out


def _expert_weight_casts(model: ModelConfig, loc: moe.MoELocal, d: int, backward: bool):
    """Fused code's fp32 parameters under autocast: every micro-batch casts the local experts'
    weights to ``d`` (forward) and casts their gradients back and adds them into ``.grad``
    (backward), as :func:`simulator.model.transformer._master_weights` does for the dense
    GEMMs (eager code: :func:`_eager_expert_params`)."""
    n = loc.local_experts * moe.expert_params(model, loc.ffn)
    if backward:
        return [cast_op("expert_gcast", "moe", n, d, FP32, True),
                accumulate_op("expert_gacc", "moe", n)]  # fmt: skip
    return [cast_op("expert_wcast", "moe", n, FP32, d)]


def _eager_expert_params(model: ModelConfig, ops: list[Op], d: int, fp32: bool,
                         backward: bool) -> list[Op]:
    """Eager experts are modules (``nn.Linear`` each): under autocast over fp32 weights each
    Linear casts its own weight (and bias) to ``d`` right before its GEMM (autocast's cache
    keeps a cast for the forward; each expert's weights are other tensors), and autograd
    casts each gradient back to fp32 and adds it into that parameter's ``.grad`` after its
    weight-gradient GEMM, as the dense eager layer's ``_linear_fwd`` / ``_linear_bwd`` do
    (``simulator/model/eager.py``); GPT-family experts carry biases as its MLP does
    (``steps_alt.py``'s ``MLP``: ``nn.Linear`` with bias), whose gradient is a sum of the
    output gradient over the expert's rows. One kernel per parameter tensor, each paying its
    host: a step of ``L`` local experts launches ``L`` times the casts of one."""
    biases = arch(model).biases
    out: list[Op] = []
    for op in ops:
        name = op.name[:-len("_wgrad")] if op.name.endswith("_wgrad") else op.name
        expert = op.kind == "gemm" and name.startswith("expert_fc") and "_e" in name
        if not expert or (backward and not op.name.endswith("_wgrad")):
            out.append(op)
            continue
        tag = name[len("expert_"):]  # fc1_e0
        if not backward:
            if fp32:
                out.append(cast_op(f"expert_wcast_{tag}", "moe", op.k * op.n, FP32, d))
                if biases:
                    out.append(cast_op(f"expert_bcast_{tag}", "moe", op.n, FP32, d))
            out.append(op)
            continue
        out.append(op)  # dW = X^T dY: [k, n] of the forward GEMM, over its op.k rows
        if biases:
            out.append(mem_op(f"expert_bgrad_{tag}", "moe", (op.k + 1) * op.n * d, True))
        if fp32:
            out += [cast_op(f"expert_gcast_{tag}", "moe", op.m * op.n, d, FP32, True),
                    accumulate_op(f"expert_gacc_{tag}", "moe", op.m * op.n)]
            if biases:
                out += [cast_op(f"expert_bgcast_{tag}", "moe", op.n, d, FP32, True),
                        accumulate_op(f"expert_bgacc_{tag}", "moe", op.n)]
    return out


def layer_settings(training, ep: int, etp: int) -> dict:
    """The MoE block's settings for :func:`layer_ops` (``moe=``): the engine's builder and
    ``plan``'s estimator both take them from here."""
    return dict(ep=ep, etp=etp, expert_load=moe.load_spec(training),
                dispatcher=training.moe_dispatcher,
                dispatch_bytes=moe_dispatch_bytes(training),
                wgrad_acc_bytes=moe.expert_wgrad_acc_bytes(training),
                router=moe.router_kernels(training),
                multihot=moe.multihot_kernels(training),
                regroup=training.moe_regroup,
                permute_kind=moe.permute_kernels(training),
                probs_alltoall=training.moe_probs_alltoall)  # fmt: skip


def layer_ops(
    model: ModelConfig,
    *,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool,
    backward: bool,
    moe_layer: bool,
    cp: int = 1,
    cp_comm: str = "p2p",
    flash_attention: bool = True,
    kernels: str = "fused",
    param_dtype: str = "bf16",
    precision_bytes: int = 2,
    tp_input_dtype: str = "residual",
    tp_impl: str = "megatron",
    lowp_gather: mc.LowPrecisionGather | None = None,
    ep: int = 1,
    etp: int = 1,
    expert_load: tuple[float, ...] | None = None,
    dispatcher: str = "alltoall",
    dispatch_bytes: float | None = None,
    wgrad_acc_bytes: int = 0,
    router: str = "fused",
    multihot: str = "fused",
    regroup: str = "aranges",
    permute_kind: str = "fused",
    probs_alltoall: bool = True,
) -> list[Op]:
    """One layer's forward (or backward) on one rank of an MoE and/or MLA model: kernels and
    collectives over ``tp``, ``cp``, ``ep`` and ``etp`` (module docstring);
    ``wgrad_acc_bytes``: the grouped experts' wgrads add into ``main_grad`` buffers of that
    many bytes an element (:func:`simulator.model.moe.expert_wgrad_acc_bytes`); ``router``
    which router kernels run (:func:`simulator.model.moe.router_kernels`); ``regroup`` how
    eager code arranges the received copies for its experts (``training.moe_regroup``);
    ``permute_kind`` how fused code permutes (:func:`simulator.model.moe.permute_kernels`);
    ``probs_alltoall`` whether Megatron-Core's alltoall dispatcher sends the routing
    probabilities beside the tokens (``training.moe_probs_alltoall``)."""
    b, sp, d = micro_batch, sequence_parallel, precision_bytes
    local = mc.cp_local(model, cp)
    # the dense layer with its TP/CP collectives: its attention and MLP halves are reused
    dense = mc.layer_ops(
        model, micro_batch=b, tp=tp, sequence_parallel=sp, backward=backward, cp=cp,
        cp_comm=cp_comm, flash_attention=flash_attention, kernels=kernels,
        param_dtype=param_dtype, tp_input_dtype=tp_input_dtype, tp_impl=tp_impl,
        lowp_gather=lowp_gather,
    )  # fmt: skip
    if not moe_layer and model.attention_kind != "mla":
        return dense
    cut = _attn_backward_start(dense) if backward else _split(dense, "norm2")
    att, mlp = (dense[cut:], dense[:cut]) if backward else (dense[:cut], dense[cut:])
    if model.attention_kind == "mla":
        fn = mla.mla_backward_ops if backward else mla.mla_forward_ops
        att = fn(local, b, tp, sp, d)
        if tp > 1:
            att = _mla_tp(att, tf.tp_comm_bytes(local, micro_batch=b), sp, backward)
    if moe_layer:
        # the layer's own norm2 and residual2 kernels (fused or eager), then the MoE block
        norm2 = [op for op in mlp if op.name.startswith("norm2")]
        res2 = [op for op in mlp if op.name.startswith("residual2")]
        body = _moe_body(local, b, tp, d, backward, kernels, param_dtype, ep, etp,
                         expert_load, dispatcher, dispatch_bytes, wgrad_acc_bytes,
                         router, multihot, regroup, permute_kind, probs_alltoall)  # fmt: skip
        mlp = [*res2, *body, *norm2] if backward else [*norm2, *body, *res2]
    return [*mlp, *att] if backward else [*att, *mlp]


def _moe_body(model, b, tp, d, backward, kernels, param_dtype, ep, etp, load, dispatcher,
              dispatch_bytes=None, wgrad_acc_bytes=0, router="fused",
              multihot="fused", regroup="aranges", permute_kind="fused",
              probs_alltoall=True) -> list[Op]:  # fmt: skip
    """The MoE block between norm2 and residual2, its collectives as comm ops."""
    loc = moe.moe_local(model, b, tp, 1, ep, etp, load)
    kw = dict(tp=tp, ep=ep, etp=etp, d=d, dispatcher=dispatcher, grouped=kernels == "fused",
              dispatch_bytes=dispatch_bytes, router=router, multihot=multihot,
              regroup=regroup, permute_kind=permute_kind,
              probs_alltoall=probs_alltoall)  # fmt: skip
    if backward:
        block = moe.moe_backward_ops(model, loc, wgrad_acc_bytes=wgrad_acc_bytes, **kw)
    else:
        block = moe.moe_forward_ops(model, loc, **kw)
    body: list[Op] = []
    for op in block:
        if isinstance(op, moe.Comm):
            nbytes = op.nbytes * (op.share * ep if op.share is not None else 1.0)
            body.append(mc.comm_op(op.name, op.collective, op.dim, nbytes))
        elif op.name not in ("norm2", "residual2"):
            body.append(op)
    if kernels == "eager":
        body = _eager_expert_params(model, body, d, param_dtype == "fp32", backward)
    elif param_dtype == "fp32":
        casts = _expert_weight_casts(model, loc, d, backward)
        body = [*body, *casts] if backward else [*casts, *body]
    # drop-and-pad (fused code, alltoall dispatcher): every split is the capacity, known
    # before the step, so Megatron-Core never reads the counts on the host
    # (token_dispatcher.py preprocess: cuda_sync_point "no_sync")
    padded = kernels == "fused" and model.moe.pad_to_capacity and dispatcher == "alltoall"
    if not backward and not padded:
        mcore_a2a = None
        if kernels == "fused" and dispatcher == "alltoall":
            mcore_a2a = "capped" if model.moe.capacity_factor is not None else "dropless"
        body.insert(_sync_at(body, kernels, mcore_a2a), Op("moe_counts_sync", HOST_SYNC, "moe"))
        if kernels == "eager" and ep > 1:
            # torch.bincount of the copies' expert ids (every eager script counts them so)
            # reads their min and max on the host before the count exchange (CUDA bincount
            # sizes its output by them): the host waits there too, for the layer so far
            at = next(i for i, op in enumerate(body) if op.name == "permute") + 1
            body.insert(at, Op("moe_bincount_sync", HOST_SYNC, "moe"))
        if kernels == "eager" and regroup == "argsort" and ep > 1:
            # repeat_interleave by the received counts (a device tensor) reads their sum on
            # the host: it waits for the dispatch (steps_third.py)
            at = next(i for i, op in enumerate(body) if op.name == "perm_ids")
            body.insert(at, Op("moe_regroup_sync", HOST_SYNC, "moe"))
    return body


def _sync_at(body: list[Op], kernels: str, mcore_a2a: str | None = None) -> int:
    """Where an MoE layer's forward waits on its host for the token counts (the host clock of
    :mod:`simulator.engine.host` prices what follows).

    Plain PyTorch splits the tokens per expert with sizes it reads on the host
    (``counts.tolist()``, after the permutation and the count exchange). Megatron-Core
    (``megatron/core/transformer/moe/token_dispatcher.py``, 2026-08) does so in every
    dispatcher of a dropless MoE: the alltoall dispatcher copies the split sizes to the host
    on a side stream once the counts are exchanged and waits for that copy before the EP
    all-to-all (``cuda_sync_point`` ``before_ep_alltoall`` with EP or expert TP, else
    ``before_finish``, before the experts, whose grouped GEMM takes the per-expert sizes on the
    host); the allgather dispatcher calls ``.cpu()`` on the tokens per expert after its
    gather; DeepEP's dispatch waits on the host for its count exchange (``num_recv_tokens_
    per_expert_list``) before it sends. So the sync follows the count exchange (or the
    gather), else comes before the first expert GEMM.

    Megatron-Core's alltoall dispatcher (``mcore_a2a``, fused code) is placed as its
    ``cuda_sync_point`` says: dropless (``"dropless"``) after its permutation, where
    ``token_dispatch`` waits for the copies (``before_ep_alltoall``: the permutation's kernels
    were launched before the wait, and the copies, issued after the count kernels, finish
    while it runs; core_v0.11 waited on the compute stream there, the permutation included);
    with a capacity factor and no padding (``"capped"``) before the permutation
    (``before_permutation_1``, which needs ``num_out_tokens``); with neither EP nor expert TP
    before the experts (``before_finish``)."""
    names = [op.name for op in body]
    if kernels == "eager":
        return max(i for i, n in enumerate(names) if n in ("permute", "moe_counts")) + 1
    if mcore_a2a == "capped":
        return max(i for i, n in enumerate(names) if n.startswith("a2a_dtoh_")) + 1
    if mcore_a2a == "dropless" and "moe_counts" in names:
        return next(i for i, n in enumerate(names) if n in ("moe_dispatch", "moe_etp_gather"))
    for after in ("moe_counts", "moe_gather"):
        if after in names:
            return names.index(after) + 1
    return next(i for i, n in enumerate(names) if n.startswith("expert_fc1"))
