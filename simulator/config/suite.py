"""Typed schemas of validation suites (``simulator validate``), like workloads have.

A suite file is checked whole before anything runs: unknown keys are refused with a
did-you-mean (``tolerance_mapee``), numbers are strict and finite, a measured figure must be
a positive number, and the measured NCCL rows of a collectives suite are read line by line
(:func:`collective_rows`), each naming its line when it is malformed. See
:mod:`simulator.validate` for what the keys mean.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from simulator.config.load import check_kind, pydantic_to_config_error, read_yaml
from simulator.config.schema import Float, Frozen, NonNegativeInt, PositiveFloat, PositiveInt
from simulator.config.yaml_safe import read_bounded
from simulator.errors import ConfigError
from simulator.network.collectives import TIMINGS

ROLES = ("fit", "development", "held_out")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")
#: Largest measured-data file a collectives suite reads.
MAX_DATA_BYTES = 64 * 2**20


class _Suite(Frozen):
    name: str = Field(min_length=1)
    role: Literal["fit", "development", "held_out"] = Field(
        description="how the suite was used: fit / development / held out"
    )
    role_note: str = ""
    held_out_until: str = Field(
        "",
        description="a pre-registered suite predicted once at this git tag and looked at since: "
        "its role is then development, and its held-out result is the cases' "
        "predicted_at_freeze, not a re-run",
    )
    predicted_at: str = Field(
        "",
        description="a pre-registered suite still held out: the git tag of its one prediction "
        "(the cases' predicted_at_freeze or the predictions file); held_out_until names it "
        "once the suite has been looked at",
    )
    summary: str = Field(
        "", max_length=120,
        description="what the suite is, in a few words (the README's fidelity table)",
    )
    note: str = Field(
        "", max_length=120,
        description="one short remark for the README's fidelity table: the main miss of the "
        "held-out result, or what was fitted or looked at; a figure only if it cannot change "
        "(the held-out result's); the full history is docs/FIDELITY_HISTORY.md",
    )
    about: str = ""
    assumptions: tuple[str, ...] = ()
    skipped: tuple[Any, ...] = Field(
        (), description="rows of the source left out of the suite, each with the reason"
    )

    @model_validator(mode="after")
    def _held_out_once(self) -> _Suite:
        if self.held_out_until and self.role != "development":
            raise ValueError(
                f"held_out_until={self.held_out_until!r} needs role: development (a suite "
                "seen after its one prediction is no longer held out)"
            )
        if self.predicted_at and self.role != "held_out":
            raise ValueError(
                f"predicted_at={self.predicted_at!r} needs role: held_out (once looked at, "
                "the tag goes in held_out_until with role: development)"
            )
        return self

    @property
    def frozen_tag(self) -> str:
        """The tag of a pre-registered suite's one prediction ('' if it has none)."""
        return self.held_out_until or self.predicted_at


class SuiteCase(Frozen):
    """One workload case: a workload (path or mapping), overrides and measured figures."""

    name: str = Field(min_length=1)
    workload: str | dict[str, Any]
    set: dict[str, Any] = Field(default_factory=dict)
    measured: dict[str, PositiveFloat] = Field(min_length=1)
    predicted_at_freeze: dict[str, Float] = Field(
        default_factory=dict,
        description="a pre-registered suite's predictions made when the model was frozen "
        "(kept as a record; validate predicts again with the current model)",
    )
    source: str = ""
    not_modelled: str = Field("", description="what the source used that is not modelled")


