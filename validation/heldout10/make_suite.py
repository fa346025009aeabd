"""Write the tenth batch's suites from its measurement and frozen predictions: ``suite.yaml``
(step time), ``memory.yaml`` (peak memory), one row per case of the first run
(``data/measured/heldout10-h100x4/steps-first.jsonl``; the service lent 4x H100, so each row runs
its workload on the H100 topology of its GPU count and carries the frozen H100 prediction), and
the collective suites ``collectives-g4.yaml``, ``collectives-g3-aligned.yaml`` and
``collectives-g3-misaligned.yaml``. Run once after measuring: ``python
validation/heldout10/make_suite.py``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "data" / "measured" / "heldout10-h100x4"
TOPOLOGY = {1: "../heldout6/h100x1.yaml", 2: "../../topologies/h100x2-nvswitch.yaml",
            4: "../../topologies/h100x4-nvswitch.yaml"}
NOTE = ("Pre-registered: cases written at 03:35 UTC (commit 3fa6da6, shapes fixed before any "
        "helper landed), model frozen at tag heldout-freeze-10 (05:01 UTC, after every helper of "
        "the session had landed), predictions for 4x H100 and 4x H200 committed (tag "
        "heldout-predictions-10) before the measurement (05:02-05:09 UTC, 4x H100).")
HEAD = """# HELD OUT, pre-registered (issue 12), tenth batch ({what}). Nothing here was used to build, fit or
# choose the model. Result as it came out, at the frozen tag (first run of every case, 4x H100): {result}
# Tolerances set after the measurement, regression guards only. Raw data: ../../data/measured/heldout10-h100x4/;
# protocol and the repeat runs: README.md.
"""


def _ninth():
    """validation/heldout9/make_suite.py: its frozen-prediction and row readers serve both batches."""
    spec = importlib.util.spec_from_file_location("make_suite9", HERE.parent / "heldout9" / "make_suite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rows(metric: str, key: str, pred: dict) -> list[dict]:
    return _ninth().rows(metric, key, pred, DATA, TOPOLOGY, "h100")


def frozen() -> dict:
    return _ninth().frozen(HERE, 10, "h100")


def write(name: str, metric: str, key: str, tol: float, what: str, result: str) -> None:
    suite = {"name": name, "role": "held_out", "role_note": NOTE,
             "about": "Tenth pre-registered held-out batch: steps_third.py on shapes E and F, "
                      "steps_alt.py on shape T, 1, 2 and 4 GPUs (README.md).",
             "metric": metric, "tolerance_mape": tol, "cases": rows(metric, key, frozen())}
    text = HEAD.format(what=what, result=result) + yaml.safe_dump(suite, sort_keys=False,
                                                                   width=100)
    (HERE / f"{name.split('-')[1]}.yaml").write_text(text)


def collectives(tag: str, what: str, result: str) -> None:
    suite = {"kind": "collectives", "name": f"heldout10-collectives-{tag}-h100x4",
             "role": "held_out", "predictions": "predictions-collectives-h100x4.yaml",
             "role_note": NOTE, "data": f"../../data/measured/heldout10-h100x4/comm-{tag}.jsonl",
             "topology": "../../topologies/h100x4-nvswitch.yaml",
             "ops": ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"],
             "splits": ["uniform"], "timing": "events",
             "bands": [{"name": "<= 1 MiB", "max_bytes": 1048576, "tolerance_mape": 0.6},
                       {"name": "1-96 MiB", "min_bytes": 1048577, "max_bytes": 100663296,
                        "tolerance_mape": 0.4},
                       {"name": ">= 96 MiB", "min_bytes": 100663297, "tolerance_mape": 0.4}]}
    head = (f"# HELD OUT, pre-registered (issue 12), tenth batch: NCCL collectives, {what}, 4x H100 NVSwitch, bf16,\n"
            "# CUDA events between back-to-back calls (benchmarks/device/comm.py via call_heldout10.sh B).\n"
            f"# Predicted once at tag heldout-freeze-10. Result as it came out: {result}\n"
            "# Band tolerances set after the measurement: regression guards only.\n")
    (HERE / f"collectives-{tag}.yaml").write_text(head + yaml.safe_dump(suite, sort_keys=False,
                                                                        width=100))


if __name__ == "__main__":
    write("heldout10-suite-h100x4", "step_time_s", "step_time_s", 0.3, "step time",
          "step time MAPE 6.8 %, bias -0.5 % (12 rows).")
    write("heldout10-memory-h100x4", "memory_gib.allocated", "peak_memory_gib", 0.3,
          "peak memory", "peak memory MAPE 4.5 %, bias +1.0 % (12 rows).")
    collectives("g4", "a group of 4 and two pairs at once at 10 KiB x 4^k (2.5x the fitted sizes)",
                "72 rows, MAPE 22.3 %, bias +17.8 % (>= 256 MiB within 0-14 %; <= 1 MiB +22..+44 %: "
                "this run's Python loop issued calls every 41-66 us against the 67 us of the box).")
    collectives("g3-aligned", "a group of 3 at 15 KiB x 4^k (every rank's share 16-byte aligned)",
                "32 rows, MAPE 8.5 %, bias +4.1 %.")
    collectives("g3-misaligned", "a group of 3 at 20 KiB x 4^k (shares off a 16-byte boundary)",
                "32 rows, MAPE 14.3 %, bias +7.2 % (all-gather +19..+33 %).")
