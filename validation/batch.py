"""What every pre-registered held-out batch since the eleventh does the same way, so that a
batch's own scripts hold only what is its own (its number, when its cases were written, its
shapes, sizes and notes):

- ``make_suites(batch, argv)``: write the batch's suites from its measurement and frozen
  predictions (``heldoutN/make_suite.py``): ``suite.yaml`` (step time) and ``memory.yaml``
  (peak memory), one row per case of the first run (``data/measured/heldoutN-<box>x4/
  steps-first.jsonl``; each row runs its workload on the topology of the lent box and its GPU
  count and carries that box's frozen prediction), and ``collectives-g4.yaml`` (a group of 4
  and two pairs at once) and ``collectives-g3.yaml``, every all-to-all split included.
- ``collectives_main(here, plan, doc)``: pre-register the batch's collective predictions
  (``heldoutN/predict_collectives.py``) once, and score a measurement against them.
- ``predict_all(n, checkout)``: every prediction of the batch at its frozen tag, once, before
  the measurement (``heldoutN/predict_all.sh``; since the fourteenth): each case on both box
  kinds at its GPU count (the cases read from the scripts' tables), then the collectives.
- ``generate_workloads(n)``: the batch's workloads (``heldoutN/generate.py``; since the ninth):
  ``hN_*.yaml`` for the cases of ``CASESN`` in ``benchmarks/device/steps_alt.py`` (the rule of
  ``heldout7/generate.py``) and ``hNt_*.yaml`` for those of ``steps_third.py``
  (``heldout8/generate_third.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import prereg
import yaml

VALIDATION = Path(__file__).resolve().parent
ORDINAL = {11: "eleventh", 12: "twelfth", 13: "thirteenth", 14: "fourteenth", 15: "fifteenth",
           16: "sixteenth", 17: "seventeenth", 18: "eighteenth", 19: "nineteenth",
           20: "twentieth"}
#: the topology of each lent box by GPU count (steps), relative to ``validation/heldoutN/``
STEP_TOPOLOGY = {"h100": {1: "../heldout6/h100x1.yaml", 2: "../../topologies/h100x2-nvswitch.yaml",
                          4: "../../topologies/h100x4-nvswitch.yaml"},
                 "h200": {1: "../heldout6/h200x1.yaml", 2: "../../topologies/h200x2-nvswitch.yaml",
                          4: "../../topologies/h200x4-nvswitch.yaml"}}
#: collectives: the box's topology relative to the repository
COLLECTIVE_TOPOLOGY = {"h100x4": "topologies/h100x4-nvswitch.yaml",
                       "h200x4": "topologies/h200x4-nvswitch.yaml"}
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
SPLITS = ("uniform", "rotated", "hot")


@dataclass(frozen=True)
class Batch:
    """One batch's own facts, as its README's protocol states them."""

    n: int
    cases_written: str  # "11:50 UTC (commit 1a1482f"
    shapes: str  # "steps_third.py on shapes I and O, steps_alt.py on shapes AA and AB"
    g4_sizes: str  # "a group of 4 and two pairs at once at 28 KiB x 4^k (7x the fitted sizes)"
    g3_sizes: str  # "a group of 3 at 42 KiB x 4^k (every rank's share 16-byte aligned)"
    notes: dict = field(default_factory=dict)  # suite, memory, g4, g3: the main miss of each
    band_tolerances: tuple = (0.8, 0.6)  # the <= 1 MiB and 1-96 MiB bands' (>= 96 MiB: 0.5)
    cases_when: str = "before any helper landed"  # when the shapes were fixed, helpers-wise
    comm_call: str = "B"  # the call of call_heldoutN.sh that measured the collectives
    frozen_when: str = "after every helper of the session had landed"
    loop_sizes: str = ""  # "groups of 4 and pairs at 20 KiB x 4^k": the loop-timed set, if any

    @property
    def here(self) -> Path:
        return VALIDATION / f"heldout{self.n}"

    @property
    def role_note(self) -> str:
        return (f"Pre-registered: cases written at {self.cases_written}, shapes fixed "
                f"{self.cases_when}), model frozen at tag heldout-freeze-{self.n} {self.frozen_when}, "
                "predictions for 4x H100 and 4x H200 committed (tag "
                f"heldout-predictions-{self.n}) before the measurement.")


HEAD = """# HELD OUT, pre-registered (issue 12), {ordinal} batch ({what}). Nothing here was used to build, fit or
# choose the model. Result as it came out, at the frozen tag (first run of every case, 4x {BOX}): {result}
# Tolerances set after the measurement, regression guards only. Raw data: ../../data/measured/{data}/;
# protocol and the repeat runs: README.md.
"""


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def generate_workloads(n: int) -> None:
    here = VALIDATION / f"heldout{n}"
    _load(VALIDATION / "heldout7" / "generate.py", "generate_alt").main(n, here)
    _load(VALIDATION / "heldout8" / "generate_third.py", "generate_third").main(n, str(here))
    generate_forced(n)


FORCED_TEMPLATE = VALIDATION / "measured-moe"


def forced_cases(n: int) -> dict:
    """``steps.py``'s forced-routing MoE cases of batch ``n`` (``benchmarks/device/
    heldout<n>_first.py``, since the seventeenth), or none."""
    path = VALIDATION.parent / "benchmarks" / "device" / f"heldout{n}_first.py"
    if not path.exists():
        return {}
    mod = _load(path, f"heldout{n}_first")
    shapes, cases = getattr(mod, f"SHAPES{n}"), getattr(mod, f"CASES{n}")
    return {name: dict(c, model=shapes[c["shape"]]) for name, c in cases.items()}


def skew_p() -> list[float]:
    """``SKEW_P`` of ``benchmarks/device/steps.py`` (the skewed rule's first-choice shares),
    evaluated from the script's source (it imports torch)."""
    import ast

    tree = ast.parse((VALIDATION.parent / "benchmarks" / "device" / "steps.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "SKEW_P":
            return eval(compile(ast.Expression(node.value), "SKEW_P", "eval"), {"__builtins__": {}})
    raise LookupError("SKEW_P not found in steps.py")


def forced_loads(experts: int, top_k: int) -> list[float]:
    """Each expert's share of the routed slots under steps.py's skewed rule: the first choice
    drawn from ``SKEW_P``, choice j = first + j (mod experts), so expert e carries
    (1/k) * sum_j P[e - j]; rounded to 6 places, the last taking the remainder."""
    p = skew_p()
    assert len(p) == experts, (len(p), experts)
    shares = [sum(p[(e - j) % experts] for j in range(top_k)) / top_k for e in range(experts)]
    out = [round(x, 6) for x in shares[:-1]]
    return out + [round(1.0 - sum(out), 6)]


def generate_forced(n: int) -> None:
    """``h<n>f_*_{uniform,skewed}.yaml``: each forced-routing case's workload is the
    measured-moe workload of the same script and scheme (``moe_ep<ep>[dp<edp>]``, read when
    this runs, i.e. at the freeze) with the case's shape, batch, layout and skewed loads."""
    for name, c in forced_cases(n).items():
        ep, world, m = c["ep"], c["world"], c["model"]
        edp = world // ep
        stem = f"moe_ep{ep}" + (f"dp{edp}" if edp > 1 else "")
        for kind in ("uniform", "skewed"):
            w = yaml.safe_load((FORCED_TEMPLATE / f"{stem}_{kind}.yaml").read_text())
            w["name"] = f"heldout{n}-{name}_{kind}"
            w["model"].update(layers=m["layers"], hidden=m["hidden"], ffn_hidden=m["ffn"],
                              heads=m["heads"], kv_heads=m["kv_heads"], vocab=m["vocab"],
                              seq_len=m["seq"])
            w["model"]["moe"].update(experts=m["experts"], top_k=m["top_k"], ffn_hidden=m["ffn"])
            w["training"].update(global_batch=c["mb"] * c["n_mb"] * world, micro_batch=c["mb"])
            if kind == "skewed":
                w["training"]["moe_expert_load"] = forced_loads(m["experts"], m["top_k"])
            w["parallelism"].update(dp=world, ep=ep)
            w["cluster"]["topology"] = STEP_TOPOLOGY["h100"][world]
            head = (f"# Held-out training step {name}_{kind} ({ORDINAL[n]} batch, pre-registered; "
                    f"measured by\n# benchmarks/device/steps.py, case '{name}', {kind} routing). "
                    "Written by validation/batch.py\n# generate_forced from "
                    f"validation/measured-moe/{stem}_{kind}.yaml (same script and scheme)\n# with "
                    "the case's shape, batch, layout and the script's skewed shares: "
                    f"{c['mb']} x {m['seq']} tokens,\n# {c['n_mb']} micro-batches a step, EP "
                    f"{ep}, expert DP {edp}, {world} GPU(s).\n")
            (VALIDATION / f"heldout{n}" / f"{name}_{kind}.yaml").write_text(
                head + yaml.safe_dump(w, sort_keys=False, width=100))


def _ninth():
    """validation/heldout9/make_suite.py: its frozen-prediction and row readers serve every batch."""
    return _load(VALIDATION / "heldout9" / "make_suite.py", "make_suite9")


def write_steps(b: Batch, box: str, name: str, metric: str, key: str, tol: float, what: str,
                result: str, note: str) -> None:
    data = VALIDATION.parent / "data" / "measured" / f"heldout{b.n}-{box}x4"
    nine = _ninth()
    cases = nine.rows(metric, key, nine.frozen(b.here, b.n, box), data, STEP_TOPOLOGY[box], box)
    scripts = ("the third and second scripts and steps.py" if forced_cases(b.n)
               else "the third and second scripts")
    summary = (f"{len(cases)} steps on 4x {box.upper()} by {scripts}"
               if metric == "step_time_s" else f"peak memory of those {len(cases)} steps")
    suite = {"name": name, "role": "held_out", "predicted_at": f"heldout-predictions-{b.n}",
             "summary": summary, "note": note, "role_note": b.role_note,
             "about": f"{ORDINAL[b.n].capitalize()} pre-registered held-out batch: {b.shapes}, "
                      "1, 2 and 4 GPUs (README.md).",
             "metric": metric, "tolerance_mape": tol, "cases": cases}
    text = HEAD.format(ordinal=ORDINAL[b.n], what=what, BOX=box.upper(), result=result,
                       data=data.name)
    text += yaml.safe_dump(suite, sort_keys=False, width=100)
    (b.here / f"{name.split('-')[1]}.yaml").write_text(text)


def write_collectives(b: Batch, box: str, tag: str, what: str, result: str, note: str) -> None:
    data = f"heldout{b.n}-{box}x4"
    groups = "a group of 3" if tag == "g3" else "groups of 4 and pairs"
    timing = "loop" if tag == "loop" else "events"
    suffix = "-loop" if tag == "loop" else ""
    small, mid = b.band_tolerances
    suite = {"kind": "collectives", "name": f"heldout{b.n}-collectives-{tag}-{box}x4",
             "role": "held_out", "predicted_at": f"heldout-predictions-{b.n}",
             "summary": f"4 collectives, {groups}, uneven all-to-alls, 4x {box.upper()}",
             "note": note,
             "predictions": f"predictions-collectives{suffix}-{box}x4.yaml",
             "role_note": b.role_note, "data": f"../../data/measured/{data}/comm-{tag}.jsonl",
             "topology": f"../../topologies/{box}x4-nvswitch.yaml",
             "ops": list(OPS), "splits": list(SPLITS), "timing": timing,
             "bands": [{"name": "<= 1 MiB", "max_bytes": 1048576, "tolerance_mape": small},
                       {"name": "1-96 MiB", "min_bytes": 1048577, "max_bytes": 100663296,
                        "tolerance_mape": mid},
                       {"name": ">= 96 MiB", "min_bytes": 100663297, "tolerance_mape": 0.5}]}
    head = (f"# HELD OUT, pre-registered (issue 12), {ORDINAL[b.n]} batch: NCCL collectives, "
            f"{what}, 4x {box.upper()} NVSwitch, bf16,\n# "
            + ("a loop of calls between one pair of CUDA events " if timing == "loop" else
               "CUDA events between back-to-back calls ") +
            f"(benchmarks/device/comm.py via call_heldout{b.n}.sh {b.comm_call}); all-to-all uniform, rotated "
            f"and hot.\n# Predicted once at tag heldout-freeze-{b.n}. Result as it came out: "
            f"{result}\n# Band tolerances set after the measurement: regression guards only.\n")
    (b.here / f"collectives-{tag}.yaml").write_text(head + yaml.safe_dump(suite, sort_keys=False,
                                                                          width=100))


def make_suites(b: Batch, argv: list[str]) -> None:
    """``BOX 'STEPS RESULT' 'MEMORY RESULT' 'G4 RESULT' 'G3 RESULT' ['LOOP RESULT']`` (BOX h100
    or h200; the results as ``validate`` prints them, written into the suites' headers; the
    loop-timed collectives since the eighteenth batch)."""
    box, steps, memory, g4, g3 = argv[:5]
    write_steps(b, box, f"heldout{b.n}-suite-{box}x4", "step_time_s", "step_time_s", 0.3,
                "step time", steps, b.notes["suite"])
    write_steps(b, box, f"heldout{b.n}-memory-{box}x4", "memory_gib.allocated",
                "peak_memory_gib", 0.3, "peak memory", memory, b.notes["memory"])
    write_collectives(b, box, "g4", b.g4_sizes, g4, b.notes["g4"])
    write_collectives(b, box, "g3", b.g3_sizes, g3, b.notes["g3"])
    if len(argv) > 5:
        write_collectives(b, box, "loop", b.loop_sizes, argv[5], b.notes["loop"])


def timing_of(entry: tuple) -> str:
    """A plan entry's timing: ``(label, group size, groups, sizes[, timing])``, events unless
    a fifth element says ``loop`` (since the eighteenth batch)."""
    return entry[4] if len(entry) > 4 else "events"


def predictions_file(here: Path, box: str, timing: str = "events") -> Path:
    return here / f"predictions-collectives{'-loop' if timing == 'loop' else ''}-{box}.yaml"


def predict_collectives(here: Path, plan: tuple, box: str) -> int:
    """Every (op, split, size) of ``plan`` ((label, group size, the groups running at once,
    sizes[, timing]), ...) as ``validate`` prices a row of that timing, written once beside the
    batch: event-timed rows in ``predictions-collectives-<box>.yaml``, loop-timed ones in
    ``predictions-collectives-loop-<box>.yaml``."""
    coll = prereg.collective_model(COLLECTIVE_TOPOLOGY[box])
    from simulator.validate import timed_collective_s  # importable once prereg set the path

    by_timing: dict[str, list] = {}
    for entry in plan:
        label, g, groups, sizes = entry[:4]
        timing = timing_of(entry)
        for op in OPS:
            for sp in (SPLITS if op == "all_to_all" else ("-",)):
                for nbytes in sizes:
                    t = float(timed_collective_s(coll, op, groups, nbytes, timing,
                                                 "uniform" if sp == "-" else sp))
                    by_timing.setdefault(timing, []).append(
                        {"op": op, "group": g, "set": label, "splits": sp, "bytes": nbytes,
                         "predicted_s": t})
    return max(prereg.write(predictions_file(here, box, timing), COLLECTIVE_TOPOLOGY[box], rows)
               for timing, rows in sorted(by_timing.items()))


def collectives_main(here: Path, plan: tuple, doc: str) -> None:
    """The command line of ``heldoutN/predict_collectives.py``: ``--box B`` predicts once,
    ``--box B --score DATA.jsonl`` prints the held-out result."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--box", choices=sorted(COLLECTIVE_TOPOLOGY), required=True)
    ap.add_argument("--score", metavar="DATA.jsonl")
    ap.add_argument("--timing", choices=["events", "loop"], default="events",
                    help="which predictions --score reads")
    a = ap.parse_args()
    out = predictions_file(here, a.box, a.timing)
    raise SystemExit(
        prereg.score(out, a.score, lambda r: f"{r['op']} g{r['group']} {r.get('splits', '-')}",
                     a.timing)
        if a.score else predict_collectives(here, plan, a.box))


#: the boxes a case of each GPU count is predicted on (``name=topology`` in the frozen checkout)
PREDICT_BOXES = {1: "h100x1=validation/heldout6/h100x1.yaml,h200x1=validation/heldout6/h200x1.yaml",
                 2: "h100x2=topologies/h100x2-nvswitch.yaml,h200x2=topologies/h200x2-nvswitch.yaml",
                 4: "h100x4=topologies/h100x4-nvswitch.yaml,h200x4=topologies/h200x4-nvswitch.yaml"}


def cases_by_world(n: int) -> dict[int, list[str]]:
    """The batch's cases (both scripts' ``CASESN``) by GPU count, in the scripts' order."""
    tables = _load(VALIDATION / "heldout7" / "generate.py", "generate_alt").tables
    out: dict[int, list[str]] = {}
    for script in ("steps_third.py", "steps_alt.py"):
        for name, c in tables(f"CASES{n}", script)[1].items():
            out.setdefault(c["world"], []).append(name)
    for name, c in forced_cases(n).items():  # steps.py: one workload per routing
        out.setdefault(c["world"], []).extend(f"{name}_{k}" for k in ("uniform", "skewed"))
    return dict(sorted(out.items()))


def predict_all(n: int, checkout: str) -> None:
    """Predict every case of batch ``n`` at ``heldout-freeze-N`` in ``checkout`` (a worktree of
    the tag) on both box kinds of its GPU count (``heldout/predict.py``), then the collectives
    (``heldoutN/predict_collectives.py`` in the checkout, copied back), and check that every case
    and every collective row has a prediction on both boxes and none is an error."""
    here, tag = VALIDATION / f"heldout{n}", f"heldout-freeze-{n}"
    predict = VALIDATION / "heldout" / "predict.py"
    by_world = cases_by_world(n)
    for world, cases in by_world.items():
        subprocess.run([sys.executable, str(predict), "--checkout", checkout, "--tag", tag,
                        "--dir", str(here), "--glob", f"h{n}*.yaml", "--only", ",".join(cases),
                        f"--suffix=-x{world}", "--boxes", PREDICT_BOXES[world]], check=True)
    plan = _load(here / "predict_collectives.py", f"predict_collectives{n}").PLAN
    timings = sorted({timing_of(e) for e in plan})
    for box in sorted(COLLECTIVE_TOPOLOGY):
        subprocess.run([sys.executable, f"validation/heldout{n}/predict_collectives.py", "--box",
                        box], cwd=checkout, check=True)
        for timing in timings:
            shutil.copy(predictions_file(Path(checkout) / "validation" / f"heldout{n}", box,
                                         timing), here)
    seen = set()
    for f in here.glob(f"predictions-{tag}-*.yaml"):
        for case, boxes in yaml.safe_load(f.read_text())["cases"].items():
            assert all("error" not in b for b in boxes.values()), (f, case, boxes)
            assert len(boxes) == 2, (f, case, sorted(boxes))
            seen.add(case)
    cases = {c for cs in by_world.values() for c in cs}
    assert seen == cases, sorted(cases ^ seen)
    for timing in timings:
        rows = (sum(len(e[3]) for e in plan if timing_of(e) == timing)
                * (len(OPS) - 1 + len(SPLITS)))
        for box in sorted(COLLECTIVE_TOPOLOGY):
            got = yaml.safe_load(predictions_file(here, box, timing).read_text())["rows"]
            assert len(got) == rows, (box, timing, len(got), rows)
    print(f"every one of the {len(seen)} cases predicted on both boxes, and the collectives")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="validation/batch.py predict-all N CHECKOUT")
    ap.add_argument("command", choices=["predict-all"])
    ap.add_argument("n", type=int)
    ap.add_argument("checkout")
    a = ap.parse_args()
    predict_all(a.n, a.checkout)
