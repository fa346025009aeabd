#!/bin/bash
# Seventh pre-registered held-out batch (issue 12), 2-GPU box (kind nvidia-h100-x2): the CASES7 of
# steps_alt.py, run after the model was frozen (tag heldout-freeze-7) and its predictions committed
# (tag heldout-predictions-7). Same driver as the sixth batch.
exec "$(dirname "$0")/call_heldout6.sh" h7_single_X,h7_ddp2_X,h7_ddp2_X_straggler,h7_fsdp2_X,h7_fsdp2_X_ac,h7_tp2_X,h7_tp2sp_X,h7_pp2_gpipe_X,h7_pp2_1f1b_X,h7_moe_ep2_Y 330
