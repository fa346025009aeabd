"""Validation suites: predictions held against measured or published figures.

A suite is a YAML file of one of two kinds.

``kind: workloads`` (default) -- each case is a workload (a path, or an inline mapping merged
over the suite's ``defaults``) plus ``set`` overrides, the measured figures and their source::

    name: megatron-published
    metric: step_time_s            # the summary key compared (dotted into nested keys:
                                   # memory_gib.allocated); ``measured`` uses the same name
    tolerance_mape: 0.10           # mean absolute percentage error allowed
    tolerance_max: 0.20            # no case off by more than this
    defaults: {training: {...}, cluster: {topology: ../topologies/x.yaml}}
    cases:
      - {name: ..., workload: {...} | path, set: {topology.nodes: 4}, measured: {step_time_s: 3.5},
         source: ...}

``kind: collectives`` -- measured NCCL collectives (JSON lines as in ``data/calibration``) on a
topology; ``groups`` GPUs per collective, with the other GPUs of the box running the same
collective on their own disjoint groups at the same time (as measured); ``timing`` says how
the rows were timed, and a row whose own ``timing`` field says otherwise is not read:
``device`` (default: the GPU's own time, nccl-tests style), ``events`` (a CUDA event between
calls a Python loop issues back to back: predicted as the longer of the device time and the
host's interval between two calls, the box's gpus.yaml ``host_events_call_s``, for an
all-to-all ``host_events_a2a_s`` with its part per peer), ``loop`` (a Python loop of N
calls back to back between one pair of CUDA events, the interval over N: nccl-tests' method
as PyTorch all-to-all benchmarks use it; the longer of the device time and that host
interval less the event record a call, gpus.yaml ``host_event_record_s``), ``host_sync`` (a
barrier and a synchronisation around each call: the host overhead is added)::

    kind: collectives
    data: ../data/calibration/h200x4-nvswitch/collectives.jsonl
    topology: ../topologies/h200x4-nvswitch.yaml
    ops: [all_reduce, all_gather, reduce_scatter]
    bands: [{name: ">= 1 MiB", min_bytes: 1048576, tolerance_mape: 0.10}, ...]

Every suite says how it was used (``role``), because a suite looked at while choosing the
model cannot measure how well the model predicts what it has not seen::

    role: fit            # constants were fitted on this data (it measures the fit, nothing more)
    role: development    # not fitted, but looked at while choosing or adjusting the model
    role: held_out       # never seen before the model was frozen
    role_note: what was chosen on it, or when it was frozen
    held_out_until: TAG  # pre-registered, predicted once at TAG (the cases' predicted_at_freeze),
                         # looked at since: role development; validate reports both results
    predicted_at: TAG    # role held_out: the tag of its one prediction (not looked at since)
    summary: a few words # and ``note:`` one short remark: the README's table (validate --markdown)

Results report the mean absolute percentage error (MAPE) and the bias (mean signed error,
predicted over measured minus one): a model that is consistently fast or slow shows there.

Paths are relative to the suite file.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.config.load import (
    LoadedWorkload,
    check_kind,
    load_topology,
    read_yaml,
    set_dotted,
    set_topology_key,
    split_overrides,
    validate_topology,
    validate_workload,
)
from simulator.config.suite import (
    CollectiveRow,
    CollectiveSuite,
    WorkloadSuite,
    collective_rows,
    frozen_predictions,
    load_suite,
)
from simulator.errors import ConfigError
from simulator.hardware.catalog import load_gpu
from simulator.network.alignment import measured_stores, narrow_time, split_table
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import build_topology
from simulator.run import resolve_loaded, simulate


@dataclass
class CaseResult:
    suite: str
    name: str
    metric: str
    predicted: float
    measured: float
    source: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


@dataclass
class SuiteResult:
    name: str
    cases: list[CaseResult]
    checks: list[tuple[str, float, float]]  # (what, value, limit)
    role: str = ""
    role_note: str = ""
    # (what, MAPE, bias, cases) of each band's cases, for collective suites
    bands: list[tuple[str, float, float, int]] = field(default_factory=list)
    #: a once-held-out suite: the tag of its one prediction, and (MAPE, bias, cases) there
    held_out_until: str = ""
    at_freeze: tuple[float, float, int] | None = None
    #: a pre-registered suite's prediction tag (``held_out_until``, or ``predicted_at`` while
    #: still held out); the suite file, and its few words and note for the README's table
    frozen_tag: str = ""
    path: Path | None = None
    summary: str = ""
    note: str = ""

    @property
    def mape(self) -> float:
        return mape(self.cases)

    @property
    def bias(self) -> float:
        return bias(self.cases)

    @property
    def passed(self) -> bool:
        return all(v <= lim for _, v, lim in self.checks)


def _merge(base: Mapping, over: Mapping) -> dict:
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def summary_value(summary: Mapping, metric: str) -> Any:
    """The summary's value at a dotted key path (``step_time_s``, ``memory_gib.allocated``);
    None when a part of the path is missing."""
    v: Any = summary
    for part in metric.split("."):
        if not isinstance(v, Mapping) or part not in v:
            return None
        v = v[part]
    return v


def mape(results: list[CaseResult]) -> float:
    return sum(abs(r.error) for r in results) / len(results) if results else 0.0


def bias(results: list[CaseResult]) -> float:
    """Mean signed error: negative when the model predicts too little (too fast)."""
    return sum(r.error for r in results) / len(results) if results else 0.0


def load_case(suite_path: Path, defaults: Mapping, case: Mapping, idx: int) -> LoadedWorkload:
    """A suite case as a LoadedWorkload (inline or path workload, defaults, overrides)."""
    where = f"cases[{idx}]"
    wl = case.get("workload")
    if isinstance(wl, str):
        wpath = suite_path.parent / wl
        raw = read_yaml(wpath, what="workload file")
        check_kind(raw, "workload", wpath)
        raw = _merge(defaults, raw)
    elif isinstance(wl, Mapping):
        wpath = suite_path
        raw = _merge(defaults, wl)
        # A case name is free text; the workload's name is a folder-safe label.
        label = re.sub(r"[^A-Za-z0-9._+-]+", "-", str(case.get("name", f"case{idx}")))
        raw.setdefault("name", label.strip("-._+")[:100] or f"case{idx}")
    else:
        raise ConfigError("give a workload path or mapping", file=str(suite_path),
                          field=f"{where}.workload")
    overrides = case.get("set") or {}
    if not isinstance(overrides, Mapping):
        raise ConfigError("expected a mapping of dotted keys", file=str(suite_path),
                          field=f"{where}.set")
    try:
        work_over, topo_over = split_overrides(dict(overrides))
    except ConfigError as e:
        raise ConfigError(e.detail, file=str(suite_path), field=f"{where}.set.{e.field}") from None
    for key, value in work_over:
        set_dotted(raw, key.split("."), value)
    work = validate_workload(raw, file=f"{suite_path} ({where})")
    tpath = Path(work.cluster.topology)
    if not tpath.is_absolute():
        tpath = wpath.parent / tpath
    traw = read_yaml(tpath, what="topology file")
    check_kind(traw, "topology", tpath)
    for key, value in topo_over:
        set_topology_key(traw, key, value)
    topo = validate_topology(traw, file=str(tpath))
    return LoadedWorkload(work, topo, wpath, tpath)


@dataclass
class PreparedSuite:
    """A suite checked whole, ready to run: its workload cases (loaded and resolved) or its
    measured collective rows. Preparing every suite before running any means a bad suite is
    reported (one ``error:`` line) before anything is printed."""

    path: Path
    suite: WorkloadSuite | CollectiveSuite
    cases: list[LoadedWorkload] = field(default_factory=list)
    rows: list[CollectiveRow] = field(default_factory=list)
    collectives: CollectiveModel | None = None
    frozen: dict[tuple, float] = field(default_factory=dict)  # predictions at the freeze tag

    @property
    def size(self) -> int:
        return len(self.cases) or len(self.rows)


def prepare_suite(path: str | Path) -> PreparedSuite:
    """Read, validate and load a suite file (see :mod:`simulator.config.suite`)."""
    p = Path(path)
    suite = load_suite(p)
    if isinstance(suite, WorkloadSuite):
        cases = []
        for i, case in enumerate(suite.cases):
            loaded = load_case(p, suite.defaults, case.model_dump(), i)
            try:
                resolve_loaded(loaded)  # a layout that does not fit the cluster fails here
            except ConfigError as e:
                # The case's defaults and set made this workload: name the case, as the
                # schema's errors do, rather than a workload file that may be valid alone.
                if e.file != str(loaded.workload_path):
                    raise
                raise ConfigError(e.detail, file=f"{p} (cases[{i}])", field=e.field) from None
            cases.append(loaded)
        return PreparedSuite(p, suite, cases=cases)
    tpath = p.parent / suite.topology
    topo_cfg = load_topology(tpath)
    gpu = load_gpu(topo_cfg.gpu, file=str(tpath), field="gpu")
    topo = build_topology(topo_cfg, gpu, file=str(tpath))
    rows = collective_rows(p, suite, topo.n_gpus)
    return PreparedSuite(p, suite, rows=rows, collectives=CollectiveModel(topo),
                         frozen=frozen_predictions(p, suite))


def run_workload_suite(prep: PreparedSuite, progress=None) -> SuiteResult:
    suite, path = prep.suite, prep.path
    metric = suite.metric
    results = []
    for i, (case, loaded) in enumerate(zip(suite.cases, prep.cases, strict=True)):
        measured = case.measured[metric]
        s = simulate(loaded).summary
        predicted = summary_value(s, metric)
        if not isinstance(predicted, (int, float)):
            raise ConfigError(f"the summary has no number at {metric!r}", file=str(path),
                              field="metric")
        extra = {"mfu": s["mfu"], "tflops_per_gpu": s["tflops_per_gpu"], "fits": s["fits"],
                 "memory_gib": s["memory_gib"]["total"]}
        for k, v in case.measured.items():
            if k != metric and isinstance(summary_value(s, k), (int, float)):
                extra[f"{k} measured"] = v
        results.append(CaseResult(suite.name, case.name or f"case{i}", metric, float(predicted),
                                  float(measured), case.source, extra))
        if progress:
            progress()
    checks = [("MAPE", mape(results), suite.tolerance_mape)]
    if suite.tolerance_max is not None:
        checks.append(("max |error|", max(abs(r.error) for r in results), suite.tolerance_max))
    return SuiteResult(suite.name, results, checks)


def timed_collective_s(coll, op: str, groups, nbytes: float, timing: str,
                       splits: str = "uniform", table=None) -> float:
    """What a measurement timed by ``timing`` shows of one collective: the GPU's time
    (``device``), the longer of it and the host's interval between back-to-back calls
    (``events``: the box's gpus.yaml ``host_events_call_s``, for an all-to-all its
    ``host_events_a2a_s`` plus its ``host_events_peer_s`` per peer), the longer of it and that
    interval less the event recorded after each call (``loop``: calls back to back between one
    pair of events, the interval over the calls; gpus.yaml ``host_event_record_s``), or it plus
    the host overhead of a barrier and a synchronisation around the call (``host_sync``). The device time is NCCL's with the measuring scripts'
    buffers: each rank's share cut as ``benchmarks/device/comm.py`` cuts it, so the parts off a
    16-byte boundary run NCCL's narrow copies (:mod:`simulator.network.alignment`). An
    all-to-all with ``comm.py``'s uneven ``splits`` (``rotated``, ``hot``) or a row's own
    ``table`` of bytes (``splits: table``) is priced part by part, its parts laid out in rank
    order (``CollectiveModel.all_to_all_table``)."""
    n = max(len(g) for g in groups)
    if op == "all_to_all" and splits != "uniform":
        if splits == "table":
            table = [[float(b) for b in row] for row in table]
        else:
            table = split_table(splits, n, nbytes)  # comm.py's layout of the parts
        t = coll.all_to_all_table(groups, table).time_s
    else:
        t = narrow_time(coll.cost(op, groups, nbytes), measured_stores(op, n, nbytes),
                        coll.unaligned_Bps)
    return coll.timed_s(t, op, n, timing, splits)


def run_collective_suite(prep: PreparedSuite, progress=None) -> SuiteResult:
    suite, coll = prep.suite, prep.collectives
    # as the suite's rows were timed (timed_collective_s)
    n_gpus = coll.topology.n_gpus
    results = []
    for r in prep.rows:
        g = r.group
        groups = [list(range(i, i + g)) for i in range(0, n_gpus - g + 1, g)]
        predicted = timed_collective_s(coll, r.op, groups, r.bytes, suite.timing, r.splits,
                                       r.table_bytes)
        nbytes = int(r.bytes) if float(r.bytes).is_integer() else r.bytes
        kind = r.pattern or r.splits
        label = f"{r.op}{'' if r.splits == 'uniform' else ' ' + kind} g{g} {nbytes}B"
        results.append(CaseResult(suite.name, label, "time_s", predicted, r.time_s, "",
                                  {"op": r.op, "group": g, "bytes": nbytes,
                                   "splits": r.splits}))
        if progress:
            progress()
    checks, bands = [], []
    for band in suite.bands:
        lo = band.min_bytes
        hi = band.max_bytes if band.max_bytes is not None else float("inf")
        in_band = [c for c in results if lo <= c.extra["bytes"] <= hi]
        if in_band:
            bands.append((band.name, mape(in_band), bias(in_band), len(in_band)))
        kinds = sorted({(c.extra["op"], c.extra["splits"]) for c in results},
                       key=lambda k: (k[0], k[1] != "uniform", k[1]))
        for op, sp in kinds:
            name = op if sp == "uniform" else f"{op} {sp}"
            for g in sorted({c.extra["group"] for c in results}):
                sel = [c for c in results if (c.extra["op"], c.extra["splits"]) == (op, sp)
                       and c.extra["group"] == g and lo <= c.extra["bytes"] <= hi]
                if sel:
                    checks.append((f"{name} group {g} {band.name} MAPE", mape(sel),
                                   band.tolerance_mape))
    return SuiteResult(suite.name, results, checks, bands=bands)


def run_prepared(prep: PreparedSuite, progress=None) -> SuiteResult:
    """Run a prepared suite."""
    if isinstance(prep.suite, WorkloadSuite):
        res = run_workload_suite(prep, progress)
    else:
        res = run_collective_suite(prep, progress)
    res.role, res.role_note = prep.suite.role, prep.suite.role_note.strip()
    res.held_out_until, res.frozen_tag = prep.suite.held_out_until, prep.suite.frozen_tag
    res.path, res.summary, res.note = prep.path, prep.suite.summary, prep.suite.note
    # the held-out result of a pre-registered suite: its predictions recorded at the freeze
    if isinstance(prep.suite, WorkloadSuite):
        res.at_freeze = frozen_result(prep.suite)
    elif prep.frozen:
        errs = [prep.frozen[k] / r.time_s - 1.0 for r in prep.rows
                if (k := (r.op, r.group, float(r.bytes), r.splits)) in prep.frozen]
        if errs:
            res.at_freeze = (sum(abs(e) for e in errs) / len(errs), sum(errs) / len(errs),
                             len(errs))
    return res


def frozen_result(suite: WorkloadSuite) -> tuple[float, float, int] | None:
    """(MAPE, bias, cases) of the predictions a pre-registered suite recorded when the model
    was frozen (``predicted_at_freeze``): its held-out result, whatever the model is now."""
    errs = [c.predicted_at_freeze[suite.metric] / c.measured[suite.metric] - 1.0
            for c in suite.cases if suite.metric in c.predicted_at_freeze]
    if not errs:
        return None
    return sum(abs(e) for e in errs) / len(errs), sum(errs) / len(errs), len(errs)


def run_suite(path: str | Path, progress=None) -> SuiteResult:
    """Run one suite file."""
    return run_prepared(prepare_suite(path), progress)
