"""Write the fourteenth batch's suites from its measurement and frozen predictions: ``suite.yaml``
(step time), ``memory.yaml`` (peak memory), one row per case of the first run
(``data/measured/heldout14-<box>x4/steps-first.jsonl``; each row runs its workload on the
topology of the lent box and its GPU count and carries that box's frozen prediction), and the
collective suites ``collectives-g4.yaml`` (a group of 4 and two pairs at once) and
``collectives-g3.yaml``, every all-to-all split included. Run once after measuring:
``python validation/heldout14/make_suite.py BOX 'STEPS RESULT' 'MEMORY RESULT' 'G4 RESULT'
'G3 RESULT'`` (BOX h100 or h200; the results as ``validate`` prints them, written into the
suites' headers).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import batch  # noqa: E402

BATCH = batch.Batch(
    n=14, cases_written='14:27 UTC (commit 1b1484a',
    shapes='steps_third.py on shapes AC and AD, steps_alt.py on shapes AE and AF',
    g4_sizes='a group of 4 and two pairs at once at 20 KiB x 4^k (5x the fitted sizes)',
    g3_sizes="a group of 3 at 30 KiB x 4^k (every rank's share 16-byte aligned)",
    band_tolerances=(0.8, 0.6),
    cases_when="after two helpers had landed and before the other three; no helper saw them",
    comm_call="C",
    #: the main miss of each suite's held-out result, for the README's table (written after scoring)
    notes={
    "suite": "eager MoE EP 2 / 4 of the second script -18.6 / -27.9 %; 1 GPU, DDP 4, 1F1B on AC -8.5 to "
             "-10.8 %",
    "memory": "TP low (hand TP 4 -5.8 %, DTensor TP 2 / 4 + SP -7.0 / -8.9 %), MoE AF EP 4 -7.6 %; 12 others "
              "within 3 %",
    "g4": ">= 32 MiB 7.2 %, +3.5 % (ring 2.9 %); hot all-to-all +16 to +23 %; small rows the loop's pace",
    "g3": ">= 32 MiB 6.2 %, -1.1 %; small rows a loop at 49-92 us a call against 59.2",
})

if __name__ == "__main__":
    batch.make_suites(BATCH, sys.argv[1:6])
