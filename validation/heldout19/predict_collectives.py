"""Pre-register the nineteenth batch's collective predictions before measuring.

    python validation/heldout19/predict_collectives.py --box h100x4
    python validation/heldout19/predict_collectives.py --box h200x4

writes ``predictions-collectives-<box>.yaml`` (event-timed rows) and
``predictions-collectives-loop-<box>.yaml`` (loop-timed rows) beside this file once (never
rewrites them): the time the simulator gives all-reduce, all-gather, reduce-scatter and
all-to-all, bf16 (``validate.timed_collective_s``, the rule ``validate`` prices such suites with),
for what ``benchmarks/device/call_heldout19.sh D`` measures: CUDA events after every call in a
group of 4 and two pairs at once at 36 KiB x 4^k (up to 576 MiB) and in a group of 3 at
30 KiB x 4^k (up to 120 MiB, every rank's share 16-byte aligned); and nccl-tests' loop timing
(50 calls between one pair of CUDA events, 10 above 64 MiB) in a group of 4 and two pairs at once at 36 KiB x 4^k (up to 144 MiB). The all-to-all is
predicted for the three splits ``comm.py`` runs: uniform, and the uneven ``rotated`` and
``hot`` (priced part by part, as ``validate`` prices such rows). After measuring,
``--box B --score DATA.jsonl [--timing loop]`` prints the held-out result.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import batch  # noqa: E402

#: (label, group size, the groups running at once, sizes[, timing]): what call_heldout19.sh D
#: measures
PLAN = (("g4", 4, [[0, 1, 2, 3]], [36864 * 4**i for i in range(8)]),
        ("g2", 2, [[0, 1], [2, 3]], [36864 * 4**i for i in range(8)]),
        ("g3", 3, [[0, 1, 2]], [30720 * 4**i for i in range(7)]),
        ("loop4", 4, [[0, 1, 2, 3]], [36864 * 4**i for i in range(7)], "loop"),
        ("loop2", 2, [[0, 1], [2, 3]], [36864 * 4**i for i in range(7)], "loop"))

if __name__ == "__main__":
    batch.collectives_main(Path(__file__).resolve().parent, PLAN, __doc__)
