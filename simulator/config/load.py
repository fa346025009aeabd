"""Read workload, topology and sweep files into validated, immutable configs.

Everything that can be wrong with an input is reported as one :class:`ConfigError` that names
the file, the dotted field, the bad value and what is accepted, e.g.::

    workloads/x.yaml: parallelism.tpp: unknown key (did you mean 'tp'?)

``--set dotted.key=value`` overrides are applied to the raw mappings before validation; keys
under ``topology.`` go to the topology file in use. Values are parsed as YAML.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from simulator.config.hf import resolve_model
from simulator.config.schema import SweepConfig, TopologyConfig, WorkloadConfig
from simulator.config.yaml_safe import parse_yaml, read_bounded
from simulator.errors import ConfigError


@dataclass(frozen=True)
class LoadedWorkload:
    """A workload with its topology, both validated, and where they came from."""

    workload: WorkloadConfig
    topology: TopologyConfig
    workload_path: Path
    topology_path: Path


# --------------------------------------------------------------------------------------------
# YAML


def read_yaml(path: str | Path, *, what: str = "file") -> dict[str, Any]:
    """Parse a YAML mapping, turning every failure into a one-line ConfigError."""
    text = read_bounded(path, what=what)
    try:
        data = parse_yaml(text)
    except ConfigError as e:
        raise ConfigError(e.detail, file=str(path)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"malformed YAML: {where}{problem}", file=str(path)) from None
    if data is None:
        raise ConfigError("file is empty (expected a YAML mapping)", file=str(path))
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a YAML mapping at the top level, got {type(data).__name__}", file=str(path)
        )
    return data


#: What each kind of input file is for, by the command that takes it.
_KIND_USE = {
    "validation suite": "check it with `simulator validate`",
    "sweep": "run it with `simulator sweep`",
    "workload": "simulate it with `simulator run`",
    "topology": "name it with --topology or a workload's cluster.topology",
}


def _kind_of(data: dict[str, Any]) -> str | None:
    """Which kind of input file ``data`` looks like, by the keys only that kind has."""
    if "cases" in data or data.get("kind") in ("workloads", "collectives"):
        return "validation suite"
    if "base" in data and ("grid" in data or "points" in data):
        return "sweep"
    if "model" in data:
        return "workload"
    if "gpus_per_node" in data or ("gpu" in data and "nodes" in data):
        return "topology"
    return None


def check_kind(data: dict[str, Any], expected: str, path: str | Path) -> None:
    """Refuse a file of another kind (a sweep given to ``run``, a workload to ``validate``)
    on one line saying what it is, rather than with its first key as an unknown key."""
    kind = _kind_of(data)
    if kind is not None and kind != expected:
        raise ConfigError(
            f"this is a {kind} file, not a {expected} file ({_KIND_USE[kind]})", file=str(path)
        )


# --------------------------------------------------------------------------------------------
# pydantic errors -> one line


def _model_at(model: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at ``loc`` (for did-you-mean)."""
    cur: Any = model
    for part in loc:
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return None
        if isinstance(part, int):
            continue
        field = cur.model_fields.get(str(part))
        if field is None:
            return None
        cur = _first_model(field.annotation)
    return cur if isinstance(cur, type) and issubclass(cur, BaseModel) else None


