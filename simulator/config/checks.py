"""Cross-field rules: the workload against itself and against the cluster it runs on.

Each rule raises :class:`ConfigError` naming the workload file and the dotted field to change,
with the numbers that disagree and what would be accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.config.schema import ModelConfig, TopologyConfig, WorkloadConfig
from simulator.errors import ConfigError

#: Most (micro-batch, layer) forward passes one replica's step may hold: the engine's events,
#: time and memory grow with it (1,024 micro-batches of an 80-layer model, 81,920 passes:
#: ~10 s and ~600 MB).
MAX_LAYER_PASSES = 131_072


@dataclass(frozen=True)
class Resolved:
    """Derived sizes every later stage needs (all validated).

    ``sizes`` maps each parallel dimension, in rank order (innermost first), to its size;
    :meth:`size` is 1 for a dimension the job does not use."""

    n_gpus: int
    sizes: tuple[tuple[str, int], ...]
    virtual_stages: int
    microbatches: int  # per DP rank per step
    stage_layers: tuple[int, ...]  # layers per virtual stage, pp * virtual_stages entries
    ep: int = 1  # expert-parallel degree (MoE layers)
    etp: int = 1  # tensor-parallel degree inside experts
    edp: int = 1  # expert data-parallel degree: tp*cp*dp / (ep*etp)

    def size(self, dim: str) -> int:
        return dict(self.sizes).get(dim, 1)

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(d for d, _ in self.sizes)


def _product(sizes: dict[str, int]) -> int:
    n = 1
    for v in sizes.values():
        n *= v
    return n


def _culprit(given: dict[str, int], n_gpus: int) -> str:
    """The field to name when the product of ``given`` does not divide ``n_gpus``: the first
    dimension (in rank order) at which the running product stops dividing it."""
    n = 1
    for d, v in given.items():
        n *= v
        if n_gpus % n:
            return f"parallelism.{d}"
    return "parallelism.dp"


def _world(work: WorkloadConfig, n_gpus: int, topo: TopologyConfig, fail) -> dict[str, int]:
    """Sizes of the dense dimensions; ``dp`` (when not given) fills the cluster."""
    par = work.parallelism
    # cp = 1 is left out of the messages (the job has no context parallelism)
    given = {d: getattr(par, d) for d in par.dims_order if d != "dp" and (d != "cp" or par.cp > 1)}
    rest = _product(given)
    names = "*".join(given)
    if par.dp is None:
        if n_gpus % rest:
            raise fail(
                _culprit(given, n_gpus),
                f"{names} = {rest} does not divide the cluster's {n_gpus} GPUs",
            )
        dp = n_gpus // rest
    else:
        dp = par.dp
        if rest * dp != n_gpus:
            vals = "*".join(str(v) for v in given.values())
            raise fail(
                _culprit(given, n_gpus),
                f"{names}*dp = {vals}*{dp} = {rest * dp}, but the cluster "
                f"'{topo.name}' has {n_gpus} GPUs ({topo.nodes} nodes x {topo.gpus_per_node}); "
                f"they must be equal (e.g. dp={n_gpus // rest}, or dp: null to fill the "
                "cluster)"
                if n_gpus % rest == 0
                else f"{names}*dp = {rest * dp}, but the cluster '{topo.name}' has {n_gpus} GPUs",
            )
    return {d: (dp if d == "dp" else given.get(d, 1)) for d in par.dims_order}


def cp_window_refusal(model: ModelConfig, cp: int, cp_comm: str) -> tuple[str, str] | None:
    """(field, message) where a local attention window under context parallelism is one that
    Transformer Engine refuses (``attention/dot_product_attention/context_parallel.py``): a
    chunked window (TE has no chunked mask), a sliding one on the p2p ring (sliding windows
    run with cp_comm_type all_gather or a2a only); None where it runs
    (:mod:`simulator.model.context`)."""
    if cp == 1 or model.attention_window is None:
        return None
    whole = ("; a window of the whole sequence is full causal attention: leave the window out"
             if model.attention_window >= model.seq_len else "")
    if model.attention_window_kind == "chunked":
        return ("model.attention_window_kind",
                f"chunked with cp={cp}: Transformer Engine's context parallelism has no chunked "
                f"mask (it runs sliding windows, with parallelism.cp_comm: all_gather or a2a){whole}")
    if cp_comm == "p2p":
        return ("parallelism.cp_comm",
                f"p2p with a sliding model.attention_window={model.attention_window} and "
                f"cp={cp}: Transformer Engine's ring refuses sliding windows (use all_gather or "
                f"a2a){whole}")
    return None


def cp_a2a_refusal(model: ModelConfig, tp: int, cp: int) -> tuple[str, str] | None:
    """(field, message) where ``cp_comm: a2a`` (Ulysses) cannot split a TP rank's heads over
    the CP group: Transformer Engine's ``AttnFuncWithCPAndQKVOA2A`` asserts that the query
    and the key/value heads of Q, K and V (per TP rank; KV heads replicated when ``tp`` is a
    multiple of them, Megatron-LM's GQA rule) divide by ``cp``; None where they do."""
    if cp == 1:
        return None
    hq = model.heads // tp if model.heads % tp == 0 else 0
    kv = model.n_kv_heads
    hkv = kv // tp if kv % tp == 0 else 1
    if hq and hq % cp == 0 and hkv % cp == 0:
        return None
    return ("parallelism.cp_comm",
            f"a2a with cp={cp}: the heads per TP rank (query {hq}, key/value {hkv} at tp={tp}) "
            "must divide by cp, as Transformer Engine's all-to-all attention asserts (use p2p "
            "or all_gather)")


def cp_comm_refusal(model: ModelConfig, tp: int, cp: int, cp_comm: str) -> tuple[str, str] | None:
    """(field, message) of the first reason Transformer Engine refuses ``cp_comm`` for the model
    at ``tp`` x ``cp``: a local layer's window on it (:func:`cp_window_refusal`), ``a2a``'s heads
    per TP rank (:func:`cp_a2a_refusal`; heads that do not divide by ``tp`` are the layout's
    own refusal); None where it runs."""
    if any(model.is_local_layer(i) for i in range(model.layers)):
        refusal = cp_window_refusal(model, cp, cp_comm)
        if refusal is not None:
            return refusal
    if cp_comm == "a2a" and model.heads % tp == 0:
        return cp_a2a_refusal(model, tp, cp)
    return None


def _check_cp(work: WorkloadConfig, cp: int, tp: int, fail) -> None:
    """Context parallelism: 2*cp load-balanced chunks per sequence (Megatron-LM), fused
    flash-attention kernels (Transformer Engine implements it only there)."""
    m, t, par = work.model, work.training, work.parallelism
    if cp == 1:
        return
    if m.seq_len % (2 * cp):
        raise fail(
            "parallelism.cp",
            f"seq_len={m.seq_len} is not divisible by 2*cp = {2 * cp} (the sequence is split "
            "into 2*cp chunks)",
        )
    if par.sequence_parallel and (m.seq_len // cp) % tp:
        raise fail(
            "parallelism.sequence_parallel",
            f"seq_len/cp = {m.seq_len // cp} is not divisible by tp={tp}",
        )
    refusal = cp_comm_refusal(m, tp, cp, par.cp_comm)
    if refusal is not None:
        raise fail(*refusal)
    if t.kernels != "fused" or not t.flash_attention:
        raise fail(
            "parallelism.cp",
            f"cp={cp} needs fused flash-attention kernels (training.kernels: fused, "
            "training.flash_attention: true), as Transformer Engine's context parallelism does",
        )


def resolve(
    work: WorkloadConfig, topo: TopologyConfig, *, file: str, topo_file: str | None = None
) -> Resolved:
    """Check the workload against the cluster and derive the layout sizes."""
    m, t, par = work.model, work.training, work.parallelism
    n_gpus = topo.nodes * topo.gpus_per_node

    def fail(field: str, msg: str) -> ConfigError:
        return ConfigError(msg, file=file, field=field)

    sizes = _world(work, n_gpus, topo, fail)
    tp, pp, dp = sizes["tp"], sizes["pp"], sizes["dp"]
    if m.qk_layernorm and (t.kernels != "fused" or m.attention_kind == "mla"):
        raise fail("model.qk_layernorm", "modelled for fused kernels with mha/gqa attention "
                   "only (Megatron-Core's q_layernorm and k_layernorm)")
    if m.heads % tp:
        raise fail("parallelism.tp", f"heads={m.heads} is not divisible by tp={tp}")
    kv = m.n_kv_heads
    if kv % tp and tp % kv:
        raise fail(
            "parallelism.tp",
            f"kv_heads={kv} and tp={tp}: one must divide the other (KV heads are split or replicated)",
        )
    if m.ffn % tp:
        raise fail("parallelism.tp", f"ffn_hidden={m.ffn} is not divisible by tp={tp}")
    if par.sequence_parallel and m.seq_len % tp:
        raise fail(
            "parallelism.sequence_parallel",
            f"seq_len={m.seq_len} is not divisible by tp={tp}",
        )
    _check_cp(work, sizes["cp"], tp, fail)
    if par.tp_impl == "dtensor" and t.kernels != "eager":
        raise fail("parallelism.tp_impl", "dtensor models PyTorch DTensor tensor parallelism in "
                   "eager code: needs training.kernels: eager (accepted with fused kernels: "
                   "megatron)")
    if par.tp_loss == "gathered" and (t.kernels != "eager" or par.tp_impl != "megatron"):
        raise fail("parallelism.tp_loss", "gathered models eager code that all-gathers the "
                   "LM head's logits: needs training.kernels: eager and parallelism.tp_impl: "
                   "megatron (accepted otherwise: vocab_parallel)")
    if par.tp_embedding == "replicated" and t.kernels != "eager":
        raise fail("parallelism.tp_embedding", "replicated models eager code that keeps a whole "
                   "nn.Embedding on every TP rank: needs training.kernels: eager (accepted "
                   "otherwise: vocab_parallel)")
    _check_deepspeed(work, pp, fail)
    _check_fsdp_reshard(work, pp * par.virtual_stages, fail)
    if t.master_weights == "remainder" and (t.param_dtype != "bf16" or t.optimizer_impl != "fused"):
        raise fail("training.master_weights", "remainder keeps the 16 bits an fp32 weight has "
                   "beyond its bf16 value (Apex DistributedFusedAdam): needs param_dtype: bf16 "
                   "and optimizer_impl: fused (accepted otherwise: fp32, none)")

    v = par.virtual_stages
    if par.pp_schedule == "dualpipev" and v != 2:
        raise fail("parallelism.virtual_stages", f"dualpipev holds two stages a rank in a V "
                   f"(i and 2pp-1-i): needs virtual_stages: 2 (got {v})")
    if par.pp_schedule not in ("interleaved", "dualpipev") and v != 1:
        raise fail(
            "parallelism.virtual_stages",
            f"virtual_stages={v} needs pp_schedule: interleaved (got {par.pp_schedule})",
        )
    if par.pp_schedule == "interleaved" and pp == 1:
        raise fail("parallelism.pp_schedule", "interleaved needs pp > 1")
    _check_dualpipe(par, pp, fail)
    n_virtual = pp * v
    if par.stage_layers is not None:
        sl = tuple(par.stage_layers)
        if len(sl) != n_virtual:
            raise fail(
                "parallelism.stage_layers",
                f"has {len(sl)} entries, expected pp*virtual_stages = {n_virtual}",
            )
        empty = [i for i, n in enumerate(sl) if n == 0 and i not in (0, n_virtual - 1)]
        if empty or min(sl) == 0 and n_virtual == 1:
            raise fail(
                "parallelism.stage_layers",
                f"virtual stage {empty[0] if empty else 0} holds no layer (only the first, "
                "with the embedding, and the last, with the head, may be empty)",
            )
        if sum(sl) != m.layers:
            raise fail(
                "parallelism.stage_layers",
                f"adds up to {sum(sl)} layers, but model.layers = {m.layers}",
            )
    else:
        if m.layers % n_virtual:
            raise fail(
                "parallelism.pp",
                f"model.layers={m.layers} is not divisible by pp*virtual_stages={n_virtual} "
                "(give parallelism.stage_layers to split unevenly)",
            )
        sl = (m.layers // n_virtual,) * n_virtual

    per_step = dp * t.micro_batch
    if t.global_batch % per_step:
        raise fail(
            "training.global_batch",
            f"global_batch={t.global_batch} is not divisible by dp*micro_batch = {dp}*"
            f"{t.micro_batch} = {per_step}",
        )
    mbs = t.global_batch // per_step
    if mbs * m.layers > MAX_LAYER_PASSES:
        raise fail(
            "training.global_batch",
            f"{mbs:,} micro-batches per replica x {m.layers} layers = {mbs * m.layers:,} layer "
            f"passes per step; the simulator takes up to {MAX_LAYER_PASSES:,} (raise "
            "micro_batch or dp, or lower global_batch)",
        )
    if par.pp_schedule == "interleaved" and mbs % pp:
        raise fail(
            "training.global_batch",
            f"the interleaved schedule needs micro-batches ({mbs}) to be a multiple of pp={pp}",
        )
    if par.pp_schedule == "dualpipev" and mbs < 2 * pp:
        raise fail("training.global_batch", f"dualpipev needs at least 2 pp = {2 * pp} "
                   f"micro-batches per replica (got {mbs})")
    if par.pp_schedule == "dualpipe" and (mbs % 2 or mbs < 2 * pp):
        # (DeepSeek's DualPipe asserts num_chunks % 2 == 0 and num_chunks >= 2 * num_ranks)
        raise fail(
            "training.global_batch",
            f"dualpipe needs an even number of micro-batches per replica, at least 2 pp = "
            f"{2 * pp} (got {mbs})",
        )
    for i, s in enumerate(work.faults.stragglers):
        if s.gpu is not None and s.gpu >= n_gpus:
            raise fail(
                f"faults.stragglers[{i}].gpu",
                f"gpu {s.gpu} does not exist (the cluster has GPUs 0..{n_gpus - 1})",
            )
        if s.node is not None and s.node >= topo.nodes:
            raise fail(
                f"faults.stragglers[{i}].node",
                f"node {s.node} does not exist (the cluster has nodes 0..{topo.nodes - 1})",
            )
    for i, lf in enumerate(work.faults.links):
        if lf.kind == "nvlink":
            if lf.gpu is None or lf.gpu >= n_gpus:
                raise fail(
                    f"faults.links[{i}].gpu", f"an nvlink fault needs gpu in 0..{n_gpus - 1}"
                )
        else:
            if lf.node is None or lf.node >= topo.nodes:
                raise fail(
                    f"faults.links[{i}].node", f"a nic fault needs node in 0..{topo.nodes - 1}"
                )
            if topo.nics_per_node == 0:
                raise fail(
                    f"faults.links[{i}].kind",
                    "the topology has no NICs (nics_per_node: 0), so no nic link to fault "
                    "(accepted: kind: nvlink)",
                )
            if lf.nic is None or lf.nic >= topo.nics_per_node:
                raise fail(
                    f"faults.links[{i}].nic",
                    f"a nic fault needs nic in 0..{topo.nics_per_node - 1}",
                )
    if topo.nodes > 1 and topo.nics_per_node == 0:
        raise ConfigError(
            "a cluster of several nodes needs nics_per_node >= 1 (the nodes are disconnected)",
            file=topo_file or topo.name,
            field="nics_per_node",
        )
    _check_link_cuts(work, topo, file)
    ep, etp, edp = check_moe(work, dp, file)
    return Resolved(n_gpus, tuple(sizes.items()), v, mbs, sl, ep, etp, edp)


def _check_deepspeed(work: WorkloadConfig, pp: int, fail) -> None:
    """``training.zero_impl: deepspeed`` is DeepSpeed's ZeRO stage 3 on a dense model without
    pipeline stages (DeepSpeed's pipeline engine refuses ZeRO-2 and -3:
    deepspeed/runtime/pipe/engine.py)."""
    if work.training.zero_impl != "deepspeed":
        return
    m, par = work.model, work.parallelism
    if par.zero != 3:
        raise fail("training.zero_impl", f"deepspeed models DeepSpeed's ZeRO stage 3: needs "
                   f"parallelism.zero: 3 (got {par.zero}; accepted with other stages: unit)")
    if pp > 1:
        raise fail("training.zero_impl", f"DeepSpeed's ZeRO-3 is incompatible with pipeline "
                   f"parallelism: needs pp: 1 (got {pp}; accepted with pp > 1: unit)")
    if m.moe is not None or m.attention_kind == "mla":
        raise fail("training.zero_impl", "deepspeed models a dense transformer's modules "
                   "(accepted: no model.moe, attention mha or gqa)")


def _check_fsdp_reshard(work: WorkloadConfig, stages: int, fail) -> None:
    """``training.fsdp_reshard_after_forward`` other than ``default`` says how FSDP2 units are
    resharded, ``training.fsdp_version: 1`` that they are FSDP1's: both apply where the engine
    runs FSDP's units (eager code, ZeRO-3 by units, no pipeline stages)."""
    t, par = work.training, work.parallelism
    if t.fsdp_version == 1 and t.fsdp_reshard_after_forward == "all":
        raise fail("training.fsdp_version", "FSDP1 never reshards the root after the forward "
                   "(_post_forward_reshard): fsdp_reshard_after_forward all needs fsdp_version 2 "
                   "(accepted with 1: default, none)")
    if t.fsdp_reshard_after_forward == "default" and t.fsdp_version == 2:
        return
    if t.kernels != "eager" or par.zero != 3 or t.zero_impl != "unit" or stages > 1:
        field, value = (("training.fsdp_version", "1") if t.fsdp_version == 1 else
                        ("training.fsdp_reshard_after_forward", t.fsdp_reshard_after_forward))
        raise fail(field,
                   f"{value} applies to PyTorch FSDP's units: needs "
                   f"training.kernels: eager, parallelism.zero: 3, training.zero_impl: unit and "
                   f"no pipeline stages (got {t.kernels}, zero {par.zero}, {t.zero_impl}, "
                   f"{stages} stages; accepted otherwise: the defaults)")


def _check_dualpipe(par, pp: int, fail) -> None:
    """DualPipe (DeepSeek-V3): rank ``i`` holds stages ``i`` and ``pp - 1 - i``, so ``pp`` is
    even (DualPipeV: ``pp >= 2``); both modelled with ZeRO 0-2 (ZeRO-3's per-layer gathers are
    not split into the input- and weight-gradient passes)."""
    if par.pp_schedule not in ("dualpipe", "dualpipev"):
        return
    if par.pp_schedule == "dualpipev" and pp < 2:
        raise fail("parallelism.pp", f"dualpipev needs pp >= 2, got {pp}")
    if par.pp_schedule == "dualpipe" and (pp < 2 or pp % 2):
        raise fail("parallelism.pp", f"dualpipe needs an even pp of at least 2 (rank i holds "
                   f"stages i and pp-1-i), got {pp}")
    if par.zero == 3:
        raise fail("parallelism.zero",
                   f"{par.pp_schedule} is modelled with zero 0, 1 or 2 (got 3)")


#: Tolerance on ``training.moe_expert_load`` summing to 1.
LOAD_SUM_TOL = 1e-3


def check_moe(work: WorkloadConfig, dp: int, file: str) -> tuple[int, int, int]:
    """The MoE keys against the model and the layout; returns ``(ep, etp, edp)``.

    MoE Parallel Folding (Liu et al. 2025, arXiv:2504.14960, Section 3): the MoE layers of a
    pipeline stage run on the same ``tp*cp*dp`` GPUs as its attention layers, regrouped as
    ``etp x ep x edp``; so ``ep*etp`` must divide ``tp*cp*dp`` and ``edp`` is the quotient.
    Each EP rank holds ``experts/ep`` experts, split ``etp`` ways along their inner width.
    """
    m, t, par = work.model, work.training, work.parallelism
    ep, etp = par.ep, par.etp
    cp = getattr(par, "cp", 1) or 1

    def fail(field: str, msg: str) -> ConfigError:
        return ConfigError(msg, file=file, field=field)

    mods = t.recompute_modules
    if mods and "mla_up_proj" in mods and m.attention_kind != "mla":
        raise fail("training.recompute_modules",
                   "mla_up_proj needs model.attention: mla (accepted here: core_attn, "
                   "layernorm, mlp, moe_act)")
    if mods and set(mods) - {"core_attn"} and m.moe is None and m.attention_kind != "mla":
        raise fail("training.recompute_modules",
                   "layernorm, mla_up_proj, mlp and moe_act are modelled for MoE / MLA models "
                   "(accepted here: core_attn)")
    if mods and "moe_act" in mods and m.moe is None:
        raise fail("training.recompute_modules", "moe_act needs model.moe")
    if t.moe_dispatch_dtype == "fp8" and t.precision not in ("fp8", "mxfp8"):
        raise fail("training.moe_dispatch_dtype",
                   f"fp8 sends the tokens quantised for FP8 expert GEMMs, but precision is "
                   f"{t.precision} (accepted: bf16; fp8 with precision fp8 or mxfp8)")
    if t.delay_wgrad_compute and not t.overlap_moe_expert_parallel_comm:
        raise fail("training.delay_wgrad_compute",
                   "needs training.overlap_moe_expert_parallel_comm (Megatron-Core asserts it; "
                   "accepted: false)")
    if t.overlap_moe_expert_parallel_comm:
        if m.moe is None:
            raise fail("training.overlap_moe_expert_parallel_comm",
                       "needs model.moe (the model is dense; accepted: false)")
        if par.zero == 3 or par.pp_schedule == "gpipe" or t.moe_dispatcher == "allgather":
            raise fail("training.overlap_moe_expert_parallel_comm",
                       "combined 1F1B is modelled with pp_schedule 1f1b or interleaved, zero "
                       "0-2 and moe_dispatcher alltoall or deepep (as Megatron-Core runs it), got "
                       f"{par.pp_schedule}, zero {par.zero}, {t.moe_dispatcher}")
    if m.moe is None:
        if ep > 1 or etp > 1:
            raise fail(
                "parallelism.ep" if ep > 1 else "parallelism.etp",
                f"ep={ep}, etp={etp} need a mixture-of-experts model (model.moe is not set; "
                "accepted: 1)",
            )
        if t.moe_expert_load is not None:
            raise fail("training.moe_expert_load", "needs model.moe (the model is dense)")
        if t.moe_routing != "balanced":
            raise fail("training.moe_routing", "needs model.moe (the model is dense; "
                       "accepted: balanced)")
        if t.moe_dispatch_dtype != "bf16":
            raise fail("training.moe_dispatch_dtype", "needs model.moe (the model is dense; "
                       "accepted: bf16)")
        return 1, 1, 1
    moe = m.moe
    if par.tp > 1 and not par.sequence_parallel:
        raise fail(
            "parallelism.sequence_parallel",
            f"an MoE model with tp={par.tp} needs sequence_parallel: true (Megatron-Core's "
            "rule: the MoE block routes the s/tp tokens of each rank)",
        )
    width = par.tp * cp * dp
    if width % (ep * etp):
        raise fail(
            "parallelism.ep",
            f"ep*etp = {ep}*{etp} = {ep * etp} must divide tp*cp*dp = {par.tp}*{cp}*{dp} = "
            f"{width} (the MoE layers fold onto the attention layers' GPUs)",
        )
    if moe.experts % ep:
        raise fail(
            "parallelism.ep",
            f"experts={moe.experts} is not divisible by ep={ep} (each EP rank holds "
            "experts/ep experts)",
        )
    if moe.ffn_hidden % etp:
        raise fail(
            "parallelism.etp", f"moe.ffn_hidden={moe.ffn_hidden} is not divisible by etp={etp}"
        )
    load = t.moe_expert_load
    if t.moe_routing == "learned" and moe.capacity_factor is not None:
        raise fail("training.moe_routing",
                   "learned routes' busiest rank is not modelled with model.moe.capacity_factor "
                   "(accepted: balanced, or drop that key)")
    if t.moe_routing == "random" and (load is not None or moe.capacity_factor is not None):
        raise fail("training.moe_routing",
                   "random routes draw every expert alike and are not modelled with "
                   + ("training.moe_expert_load" if load is not None else
                      "model.moe.capacity_factor") + " (accepted: balanced, or drop that key)")
    if load is not None:
        if len(load) != moe.experts:
            raise fail(
                "training.moe_expert_load",
                f"has {len(load)} entries, expected one per expert ({moe.experts})",
            )
        if any(x < 0 for x in load):
            raise fail("training.moe_expert_load", "shares must be >= 0")
        if abs(sum(load) - 1.0) > LOAD_SUM_TOL:
            raise fail(
                "training.moe_expert_load",
                f"shares add up to {sum(load):.6g}, expected 1 (within {LOAD_SUM_TOL})",
            )
    return ep, etp, width // (ep * etp)


def _check_link_cuts(work: WorkloadConfig, topo: TopologyConfig, file: str) -> None:
    """Failed links (``bandwidth_factor: 0``) that cut a GPU or a node off the job.

    The job uses every GPU and every GPU talks to others, so a GPU whose NVLink port failed
    (in a node of several GPUs it reaches no peer of its node: intra-node traffic only goes
    over that port) or a node all of whose NICs in use failed (no route to other nodes; a
    failed NIC's GPUs otherwise reroute through another NIC of the node, see
    :mod:`simulator.network.topology`) cannot run the plan.
    """
    k, m = topo.gpus_per_node, topo.nics_per_node
    used_nics = {x * m // k for x in range(k)} if m else set()
    dead_nics: dict[int, list[int]] = {}
    for i, lf in enumerate(work.faults.links):
        if lf.bandwidth_factor > 0:
            continue
        if lf.kind == "nvlink" and k > 1:
            raise ConfigError(
                f"gpu {lf.gpu}'s NVLink port failed (bandwidth_factor 0), which cuts it off "
                f"from the other GPUs of node {lf.gpu // k} (accepted: bandwidth_factor > 0)",
                file=file,
                field=f"faults.links[{i}].bandwidth_factor",
            )
        if lf.kind == "nic" and topo.nodes > 1:
            dead_nics.setdefault(lf.node, []).append(i)
            failed = {work.faults.links[j].nic for j in dead_nics[lf.node]}
            if used_nics <= failed:
                raise ConfigError(
                    f"every NIC of node {lf.node} in use ({', '.join(map(str, sorted(used_nics)))}"
                    ") has failed, which cuts the node off the others (accepted: at least one "
                    "working NIC per node)",
                    file=file,
                    field=f"faults.links[{i}].bandwidth_factor",
                )
