"""The nineteenth held-out batch's cases for ``steps.py`` (forced uniform and skewed routing,
issue 10), kept beside the script so that helpers working on ``steps.py`` never read them.
Written 2026-11-28 03:20 UTC before the batch's freeze; ``steps.py`` merges both tables."""

SHAPES19 = {
    # MoE: 8 layers of width 2560, 20 query / 4 KV heads of 128, 8 SwiGLU experts of 3072, top-2
    # (the script's rule: choices first, first+1 mod 8), a 32000-token vocabulary, 2K sequences.
    "Z": dict(layers=8, hidden=2560, ffn=3072, heads=20, kv_heads=4, vocab=32000, seq=2048,
              experts=8, top_k=2),
}
CASES19 = {
    "h19f_moe_ep1_Z": dict(shape="Z", world=1, ep=1, scheme="moe", mb=2, n_mb=3),
    "h19f_moe_ep2_Z": dict(shape="Z", world=2, ep=2, scheme="moe", mb=2, n_mb=3),
    "h19f_moe_ep4_Z": dict(shape="Z", world=4, ep=4, scheme="moe", mb=2, n_mb=3),
    "h19f_moe_ep2dp2_Z": dict(shape="Z", world=4, ep=2, scheme="moe", mb=2, n_mb=3),
}
