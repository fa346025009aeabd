"""The measured grouped expert GEMMs (``grouped_gemm.jsonl``) beside what the simulator prices
for the same experts (``simulator/model/moe.py``: one GEMM per round of
``TE_GEMM_STREAMS`` experts, their rows together; the wgrad per expert, stacked in m, with an
fp32 ``main_grad`` of 4 bytes an element when accumulated), each GEMM plus the GPU's kernel
launch gap. Prints one line per configuration, GEMM and pass: the model's time and, for each
method, the measured device time (CUDA-graph replay) and its ratio to the model.

Usage: ``python data/measured/grouped-gemm-h100/compare.py [FILE.jsonl]``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from simulator.hardware.catalog import load_gpu
from simulator.hardware.compute import ComputeModel
from simulator.model.moe import TE_GEMM_STREAMS

HERE = Path(__file__).resolve().parent


def model_s(cm: ComputeModel, E: int, M: int, k: int, n: int, pas: str, dtype: str) -> float:
    """Seconds the simulator charges for ``E`` experts of ``M`` rows, ``[M,k] @ [k,n]``."""
    t, launch = 0.0, cm.gpu.kernel_launch_s
    for r0 in range(0, E, TE_GEMM_STREAMS):
        e = min(TE_GEMM_STREAMS, E - r0)
        if pas == "fwd":
            t += cm.gemm_s(e * M, k, n, dtype) + launch
        elif pas == "dgrad":
            t += cm.gemm_s(e * M, n, k, dtype) + launch
        elif pas == "wgrad":
            t += cm.gemm_s(e * k, M, n, dtype) + launch
        elif pas == "wgrad_acc":
            t += cm.gemm_s(e * k, M, n, dtype, 4) + launch
    return t


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(recs: list[dict], gpu: str = "H100-SXM-80GB") -> list[dict]:
    cm = ComputeModel(load_gpu(gpu))
    rows: dict[tuple, dict] = {}
    for r in recs:
        if "graph_s" not in r and "eager_s" not in r:
            continue
        key = (r["config"], r["gemm"], r["pass"])
        row = rows.setdefault(key, {
            "config": r["config"], "gemm": r["gemm"], "pass": r["pass"], "E": r["experts"],
            "M": r["rows"], "k": r["k"], "n": r["n"], "dtype": r["dtype"],
            "model_s": model_s(cm, r["experts"], r["rows"], r["k"], r["n"], r["pass"],
                               r["dtype"]),
        })  # fmt: skip
        row[r["method"]] = r.get("graph_s")
        row[r["method"] + "_eager"] = r.get("eager_s")
    return list(rows.values())


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "grouped_gemm.jsonl"
    rows = table(load(path))
    methods = ("loop4", "grouped_mm", "loop1", "round", "fp8_loop4", "fp8_scaled_grouped_mm_rowwise")
    print(f"{'config':22s} {'gemm':4s} {'pass':9s} {'model us':>9s}  "
          + "  ".join(f"{m[:14]:>14s} (x)" for m in methods))
    for r in rows:
        cells = []
        for m in methods:
            v = r.get(m)
            cells.append(f"{v * 1e6:14.1f} ({v / r['model_s']:4.2f})" if v else " " * 21)
        print(f"{r['config']:22s} {r['gemm']:4s} {r['pass']:9s} {r['model_s'] * 1e6:9.1f}  "
              + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
