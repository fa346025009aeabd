"""The eighteenth held-out batch's cases for ``steps.py`` (forced uniform and skewed routing,
issue 10), kept beside the script so that helpers working on ``steps.py`` never read them.
Written 2026-11-28 01:14 UTC before the batch's freeze; ``steps.py`` merges both tables."""

SHAPES18 = {
    # MoE: 6 layers of width 3584, 28 query / 4 KV heads of 128, 8 SwiGLU experts of 2048, top-2
    # (the script's rule: choices first, first+1 mod 8), a 32000-token vocabulary, 2K sequences.
    "Y": dict(layers=6, hidden=3584, ffn=2048, heads=28, kv_heads=4, vocab=32000, seq=2048,
              experts=8, top_k=2),
}
CASES18 = {
    "h18f_moe_ep1_Y": dict(shape="Y", world=1, ep=1, scheme="moe", mb=2, n_mb=3),
    "h18f_moe_ep2_Y": dict(shape="Y", world=2, ep=2, scheme="moe", mb=2, n_mb=3),
    "h18f_moe_ep4_Y": dict(shape="Y", world=4, ep=4, scheme="moe", mb=2, n_mb=3),
    "h18f_moe_ep2dp2_Y": dict(shape="Y", world=4, ep=2, scheme="moe", mb=2, n_mb=3),
}
