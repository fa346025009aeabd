"""The host that launches eager kernels, as a second clock beside each GPU.

Eager PyTorch issues a training step from Python one kernel at a time: the host spends
``op_s`` on each kernel of model code (module calls, autocast, autograd recording and its
engine) and ``collective_s`` on each collective call (measured host-bound steps, gpus.yaml
``host_op_s`` / ``host_collective_s``). The GPU runs a kernel once the host has issued it
and the kernel before it has finished. Nothing makes the host wait for the GPU (kernel and
NCCL launches are asynchronous; a pipeline ``recv`` makes the stream wait, not the host),
except a synchronisation: ``.tolist()`` of the MoE token counts waits until the GPU has run
everything issued before it, and so does cuBLAS at the first launch of a kernel new to the
process (an eager expert backward's, :func:`with_drains`).

So the host runs ahead of the GPU where the GPU is the slower one, and its lead carries from
one program (a layer's forward, a backward, the head) to the next, across pipeline waits;
where the host is the slower one, the GPU idles between kernels. Over a program of parts
``(h_i, g_i)`` (host time, GPU time) entered with the GPU free at ``g`` and the host at ``h``::

    GPU done  g' = max(g + G, h + A)     G = the program's GPU time
    host done h' = h + H                 H = sum of h_i
    A = max over k of (h_1 + .. + h_k) + (GPU time of parts k .. n)

(part ``k`` cannot start before the host has issued it; everything after it runs back to back
at best). A synchronisation sets ``h' = max(g, h) + sync_s``. Each is linear in the max-plus
algebra, so a program is a 2 x 2 max-plus matrix, and programs compose by the max-plus
product: :func:`program_matrix` builds it once per program, the engine applies it per segment.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType

from simulator.model.moe import MULTIHOT_KERNELS, PLAIN_ATEN_PREFIXES, engine_op, routing_op
from simulator.model.ops import HOST_SYNC
from simulator.model.sync import BARRIER_SYNCS

NEG = -math.inf

#: (gg, gh, hg, hh): ``g' = max(g + gg, h + gh)``, ``h' = max(g + hg, h + hh)``
Matrix = tuple[float, float, float, float]

IDENTITY: Matrix = (0.0, NEG, NEG, 0.0)


@dataclass(frozen=True)
class HostRates:
    """The host's time per kernel of eager model code, per collective call, to resume after a
    synchronisation, per kernel of an MoE layer's token routing (router, counts,
    permutation, combine: more Python per kernel than model code), per FSDP2 collective
    call of a ZeRO-3 unit with its hook, and per parameter tensor of the unit in each such
    call (seconds; see :data:`FSDP_CALLS`); ``extra``: more host time on the parts of these
    names (DTensor tensor parallelism, :func:`dtensor_extra`)."""

    op_s: float
    collective_s: float
    sync_s: float
    moe_op_s: float = 0.0
    fsdp_call_s: float = 0.0
    fsdp_tensor_s: float = 0.0
    extra: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}),
                                       compare=False)
    #: more host time on each expert GEMM of an eager MoE layer, (forward, data gradient,
    #: weight gradient): the expected share of them with a new shape times the host cost of
    #: one (:func:`simulator.model.moe.new_shape_share`, gpus.yaml host_gemm_new_shape_*)
    expert_gemm_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    #: host time per kernel of eager MoE code that no Python line launches (autocast's casts
    #: of each expert parameter, autograd's engine work for them and for the experts' input
    #: slices, :data:`simulator.model.moe.ENGINE_OPS`); 0: ``op_s``
    engine_op_s: float = 0.0
    #: per kernel of Megatron-Core's unfused DeepEP routing map (``moe.MULTIHOT_KERNELS``:
    #: plain aten calls on integer tensors, measured as a call, :func:`multihot_op_s`), and
    #: of its alltoall dispatcher's count kernels and copies (``moe.PLAIN_ATEN_PREFIXES``:
    #: the same kind of call); 0: ``op_s``
    multihot_op_s: float = 0.0
    #: more host time on each synchronisation that follows a collective of the EP group (a
    #: barrier of its hosts, :data:`simulator.model.sync.BARRIER_SYNCS`), beyond ``sync_s``:
    #: :func:`simulator.model.sync.host_barrier_s` of the group; not scaled by
    #: :meth:`scaled` (already a group's figure)
    barrier_s: float = 0.0
    #: expert backwards a step (per process) whose data gradient launches a cuBLAS kernel new
    #: to the process, so the host waits until the GPU has run everything queued
    #: (:func:`simulator.model.moe.first_launch_drains`, the slowest EP rank's); not scaled
    #: by :meth:`scaled` (a count)
    drains: float = 0.0
    #: MoE layer backwards a step (per process) that the drains are spread over
    drain_bwds: int = 0
    #: the host's time after such a wait (:data:`simulator.model.kernel_first.DRAIN_S`)
    drain_s: float = 0.0
    #: the host's own work of a pass's first launches (cuBLASLt's, at a kernel new to the
    #: process), before its wait and after it (:func:`simulator.model.kernel_first.launch_work`)
    launch_pre_s: float = 0.0
    launch_post_s: float = 0.0
    #: whether the drains fall in the expert forwards too (their first launches, same count)
    fwd_drains: bool = False

    def scaled(self, factor: float) -> HostRates:
        """Every host time ``factor`` times as long (a group paced by its slowest host,
        :func:`simulator.model.sync.host_group_factor`)."""
        if factor == 1.0:
            return self
        times = {f.name: getattr(self, f.name) * factor for f in fields(self)
                 if isinstance(getattr(self, f.name), (int, float))
                 and f.name not in ("barrier_s", "drains", "drain_bwds", "fwd_drains")}
        return replace(self, **times,
                       extra=MappingProxyType({k: v * factor for k, v in self.extra.items()}),
                       expert_gemm_s=tuple(x * factor for x in self.expert_gemm_s))

    def sync_part_s(self, part) -> float:
        """Host time of a synchronisation part once the GPU has drained: ``sync_s``, and
        ``barrier_s`` more where it is a barrier of the EP group's hosts."""
        if part.name == FIRST_LAUNCH:
            return self.drain_s + self.launch_post_s
        return self.sync_s + (self.barrier_s if part.name in BARRIER_SYNCS else 0.0)

    def drains_at(self, k: int) -> int:
        """Drains in the ``k``-th MoE layer backward of a step (0-based, counted modulo
        :attr:`drain_bwds`): :attr:`drains` spread evenly and deterministically, their running
        total rounded to the nearest integer (``round(drains)`` in all)."""
        if self.drains <= 0.0 or self.drain_bwds <= 0:
            return 0
        k %= self.drain_bwds
        per = self.drains / self.drain_bwds
        return math.floor((k + 1) * per + 0.5) - math.floor(k * per + 0.5)

    def part_s(self, part) -> float:
        """Host time to issue one part of a program."""
        if part.kind == "comm":
            return self.collective_s
        if self.engine_op_s > 0.0 and engine_op(part.name):
            return self.engine_op_s
        if self.multihot_op_s > 0.0 and (part.name in MULTIHOT_KERNELS
                                         or part.name.startswith(PLAIN_ATEN_PREFIXES)):
            return self.multihot_op_s
        if self.moe_op_s > 0.0 and part.block == "moe" and routing_op(part.name):
            return self.moe_op_s
        if part.block == "moe" and part.name.startswith("expert_fc3"):
            # SwiGLU's w3 has w1's sizes, input and row count: its GEMMs find the entries
            # w1's just made (one cuBLAS problem description, one cache entry)
            return self.op_s
        if part.block == "moe" and part.name.startswith("expert_fc"):
            fwd, dgrad, wgrad = self.expert_gemm_s
            extra = dgrad if part.name.endswith("_dgrad") else \
                wgrad if part.name.endswith("_wgrad") else fwd
            return self.op_s + extra
        return self.op_s + self.extra.get(part.name, 0.0)


