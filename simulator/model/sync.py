"""What a group of GPUs that synchronises every layer pays for its members' speed differences.

Under sustained load every H100 runs at its 700 W power cap, and the power limiter sets each
GPU's clock on its own: the same GEMM loop, timed in 65 ms windows on four GPUs at once, runs
1.2-2.3 % faster or slower from window to window and from GPU to GPU
(``data/measured/sustained-h100x4``). A tensor-parallel group meets at every layer's
collective, so each layer takes as long as its slowest member: the expected maximum of ``n``
rates, not their mean, which the kernel-time model (calibrated one GPU at a time) prices.

Model: each member's time for the same work is ``mean x (1 + s Z)`` with ``Z`` standard normal
and independent between members, so the group's expected time is ``mean x (1 + s e_n)`` with
``e_n`` the expected maximum of ``n`` standard normals (``e_1 = 0``, ``e_2 = 1/sqrt(pi)``,
``e_3 = 3 / (2 sqrt(pi))``, ``e_4 = 1.0294``; Tippett 1925). The scale ``s`` (gpus.yaml
``sync_jitter``) is fitted through the origin on the measured penalty ``max / mean - 1`` of
every pair and of the group of four in those windows (``python -m simulator.calibrate sync``).
"""

from __future__ import annotations

from simulator.model.moe import expected_max_normal  # one quadrature for every E[max] of normals

__all__ = ["BARRIER_SYNCS", "expected_max_normal", "group_sync_factor", "host_barrier_s",
           "host_group_factor", "host_group_size", "sync_group_size"]


def group_sync_factor(n: int, jitter: float) -> float:
    """How much longer a group of ``n`` GPUs that meets at every layer computes than one GPU:
    ``1 + jitter x e_n``."""
    return 1.0 + jitter * expected_max_normal(n)


def sync_group_size(tp: int, cp: int, ep: int, etp: int, moe: bool) -> int:
    """GPUs that meet at every layer's collective on the critical path: the tensor x context
    parallel group, or an MoE layer's expert-parallel group (``ep x etp``) if larger."""
    n = tp * cp
    return max(n, ep * etp) if moe else n


# ---- the hosts: a host-bound group is paced by its slowest process
#
# Eager PyTorch issues a step from Python on every rank at once, one process per GPU, and the
# processes do not run equally fast: the same host-bound kernel stream, timed on 4 processes
# of one box at once, runs a few per cent faster or slower from process to process and from
# launch to launch (``data/measured/host-spread-h100x4``). Nothing in a step makes a host wait
# for another (NCCL launches are asynchronous), but every rank's GPU waits in each collective
# for the last rank to issue it, and a step ends with a collective every rank takes part in
# (the gradient reduction, or the tensor / expert / pipeline traffic itself), so where the host
# sets the pace a step takes as long as its slowest host: the expected maximum of ``n`` host
# rates, not the mean a micro-benchmark of one process gives. Model: each process's time for
# the same host work is ``mean x (1 + s Z)``, ``Z`` standard normal, independent between
# processes and persistent over a step, so a group of ``n`` issues at ``1 + s e_n`` times the
# mean rate (``s``: gpus.yaml ``host_jitter``, ``python -m simulator.calibrate host_spread``).


def host_group_factor(n: int, jitter: float) -> float:
    """How much longer a host-bound step of ``n`` processes that meet in it takes than one
    process's: ``1 + jitter x e_n`` (1 for one process), the GPUs' formula with the hosts'
    spread."""
    return group_sync_factor(n, jitter)


def host_group_size(gpus: int) -> int:
    """Processes whose hosts pace a host-bound step: every rank of the job (one process per
    GPU). Every part of a step is issued by every rank, and the ranks meet at least once per
    step on a collective every one of them takes part in or waits on (tensor / context / expert
    parallel collectives every layer; the data-parallel gradient reduction, whose last bucket
    no rank's GPU can finish before the slowest host has issued it; a pipeline's sends, which
    chain every stage into the last one's backward), so the slowest host's lag reaches every
    GPU by the end of the step: a host ``Z`` that is persistent over the step costs the same
    whether the ranks meet every layer or once."""
    return max(1, gpus)


# ---- a host read after a collective: a barrier of the hosts
#
# An MoE layer reads its token counts on the host after exchanging them with its EP group
# (``.tolist()`` / ``.cpu()``; CUDA ``bincount``'s read of the ids' range waits for the GPU,
# which waited in the previous layer's combine): each host waits there for its GPU, which
# waits in the exchange for the slowest host of the group. So every such read is a barrier of
# the group's hosts, and a step cut by them pays, per segment between two barriers, that
# segment's slowest host, where a continuous issue pays the slowest host over the step
# (``host_group_factor``): a process's lag is partly drawn afresh at each barrier (woken after
# its wait, it resumes on whichever core, at whichever pace). Measured
# (``data/measured/sync-segments-h100x4``): the same host-bound stream cut into 4-256 segments
# by an uneven ``all_to_all_single`` whose sizes are or are not read on the host, 1, 2 and 4
# processes: the sum of the segments' maxima exceeds the largest sum by a roughly fixed time
# a barrier (not a share of the segment), and the read costs more than one process's by about
# as much again; together ``e_n x host_barrier_s`` a barrier (``e_n`` the expected maximum of
# ``n`` standard normals: the slowest of ``n`` fresh lags; ``python -m simulator.calibrate
# host_barrier``).

#: the host synchronisations that follow a collective of the EP group (a barrier of its hosts)
BARRIER_SYNCS = frozenset({"moe_bincount_sync", "moe_counts_sync", "moe_regroup_sync"})


def host_barrier_s(n: int, scale: float) -> float:
    """What one host read after a collective of ``n`` ranks costs beyond one process's
    synchronisation: ``scale x e_n`` (0 for one rank)."""
    return scale * expected_max_normal(n)
