"""Write the nineteenth held-out batch's workloads: ``h19_*.yaml`` for the cases of ``CASES19`` in
``benchmarks/device/steps_alt.py`` (the rule of ``../heldout7/generate.py``: each case repeats the
scheme of a sixth-batch case on a new shape, batch and layout) and ``h19t_*.yaml`` for those of
``benchmarks/device/steps_third.py`` (``../heldout8/generate_third.py``). Run before the freeze:
``python validation/heldout19/generate.py``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import batch  # noqa: E402

if __name__ == "__main__":
    batch.generate_workloads(19)
