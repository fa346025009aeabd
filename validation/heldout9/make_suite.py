"""Write the ninth batch's suites from its measurement and frozen predictions:
``suite.yaml`` (step time) and ``memory.yaml`` (peak memory), one row per case of the first run
(``data/measured/heldout9-h200x4/steps-first.jsonl``; the device service lent 4x H200 for
``nvidia-h100-x4``, so each row runs its workload on the H200 topology of its GPU count and
carries the frozen H200 prediction). Run once after measuring: ``python
validation/heldout9/make_suite.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
DATA = HERE.parent.parent / "data" / "measured" / "heldout9-h200x4"
TOPOLOGY = {1: "../heldout6/h200x1.yaml", 2: "../../topologies/h200x2-nvswitch.yaml",
            4: "../../topologies/h200x4-nvswitch.yaml"}
HEAD = """# HELD OUT, pre-registered (issue 12), ninth batch ({what}). Nothing here was used to build, fit or
# choose the model. Result as it came out, at the frozen tag (first run of every case, 4x H200): {result}
# Tolerances set after the measurement, regression guards only. Raw data: ../../data/measured/heldout9-h200x4/;
# protocol and the repeat runs: README.md.
"""


def frozen(here: Path = HERE, batch: int = 9, box: str = "h200") -> dict:
    """case -> the frozen prediction for ``box`` (every predictions file of the batch's tag)."""
    out = {}
    for f in sorted(here.glob(f"predictions-heldout-freeze-{batch}-*.yaml")):
        for case, boxes in yaml.safe_load(f.read_text())["cases"].items():
            for name, p in boxes.items():
                if name.startswith(box):
                    out[case] = p
    return out


def rows(metric: str, key: str, pred: dict, data: Path = DATA, topology: dict = TOPOLOGY,
         box: str = "h200") -> list[dict]:
    """One suite row per case of ``data``'s first run, with its frozen prediction."""
    out = []
    for line in open(data / "steps-first.jsonl"):
        r = json.loads(line)
        c, n = r["case"], r["gpus"]
        out.append({
            "name": f"{box}x{n}-{c}", "workload": f"{c}.yaml",
            "set": {"cluster.topology": topology[n]},
            "measured": {metric: round(r[key], 5)},
            "predicted_at_freeze": {metric: pred[c][key]},
            "source": f"this project's measurement: {r['script']} on {r['env']['gpu']} x{n}, "
                      f"{r['measured_utc']}; ../../data/measured/{data.name}/steps-first.jsonl "
                      f"(case {c}, median of the timed steps, slowest rank)"})
    return out


def write(name: str, metric: str, key: str, tol: float, what: str, result: str) -> None:
    pred = frozen()
    suite = {"name": name, "role": "held_out",
             "role_note": "Pre-registered: cases written at commit ce4cbd5 (00:12 UTC), model frozen "
                          "at tag heldout-freeze-9 (01:58 UTC), predictions committed (tag "
                          "heldout-predictions-9) before the measurement (02:00-02:08 UTC). The "
                          "device service gave 4x H200 for the H100 call: the H200 predictions "
                          "were computed at the same frozen tag after the measurement, and "
                          "h9_tp4sp_R's (missed by a file pattern) too; the tag fixes them.",
             "about": "Ninth pre-registered held-out batch: steps_third.py on shapes C and D, "
                      "steps_alt.py on shapes R and S, 1, 2 and 4 GPUs (README.md).",
             "metric": metric, "tolerance_mape": tol, "cases": rows(metric, key, pred)}
    text = HEAD.format(what=what, result=result) + yaml.safe_dump(suite, sort_keys=False,
                                                                   width=100)
    (HERE / f"{name.split('-')[1]}.yaml").write_text(text)


if __name__ == "__main__":
    write("heldout9-suite-h200x4", "step_time_s", "step_time_s", 0.5, "step time",
          "step time MAPE 9.6 %, bias -4.4 % (14 rows).")
    write("heldout9-memory-h200x4", "memory_gib.allocated", "peak_memory_gib", 0.3, "peak memory",
          "peak memory MAPE 3.8 %, bias -1.2 % (14 rows).")
