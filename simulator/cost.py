"""Time, GPU-hours, energy and money to train a whole run, from one simulated step.

The arithmetic is deliberately plain, so a person can redo it by hand:

* time to train ``T = tokens / tokens_per_s`` (every step processes the same
  ``global_batch * seq_len`` tokens; no failures, restarts or evaluation pauses);
* GPU-hours ``= n_gpus * T / 3600`` (the whole job's GPUs are held for the whole run);
* power per GPU ``P = (power_W + node_overhead_W / gpus_per_node) * pue``: the GPU's board
  power (TDP, from the hardware catalog), its share of the rest of its node (the topology's
  ``cost.node_overhead_W``: CPUs, memory, NICs, fans, switches) and the facility's cooling and
  conversion (``cost.pue``). With the defaults (no overhead, PUE 1.0) that is **GPU board power
  only**; GPUs rarely sit at TDP the whole time, so the board figure is an upper bound of GPU
  energy and the default a lower bound of the facility's;
* energy ``= P * n_gpus * T``;
* price of a GPU-hour: ``cost.price_per_gpu_hour`` (rental, all in), else, for a purchase,
  ``cost.capex_per_gpu_usd / (cost.amortisation_years * 8766 h) + P * electricity_usd_per_kWh``,
  else the catalog's typical on-demand cloud price (also overridable per GPU:
  ``gpu: {base: H100-SXM-80GB, price_per_gpu_hour: 2.1}``);
* cost ``= gpu_hours * price of a GPU-hour``.

:func:`per_mtoken` gives the same per million tokens (``cost_per_Mtoken_usd``,
``energy_per_Mtoken_kWh``), which needs no run length: every summary has them.

Returns nothing (an empty dict) when the run has no ``training.tokens`` or the step did not
produce a finite throughput, so callers can merge the result unconditionally.
"""

from __future__ import annotations

import math
from typing import Any

#: Keys :func:`training_cost` adds to a summary, in display order.
COST_KEYS = ("time_to_train_days", "gpu_hours", "energy_MWh", "cost_usd")
#: Keys :func:`per_mtoken` adds to every summary.
PER_MTOKEN_KEYS = ("cost_per_Mtoken_usd", "energy_per_Mtoken_kWh")

SECONDS_PER_DAY = 86_400.0
HOURS_PER_YEAR = 8766.0  # 365.25 days


def rates(gpu: Any, facility: Any = None, gpus_per_node: int = 1, *, pue: float = 1.0) -> dict:
    """Power per GPU (W, facility included) and the price of a GPU-hour (USD), with the basis
    of each (module docstring). ``facility`` is the topology's
    :class:`~simulator.config.schema.CostConfig` (``None``: GPU board power at ``pue``, the
    GPU's catalog price)."""
    overhead = float(getattr(facility, "node_overhead_W", 0.0) or 0.0)
    pue = float(getattr(facility, "pue", pue))
    if not pue >= 1.0:
        raise ValueError(f"pue must be >= 1, got {pue!r}")
    power = (float(gpu.power_W) + overhead / max(1, int(gpus_per_node))) * pue
    price = getattr(facility, "price_per_gpu_hour", None)
    capex = getattr(facility, "capex_per_gpu_usd", None)
    if price is not None:
        usd, basis = float(price), "topology cost.price_per_gpu_hour"
    elif capex is not None:
        years = float(facility.amortisation_years)
        kwh = float(facility.electricity_usd_per_kWh)
        usd = float(capex) / (years * HOURS_PER_YEAR) + power / 1000.0 * kwh
        basis = f"capex ${float(capex):,.0f} per GPU over {years:g} years + ${kwh:g}/kWh"
    else:
        name = getattr(gpu, "name", "the GPU")
        usd, basis = float(gpu.price_per_gpu_hour), f"hardware catalog price of {name}"
    return {
        "power_per_gpu_W": power,
        "usd_per_gpu_hour": usd,
        "pue": pue,
        "node_overhead_W": overhead,
        "price_basis": basis,
    }


def per_mtoken(summary: dict, r: dict) -> dict[str, float]:
    """Cost (USD) and energy (kWh) per million tokens at this step's throughput, from
    :func:`rates` ``r``; empty when the throughput is not a positive number."""
    rate, n_gpus = summary.get("tokens_per_s"), summary.get("n_gpus")
    if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0 or not n_gpus:
        return {}
    gpu_hours = int(n_gpus) * 1e6 / float(rate) / 3600.0
    return {
        "cost_per_Mtoken_usd": gpu_hours * r["usd_per_gpu_hour"],
        # W * h = Wh; 1 kWh = 1e3 Wh.
        "energy_per_Mtoken_kWh": gpu_hours * r["power_per_gpu_W"] / 1e3,
    }