class WorkloadSuite(_Suite):
    """``kind: workloads``: simulated steps against measured or published figures."""

    kind: Literal["workloads"] = "workloads"
    metric: str = Field("step_time_s", min_length=1)
    tolerance_mape: PositiveFloat = Field(0.10, le=10.0)
    tolerance_max: PositiveFloat | None = Field(None, le=10.0)
    defaults: dict[str, Any] = Field(default_factory=dict)
    cases: tuple[SuiteCase, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _measured_metric(self) -> WorkloadSuite:
        for i, case in enumerate(self.cases):
            if self.metric not in case.measured:
                raise ValueError(
                    f"metric={self.metric!r} is not among cases[{i}].measured "
                    f"({', '.join(case.measured)})"
                )
        return self


class Band(Frozen):
    """Message sizes checked together against one tolerance."""

    name: str = Field(min_length=1)
    min_bytes: Float = Field(0, ge=0)
    max_bytes: Float | None = Field(None, gt=0)
    tolerance_mape: PositiveFloat = Field(le=10.0)


class CollectiveSuite(_Suite):
    """``kind: collectives``: measured NCCL collectives on a topology."""

    kind: Literal["collectives"]
    data: str = Field(min_length=1, description="JSON lines of measured collectives")
    topology: str = Field(min_length=1)
    ops: tuple[Literal[COLLECTIVE_OPS], ...] = Field(  # type: ignore[valid-type]
        ("all_reduce", "all_gather", "reduce_scatter"), min_length=1
    )
    timing: Literal[TIMINGS] = Field(  # type: ignore[valid-type]
        "device",
        description="how the rows were timed: device (the GPU's time: the stream held while "
        "the host enqueues, or calls longer than the host's), events (a CUDA event between "
        "calls a Python loop issues back to back: max(device time, the host's call interval)), "
        "loop (a Python loop of N calls back to back between one pair of CUDA events, the "
        "interval over N, nccl-tests' method as PyTorch all-to-all benchmarks use it: "
        "max(device time, the host's call interval less the event record a call)), "
        "host_sync (a barrier and a synchronisation around each call); rows whose own "
        "``timing`` says otherwise are not read",
    )
    splits: tuple[str, ...] = Field(
        ("uniform",), min_length=1, description="all-to-all rows: which split patterns to check"
    )
    bands: tuple[Band, ...] = Field(
        (Band(name="all", tolerance_mape=0.10),), min_length=1
    )
    predictions: str = Field(
        "",
        description="a pre-registered suite's predictions file, written at its freeze tag "
        "(rows of op, group, bytes, predicted_s), relative to the suite: with held_out_until, "
        "its score on the measured rows is the held-out result",
    )


#: the all-to-all split patterns of ``benchmarks/device/comm.py`` a collective suite can price,
#: and ``table``: a row that gives its own bytes from every group rank to every other
#: (``table_bytes``, ``benchmarks/device/a2a_probe.py``)
SPLITS = ("uniform", "rotated", "hot", "table")


class FrozenPrediction(Frozen):
    """One row of a predictions file written at a freeze tag (other keys are not read)."""

    model_config = {**Frozen.model_config, "extra": "ignore"}

    op: str
    group: PositiveInt
    bytes: PositiveFloat
    predicted_s: PositiveFloat
    #: an all-to-all's split pattern (``comm.py``'s); '-' (other operations) reads as uniform
    splits: str = "uniform"


class CollectiveRow(Frozen):
    """One measured collective (other keys of the line are kept in the file, not read)."""

    model_config = {**Frozen.model_config, "extra": "ignore"}

    op: str
    splits: str = "uniform"
    group: PositiveInt
    bytes: PositiveFloat
    time_s: PositiveFloat
    timing: str | None = Field(None, description="how the row was timed, if it says "
                               "(``cuda_events`` is ``events``); else the suite's timing")
    #: ``splits: table``: bytes group rank s sends to rank j, and the pattern's name
    table_bytes: tuple[tuple[NonNegativeInt, ...], ...] | None = None
    pattern: str = ""

    @property
    def timed(self) -> str | None:
        """The row's own timing, ``cuda_events`` read as ``events``."""
        return "events" if self.timing == "cuda_events" else self.timing


def load_suite(path: str | Path) -> WorkloadSuite | CollectiveSuite:
    """Read and validate a suite file; every problem is one ConfigError naming the field."""
    p = Path(path)
    data = read_yaml(p, what="validation suite")
    check_kind(data, "validation suite", p)
    kind = data.get("kind", "workloads")
    model = {"workloads": WorkloadSuite, "collectives": CollectiveSuite}.get(kind)
    if model is None:
        raise ConfigError(
            f"unknown suite kind {kind!r} (accepted: workloads, collectives)",
            file=str(p),
            field="kind",
        )
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise pydantic_to_config_error(e, model, file=str(p)) from None


def collective_rows(
    suite_path: Path, suite: CollectiveSuite, n_gpus: int
) -> list[CollectiveRow]:
    """The measured rows of ``suite.ops`` (JSON lines), each checked; a group larger than the
    topology, a malformed line or no matching row at all is a ConfigError."""
    data_path = suite_path.parent / suite.data
    text = read_bounded(data_path, what="measured data", limit=MAX_DATA_BYTES)
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {n}"
        try:
            raw = json.loads(line, parse_constant=_no_constant)
        except (json.JSONDecodeError, ValueError) as e:
            raise ConfigError(f"not a JSON object: {e}", file=str(data_path), field=where) from None
        if not isinstance(raw, dict):
            raise ConfigError("not a JSON object", file=str(data_path), field=where)
        try:
            row = CollectiveRow.model_validate(raw)
        except ValidationError as e:
            err = pydantic_to_config_error(e, CollectiveRow, file=str(data_path), prefix=where)
            raise err from None
        if row.splits == "-":  # comm.py's mark on operations other than the all-to-all
            row = row.model_copy(update={"splits": "uniform"})
        if row.op not in suite.ops or row.splits not in suite.splits:
            continue
        if row.splits not in SPLITS:
            raise ConfigError(f"unknown all-to-all splits {row.splits!r} (accepted: "
                              f"{', '.join(SPLITS)})", file=str(data_path), field=f"{where}.splits")
        if row.timed is not None and row.timed != suite.timing:
            continue
        if row.splits == "table" and (
            row.table_bytes is None or len(row.table_bytes) != row.group
            or any(len(r) != row.group for r in row.table_bytes)
        ):
            raise ConfigError(f"splits 'table' needs table_bytes, {row.group} rows of "
                              f"{row.group} byte counts", file=str(data_path),
                              field=f"{where}.table_bytes")
        if row.group > n_gpus:
            raise ConfigError(
                f"a group of {row.group} GPUs, but the topology {suite.topology!r} has "
                f"{n_gpus} (accepted: 1..{n_gpus})",
                file=str(data_path),
                field=f"{where}.group",
            )
        rows.append(row)
    if not rows:
        raise ConfigError(
            f"no measured row of {', '.join(suite.ops)} in {suite.data!r}: nothing to check",
            file=str(suite_path),
            field="data",
        )
    return rows


def frozen_predictions(suite_path: Path, suite: CollectiveSuite) -> dict[tuple, float]:
    """{(op, group, bytes, splits): predicted_s} of the suite's ``predictions`` file (empty if
    none); a malformed file is a ConfigError naming the row."""
    if not suite.predictions:
        return {}
    path = suite_path.parent / suite.predictions
    data = read_yaml(path, what="predictions file")
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ConfigError("no rows (accepted: a mapping with a non-empty list 'rows')",
                          file=str(path), field="rows")
    out = {}
    for i, raw in enumerate(rows):
        try:
            row = FrozenPrediction.model_validate(raw)
        except ValidationError as e:
            raise pydantic_to_config_error(e, FrozenPrediction, file=str(path),
                                           prefix=f"rows.{i}") from None
        splits = "uniform" if row.splits == "-" else row.splits
        out[(row.op, row.group, float(row.bytes), splits)] = row.predicted_s
    return out


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")

