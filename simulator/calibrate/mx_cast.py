"""Refit the bandwidth of Transformer Engine's MXFP8 cast relative to a streaming copy
(``memory_access.mx_cast`` of the Blackwell GPUs in gpus.yaml).

Data: ``data/published/te-mxfp8-cast-b200/cast.jsonl``, Transformer Engine's MXFP8
quantisation kernel on a B200 (ROCm/TransformerEngine PR #598, the B200 reference column of its
``CAST_ONLY`` table), bf16 input of 8192 x 8192 writing both orientations (the one kernel TE
runs for an activation, an output gradient or a weight in training). Bytes: the bf16 read (2)
and both e4m3 copies with their E8M0 scales (2 (1 + 1/32)), as
``simulator.hardware.precision.RECIPES["mxfp8"].quant_bytes`` counts them. The class is that
bandwidth over B200's copy (``hbm_TBps x hbm_efficiency``); GB200, B300 and GB300 take B200's
ratio (the same kernel on the same HBM3e generation; not published for them).
"""

from __future__ import annotations

from simulator.calibrate import REPO, jsonl
from simulator.hardware.catalog import load_gpu
from simulator.hardware.precision import RECIPES

DATA = REPO / "data/published/te-mxfp8-cast-b200/cast.jsonl"
#: GPUs that take B200's ratio
SIBLINGS = ("GB200", "B300", "GB300")


def cast_bandwidth(scaling: str = "both") -> float:
    """Bytes per second of the published B200 bf16 cast writing ``scaling``."""
    r = next(r for r in jsonl(DATA) if r["scaling"] == scaling and r["itype"] == "bf16")
    per_elem = 2.0 + (2.0 if scaling == "both" else 1.0) * (1.0 + 1.0 / 32.0)
    return per_elem * r["rows"] * r["cols"] / r["time_s"]


def fit() -> float:
    """``mx_cast`` of B200, rounded as shipped."""
    assert RECIPES["mxfp8"].quant_bytes == 2.0 + 2.0 * (1.0 + 1.0 / 32.0)
    return round(cast_bandwidth("both") / load_gpu("B200").hbm_Bps, 3)


def refit() -> dict[str, tuple[float, float]]:
    v = fit()
    return {f"{g}.memory_access.mx_cast": (v, load_gpu(g).memory_access["mx_cast"])
            for g in ("B200", *SIBLINGS)}
