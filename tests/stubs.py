"""Stand-ins for the hardware side, so engine tests price kernels by a closed form."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RATE = 1e15  # FLOP/s of the stub GPU


@dataclass
class StubGpu:
    name: str = "stub"
    kernel_launch_s: float = 0.0
    hbm_GiB: float = 80.0
    host_op_s: float = 0.0  # no host time: the closed forms count GPU work only
    host_collective_s: float = 0.0
    sync_jitter: float = 0.0  # identical GPUs: a group computes at each one's speed
    host_jitter: float = 0.0  # identical hosts: a group issues at each one's rate

    def peak_flops(self, dtype):
        return RATE


class NoLinks:
    """A topology without links: collectives cost what the stub collective model says."""

    n_links = 0
    link_names: list = []
    link_kinds: list = []
    capacity = np.zeros(0)
    figures: dict = {}  # no fabric figures to report

    def warnings(self):
        return []

    def effective_capacity(self, efficiency=None):
        return np.zeros(0)

    def route(self, src, dst):
        return ()
