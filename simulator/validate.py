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
collective on their own disjoint groups at the same time (as measured); ``timing: host_sync``
when each call was timed with a barrier and a synchronisation (the host overhead is added to
the prediction), ``device`` (default) for CUDA-event timing::

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

Results report the mean absolute percentage error (MAPE) and the bias (mean signed error,
predicted over measured minus one): a model that is consistently fast or slow shows there.

Paths are relative to the suite file.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.config.load import (
    LoadedWorkload,
    load_topology,
    read_yaml,
    set_dotted,
    split_overrides,
    validate_topology,
    validate_workload,
)
from simulator.errors import ConfigError
from simulator.hardware.catalog import load_gpu
from simulator.network.collectives import CollectiveModel
from simulator.network.topology import Topology
from simulator.run import simulate


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


ROLES = ("fit", "development", "held_out")


@dataclass
class SuiteResult:
    name: str
    cases: list[CaseResult]
    checks: list[tuple[str, float, float]]  # (what, value, limit)
    role: str = ""
    role_note: str = ""
    # (what, MAPE, bias, cases) of each band's cases, for collective suites
    bands: list[tuple[str, float, float, int]] = field(default_factory=list)

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
        raw = _merge(defaults, read_yaml(wpath, what="workload file"))
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
    work_over, topo_over = split_overrides(dict(overrides))
    for key, value in work_over:
        set_dotted(raw, key.split("."), value)
    work = validate_workload(raw, file=f"{suite_path} ({where})")
    tpath = Path(work.cluster.topology)
    if not tpath.is_absolute():
        tpath = wpath.parent / tpath
    traw = read_yaml(tpath, what="topology file")
    for key, value in topo_over:
        set_dotted(traw, key.split("."), value)
    topo = validate_topology(traw, file=str(tpath))
    return LoadedWorkload(work, topo, wpath, tpath)


def run_workload_suite(path: Path, data: dict, progress=None) -> SuiteResult:
    metric = data.get("metric", "step_time_s")
    defaults = data.get("defaults") or {}
    cases = data.get("cases") or []
    if not cases:
        raise ConfigError("the suite has no cases", file=str(path), field="cases")
    results = []
    for i, case in enumerate(cases):
        loaded = load_case(path, defaults, case, i)
        measured = (case.get("measured") or {}).get(metric)
        if measured is None:
            raise ConfigError(f"no measured {metric}", file=str(path), field=f"cases[{i}].measured")
        res = simulate(loaded)
        s = res.summary
        predicted = summary_value(s, metric)
        if not isinstance(predicted, (int, float)):
            raise ConfigError(f"the summary has no number at {metric!r}", file=str(path),
                              field="metric")
        extra = {"mfu": s["mfu"], "tflops_per_gpu": s["tflops_per_gpu"], "fits": s["fits"],
                 "memory_gib": s["memory_gib"]["total"]}
        for k, v in (case.get("measured") or {}).items():
            if k != metric and isinstance(summary_value(s, k), (int, float)):
                extra[f"{k} measured"] = v
        results.append(CaseResult(data.get("name", path.stem), case.get("name", f"case{i}"),
                                  metric, float(predicted), float(measured),
                                  str(case.get("source", "")), extra))
        if progress:
            progress()
    checks = [("MAPE", mape(results), float(data.get("tolerance_mape", 0.10)))]
    if "tolerance_max" in data:
        checks.append(("max |error|", max(abs(r.error) for r in results),
                       float(data["tolerance_max"])))
    return SuiteResult(data.get("name", path.stem), results, checks)


def run_collective_suite(path: Path, data: dict, progress=None) -> SuiteResult:
    topo_cfg = load_topology(path.parent / data["topology"])
    gpu = load_gpu(topo_cfg.gpu, file=str(path.parent / data["topology"]), field="gpu")
    topo = Topology(topo_cfg, gpu)
    coll = CollectiveModel(topo)
    ops = set(data.get("ops") or ["all_reduce", "all_gather", "reduce_scatter"])
    # How the data was timed: "device" (CUDA events, as nccl-tests and a training step see a
    # collective) or "host_sync" (a barrier and a device synchronisation around each call,
    # which adds the host overhead of fabrics.yaml's host_sync_overhead_us).
    timing = data.get("timing", "device")
    if timing not in ("device", "host_sync"):
        raise ConfigError(f"unknown timing {timing!r} (accepted: device, host_sync)",
                          file=str(path), field="timing")
    host = coll.host_sync_overhead_s if timing == "host_sync" else 0.0
    rows = [json.loads(line) for line in (path.parent / data["data"]).read_text().splitlines()
            if line.strip()]
    results = []
    splits = set(data.get("splits") or ["uniform"])  # all-to-all rows: which split patterns
    for r in rows:
        if r.get("op") not in ops or r.get("splits", "uniform") not in splits:
            continue
        g = int(r["group"])
        groups = [list(range(i, i + g)) for i in range(0, topo.n_gpus - g + 1, g)]
        cost = coll.cost(r["op"], groups, float(r["bytes"]))
        predicted = cost.time_s + host
        results.append(CaseResult(data.get("name", path.stem), f"{r['op']} g{g} {r['bytes']}B",
                                  "time_s", predicted, float(r["time_s"]), "",
                                  {"op": r["op"], "group": g, "bytes": r["bytes"]}))
        if progress:
            progress()
    checks, bands = [], []
    for band in data.get("bands") or [{"name": "all", "tolerance_mape": 0.10}]:
        lo, hi = band.get("min_bytes", 0), band.get("max_bytes", float("inf"))
        in_band = [c for c in results if lo <= c.extra["bytes"] <= hi]
        if in_band:
            bands.append((band["name"], mape(in_band), bias(in_band), len(in_band)))
        for op in sorted(ops):
            for g in sorted({c.extra["group"] for c in results}):
                sel = [c for c in results if c.extra["op"] == op and c.extra["group"] == g
                       and lo <= c.extra["bytes"] <= hi]
                if sel:
                    checks.append((f"{op} group {g} {band['name']} MAPE", mape(sel),
                                   float(band["tolerance_mape"])))
    return SuiteResult(data.get("name", path.stem), results, checks, bands=bands)


def run_suite(path: str | Path, progress=None) -> SuiteResult:
    """Run one suite file."""
    p = Path(path)
    data: dict[str, Any] = read_yaml(p, what="validation suite")
    kind = data.get("kind", "workloads")
    role = check_role(p, data)
    if kind == "workloads":
        res = run_workload_suite(p, data, progress)
    elif kind == "collectives":
        res = run_collective_suite(p, data, progress)
    else:
        raise ConfigError(f"unknown suite kind {kind!r} (accepted: workloads, collectives)",
                          file=str(p), field="kind")
    res.role, res.role_note = role, str(data.get("role_note", "")).strip()
    return res


def check_role(path: Path, data: Mapping) -> str:
    """The suite's ``role`` (how it was used); a ConfigError when missing or unknown."""
    role = data.get("role")
    if role not in ROLES:
        raise ConfigError(f"{'missing' if role is None else repr(role)}: say how the suite was "
                          f"used (accepted: {', '.join(ROLES)})", file=str(path), field="role")
    return role


def suite_size(path: str | Path) -> int:
    """Cases in a suite (for a progress bar); checks its ``role`` first, so that a bad suite
    is reported before anything is drawn."""
    p = Path(path)
    data = read_yaml(p, what="validation suite") or {}
    check_role(p, data)
    return len(data.get("cases") or []) or 1