def training_cost(
    summary: dict,
    gpu: Any,
    tokens: float | None,
    *,
    pue: float = 1.0,
    facility: Any = None,
    gpus_per_node: int = 1,
) -> dict[str, float]:
    """Time, GPU-hours, energy and cost to train on ``tokens`` tokens at this step's speed.

    ``summary`` needs ``tokens_per_s`` and ``n_gpus`` (as :func:`simulator.run.simulate`
    returns them); ``gpu`` is a :class:`~simulator.hardware.catalog.GPUSpec` (``power_W``,
    ``price_per_gpu_hour``). Result keys: ``tokens`` (echoed), ``time_to_train_days``,
    ``gpu_hours``, ``energy_MWh``, ``cost_usd``, and the assumptions used: ``power_W``
    (per GPU, facility included), ``price_per_gpu_hour``, ``pue``. ``facility`` and
    ``gpus_per_node`` as for :func:`rates`.
    """
    if tokens is None:
        return {}
    if not (isinstance(tokens, (int, float)) and math.isfinite(tokens) and tokens > 0):
        raise ValueError(f"tokens must be a positive number, got {tokens!r}")
    r = rates(gpu, facility, gpus_per_node, pue=pue)
    rate = summary.get("tokens_per_s")
    n_gpus = summary.get("n_gpus")
    if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0 or not n_gpus:
        return {}
    seconds = float(tokens) / float(rate)
    hours = seconds / 3600.0
    gpu_hours = int(n_gpus) * hours
    power, price = r["power_per_gpu_W"], r["usd_per_gpu_hour"]
    return {
        "tokens": float(tokens),
        "time_to_train_days": seconds / SECONDS_PER_DAY,
        "gpu_hours": gpu_hours,
        # W * h = Wh; 1 MWh = 1e6 Wh.
        "energy_MWh": power * gpu_hours / 1e6,
        "cost_usd": gpu_hours * price,
        "power_W": power,
        "price_per_gpu_hour": price,
        "pue": r["pue"],
    }


def cost_summary(summary: dict, gpu: Any, topology: Any, tokens: float | None) -> dict:
    """What a run summary gains: :data:`PER_MTOKEN_KEYS`, ``cost_basis`` (the rates and where
    the price came from) and, with ``tokens``, ``training`` and :data:`COST_KEYS`.
    ``topology`` is the :class:`~simulator.config.schema.TopologyConfig` (its ``cost`` and
    ``gpus_per_node``)."""
    if not (hasattr(gpu, "power_W") and hasattr(gpu, "price_per_gpu_hour")):
        return {}  # a GPU described without power and price (test stubs): no cost figures
    facility, gpn = getattr(topology, "cost", None), getattr(topology, "gpus_per_node", 1)
    r = rates(gpu, facility, gpn)
    out: dict[str, Any] = dict(per_mtoken(summary, r))
    if out:
        out["cost_basis"] = r
    cost = training_cost(summary, gpu, tokens, facility=facility, gpus_per_node=gpn)
    if cost:
        out["training"] = cost
        out.update({k: cost[k] for k in COST_KEYS})
    return out


def with_training_cost(summary: dict, loaded: Any, gpu: Any | None = None) -> dict:
    """``summary`` with :func:`training_cost` merged in (unchanged keys win if already there).

    ``loaded`` is a :class:`~simulator.config.load.LoadedWorkload`; its
    ``training.tokens`` sets the run length. ``gpu`` defaults to the topology's GPU from the
    catalog. The summary is returned as a new dict; the input is not modified.
    """
    tokens = loaded.workload.training.tokens
    if all(k in summary for k in PER_MTOKEN_KEYS) and (
        tokens is None or all(k in summary for k in COST_KEYS)
    ):
        return dict(summary)
    if gpu is None:
        from simulator.hardware.catalog import load_gpu

        gpu = load_gpu(loaded.topology.gpu, file=str(loaded.topology_path), field="gpu")
    extra = cost_summary(summary, gpu, loaded.topology, tokens)
    out = dict(summary)
    for k, v in extra.items():
        out.setdefault(k, v)
    return out
