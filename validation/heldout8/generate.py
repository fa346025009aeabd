"""Write the eighth held-out batch's ``steps_alt.py`` workloads (``h8_*.yaml``) from the sixth's.

The same rule as ``../heldout7/generate.py`` (each case repeats the scheme of a sixth-batch case
on a new shape, batch and layout) for the cases of ``CASES8``. Run before the freeze.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "heldout7"))

from generate import main  # noqa: E402

if __name__ == "__main__":
    main(8, HERE)