#: the synchronisation part of an expert backward's first launch of a cuBLAS kernel
FIRST_LAUNCH = "expert_first_launch"


def with_drains(prog: Sequence, drains: int, forward: bool = False) -> tuple:
    """``prog`` (an eager MoE layer's backward) with a host wait (:data:`FIRST_LAUNCH`) before
    the data gradient of its first ``drains`` experts (``expert_fc2_e*_dgrad``, each expert
    backward's first GEMM; at most one wait an expert backward, measured); ``forward``: the
    layer's forward, the wait before its first ``drains`` experts' first GEMM
    (``expert_fc1_e*``)."""
    out, left = [], drains

    def first_gemm(name: str) -> bool:
        if forward:
            return name.startswith("expert_fc1_e") and not name.endswith(("_dgrad", "_wgrad"))
        return name.startswith("expert_fc2_e") and name.endswith("_dgrad")

    for p in prog:
        if left > 0 and first_gemm(p.name):
            out.append(replace(p, name=FIRST_LAUNCH, kind=HOST_SYNC, dur=0.0, flops=0.0,
                               op="", nbytes=0.0, overlap_next=False, dim=""))
            left -= 1
        out.append(p)
    return tuple(out)


def multihot_op_s(call_s: float, sync_s: float, kernels: int, syncs: int) -> float:
    """The host's time per kernel of Megatron-Core's ``_indices_to_multihot`` from one call's
    measured host time ``call_s`` (gpus.yaml ``host_multihot_s``: ``kernels`` kernels and
    ``syncs`` synchronisations, the GPU idle, so each synchronisation waits only for the
    kernels just issued): what the call leaves after the synchronisations, which the host
    clock charges ``sync_s`` each, spread evenly over its kernels."""
    return max(0.0, call_s - syncs * sync_s) / kernels


