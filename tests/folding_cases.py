"""Seeded random layouts for checking folded against full detail.

:func:`random_case` draws one small training step (a few layers of a 1,024-wide model) on a
random cluster and layout: TP up to 16 (across nodes), PP with every schedule, ZeRO 0-3,
sequence parallelism, gradient-reduce overlap on or off, leaf size, oversubscription, NICs per
node and, sometimes, a straggling GPU. Used by ``tests/test_folding.py`` (a fixed set of seeds)
and ``benchmarks/folding.py`` (a larger sweep that prints the error distribution).
"""

from __future__ import annotations

import numpy as np

GELU = {"layers": 4, "hidden": 1024, "ffn_hidden": 4096, "heads": 16, "kv_heads": 16,
        "vocab": 32000, "seq_len": 1024, "activation": "gelu"}
SWIGLU = {"layers": 4, "hidden": 1024, "ffn_hidden": 2816, "heads": 16, "kv_heads": 4,
          "vocab": 32000, "seq_len": 1024, "activation": "swiglu"}


def _pick(rng: np.random.Generator, options):
    return options[int(rng.integers(len(options)))]


def random_case(seed: int, max_gpus: int = 64) -> tuple[str, dict, dict]:
    """One valid (name, workload, topology) drawn from ``seed``; at most ``max_gpus`` GPUs."""
    rng = np.random.default_rng(seed)
    gpn = _pick(rng, [8, 8, 4])
    nodes = _pick(rng, [n for n in (1, 2, 4, 8, 16, 32) if n * gpn <= max_gpus])
    n = nodes * gpn
    model = dict(_pick(rng, [GELU, SWIGLU]))
    tp = _pick(rng, [t for t in (1, 2, 4, 8, 16) if t <= n and t * 1 <= n])
    if model["kv_heads"] % tp and tp % model["kv_heads"]:
        tp = model["kv_heads"]
    pp = _pick(rng, [p for p in (1, 2, 4) if n % (tp * p) == 0])
    dp = n // (tp * pp)
    schedule = "1f1b" if pp == 1 else _pick(rng, ["1f1b", "gpipe", "interleaved"])
    v = 2 if schedule == "interleaved" else 1
    model["layers"] = max(model["layers"], pp * v)
    model["layers"] = pp * v * int(np.ceil(model["layers"] / (pp * v)))
    mbs = pp * _pick(rng, [1, 2]) if pp > 1 else _pick(rng, [1, 2])
    par = {"tp": tp, "pp": pp, "dp": dp, "zero": int(_pick(rng, [0, 1, 2, 3])),
           "sequence_parallel": bool(tp > 1 and rng.random() < 0.5),
           "pp_schedule": schedule, "virtual_stages": v}
    if tp > 1 and pp > 1 and not par["sequence_parallel"]:
        par["pp_scatter_gather"] = bool(rng.random() < 0.5)
    train = {"global_batch": dp * mbs, "micro_batch": 1,
             "overlap_grad_reduce": bool(rng.random() < 0.6),
             "grad_bucket_MB": float(_pick(rng, [5, 25])),
             "recompute": _pick(rng, ["none", "none", "selective", "full"])}
    work = {"name": f"case{seed}", "model": model, "training": train, "parallelism": par}
    if rng.random() < 0.25:
        work["faults"] = {"stragglers": [{"gpu": int(rng.integers(n)),
                                          "slowdown": float(_pick(rng, [1.2, 1.5]))}]}
    topo = {"name": "t", "gpu": "H100-SXM-80GB", "nodes": nodes, "gpus_per_node": gpn,
            "nics_per_node": _pick(rng, [gpn, gpn, 1]),
            "nodes_per_leaf": _pick(rng, [1, 2, 4]),
            "oversubscription": float(_pick(rng, [1.0, 2.0, 4.0]))}
    return work["name"], work, topo


def describe(work: dict, topo: dict) -> str:
    """A one-line summary of a case, for messages and the benchmark's table."""
    p, t = work["parallelism"], work["training"]
    bits = [f"{topo['nodes']}x{topo['gpus_per_node']}", f"tp{p['tp']}", f"pp{p['pp']}",
            f"dp{p['dp']}", f"z{p['zero']}", p["pp_schedule"]]
    if p.get("sequence_parallel"):
        bits.append("sp")
    if p.get("pp_scatter_gather") is False:
        bits.append("no-sg")
    bits.append("ovl" if t["overlap_grad_reduce"] else "no-ovl")
    if t["recompute"] != "none":
        bits.append(f"rc-{t['recompute']}")
    bits.append(f"os{topo['oversubscription']:g}/npl{topo['nodes_per_leaf']}"
                f"/nic{topo['nics_per_node']}")
    for s in work.get("faults", {}).get("stragglers", []):
        bits.append(f"slow g{s['gpu']}x{s['slowdown']}")
    return " ".join(bits)
