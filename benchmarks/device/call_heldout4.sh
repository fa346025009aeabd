#!/bin/bash
# Fourth pre-registered held-out batch (issue 12): run by the device tool (kind nvidia-h100-x4)
# after the model was frozen at tag heldout-freeze-4 (the host as a second clock beside each GPU)
# and its predictions committed (validation/heldout4/predictions-heldout-freeze-4.yaml).
exec "$(dirname "$0")/steps_batch.sh" h4_tp4sp_F,h4_moe_ep4_R,h4_tp2dp2_G,h4_ddp4_G,h4_pp4_int2_F,h4_tp2pp2_F,h4_fsdp4_F_rc,h4_moe_ep2dp2_R,h4_pp4_gpipe_F 500
