"""Write the seventh held-out batch's workloads (``h7_*.yaml``) from the sixth's.

Each case of ``CASES7`` in ``benchmarks/device/steps_alt.py`` runs the same scheme of the same
script as a sixth-batch case, on a new shape and batch: its workload is that case's workload
(``validation/heldout6/``, whatever keys it carries) with the shape, batch, layout size,
topology and straggler factor of the new case. Run before the freeze; ``python
validation/heldout7/generate.py`` rewrites every ``h7_*.yaml`` here.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from simulator.calibrate.routes import INIT_RANKS, INIT_ROUTER  # noqa: E402

SIX = ROOT / "validation" / "heldout6"
HERE = Path(__file__).resolve().parent
TOPOLOGY = {1: "../heldout6/h100x1.yaml", 2: "../../topologies/h100x2-nvswitch.yaml",
            4: "../../topologies/h100x4-nvswitch.yaml"}
ORDINAL = {7: "seventh", 8: "eighth", 9: "ninth", 10: "tenth", 11: "eleventh", 12: "twelfth",
           13: "thirteenth", 14: "fourteenth", 15: "fifteenth", 16: "sixteenth", 17: "seventeenth",
           18: "eighteenth", 19: "nineteenth"}


def tables(var: str = "CASES7", script: str = "steps_alt.py") -> tuple[dict, dict]:
    """(SHAPES with every update, the case table ``var``) read from the measuring script's
    source (``benchmarks/device/<script>``; parsed, not imported: it needs torch)."""
    tree = ast.parse((ROOT / "benchmarks" / "device" / script).read_text())
    shapes, cases = {}, {}

    def entries(d: ast.Dict) -> dict:
        return {ast.literal_eval(k): {kw.arg: ast.literal_eval(kw.value) for kw in v.keywords}
                for k, v in zip(d.keys, d.values, strict=True)}

    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SHAPES":
            shapes.update(entries(node.value))
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == var:
            cases = entries(node.value)
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "attr", None) == "update"
                and getattr(node.value.func.value, "id", None) == "SHAPES"):
            shapes.update(entries(node.value.args[0]))
    return shapes, cases


def template(c: dict) -> str:
    """The sixth-batch case whose scheme the new case repeats."""
    s = c["scheme"]
    if s == "ddp":
        return "h6_ddp2_U_straggler" if c.get("straggler") else "h6_ddp2_U"
    if s == "fsdp":
        return "h6_fsdp2_V_ac" if c.get("ac") else "h6_fsdp2_U"
    if s == "tp":
        return "h6_tp2sp_V" if c.get("sp") else "h6_tp2_U"
    if s == "pp":
        return {"gpipe": "h6_pp4_gpipe_V", "1f1b": "h6_pp2_1f1b_V",
                "interleaved": "h6_pp2_int2_V"}[c["schedule"]]
    return {"single": "h6_single_U", "moe": "h6_moe_ep2_W"}[s]


def main(batch: int = 7, out: Path = HERE) -> None:
    """Write ``out/<case>.yaml`` for every case of the script's ``CASES<batch>``."""
    shapes, cases = tables(f"CASES{batch}")
    for name, c in cases.items():
        src = SIX / f"{template(c)}.yaml"
        w = yaml.safe_load(src.read_text())
        s, world = shapes[c["shape"]], c["world"]
        m = w["model"]
        m.update(layers=s["layers"], hidden=s["hidden"], heads=s["heads"], kv_heads=s["heads"],
                 vocab=s["vocab"], seq_len=s["seq"])
        if "experts" in s:
            m["ffn_hidden"] = s["expert_ffn"]
            m["moe"] = {"experts": s["experts"], "top_k": s["top_k"], "ffn_hidden": s["expert_ffn"]}
        else:
            m["ffn_hidden"] = 4 * s["hidden"]
        p, t = w["parallelism"], w["training"]
        dp = world if c["scheme"] in ("ddp", "fsdp", "moe") else 1
        if c["scheme"] == "pp":
            p["pp"] = world
        if c["scheme"] == "tp":
            p["tp"] = world
        p["dp"] = dp
        if "ep" in p:
            p["ep"] = world
        t["micro_batch"], t["global_batch"] = c["mb"], c["mb"] * c["n_mb"] * dp
        t["grad_clip"] = "none"  # steps_alt.py clips nothing (no clip_grad_norm_)
        top1 = "experts" in s and s["top_k"] == 1
        if top1:
            # steps_alt.py renormalises the top-k weights (w / w.sum(-1)): identically 1 for
            # one expert, so no gradient reaches the router and it never collapses: the
            # routes of a router at initialization (simulator/calibrate/routes.py INIT_*)
            t["moe_route_correlation"], t["moe_rank_correlation"] = INIT_ROUTER, INIT_RANKS
        w["name"] = f"heldout{batch}-{name}"
        w["cluster"]["topology"] = TOPOLOGY[world]
        if c.get("straggler"):
            w["faults"] = dict(w.get("faults") or {},
                               stragglers=[{"gpu": 0, "slowdown": c["straggler"]}])
        head = [ln for ln in src.read_text().splitlines() if ln.startswith("#")][1:]
        text = (f"# Held-out training step {name} ({ORDINAL[batch]} batch, pre-registered; measured by\n"
                f"# benchmarks/device/steps_alt.py, case '{name}'). Generated by generate.py from\n"
                f"# ../heldout6/{src.name} (the same scheme of the same script) with this case's shape,\n"
                f"# batch and layout. What the script does, as for that case:\n"
                + "\n".join(head) + "\n"
                + ("# Top-1: steps_alt.py's router gets no gradient (its weight w / w.sum() is 1), so\n"
                   "# moe_route_correlation and moe_rank_correlation are a router's at initialization\n"
                   "# (simulator/calibrate/routes.py INIT_ROUTER, INIT_RANKS), not the collapsing one's.\n"
                   if top1 else "")
                + yaml.safe_dump(w, sort_keys=False))
        (out / f"{name}.yaml").write_text(text)
        print(name, "from", src.name)


if __name__ == "__main__":
    main()
