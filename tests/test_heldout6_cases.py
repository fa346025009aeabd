"""The sixth, seventh and eighth held-out batches' ``steps_alt.py`` workloads describe what their measuring script does.

``benchmarks/device/steps_alt.py`` (which needs torch, absent in CI) is read as source: its
``SHAPES`` and ``CASES`` tables (with the later batches' ``SHAPES.update``, ``CASES7`` and ``CASES8``) are parsed, not
imported. Each case must have a workload in ``validation/heldout6/`` (``h7_*``: ``heldout7/``) that says the same shape, batch, layout, precision and schedule, on a
topology of the case's GPU count, and the suite templates must become valid suites once
measured figures are filled in.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from simulator.validate import prepare_suite

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device" / "steps_alt.py"
DIR = ROOT / "validation" / "heldout6"


def _table(name: str) -> dict[str, dict]:
    """The module-level ``name = {key: dict(k=v, ...)}`` of the script, as plain dicts."""
    tree = ast.parse(SCRIPT.read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            out = {}
            for k, v in zip(node.value.keys, node.value.values, strict=True):
                assert isinstance(v, ast.Call) and v.func.id == "dict"
                out[ast.literal_eval(k)] = {kw.arg: ast.literal_eval(kw.value) for kw in v.keywords}
            return out
    raise AssertionError(f"{name} not found in {SCRIPT}")


def _shapes_update() -> dict[str, dict]:
    """The shapes the script adds with ``SHAPES.update({...})``."""
    out = {}
    for node in ast.parse(SCRIPT.read_text()).body:
        call = getattr(node, "value", None)
        if (isinstance(node, ast.Expr) and isinstance(call, ast.Call)
                and getattr(call.func, "attr", None) == "update"
                and getattr(call.func.value, "id", None) == "SHAPES"):
            for k, v in zip(call.args[0].keys, call.args[0].values, strict=True):
                out[ast.literal_eval(k)] = {kw.arg: ast.literal_eval(kw.value) for kw in v.keywords}
    return out


SHAPES = {**_table("SHAPES"), **_shapes_update()}
CASES = {**_table("CASES"), **_table("CASES7"), **_table("CASES8")}


def _dir(name: str) -> Path:
    """The folder of case ``name``'s workload: ``h6_*`` in heldout6, ``h7_*`` in heldout7, ..."""
    return ROOT / "validation" / f"heldout{name[1]}"


def _gpus(workload: Path, topo: str) -> int:
    t = yaml.safe_load((workload.parent / topo).read_text())
    return t["nodes"] * t["gpus_per_node"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_workload_says_what_the_script_does(name):
    c, path = CASES[name], _dir(name) / f"{name}.yaml"
    s = SHAPES[c["shape"]]
    w = yaml.safe_load(path.read_text())
    m, t, p = w["model"], w["training"], w["parallelism"]
    scheme, world = c["scheme"], c["world"]
    moe = "experts" in s
    assert (m["layers"], m["hidden"], m["heads"], m["vocab"], m["seq_len"]) == (
        s["layers"], s["hidden"], s["heads"], s["vocab"], s["seq"])
    assert m.get("kv_heads", m["heads"]) == m["heads"]  # MHA: c_attn makes q, k and v per head
    assert (m["activation"], m["norm"], t["kernels"]) == ("gelu", "layernorm", "eager")
    assert m["tied_embeddings"] is (scheme not in ("tp", "pp"))
    if moe:
        assert m["moe"] == {"experts": s["experts"], "top_k": s["top_k"],
                            "ffn_hidden": s["expert_ffn"]}
    else:
        assert m["ffn_hidden"] == 4 * s["hidden"]
    tp = world if scheme == "tp" else 1
    pp = world if scheme == "pp" else 1
    dp = world if scheme in ("ddp", "fsdp", "moe") else 1
    assert (p["tp"], p["pp"], p["dp"], p.get("ep", 1)) == (tp, pp, dp, world if moe else 1)
    assert _gpus(path, w["cluster"]["topology"]) == world
    assert t["micro_batch"] == c["mb"]
    assert t["global_batch"] == c["mb"] * c["n_mb"] * dp
    assert p["zero"] == (3 if scheme == "fsdp" else 0)
    assert t["param_dtype"] == ("bf16" if scheme == "fsdp" else "fp32")  # FSDP2 MP vs autocast
    assert t["recompute"] == ("full" if c.get("ac") else "none")
    assert p["sequence_parallel"] is bool(c.get("sp"))
    if scheme == "pp":
        assert p["pp_schedule"] == c["schedule"]
        assert p["virtual_stages"] == c.get("v", 1)
    if scheme == "ddp":
        assert (t["ddp_buckets"], t["grad_bucket_MB"], t["overlap_grad_reduce"]) == (
            "separate", 25, True)
    if moe:
        assert (t["ddp_buckets"], t["overlap_grad_reduce"]) == ("none", False)
        assert t["measured_steps"] == [4, 9]  # 3 warm-up and 6 timed steps, a learned router
    stragglers = w.get("faults", {}).get("stragglers", [])
    if c.get("straggler"):
        assert stragglers == [{"gpu": 0, "slowdown": c["straggler"]}]
        assert w["faults"]["straggler_scope"] == "layers"  # the Pacer pads blocks and LM head
    else:
        assert stragglers == []


def test_every_case_has_a_workload_and_no_workload_is_orphaned():
    workloads = {p.stem for b in (6, 7, 8) for p in _dir(f"h{b}").glob(f"h{b}_*.yaml")}
    assert workloads == set(CASES)


@pytest.mark.parametrize("template", ["suite.yaml.in", "memory.yaml.in", "suite-x4.yaml.in",
                                      "memory-x4.yaml.in"])
def test_templates_become_valid_suites_once_measured(template, tmp_path):
    """A template (not read by validate: it has no measured figures) turns into a suite that
    loads, with every workload valid, when a measured figure is added to each case."""
    doc = yaml.safe_load((DIR / template).read_text())
    assert doc["role"] == "held_out"
    for case in doc["cases"]:
        assert "measured" not in case  # filled in after the measurement, never before
        case["measured"] = {doc["metric"]: 1.0}
        case["workload"] = str(DIR / case["workload"])
    out = tmp_path / template[: -len(".in")]
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    prep = prepare_suite(out)
    world = {"suite.yaml.in": (1, 2), "memory.yaml.in": (1, 2)}.get(template, (4,))
    names = {c["name"].split("-", 1)[1] for c in doc["cases"]}
    assert names == {k for k, c in CASES.items() if c["world"] in world and k.startswith("h6_")}
    assert prep.size == len(names)
