"""Writes the eighth held-out batch's steps_third.py inputs (h8t_*.yaml), one YAML per case of
benchmarks/device/steps_third.py (CASES8), describing what that script does with the
simulator's input keys. Run from the repository root: python validation/heldout8/generate_third.py"""

from __future__ import annotations

import ast
import os

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "benchmarks", "device", "steps_third.py")


def _tables(var: str = "CASES8") -> tuple[dict, dict]:
    """(SHAPES with every update, the case table ``var``) read from steps_third.py's source (it
    needs torch: parsed, not imported), so the workloads cannot drift from the cases the script
    runs."""
    def entries(d: ast.Dict) -> dict:
        return {ast.literal_eval(k): {kw.arg: ast.literal_eval(kw.value) for kw in v.keywords}
                for k, v in zip(d.keys, d.values, strict=True)}

    shapes, cases = {}, {}
    with open(SCRIPT) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        name = getattr(node.targets[0], "id", None) if isinstance(node, ast.Assign) else None
        if name == "SHAPES":
            shapes.update(entries(node.value))
        if name == var:
            cases = entries(node.value)
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "attr", None) == "update"
                and getattr(node.value.func.value, "id", None) == "SHAPES"):
            shapes.update(entries(node.value.args[0]))
    return shapes, cases


SHAPES, CASES8 = _tables()
ORDINAL = {8: "eighth", 9: "ninth"}
COMMON_NOT = "gradient clipping at 1.0 every step, RoPE as unfused cat/mul/add"
# described by keys since the eighth batch's memory result (its memory suite a development set
# since): no master copy, Meta-style RMSNorm, K/V repeated
COMMON_DOES = ("No fp32 master weights, the bf16 parameters updated in place by AdamW(fused) "
               "with bf16 moments (master_weights: none); RMSNorm casting back to bf16 before "
               "its gain (rmsnorm_gain: input_dtype); separate wq/wk/wv with K, V heads copied "
               "by repeat_interleave before SDPA (kv_repeat: true).")
DOES = {
    "single": "one GPU, gradient accumulation over the micro-batches, "
              "clip_grad_norm_, AdamW(fused).",
    "ddp": "DistributedDataParallel(bucket_cap_mb=50, gradient_as_bucket_view=True), no_sync "
           "on all but the last micro-batch, bf16 gradients all-reduced in buckets during the "
           "last backward, clip_grad_norm_, AdamW(fused).",
    "fsdp": "FSDP2 fully_shard per block and root, reshard_after_forward=True, no "
            "MixedPrecisionPolicy (bf16 all-gathers and reduce-scatters), clip_grad_norm_ "
            "on DTensors, AdamW(fused) on the shards.",
    "tp": "hand-written Megatron-style column/row parallel Linears (custom autograd "
          "all-reduces, bf16), no SP; LM head column-parallel with its logits all-gathered "
          "before an ordinary cross entropy (tp_loss: gathered); embedding and norms "
          "replicated.",
    "pp": "layers split evenly, hand-written 1F1B with batch_isend_irecv pairs "
          "(Megatron's pairing), full activations sent (no scatter/gather), distributed clip "
          "(one scalar all-reduce).",
    "moe": "every MLP 8 SwiGLU experts top-2 (learned router, softmax over the top-2 "
           "logits), EP = world; per layer a counts all_to_all_single + .tolist(), dispatch "
           "and combine by all_to_all_single, local experts one after another; replicated "
           "gradients all-reduced one parameter at a time after the last backward.",
}
NOT = {
    "single": "",
    "ddp": "",
    "fsdp": "",
    "tp": "; replicated embedding",
    "pp": "; the scalar all-reduce of the distributed clip",
    "moe": "; one all-reduce per replicated parameter (no bucketing; described as ddp_buckets "
           "none after backward with 25 MiB buckets), the host sort of received rows by "
           "local expert",
}


