"""Predict every case of suite.yaml (cases.yaml until the figures were entered) once, in a checkout of the frozen tag, and write
predictions-<tag>.yaml beside it (issue 12: the published suite is scored against these).

    git worktree add FROZEN published-freeze-16
    cp -r validation/nemo-h100-2407 FROZEN/validation/
    cd FROZEN && PYTHONPATH=$PWD python validation/nemo-h100-2407/predict.py published-freeze-16
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def main(tag: str) -> None:
    sys.path.insert(0, str(ROOT))
    from simulator.config.load import read_yaml
    from simulator.run import resolve_loaded, simulate
    from simulator.validate import load_case

    path = HERE / "suite.yaml"
    suite = read_yaml(path, what="suite file")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    cases = {}
    for i, case in enumerate(suite["cases"]):
        loaded = load_case(path, suite.get("defaults") or {}, case, i)
        resolve_loaded(loaded)
        s = simulate(loaded).summary
        w, p = loaded.workload, loaded.workload.parallelism
        n_gpus = p.tp * p.pp * p.cp * p.dp
        cases[case["name"]] = {"step_time_s": round(float(s["step_time_s"]), 5),
                               "tokens_per_s_per_gpu": round(w.training.global_batch * w.model.seq_len
                                                             / float(s["step_time_s"]) / n_gpus, 1),
                               "peak_memory_gib": round(float(s["memory_gib"]["total"]), 2),
                               "fits": bool(s["fits"]), "mfu": round(float(s["mfu"]), 4)}
        print(case["name"], cases[case["name"]], flush=True)
    out = {"tag": tag, "commit": commit,
           "predicted_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": "python validation/nemo-h100-2407/predict.py (in a checkout of the tag)",
           "cases": cases}
    (HERE / f"predictions-{tag}.yaml").write_text(yaml.safe_dump(out, sort_keys=False))


if __name__ == "__main__":
    main(sys.argv[1])
