"""Time, GPU-hours, energy and cost to train, against hand arithmetic."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from simulator.config.load import load_workload
from simulator.cost import COST_KEYS, per_mtoken, rates, training_cost, with_training_cost
from simulator.hardware.catalog import load_gpu
from tests.conftest import ROOT


@dataclass(frozen=True)
class Gpu:
    power_W: float = 700.0
    price_per_gpu_hour: float = 2.0


SUMMARY = {"tokens_per_s": 1.0e6, "n_gpus": 1024}


def test_closed_form():
    # 2e12 tokens at 1e6 tokens/s = 2e6 s = 23.148 days; 1024 GPUs -> 568,888.9 GPU-hours;
    # x 700 W = 398.22 MWh; x $2 = $1,137,777.8.
    c = training_cost(SUMMARY, Gpu(), 2.0e12)
    assert c["time_to_train_days"] == pytest.approx(2.0e6 / 86400)
    assert c["gpu_hours"] == pytest.approx(1024 * 2.0e6 / 3600)
    assert c["energy_MWh"] == pytest.approx(700 * 1024 * 2.0e6 / 3600 / 1e6)
    assert c["cost_usd"] == pytest.approx(2.0 * 1024 * 2.0e6 / 3600)
    assert c["pue"] == 1.0 and c["power_W"] == 700.0 and c["price_per_gpu_hour"] == 2.0


def test_pue_scales_energy_only():
    base = training_cost(SUMMARY, Gpu(), 1e12)
    hall = training_cost(SUMMARY, Gpu(), 1e12, pue=1.4)
    assert hall["energy_MWh"] == pytest.approx(1.4 * base["energy_MWh"])
    for k in ("time_to_train_days", "gpu_hours", "cost_usd"):
        assert hall[k] == base[k]
    with pytest.raises(ValueError):
        training_cost(SUMMARY, Gpu(), 1e12, pue=0.9)


def test_invariants():
    a = training_cost(SUMMARY, Gpu(), 1e12)
    fast = training_cost({**SUMMARY, "tokens_per_s": 2e6}, Gpu(), 1e12)
    for k in COST_KEYS:
        assert fast[k] == pytest.approx(a[k] / 2)
    # Twice the tokens: everything doubles; a dearer GPU changes only the cost.
    twice = training_cost(SUMMARY, Gpu(), 2e12)
    for k in COST_KEYS:
        assert twice[k] == pytest.approx(2 * a[k])
    dear = training_cost(SUMMARY, Gpu(price_per_gpu_hour=4.0), 1e12)
    assert dear["cost_usd"] == pytest.approx(2 * a["cost_usd"])
    assert dear["energy_MWh"] == a["energy_MWh"]


def test_nothing_without_tokens_or_throughput():
    assert training_cost(SUMMARY, Gpu(), None) == {}
    assert training_cost({"tokens_per_s": 0.0, "n_gpus": 8}, Gpu(), 1e9) == {}
    assert training_cost({"tokens_per_s": float("nan"), "n_gpus": 8}, Gpu(), 1e9) == {}
    with pytest.raises(ValueError):
        training_cost(SUMMARY, Gpu(), -5.0)


def test_catalog_price_and_override():
    """The catalog's H100 figures, and a per-topology price override, reach the cost."""
    loaded = load_workload(ROOT / "workloads" / "llama70b.yaml")
    gpu = load_gpu(loaded.topology.gpu)
    out = with_training_cost(SUMMARY, loaded)
    hours = 1024 * loaded.workload.training.tokens / 1e6 / 3600
    assert out["gpu_hours"] == pytest.approx(hours)
    assert out["cost_usd"] == pytest.approx(hours * gpu.price_per_gpu_hour)
    assert out["energy_MWh"] == pytest.approx(hours * gpu.power_W / 1e6)
    assert out["tokens_per_s"] == SUMMARY["tokens_per_s"]  # input kept, not modified
    assert "cost_usd" not in SUMMARY

    cheap = load_workload(
        ROOT / "workloads" / "llama70b.yaml",
        {"topology.gpu": {"base": "H100-SXM-80GB", "price_per_gpu_hour": 1.5}},
    )
    out = with_training_cost(SUMMARY, cheap)
    assert out["cost_usd"] == pytest.approx(hours * 1.5)


def test_no_tokens_leaves_summary_alone():
    loaded = load_workload(ROOT / "workloads" / "llama70b.yaml", {"training.tokens": None})
    out = with_training_cost(SUMMARY, loaded)
    assert not any(k in out for k in COST_KEYS)  # no run length: only the per-token figures
    assert out["cost_per_Mtoken_usd"] > 0


@dataclass(frozen=True)
class Facility:
    pue: float = 1.3
    node_overhead_W: float = 4600.0
    price_per_gpu_hour: float | None = None
    capex_per_gpu_usd: float | None = 30000.0
    amortisation_years: float = 4.0
    electricity_usd_per_kWh: float = 0.1


def test_purchase_per_million_tokens_by_hand():
    """Issue 15.10: (700 W + 4,600 W / 8 GPUs) x PUE 1.3 = 1,657.5 W per GPU; a GPU-hour of
    a $30,000 GPU over 4 years is 30,000 / 35,064 h + 1.6575 kW x $0.1 = $1.02131. At 1e6
    tokens/s on 1,024 GPUs a million tokens takes 1,024 / 3,600 GPU-hours."""
    r = rates(Gpu(), Facility(), 8)
    assert r["power_per_gpu_W"] == pytest.approx(1657.5)
    assert r["usd_per_gpu_hour"] == pytest.approx(30000 / 35064 + 0.16575)
    per = per_mtoken(SUMMARY, r)
    gh = 1024 / 3600
    assert per["cost_per_Mtoken_usd"] == pytest.approx(gh * (30000 / 35064 + 0.16575))
    assert per["energy_per_Mtoken_kWh"] == pytest.approx(gh * 1.6575)
    run = training_cost(SUMMARY, Gpu(), 1e12, facility=Facility(), gpus_per_node=8)
    assert run["energy_MWh"] == pytest.approx(1e6 * per["energy_per_Mtoken_kWh"] / 1e3)
    assert run["cost_usd"] == pytest.approx(1e6 * per["cost_per_Mtoken_usd"])
    rent = rates(Gpu(), Facility(capex_per_gpu_usd=None, price_per_gpu_hour=2.5), 8)
    assert rent["usd_per_gpu_hour"] == 2.5 and rent["power_per_gpu_W"] == r["power_per_gpu_W"]


def test_every_summary_has_cost_per_million_tokens(tmp_path):
    loaded = load_workload(
        ROOT / "workloads" / "llama70b.yaml",
        {"topology.cost": {"pue": 1.2, "node_overhead_W": 4000.0, "price_per_gpu_hour": 3.0}},
    )
    out = with_training_cost({**SUMMARY}, loaded)
    gh = 1024 / 3600
    assert out["cost_per_Mtoken_usd"] == pytest.approx(gh * 3.0)
    assert out["energy_per_Mtoken_kWh"] == pytest.approx(gh * (700 + 500) * 1.2 / 1e3)
    assert out["cost_basis"]["price_basis"] == "topology cost.price_per_gpu_hour"


def test_rental_and_purchase_are_alternatives(tmp_path, capsys):
    from simulator.cli import main

    rc = main(["run", str(ROOT / "workloads" / "llama3-8b.yaml"), "--no-files",
               "--set", "topology.cost={price_per_gpu_hour: 2, capex_per_gpu_usd: 30000}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error:") and ".yaml: cost: " in err
    assert len(err.splitlines()) == 1
