"""Draw the purchase study (README "What to buy in 2026") from its two sweeps.

    python -m simulator sweep studies/buy-2026/sweep-llama3-70b.yaml
    python -m simulator sweep studies/buy-2026/sweep-llama3-405b.yaml
    python studies/buy-2026/plot.py [RESULTS_DIR]     # writes studies/buy-2026/buy-2026.png

Per system: step time, cost and GPU energy per million tokens (the sweeps' cost_usd and
energy_MWh with training.tokens = 1e6), for both models.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

HERE = Path(__file__).resolve().parent
MODELS = {"llama3-70b": "Llama 3 70B", "llama3-405b": "Llama 3.1 405B"}
PANELS = [("step_time_s", "step time (s)", 1.0), ("cost_usd", "$ per million tokens", 1.0),
          ("energy_MWh", "GPU kWh per million tokens", 1000.0)]


def main() -> None:
    results = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE.parents[1] / "results"
    fig, axes = plt.subplots(len(MODELS), len(PANELS), figsize=(12, 6), constrained_layout=True)
    for row, (key, title) in enumerate(MODELS.items()):
        df = pd.read_parquet(results / f"buy-2026-{key}" / "sweep.parquet")
        df = df.sort_values("point_index")
        labels = [f"{g.split('-')[0]}\n{n:,} GPUs" for g, n in zip(df["gpu"], df["n_gpus"], strict=True)]
        for col, (metric, name, scale) in enumerate(PANELS):
            ax = axes[row][col]
            vals = df[metric] * scale
            best = vals.idxmin()
            colors = ["#2a9d8f" if i == best else "#8d99ae" for i in vals.index]
            ax.bar(labels, vals, color=colors)
            for x, v in enumerate(vals):
                ax.annotate(f"{v:.3g}", (x, v), ha="center", va="bottom", fontsize=8)
            ax.set_title(f"{title}: {name}", fontsize=9)
            ax.tick_params(axis="x", labelsize=7)
            ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle("Equal budget per hour (catalog on-demand prices): lower is better; "
                 "green = best", fontsize=10)
    out = HERE / "buy-2026.png"
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
