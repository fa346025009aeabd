"""DeepSeek-V3 on 2,048 H800, 2,048 H100 or 256 GB200 NVL72 (issue 10's question).

    python studies/deepseek-v3/study.py plan     # plan's best layout per machine -> layouts.yaml
    python studies/deepseek-v3/study.py report   # run them -> results.json, README.md, .png
    python studies/deepseek-v3/study.py mechanisms   # README's table: one mechanism at a time

``workloads/deepseek-v3.yaml`` as shipped (the report's model, batch of 15,360 x 4,096 tokens,
FP8 recipe, DeepEP dispatch) on each machine of ``machines.yaml``: first the layout DeepSeek
ran (PP 16 DualPipe, EP 64, ZeRO-1; where EP 64 does not divide the data-parallel ranks, the
largest EP that does), then the best layout ``plan`` finds for that machine (same model,
batch, sequence and training recipe; plan searches tp, pp, dp, ep, etp, micro-batch, ZeRO,
recompute and the schedule, DualPipe and DualPipeV included). ``plan`` writes what it chose
to ``layouts.yaml`` with how long it took; ``report`` runs every layout with ``run``'s
simulation and writes the table (``README.md``), the numbers (``results.json``) and the plot
(``deepseek-v3.png``), so no figure is copied by hand.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's package
from simulator.config.load import load_workload  # noqa: E402
from simulator.plan import plan  # noqa: E402
from simulator.run import simulate  # noqa: E402

WORKLOAD = ROOT / "workloads" / "deepseek-v3.yaml"
#: exposed time, as the step's breakdown names it, grouped for the table and the plot
PARTS = {
    "compute": ("compute",),
    "EP all-to-all": ("ep_comm",),
    "DP comm": ("dp_comm",),
    "PP send": ("pp_comm",),
    "bubble + stage imbalance": ("pp_bubble", "pp_imbalance"),
    "other": ("tp_comm", "cp_comm", "etp_comm", "host", "optimizer", "other"),
}
COLORS = ["#2a9d8f", "#e76f51", "#f4a261", "#8d99ae", "#adb5bd", "#6c757d"]


def machines() -> list[dict]:
    return yaml.safe_load((HERE / "machines.yaml").read_text())["machines"]


def machine_sets(m: dict) -> list[str]:
    """``--set`` overrides that put the workload on machine ``m``."""
    sets = [f"cluster.topology={ROOT / m['topology']}"]
    return sets + [f"{k}={v}" for k, v in (m.get("set") or {}).items()]


def _value(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ",".join(_value(x) for x in v) + "]"
    return str(v)


def run_plan(top: int) -> None:
    """``plan`` on each machine; its best fitting layout into ``layouts.yaml``."""
    out: dict = {"workload": "workloads/deepseek-v3.yaml", "machines": {}}
    for m in machines():
        loaded = load_workload(WORKLOAD, machine_sets(m))
        t0, c0 = time.perf_counter(), time.process_time()
        res = plan(loaded, m["gpus"], top=top, workers=int(os.environ.get("WORKERS", "1")))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        best = res.top[0]
        out["machines"][m["key"]] = {
            "layout": best.candidate.label(),
            "overrides": {k: _value(v) for k, v in best.candidate.overrides().items()},
            "counts": res.counts,
            "plan_wall_s": round(wall, 1),
            "plan_cpu_s_main_process": round(cpu, 1),
        }
        print(f"{m['key']}: {best.candidate.label()}: {best.summary['step_time_s']:.2f} s "
              f"({res.counts['enumerated']:,} layouts, {wall:.0f} s)", flush=True)  # fmt: skip
    (HERE / "layouts.yaml").write_text(
        "# Written by `python studies/deepseek-v3/study.py plan` (plan's best fitting layout of\n"
        "# workloads/deepseek-v3.yaml per machine of machines.yaml). Do not edit by hand.\n"
        + yaml.safe_dump(out, sort_keys=False, width=100)
    )


def _row(m: dict, which: str, label: str, sets: list[str]) -> dict:
    s = simulate(load_workload(WORKLOAD, machine_sets(m) + sets)).summary
    bd, moe, mem = s["breakdown_s"], s["moe"], s["memory_gib"]
    return {
        "machine": m["key"], "name": m["name"], "which": which, "layout": label,
        "sets": sets, "step_time_s": s["step_time_s"], "tokens_per_s": s["tokens_per_s"],
        "mfu": s["mfu"], "parts_s": {k: sum(bd.get(x, 0.0) for x in v) for k, v in PARTS.items()},
        "memory_gib": mem["total"], "capacity_gib": mem["capacity"], "fits": s["fits"],
        "ep": moe["ep"], "nvlink_domain_gpus": moe["nvlink_domain_gpus"],
        "ep_inside_nvlink_domain": moe["ep_inside_nvlink_domain"],
        "ep_network_bytes_per_rank_per_layer": moe.get("network_bytes_per_rank_per_layer"),
        "cost_per_Mtoken_usd": s["cost_per_Mtoken_usd"], "critical": s["critical_process"],
        "breakdown_s": bd, "imbalance_from": s.get("pp_imbalance_from"),
    }  # fmt: skip


def run_report() -> None:
    layouts = yaml.safe_load((HERE / "layouts.yaml").read_text())["machines"]
    rows = []
    for m in machines():
        shipped = [f"parallelism.ep={m['shipped_ep']}"] if m.get("shipped_ep") else []
        label = "as DeepSeek ran it (PP16 DualPipe, EP" + str(m.get("shipped_ep") or 64) + ")"
        rows.append(_row(m, "shipped", label, shipped))
        best = layouts[m["key"]]
        planned = [f"{k}={v}" for k, v in best["overrides"].items()]
        rows.append(_row(m, "plan", best["layout"], planned))
        for label, extra in (m.get("variants") or {}).items():  # plan's layout, one key changed
            if all(best["overrides"].get(k) == _value(v) for k, v in extra.items()):
                continue  # plan's layout has it already
            rows.append(_row(m, "variant", f"plan's, {label}",
                             planned + [f"{k}={v}" for k, v in extra.items()]))  # fmt: skip
        print(f"{m['key']}: " + ", ".join(f"{r['which']} {r['step_time_s']:.2f} s"
                                          for r in rows if r["machine"] == m["key"]), flush=True)
    (HERE / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    write_markdown(rows, layouts)
    plot(rows)


def _ep_cell(r: dict) -> str:
    where = "NVLink" if r["ep_inside_nvlink_domain"] else "IB + NVLink"
    return f"EP {r['ep']} in {r['nvlink_domain_gpus']}-GPU domains: {where}"


def write_markdown(rows: list[dict], layouts: dict) -> None:
    head = ["machine", "layout", "step s", "k tokens/s", "MFU", *PARTS, "memory GiB",
            "EP all-to-all", "$ / M tokens"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        parts = [f"{r['parts_s'][k]:.2f}" for k in PARTS]
        fit = "" if r["fits"] else " (does not fit)"
        lines.append("| " + " | ".join([
            r["name"], r["layout"], f"{r['step_time_s']:.2f}", f"{r['tokens_per_s'] / 1e3:,.0f}",
            f"{100 * r['mfu']:.1f} %", *parts,
            f"{r['memory_gib']:.1f} of {r['capacity_gib']:.1f}{fit}", _ep_cell(r),
            f"{r['cost_per_Mtoken_usd']:.2f}"]) + " |")  # fmt: skip
    plans = [f"- {k}: {v['counts']['enumerated']:,} layouts enumerated, "
             f"{v['counts']['estimated']:,} estimated, {v['counts']['simulated']} simulated; "
             f"{v['plan_wall_s']:.0f} s wall" for k, v in layouts.items()]  # fmt: skip
    text = (HERE / "README.template.md").read_text()
    text = text.replace("{{TABLE}}", "\n".join(lines)).replace("{{PLANS}}", "\n".join(plans))
    text = text.replace("{{SUMMARY}}", "\n".join(summary(rows)))
    text = text.replace("{{ANSWER}}", "\n".join(answer_table(rows)))
    (HERE / "README.md").write_text(text)


def _busiest_view(r: dict) -> dict[str, float]:
    """Shares of the step (%) by ``PARTS``, with the critical GPU's wait for a busier stage
    (stage imbalance) counted as what that stage spends the time on (the summary's
    ``pp_imbalance_from``); what it does not explain stays with the bubble."""
    bd = dict(r["breakdown_s"])
    why = (r.get("imbalance_from") or {}).get("parts_s") or {}
    moved = min(sum(why.values()), bd.get("pp_imbalance", 0.0))
    scale = moved / sum(why.values()) if why else 0.0
    for k, v in why.items():
        bd[k] = bd.get(k, 0.0) + v * scale
    bd["pp_imbalance"] = bd.get("pp_imbalance", 0.0) - moved
    return {k: 100 * sum(bd.get(x, 0.0) for x in v) / r["step_time_s"] for k, v in PARTS.items()}


def answer_table(rows: list[dict]) -> list[str]:
    """Issue 10's question in a short table: per machine, DeepSeek's layout and plan's best:
    step, where it goes (share of the step), memory, and where the EP all-to-all runs."""
    head = ["machine", "layout", "step s", "compute", "EP all-to-all", "pipeline bubble",
            "rest", "memory GiB", "EP group inside one NVLink domain?"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["which"] == "variant":
            continue
        step, share = r["step_time_s"], _busiest_view(r)
        rest = 100 - share["compute"] - share["EP all-to-all"] - share["bubble + stage imbalance"]
        where = (f"yes: EP {r['ep']} in a {r['nvlink_domain_gpus']}-GPU domain, NVLink only"
                 if r["ep_inside_nvlink_domain"] else
                 f"no: EP {r['ep']} spans {r['ep'] // r['nvlink_domain_gpus']} domains of "
                 f"{r['nvlink_domain_gpus']}, IB + NVLink")  # fmt: skip
        layout = "DeepSeek's" if r["which"] == "shipped" else "plan's: " + r["layout"]
        fit = "" if r["fits"] else " (no fit)"
        lines.append("| " + " | ".join([
            r["name"], layout, f"{step:.2f}", f"{share['compute']:.0f} %",
            f"{share['EP all-to-all']:.0f} %", f"{share['bubble + stage imbalance']:.0f} %",
            f"{rest:.0f} %", f"{r['memory_gib']:.1f} of {r['capacity_gib']:.0f}{fit}",
            where]) + " |")  # fmt: skip
    return lines


def summary(rows: list[dict]) -> list[str]:
    """What the table says, as sentences computed from it."""
    by = {(r["machine"], r["which"]): r for r in rows}
    keys = list(dict.fromkeys(r["machine"] for r in rows))
    ref = by[(keys[0], "plan")]
    out = []
    for k in keys:
        shipped, best = by[(k, "shipped")], by[(k, "plan")]
        gain = shipped["step_time_s"] / best["step_time_s"] - 1
        share = _busiest_view(best)
        ep, idle = share["EP all-to-all"] / 100, share["bubble + stage imbalance"] / 100
        line = (f"- **{best['name']}**: plan's layout ({best['layout']}) takes "
                f"{best['step_time_s']:.2f} s a step, {100 * gain:+.0f} % tokens/s against "
                f"DeepSeek's layout ({shipped['step_time_s']:.2f} s"
                f"{'' if shipped['fits'] else ', which does not fit'}); compute "
                f"{share['compute']:.0f} % of the busiest stage's step, exposed all-to-all "
                f"{100 * ep:.0f} %, pipeline bubble {100 * idle:.0f} %; {_ep_cell(best)}; "
                f"${best['cost_per_Mtoken_usd']:.2f} per million tokens")  # fmt: skip
        if best is not ref:
            line += (f" ({best['step_time_s'] / ref['step_time_s']:.2f}x the step and "
                     f"{best['cost_per_Mtoken_usd'] / ref['cost_per_Mtoken_usd']:.2f}x the cost "
                     f"per token of {ref['name']})")  # fmt: skip
        out.append(line + ".")
    return out


def plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4.8), constrained_layout=True)
    who = {"shipped": "DeepSeek", "plan": "plan", "variant": "variant"}
    labels = [f"{r['name']}\n{who[r['which']]}: {r['layout'].split(' layers')[0]}"
              for r in rows]  # fmt: skip
    for i, r in enumerate(rows):
        left = 0.0
        for (part, color) in zip(PARTS, COLORS, strict=True):
            w = r["parts_s"][part]
            ax.barh(i, w, left=left, color=color, label=part if i == 0 else None)
            left += w
        ax.annotate(f"{r['step_time_s']:.1f} s", (left, i), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=8)  # fmt: skip
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("one optimizer step (s): where the time goes (exposed)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=len(PARTS),
              frameon=False)  # fmt: skip
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title("DeepSeek-V3, 15,360 x 4,096 tokens a step", fontsize=10)
    fig.savefig(HERE / "deepseek-v3.png", dpi=110)


#: README's mechanism table: DeepSeek's layout with one mechanism at a time (``--set``s)
MECHANISMS = {
    "NCCL all-to-all (`moe_dispatcher: alltoall`), plain 1F1B": [
        "training.moe_dispatcher=alltoall", "parallelism.pp_schedule=1f1b"],
    "`moe_dispatcher: deepep`, plain 1F1B": ["parallelism.pp_schedule=1f1b"],
    "`alltoall` with combined 1F1B (`overlap_moe_expert_parallel_comm`)": [
        "training.moe_dispatcher=alltoall", "parallelism.pp_schedule=1f1b",
        "training.overlap_moe_expert_parallel_comm=true"],
    "`deepep` with combined 1F1B": [
        "parallelism.pp_schedule=1f1b", "training.overlap_moe_expert_parallel_comm=true"],
    "as shipped without MTP (`model.mtp_depth=0`)": ["model.mtp_depth=0"],
    "**as shipped**: `deepep`, DualPipe, MTP depth 1": [],
}  # fmt: skip
#: the mechanism table's machines: DeepSeek's layout needs 2,048 GPUs, so GB200 as 32 NVL72
#: racks using 16 of their 18 trays (64-GPU NVLink domains; README "Inputs")
MECHANISM_MACHINES = {
    "H800": [],
    "H100": ["topology.gpu=H100-SXM-80GB"],
    "2,048 GB200 (EP 64 inside a 64-GPU NVLink domain)": [
        f"cluster.topology={ROOT / 'topologies/gb200-nvl72.yaml'}", "topology.nodes=512",
        "topology.nvlink_domain_gpus=64"],
}  # fmt: skip


def run_mechanisms() -> None:
    """Print README's table: the shipped workload with each mechanism switched on alone, per
    machine (step, worst GPU's memory and whether it fits, MFU on active parameters)."""
    head = ["", *MECHANISM_MACHINES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, sets in MECHANISMS.items():
        cells = []
        for extra in MECHANISM_MACHINES.values():
            s = simulate(load_workload(WORKLOAD, extra + sets)).summary
            mem = s["memory_gib"]
            fit = "" if s["fits"] else ": does not fit"
            cells.append(f"{s['step_time_s']:.2f} s, {mem['total']:.1f} of "
                         f"{mem['capacity']:.1f} GiB{fit}, {100 * s['mfu']:.1f} %")  # fmt: skip
        lines.append("| " + " | ".join([label, *cells]) + " |")
        print(lines[-1], flush=True)
    print("\n".join(lines))


if __name__ == "__main__":
    step = sys.argv[1] if len(sys.argv) > 1 else "report"
    if step == "plan":
        run_plan(top=int(os.environ.get("TOP", "3")))
    elif step == "report":
        run_report()
    elif step == "readme":  # README.md and the plot again from results.json, no runs
        rows = json.loads((HERE / "results.json").read_text())
        write_markdown(rows, yaml.safe_load((HERE / "layouts.yaml").read_text())["machines"])
        plot(rows)
    elif step == "mechanisms":
        run_mechanisms()
    else:
        raise SystemExit(f"usage: {sys.argv[0]} plan|report|readme|mechanisms")
