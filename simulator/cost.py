"""Time, GPU-hours, energy and money to train a whole run, from one simulated step.

The arithmetic is deliberately plain, so a person can redo it by hand:

* time to train ``T = tokens / tokens_per_s`` (every step processes the same
  ``global_batch * seq_len`` tokens; no failures, restarts or evaluation pauses);
* GPU-hours ``= n_gpus * T / 3600`` (the whole job's GPUs are held for the whole run);
* energy ``= power_W * n_gpus * T * pue``: every GPU drawing its board power (TDP, from the
  hardware catalog) for the whole run. ``pue`` defaults to 1.0, i.e. **GPU board power only**:
  no CPUs, NICs, switches, storage or cooling. Multiply by a facility's PUE and server
  overhead (e.g. ``pue=1.4``) for the power bill of a whole data hall. GPUs rarely sit at TDP
  the whole time, so the default is an upper bound of GPU energy and a lower bound of the
  facility's;
* cost ``= gpu_hours * price_per_gpu_hour`` (the catalog's typical on-demand cloud price,
  overridable per topology: ``gpu: {base: H100-SXM-80GB, price_per_gpu_hour: 2.1}``).

Returns nothing (an empty dict) when the run has no ``training.tokens`` or the step did not
produce a finite throughput, so callers can merge the result unconditionally.
"""

from __future__ import annotations

import math
from typing import Any

#: Keys :func:`training_cost` adds to a summary, in display order.
COST_KEYS = ("time_to_train_days", "gpu_hours", "energy_MWh", "cost_usd")

SECONDS_PER_DAY = 86_400.0


def training_cost(
    summary: dict, gpu: Any, tokens: float | None, *, pue: float = 1.0
) -> dict[str, float]:
    """Time, GPU-hours, energy and cost to train on ``tokens`` tokens at this step's speed.

    ``summary`` needs ``tokens_per_s`` and ``n_gpus`` (as :func:`simulator.run.simulate`
    returns them); ``gpu`` is a :class:`~simulator.hardware.catalog.GPUSpec` (``power_W``,
    ``price_per_gpu_hour``). Result keys: ``tokens`` (echoed), ``time_to_train_days``,
    ``gpu_hours``, ``energy_MWh``, ``cost_usd``, and the assumptions used: ``power_W``,
    ``price_per_gpu_hour``, ``pue``.
    """
    if tokens is None:
        return {}
    if not (isinstance(tokens, (int, float)) and math.isfinite(tokens) and tokens > 0):
        raise ValueError(f"tokens must be a positive number, got {tokens!r}")
    if not pue >= 1.0:
        raise ValueError(f"pue must be >= 1, got {pue!r}")
    rate = summary.get("tokens_per_s")
    n_gpus = summary.get("n_gpus")
    if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0 or not n_gpus:
        return {}
    seconds = float(tokens) / float(rate)
    hours = seconds / 3600.0
    gpu_hours = int(n_gpus) * hours
    power = float(gpu.power_W)
    price = float(gpu.price_per_gpu_hour)
    return {
        "tokens": float(tokens),
        "time_to_train_days": seconds / SECONDS_PER_DAY,
        "gpu_hours": gpu_hours,
        # W * h = Wh; 1 MWh = 1e6 Wh.
        "energy_MWh": power * gpu_hours * pue / 1e6,
        "cost_usd": gpu_hours * price,
        "power_W": power,
        "price_per_gpu_hour": price,
        "pue": float(pue),
    }


def with_training_cost(summary: dict, loaded: Any, gpu: Any | None = None) -> dict:
    """``summary`` with :func:`training_cost` merged in (unchanged keys win if already there).

    ``loaded`` is a :class:`~simulator.config.load.LoadedWorkload`; its
    ``training.tokens`` sets the run length. ``gpu`` defaults to the topology's GPU from the
    catalog. The summary is returned as a new dict; the input is not modified.
    """
    tokens = loaded.workload.training.tokens
    if tokens is None or all(k in summary for k in COST_KEYS):
        return dict(summary)
    if gpu is None:
        from simulator.hardware.catalog import load_gpu

        gpu = load_gpu(loaded.topology.gpu, file=str(loaded.topology_path), field="gpu")
    extra = training_cost(summary, gpu, tokens)
    out = dict(summary)
    for k, v in extra.items():
        out.setdefault(k, v)
    return out
