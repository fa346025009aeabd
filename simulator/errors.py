"""The two error types the CLI turns into one-line messages (exit code 2).

* :class:`ConfigError` -- the input is invalid: it names the file, the dotted field, the bad
  value and what is accepted.
* :class:`PlanError` -- the input is valid but describes something that cannot be simulated
  (for example a topology whose failed links disconnect two GPUs that must talk).
"""

from __future__ import annotations


class SimulatorError(Exception):
    """Base class of the errors the CLI reports on one line."""


class ConfigError(SimulatorError):
    """Invalid input.

    ``str(err)`` reads ``FILE: dotted.field: what is wrong (what is accepted)``.
    """

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.file = file
        self.field = field
        self.detail = message
        parts = [p for p in (file, field) if p]
        super().__init__(": ".join([*parts, message]))


class PlanError(SimulatorError):
    """A valid input that describes an impossible plan."""
