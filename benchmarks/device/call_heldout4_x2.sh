#!/bin/bash
# Fourth pre-registered held-out batch, its 2-GPU cases (issue 12): run by the device tool (kind
# nvidia-h100-x2 or nvidia-h200-x2) after the model was frozen at tag heldout-freeze-4 and their
# predictions committed (validation/heldout4/predictions-heldout-freeze-4-x2.yaml).
exec "$(dirname "$0")/steps_batch.sh" h4x2_tp2sp_F,h4x2_moe_ep2_R,h4x2_ddp2_G,h4x2_pp2_int2_F,h4x2_fsdp2_F_rc 400
