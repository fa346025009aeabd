"""Refit the power-limited SM clock of dense GEMM streams (``power_clock`` in gpus.yaml) from
one H100's GEMM duty-cycle runs: data/measured/stepmech-h100x4 (``clocks.jsonl`` on GPU 0 and
``clocks-gpu3.jsonl`` on GPU 3, ``benchmarks/device/step_mechanisms.py --phase clocks``;
``smi.csv``, nvidia-smi every 50 ms).

Each condition runs shape AC's 21 block GEMMs in rounds for 3 s: back to back (``b2b``), each
GEMM followed by bf16 adds of r times its time (``mem_r``) or by ``torch.cuda._sleep`` of r
times its time (``idle_r``). Per condition, over the second half of its run: the GEMMs' share
of the round (``duty``: GEMM seconds over the round's span), the SM clock and the board power
(nvidia-smi's mean over the samples of that GPU). A power balance explains them:

    P = duty P_gemm(f) + (1 - duty) P_other,    P_gemm(f) = P_gemm_max - slope (f_max - f)

with the clock at ``f_max`` while ``P <= power_W`` and lowered until it holds otherwise.
``P_idle``: samples at ``f_max`` with the GPU idle (0 % utilisation). ``P_gemm_max``: the
``idle_1`` condition (at ``f_max``, below the cap) less its idle share. ``P_mem``: the
``mem_2`` condition (at ``f_max``) less its GEMM share. ``slope``: the back-to-back condition
(duty ~1, at the cap) against ``P_gemm_max``. ``clock_share`` ``c``: a GEMM's time is
``(1 - c) + c f_max / f`` of its time at ``f_max`` (the part that scales with the SM clock),
least squares over every condition's median GEMM seconds a round against its clock. Mean of
the two GPUs.
"""

from __future__ import annotations

import csv
import datetime
import json
import statistics
from pathlib import Path

from simulator.calibrate import REPO
from simulator.hardware.catalog import load_gpu

DATA = REPO / "data/measured/stepmech-h100x4"
RUNS = {0: "clocks.jsonl", 3: "clocks-gpu3.jsonl"}
F_MAX = 1980.0  # clocks.max.sm of the H100 SXM (env.txt)
ROUND = 3  # significant digits shipped


def smi(path: Path = DATA / "smi.csv") -> list[tuple[float, int, float, float, str]]:
    """(epoch seconds, GPU index, SM clock MHz, power W, utilisation) per nvidia-smi sample."""
    out = []
    with open(path) as f:
        for r in csv.reader(f):
            if len(r) < 8 or r[0].startswith("timestamp"):
                continue
            ts = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(
                tzinfo=datetime.timezone.utc).timestamp()
            out.append((ts, int(r[1]), float(r[2].split()[0]), float(r[4].split()[0]),
                        r[7].strip()))
    return out


def conditions(gpu: int, samples=None) -> dict[str, dict]:
    """Per condition of one GPU's run: duty, clock MHz, power W, GEMM seconds a round."""
    samples = smi() if samples is None else samples
    out = {}
    for line in (DATA / RUNS[gpu]).read_text().splitlines():
        r = json.loads(line)
        if r.get("op") != "condition" or "gemm_sum_s_median_late_half" not in r:
            continue
        mid = r["t0"] + 0.5 * (r["t1"] - r["t0"])
        pts = [(c, p) for ts, i, c, p, _ in samples if i == gpu and mid <= ts <= r["t1"]]
        name = r["cond"] if r["cond"] not in out else r["cond"] + "_again"
        out[name] = {
            "duty": r["gemm_sum_s_median_late_half"] / r["round_span_s_median"],
            "clock": statistics.mean(c for c, _ in pts),
            "power": statistics.mean(p for _, p in pts),
            "gemm_s": r["gemm_sum_s_median_late_half"],
        }
    return out


def fit_gpu(gpu: int, samples=None) -> dict[str, float]:
    samples = smi() if samples is None else samples
    c = conditions(gpu, samples)
    idle = statistics.median(p for _, i, clk, p, u in samples
                             if i == gpu and clk >= F_MAX and u.startswith("0 "))
    i1, m2, b = c["idle_1"], c["mem_2"], c["b2b"]
    p_gemm = (i1["power"] - (1 - i1["duty"]) * idle) / i1["duty"]
    p_mem = (m2["power"] - m2["duty"] * p_gemm) / (1 - m2["duty"])
    p_b2b = (b["power"] - (1 - b["duty"]) * p_mem) / b["duty"]
    slope = (p_gemm - p_b2b) / (F_MAX - b["clock"])
    # GEMM seconds a round t = t_max ((1 - c) + c F_MAX / f): linear in x = F_MAX / f - 1,
    # t = t_max + t_max c x; least squares for (t_max, t_max c)
    xs = [F_MAX / v["clock"] - 1.0 for v in c.values()]
    ts = [v["gemm_s"] for v in c.values()]
    mx, mt = statistics.mean(xs), statistics.mean(ts)
    k = sum((x - mx) * (t - mt) for x, t in zip(xs, ts, strict=True)) / sum(
        (x - mx) ** 2 for x in xs)
    t_max = mt - k * mx
    return {"P_idle_W": idle, "P_gemm_max_W": p_gemm, "P_mem_W": p_mem,
            "slope_W_per_MHz": slope, "clock_share": k / t_max}


def fit() -> dict[str, float]:
    """The constants, mean of the two GPUs, rounded as shipped."""
    samples = smi()
    per = [fit_gpu(g, samples) for g in RUNS]
    return {k: float(f"{statistics.mean(p[k] for p in per):.{ROUND}g}") for k in per[0]}


def refit() -> dict[str, tuple[float, float]]:
    """{H100-SXM-80GB.power_clock.name: (refitted, shipped)}."""
    shipped = load_gpu("H100-SXM-80GB").power_clock
    return {f"H100-SXM-80GB.power_clock.{k}": (v, float(shipped[k])) for k, v in fit().items()}
