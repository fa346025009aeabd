"""Row counts of a learned-router eager MoE step drawn as the simulator assumes them (issue 10).

For ``benchmarks/device/route_replay.py``'s ``model`` variant: every MoE layer call of a case's
first ``steps`` steps, each source rank's per-expert counts of its token copies, drawn from the
simulator's distribution of a learned router's routes for the case's workload
(``validation/heldoutN/CASE.yaml``):

* a call's expert shares are a nested Dirichlet: the EP ranks' shares with the workload's rank
  correlation (``training.moe_rank_correlation``, what ``route_skew.busiest_share`` prices),
  each rank's experts within it with the correlation that makes two copies' experts
  correlated by the step's route correlation (``moe_route_correlation`` plus the widening
  ``moe.route_widening`` of the step, what ``shape_cache`` prices), around the mean loads
  (``moe_expert_load`` or uniform);
* every source rank's tokens then pick ``top_k`` distinct experts by those shares (Gumbel
  top-k), and the counts are the picks per expert.

Usage: ``python benchmarks/route_model_counts.py --out FILE CASE [CASE ...]`` (``--quick``: the
scripts' shrunken CPU shapes, for a dry run). Seeded: the same output every run.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.config.load import load_workload  # noqa: E402
from simulator.model import moe as moe_math  # noqa: E402
from simulator.model.shape_cache import step_rho  # noqa: E402


def workload_path(case: str) -> Path:
    n = re.match(r"h(\d+)t?_", case).group(1)
    return ROOT / "validation" / f"heldout{n}" / f"{case}.yaml"


def params(case: str) -> dict:
    """The simulator's parameters of the case's routes."""
    lw = load_workload(workload_path(case))
    w = lw.workload
    model, t, par = w.model, w.training, w.parallelism
    ep = par.ep
    tokens = t.micro_batch * model.seq_len
    widen = moe_math.route_widening(model, t, ep * tokens)
    E = model.moe.experts
    means = list(t.moe_expert_load) if t.moe_expert_load else [1.0 / E] * E
    return {"experts": E, "top_k": model.moe.top_k, "ep": ep, "tokens": tokens,
            "layers": model.layers, "micro_batch": t.micro_batch, "rho_route": t.moe_route_correlation, "widen": widen,
            "rho_rank": t.moe_rank_correlation, "means": means}


def nested_shares(rng, p: dict, rho_e: float) -> np.ndarray:
    """One call's expert shares (module docstring)."""
    E, ep, means = p["experts"], p["ep"], np.asarray(p["means"])
    L = E // ep
    rank_means = means.reshape(ep, L).sum(1)
    rho_r = max(p["rho_rank"], 1e-12)
    R = rng.dirichlet(rank_means * (1.0 / rho_r - 1.0))
    # two copies land on the same expert with E[sum S^2] = sum p^2 + rho (1 - sum p^2);
    # nested: E[sum R^2] x E[sum W^2] (W: shares within a rank)
    q_e = (means ** 2).sum() + rho_e * (1 - (means ** 2).sum())
    q_r = (rank_means ** 2).sum() + rho_r * (1 - (rank_means ** 2).sum())
    out = np.empty(E)
    for r in range(ep):
        inner = means[r * L:(r + 1) * L] / rank_means[r]
        s2 = (inner ** 2).sum()
        rho_w = min(1.0 - 1e-6, max(1e-12, (q_e / q_r - s2) / (1 - s2))) if L > 1 else 1.0
        W = rng.dirichlet(inner * (1.0 / rho_w - 1.0)) if L > 1 else np.ones(1)
        out[r * L:(r + 1) * L] = R[r] * W
    return out


def draw(p: dict, steps: int, n_mb: int, tokens: int, seed: int) -> list:
    """``[step][call][source][expert]`` counts."""
    rng = np.random.default_rng(seed)
    E, k, ep = p["experts"], p["top_k"], p["ep"]
    out = []
    for s in range(1, steps + 1):
        rho_e = step_rho(p["rho_route"], p["widen"], s)
        calls = []
        for _ in range(n_mb * p["layers"]):
            S = np.maximum(nested_shares(rng, p, rho_e), 1e-300)
            srcs = []
            for _src in range(ep):
                g = np.log(S)[None, :] + rng.gumbel(size=(tokens, E))
                picks = np.argpartition(-g, k - 1, axis=1)[:, :k] if k < E else None
                c = np.bincount(picks.reshape(-1), minlength=E) if picks is not None \
                    else np.full(E, tokens)
                srcs.append([int(x) for x in c])
            calls.append(srcs)
        out.append(calls)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--n-mb", type=int, default=2, help="micro-batches a step (the cases': 2)")
    ap.add_argument("--quick", action="store_true",
                    help="the scripts' --quick shapes (tokens and layers of the dry run)")
    args = ap.parse_args()
    res = {}
    for i, case in enumerate(args.cases):
        p = params(case)
        tokens = p["tokens"]
        if args.quick:  # steps_third.py QUICK: 4 layers, seq 32; steps_alt.py: 8 layers, 32
            p["layers"] = 4 if re.match(r"h\d+t_", case) else 8
            tokens = p["micro_batch"] * 32
        res[case] = {"params": p, "tokens": tokens, "n_mb": args.n_mb,
                     "counts": draw(p, args.steps, args.n_mb, tokens, seed=1234 + i)}
    with open(args.out, "w") as f:
        json.dump(res, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
