"""Derive a GPU's ``memory_access`` ratios (gpus.yaml) from its elementwise measurements.

    python benchmarks/device/memory_access.py data/measured/h100x1

Prints each access class's bandwidth relative to a streaming copy; the method is
:mod:`simulator.calibrate.memory` (``python -m simulator.calibrate memory`` compares every
GPU's refit with the catalog).
"""

from __future__ import annotations

import sys
from pathlib import Path

from simulator.calibrate.memory import ratios

if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(arg, ratios(Path(arg)))
