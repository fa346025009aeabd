"""The seventeenth held-out batch's cases for ``steps.py`` (forced uniform and skewed routing,
issue 10), kept beside the script so that helpers working on ``steps.py`` never read them.
Written 2026-11-27 23:05 UTC before the batch's freeze; ``steps.py`` merges both tables."""

SHAPES17 = {
    # MoE: 6 layers of width 2816, 22 query / 2 KV heads of 128, 8 SwiGLU experts of 2304, top-3
    # (the script's rule: choices first, first+1, first+2 mod 8), a 49152-token vocabulary, 2K
    # sequences.
    "X": dict(layers=6, hidden=2816, ffn=2304, heads=22, kv_heads=2, vocab=49152, seq=2048,
              experts=8, top_k=3),
}
CASES17 = {
    "h17f_moe_ep1_X": dict(shape="X", world=1, ep=1, scheme="moe", mb=2, n_mb=2),
    "h17f_moe_ep2_X": dict(shape="X", world=2, ep=2, scheme="moe", mb=2, n_mb=4),
    "h17f_moe_ep4_X": dict(shape="X", world=4, ep=4, scheme="moe", mb=2, n_mb=4),
    "h17f_moe_ep2dp2_X": dict(shape="X", world=4, ep=2, scheme="moe", mb=2, n_mb=4),
}