def body(name: str, c: dict, batch: int = 8, shapes: dict = SHAPES) -> str:
    m = shapes[c["shape"]]
    world, sch = c["world"], c["scheme"]
    dp = world if sch in ("ddp", "fsdp", "moe") else 1
    topo = ("../heldout6/h100x1.yaml" if world == 1
            else f"../../topologies/h100x{world}-nvswitch.yaml")
    lines = [
        f"# Held-out training step {name} ({ORDINAL[batch]} batch, pre-registered; measured by",
        f"# benchmarks/device/steps_third.py, case '{name}': a Llama-style script written",
        "# independently of steps.py, steps_alt.py and the simulator's op lists; bf16 weights",
        "# without autocast, AdamW(fused) in bf16, clip 1.0). What the script does:",
    ]
    lines += ["# " + x for x in _wrap(DOES[sch])]
    lines += ["# " + x for x in _wrap(COMMON_DOES)]
    lines += ["# Not described by the simulator's keys (not_modelled):"]
    lines += ["# " + x for x in _wrap(COMMON_NOT + NOT[sch] + ".")]
    lines += [f"# Generated by generate_third.py. name: heldout{batch}-{name}",
              f"name: heldout{batch}-{name}", "model:"]
    lines += [f"  layers: {m['layers']}", f"  hidden: {m['hidden']}",
              f"  ffn_hidden: {m['ffn']}", f"  heads: {m['heads']}",
              f"  kv_heads: {m['kv_heads']}", f"  vocab: {m['vocab']}",
              f"  seq_len: {m['seq']}", "  activation: swiglu", "  norm: rmsnorm",
              "  tied_embeddings: false", "  dropout: false"]
    if "experts" in m:
        lines += ["  moe:", f"    experts: {m['experts']}", f"    top_k: {m['top_k']}",
                  f"    ffn_hidden: {m['ffn']}"]
    ddp = sch == "ddp"
    lines += ["training:", f"  global_batch: {c['mb'] * c['n_mb'] * dp}",
              f"  micro_batch: {c['mb']}", "  precision: bf16", "  param_dtype: bf16",
              "  grad_reduce_dtype: bf16",
              f"  recompute: {'full' if c.get('ac') else 'none'}",
              f"  overlap_grad_reduce: {'true' if sch in ('ddp', 'fsdp') else 'false'}",
              f"  grad_bucket_MB: {50 if ddp else 25}"]
    if ddp:
        lines.append("  ddp_buckets: view")
    if sch == "moe":
        lines += ["  ddp_buckets: none", "  moe_dispatcher: alltoall", "  moe_routes: learned"]
    lines += ["  flash_attention: true", "  kernels: eager", "  measured_steps: [4, 9]",
              "  optimizer_impl: fused", "  optimizer_moments_dtype: bf16",
              "  master_weights: none", "  rmsnorm_gain: input_dtype", "  kv_repeat: true",
              "parallelism:", f"  tp: {world if sch == 'tp' else 1}",
              f"  pp: {world if sch == 'pp' else 1}", f"  dp: {dp}",
              f"  zero: {3 if sch == 'fsdp' else 0}", "  sequence_parallel: false"]
    if sch == "tp":
        lines += ["  tp_input_dtype: compute", "  tp_impl: megatron", "  tp_loss: gathered"]
    if sch == "pp":
        lines += ["  pp_schedule: 1f1b", "  virtual_stages: 1", "  pp_scatter_gather: false"]
    if sch == "moe":
        lines.append(f"  ep: {world}")
    lines += ["cluster:", f"  topology: {topo}"]
    return "\n".join(lines) + "\n"


def _wrap(text: str, width: int = 95) -> list[str]:
    out, cur = [], ""
    for w in text.split():
        if cur and len(cur) + 1 + len(w) > width:
            out.append(cur)
            cur = w
        else:
            cur = f"{cur} {w}" if cur else w
    return out + [cur] if cur else out


def main(batch: int = 8, out: str = HERE) -> None:
    """Write ``out/<case>.yaml`` for every case of steps_third.py's ``CASES<batch>``."""
    shapes, cases = _tables(f"CASES{batch}")
    for name, c in cases.items():
        with open(os.path.join(out, f"{name}.yaml"), "w") as f:
            f.write(body(name, c, batch, shapes))


if __name__ == "__main__":
    main()