def dtensor_param_tensors(layers: int, sp: bool, norm_tensors: int, tied: bool) -> int:
    """DTensor parameter tensors of a rank under ``steps_alt.py``'s plan (TorchTitan's) for
    ``layers`` GPT-2 blocks: per block the four parallel Linears' weights and biases (the
    measured script's; the simulator has no bias key), with SP the two ``SequenceParallel``
    norms' parameters (``norm_tensors`` each: 2 for LayerNorm, 1 for RMSNorm); then the token
    embedding and the LM head (one tensor if tied) and, with SP, the final norm. Learned
    positions stay plain. Both ends are counted whatever the pipeline stage (every DTensor
    case measured runs without a pipeline)."""
    per_layer = 8 + (2 * norm_tensors if sp else 0)
    return layers * per_layer + (1 if tied else 2) + (norm_tensors if sp else 0)


def dtensor_opt_s(step_s: float, tensor_s: float, tensors: int) -> float:
    """The host time DTensor adds to one optimizer step (``torch.optim.AdamW(foreach=True)``
    and ``zero_grad``) over ``tensors`` DTensor parameters: gpus.yaml
    ``host_dtensor_opt_step_s + tensors x host_dtensor_opt_tensor_s``. Each foreach op of the
    step runs DTensor's dispatch on every DTensor of its lists (unwrap, sharding check,
    wrap), so the cost grows with the tensors, not their size, and is paid once a step,
    not per micro-batch."""
    return step_s + tensor_s * tensors


def dtensor_extra(rates: Mapping[str, tuple[float, float]], sp: bool,
                  opt_s: float = 0.0) -> dict[str, float]:
    """The host time PyTorch DTensor tensor parallelism adds, by the name of the part it is
    charged to, from gpus.yaml ``host_dtensor`` (``{unit: (forward_s, backward_s)}``, each
    unit's DTensor time less the same work on plain tensors, its collectives included).

    What becomes a DTensor in the plan of ``benchmarks/device/steps_alt.py`` (TorchTitan's):
    per layer two ``ColwiseParallel`` Linears (qkv, fc1) and two ``RowwiseParallel`` ones
    (out_proj, fc2); the attention and MLP interiors and the residual adds run on local
    tensors (both styles return local outputs). Without SP a column-parallel Linear is the
    ``colwise`` unit (its local input taken as Replicate, its input's gradient all-reduced)
    and a row-parallel one ``rowwise`` (output all-reduced). With SP the norm before each
    column-parallel Linear is a ``SequenceParallel`` module and ``PrepareModuleInput``
    all-gathers its output: the three are the ``sp_colwise`` unit; the row-parallel Linear
    reduce-scatters its output (``rowwise_rs``). The LM head is column-parallel (with SP its
    final norm too), the token embedding row-parallel, the loss ``loss_parallel``'s.
    Each unit's forward time is charged to its GEMM, its backward time to the GEMM's input
    gradient (``_dgrad``); the loss to its first kernel each way; ``opt_s`` (the optimizer
    step's, :func:`dtensor_opt_s`) to the optimizer's ``adam`` part."""
    col = rates["sp_colwise" if sp else "colwise"]
    row = rates["rowwise_rs" if sp else "rowwise"]
    loss = rates["loss_parallel"]
    out = {"ce_max": loss[0], "ce_scatter": loss[1], "embed": row[0], "embed_scatter": row[1],
           "adam": opt_s}
    for name, (f, b) in (("qkv", col), ("fc1", col), ("lm_head", col), ("out_proj", row),
                         ("fc2", row)):
        out[name], out[f"{name}_dgrad"] = f, b
    return out


