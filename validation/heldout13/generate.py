"""Write the thirteenth held-out batch's workloads: ``h13_*.yaml`` for the cases of ``CASES13`` in
``benchmarks/device/steps_alt.py`` (the rule of ``../heldout7/generate.py``: each case repeats the
scheme of a sixth-batch case on a new shape, batch and layout) and ``h13t_*.yaml`` for those of
``benchmarks/device/steps_third.py`` (``../heldout8/generate_third.py``). Run before the freeze:
``python validation/heldout13/generate.py``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


if __name__ == "__main__":
    _load(HERE.parent / "heldout7" / "generate.py", "generate_alt").main(13, HERE)
    _load(HERE.parent / "heldout8" / "generate_third.py", "generate_third").main(13, str(HERE))