def _first_model(annotation: Any) -> Any:
    """Unwrap Optional/tuple/Union annotations to the BaseModel inside, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """`` (did you mean 'x'?)`` or, failing a close match, the accepted keys."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if close:
        return f" (did you mean '{close[0]}'?)"
    return f" (accepted: {', '.join(sorted(choices))})" if choices else ""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def dotted_path(loc: Sequence[Any]) -> str:
    """``('faults', 'stragglers', 0, 'gpu')`` -> ``faults.stragglers[0].gpu``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def pydantic_to_config_error(
    err: ValidationError, model: type[BaseModel], *, file: str, prefix: str = ""
) -> ConfigError:
    """Convert the first pydantic error into a ConfigError naming the dotted field. A missing
    key is reported after an unknown one: a misspelled required key (``global_bach``) is
    both, and the unknown key's did-you-mean names the fix."""
    errors = err.errors(include_url=False)
    e = errors[0]
    if e["type"] == "missing":
        e = next((x for x in errors if x["type"] == "extra_forbidden"), e)
    loc = [p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    # Drop union-branch tags pydantic inserts (e.g. 'str', 'dict[str,any]').
    loc = [p for p in loc if not (isinstance(p, str) and ("[" in p or p in {"str", "int"}))]
    kind = e["type"]
    msg = e["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
        # A model-level rule ("kv_heads=3 must divide heads=64") names its field first: point
        # the dotted path at it rather than at the whole section.
        # (a dotted name, "moe.layer_freq=...", points at a field of a sub-section)
        owner = _model_at(model, loc)
        first = msg.split("=", 1)[0].split(".") if "=" in msg else [""]
        sub = _model_at(owner, first[:-1]) if owner is not None and len(first) > 1 else owner
        if sub is not None and first[-1] in sub.model_fields:
            loc = [*loc, *first]
    dotted = dotted_path(loc)
    if prefix:
        dotted = f"{prefix}.{dotted}" if dotted else prefix
    if kind == "extra_forbidden":
        owner = _model_at(model, loc[:-1])
        choices = list(owner.model_fields) if owner else []
        return ConfigError(
            "unknown key" + did_you_mean(str(loc[-1]), choices), file=file, field=dotted
        )
    if kind == "missing":
        return ConfigError("required key is missing", file=file, field=dotted)
    got = e.get("input")
    if kind not in {"model_type", "dict_type"} and not isinstance(got, dict):
        msg = f"{msg}, got {_short(got)}"
    return ConfigError(msg[0].lower() + msg[1:], file=file, field=dotted or None)


# --------------------------------------------------------------------------------------------
# --set overrides


def parse_override(text: str) -> tuple[str, Any]:
    """``dotted.key=value`` -> (key, YAML-parsed value)."""
    if "=" not in text:
        raise ConfigError(f"expected dotted.key=value, got {text!r}", file="--set")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"bad key {key!r} (expected dotted.key=value)", file="--set")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    except ConfigError as e:
        raise ConfigError(e.detail, file="--set", field=key) from None
    return key, value


def _check_key(
    model: type[BaseModel], parts: Sequence[str], full: str, root: str = "top level"
) -> None:
    """Refuse an override whose dotted path is not a field of ``model`` (with did-you-mean);
    ``root`` names the model in the message (``topology`` for topology keys)."""
    cur: Any = model
    for i, part in enumerate(parts):
        if not (isinstance(cur, type) and issubclass(cur, BaseModel)):
            return  # inside a free-form mapping (e.g. topology.gpu overrides): leave to validation
        if part not in cur.model_fields:
            where = ".".join(parts[:i])
            where = (f"{root}.{where}" if root != "top level" else where) if where else root
            raise ConfigError(
                f"no such key under {where}" + did_you_mean(part, list(cur.model_fields)),
                file="--set",
                field=full,
            )
        cur = _first_model(cur.model_fields[part].annotation)


def _topology_hint(key: str) -> str:
    """`` (did you mean 'topology.nodes'?)`` for a topology key given without its prefix
    (``nodes``, or a near miss such as ``nodez``); empty when nothing is close."""
    close = difflib.get_close_matches(key.split(".")[0], list(TopologyConfig.model_fields), n=1)
    return f" (did you mean 'topology.{close[0]}'?)" if close else ""


def set_dotted(data: dict[str, Any], parts: Sequence[str], value: Any) -> None:
    """Set ``data[a][b][c] = value`` for parts a.b.c, creating mappings on the way."""
    cur = data
    for part in parts[:-1]:
        nxt = cur.get(part)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[part] = nxt
        cur = nxt
    cur[parts[-1]] = value


def set_topology_key(traw: dict[str, Any], key: str, value: Any) -> None:
    """Apply one topology override. A key under ``gpu.`` on a GPU named by the catalog
    overrides that field of the named GPU (``gpu: H100`` becomes ``{base: H100, ...}``),
    rather than replacing it with an empty custom GPU."""
    parts = key.split(".")
    if len(parts) > 1 and parts[0] == "gpu" and isinstance(traw.get("gpu"), str):
        traw["gpu"] = {"base": traw["gpu"]}
    set_dotted(traw, parts, value)


def split_overrides(
    overrides: Sequence[str] | Mapping[str, Any],
) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """Parse overrides and split them into (workload, topology) lists of (dotted key, value)."""
    items = (
        list(overrides.items())
        if isinstance(overrides, Mapping)
        else [parse_override(o) for o in overrides]
    )
    work, topo = [], []
    for key, value in items:
        if key == "topology" or key.startswith("topology."):
            sub = key[len("topology.") :] if key != "topology" else ""
            if not sub:
                raise ConfigError(
                    "set a topology key (topology.nodes=8) or the file (cluster.topology=FILE)",
                    file="--set",
                    field=key,
                )
            _check_key(TopologyConfig, sub.split("."), key, root="topology")
            topo.append((sub, value))
        else:
            head = key.split(".")[0]
            if head not in WorkloadConfig.model_fields and head in TopologyConfig.model_fields:
                raise ConfigError(
                    "no such key under top level" + _topology_hint(key), file="--set", field=key
                )
            _check_key(WorkloadConfig, key.split("."), key)
            work.append((key, value))
    return work, topo


# --------------------------------------------------------------------------------------------
# Public loaders


def validate_topology(data: dict[str, Any], *, file: str) -> TopologyConfig:
    try:
        return TopologyConfig.model_validate(data)
    except ValidationError as e:
        raise pydantic_to_config_error(e, TopologyConfig, file=file) from None


def validate_workload(data: dict[str, Any], *, file: str) -> WorkloadConfig:
    try:
        return WorkloadConfig.model_validate(data)
    except ValidationError as e:
        raise pydantic_to_config_error(e, WorkloadConfig, file=file) from None


def load_workload(
    path: str | Path,
    overrides: Sequence[str] | Mapping[str, Any] = (),
    *,
    topology: str | Path | None = None,
) -> LoadedWorkload:
    """Load a workload file and its topology, apply overrides, validate both.

    ``topology`` (the CLI's ``--topology``) replaces ``cluster.topology``; it is relative to the
    current directory, while ``cluster.topology`` is relative to the workload file.
    """
    wpath = Path(path)
    raw = read_yaml(wpath, what="workload file")
    check_kind(raw, "workload", wpath)
    work_over, topo_over = split_overrides(overrides)
    for key, value in work_over:
        set_dotted(raw, key.split("."), value)
    raw = resolve_model(raw, wpath)  # model: {from: NAME or config.json}
    workload = validate_workload(raw, file=str(wpath))

    if topology is not None:
        tpath = Path(topology)
    else:
        tpath = Path(workload.cluster.topology)
        if not tpath.is_absolute():
            tpath = Path(os.path.normpath(wpath.parent / tpath))
        if any(k == "cluster.topology" for k, _ in work_over):
            # An override path is read as given (relative to the current directory) if it exists.
            given = Path(workload.cluster.topology)
            if given.exists():
                tpath = given
    if topology is not None and not tpath.exists():
        raise ConfigError(f"topology file {str(tpath)!r} does not exist", file="--topology")
    if not tpath.exists():
        raise ConfigError(
            f"topology file {str(tpath)!r} does not exist",
            file=str(wpath),
            field="cluster.topology",
        )
    traw = read_yaml(tpath, what="topology file")
    check_kind(traw, "topology", tpath)
    for key, value in topo_over:
        set_topology_key(traw, key, value)
    topo = validate_topology(traw, file=str(tpath))
    return LoadedWorkload(workload, topo, wpath, tpath)


def load_topology(path: str | Path, overrides: Sequence[str] = ()) -> TopologyConfig:
    """Load a topology file on its own (for ``collective`` and ``compare``)."""
    raw = read_yaml(path, what="topology file")
    check_kind(raw, "topology", path)
    for text in overrides:  # a key outside the topology, or one written without its prefix
        key = parse_override(text)[0]
        if key != "topology" and not key.startswith("topology."):
            raise ConfigError(
                "only topology keys can be set here, as topology.KEY=VALUE" + _topology_hint(key),
                file="--set",
                field=key,
            )
    _, topo_over = split_overrides(overrides)
    for key, value in topo_over:
        set_topology_key(raw, key, value)
    return validate_topology(raw, file=str(path))


def load_sweep(path: str | Path) -> SweepConfig:
    """Load and validate a sweep file (keys are checked against the workload schema)."""
    raw = read_yaml(path, what="sweep file")
    check_kind(raw, "sweep", path)
    try:
        sweep = SweepConfig.model_validate(raw)
    except ValidationError as e:
        raise pydantic_to_config_error(e, SweepConfig, file=str(path)) from None
    if not sweep.grid and not sweep.points:
        raise ConfigError("the sweep is empty: give a grid or points", file=str(path), field="grid")
    for key, values in sweep.grid.items():
        if len(values) == 0:
            raise ConfigError("no values to sweep", file=str(path), field=f"grid.{key}")
        for j, value in enumerate(values):
            _check_finite(value, file=str(path), field=f"grid.{key}[{j}]")
        try:
            split_overrides({key: values[0]})
        except ConfigError as e:
            raise ConfigError(e.detail, file=str(path), field=f"grid.{key}") from None
    for i, point in enumerate(sweep.points):
        for key, value in point.items():
            _check_finite(value, file=str(path), field=f"points[{i}].{key}")
        try:
            split_overrides(point)
        except ConfigError as e:
            raise ConfigError(e.detail, file=str(path), field=f"points[{i}].{e.field}") from None
    return sweep


def _check_finite(value: Any, *, file: str, field: str) -> None:
    """Refuse NaN and infinities anywhere in a swept value (no input key accepts them)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{v} is not a finite number", file=file, field=field)
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