#: FSDP2's collective calls of one unit per pass, with reshard after forward (its default
#: and the measured scripts'): ``FSDPParamGroup.pre_forward`` unshards (all-gather of the
#: shards: a foreach copy-in, the collective, a per-parameter copy-out and ``to_unsharded``)
#: and ``post_forward`` reshards; in backward ``pre_backward`` unshards again and
#: ``post_backward`` reduce-scatters (``foreach_reduce``: chunk-cat into the reduce dtype, the
#: collective, a sharded-gradient view per parameter) and reshards. The host's time of each
#: call, hook included, is ``HostRates.fsdp_call_s`` beyond the kernels the simulator prices
#: at their own rate (the gradient cast before the reduce-scatter, ``grad_prep``), plus
#: ``HostRates.fsdp_tensor_s`` for each parameter tensor of the unit: every call loops over
#: the unit's ``FSDPParam`` objects in Python (``_fsdp_collectives.py``: the all-gather's
#: per-parameter inputs and, after the collective, its per-parameter outputs and
#: ``to_unsharded`` attribute swaps, ``to_sharded`` again at the reshard; the reduce-scatter's
#: per-parameter gradient list and, after it, a sharded-gradient view and DTensor each).
FSDP_CALLS = {"fwd": ("all_gather",), "bwd": ("all_gather", "reduce_scatter")}


def compose(m1: Matrix, m2: Matrix) -> Matrix:
    """``m1`` then ``m2`` (the max-plus product)."""
    gg1, gh1, hg1, hh1 = m1
    gg2, gh2, hg2, hh2 = m2
    return (
        max(gg1 + gg2, hg1 + gh2),
        max(gh1 + gg2, hh1 + gh2),
        max(gg1 + hg2, hg1 + hh2),
        max(gh1 + hg2, hh1 + hh2),
    )


def apply(m: Matrix, gpu: float, host: float) -> tuple[float, float]:
    """(GPU done, host done) after a program of matrix ``m`` entered at ``(gpu, host)``."""
    return max(gpu + m[0], host + m[1]), max(gpu + m[2], host + m[3])


def piece_matrix(host_s: Sequence[float], suffix_s: Sequence[float]) -> Matrix:
    """The matrix of a run of parts without a synchronisation: ``host_s[k]`` the host time to
    issue part ``k``, ``suffix_s[k]`` the GPU time of parts ``k`` to the end back to back."""
    if not host_s:
        return IDENTITY
    issued = 0.0
    a = NEG
    for h, rest in zip(host_s, suffix_s, strict=True):
        issued += h
        a = max(a, issued + rest)
    return (suffix_s[0], a, NEG, issued)


def sync_matrix(sync_s: float, pre_s: float = 0.0) -> Matrix:
    """The host spends ``pre_s``, waits for the GPU to drain, then spends ``sync_s`` (the copy
    of the counts): ``h' = max(g, h + pre_s) + sync_s``."""
    return (0.0, NEG, sync_s, pre_s + sync_s)


def program_matrix(prog: Sequence, rates: HostRates, gpu_time) -> Matrix:
    """The matrix of an eager program; ``gpu_time(parts)`` prices parts back to back on the GPU
    (the engine's :func:`~simulator.engine.program.program_time` with its slowdown)."""
    m = IDENTITY
    piece: list = []
    for p in (*prog, None):
        if p is not None and p.kind != HOST_SYNC:
            piece.append(p)
            continue
        if piece:
            suffix = [gpu_time(piece[k:]) for k in range(len(piece))]
            m = compose(m, piece_matrix([rates.part_s(q) for q in piece], suffix))
            piece = []
        if p is not None:
            pre = rates.launch_pre_s if p.name == FIRST_LAUNCH else 0.0
            m = compose(m, sync_matrix(rates.sync_part_s(p), pre))
    return m
