"""Pre-register the seventeenth batch's collective predictions before measuring.

    python validation/heldout17/predict_collectives.py --box h100x4
    python validation/heldout17/predict_collectives.py --box h200x4

writes ``predictions-collectives-<box>.yaml`` beside this file once (never rewrites it): the time
the simulator gives all-reduce, all-gather, reduce-scatter and all-to-all, bf16, CUDA-event
timing (``validate.timed_collective_s``, the rule ``validate`` prices event-timed suites with),
for what ``benchmarks/device/call_heldout17.sh C`` measures: a group of 4 and two pairs at once
at 12 KiB x 4^k (up to 768 MiB) and a group of 3 at 6 KiB x 4^k (up to 384 MiB, every rank's
share 16-byte aligned). The all-to-all is predicted for the three splits ``comm.py`` runs:
uniform, and the uneven ``rotated`` and ``hot`` (priced part by part, as ``validate`` prices
such rows). After measuring, ``--box B --score DATA.jsonl`` prints the held-out result.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import batch  # noqa: E402

#: (label, group size, the groups running at once, sizes): what call_heldout17.sh C measures
PLAN = (("g4", 4, [[0, 1, 2, 3]], [12288 * 4**i for i in range(9)]),
        ("g2", 2, [[0, 1], [2, 3]], [12288 * 4**i for i in range(9)]),
        ("g3", 3, [[0, 1, 2]], [6144 * 4**i for i in range(9)]))

if __name__ == "__main__":
    batch.collectives_main(Path(__file__).resolve().parent, PLAN, __doc__)
