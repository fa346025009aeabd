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

__all__ = ["expected_max_normal", "group_sync_factor", "sync_group_size"]


def group_sync_factor(n: int, jitter: float) -> float:
    """How much longer a group of ``n`` GPUs that meets at every layer computes than one GPU:
    ``1 + jitter x e_n``."""
    return 1.0 + jitter * expected_max_normal(n)


def sync_group_size(tp: int, cp: int, ep: int, etp: int, moe: bool) -> int:
    """GPUs that meet at every layer's collective on the critical path: the tensor x context
    parallel group, or an MoE layer's expert-parallel group (``ep x etp``) if larger."""
    n = tp * cp
    return max(n, ep * etp) if moe else n
