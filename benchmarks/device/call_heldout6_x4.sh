#!/bin/bash
# Sixth pre-registered held-out batch (issue 12), its 4-GPU cases (kind nvidia-h100-x4, or
# nvidia-h200-x4 if that is what comes): steps_alt.py, after the model was frozen (tag
# heldout-freeze-6) and its predictions committed.
exec "$(dirname "$0")/call_heldout6.sh" h6_ddp4_U,h6_fsdp4_V_ac,h6_tp4sp_V,h6_pp4_gpipe_V,h6_pp4_int2_V,h6_moe_ep4_W 300
