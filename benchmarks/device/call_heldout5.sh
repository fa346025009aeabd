#!/bin/bash
# Fifth pre-registered held-out batch, 2-GPU boxes (issue 12): run by the device tool (kind
# nvidia-h100-x2 or nvidia-h200-x2) after the model was frozen at tag heldout-freeze-5 (host clock
# with the MoE routing rate) and its predictions committed
# (validation/heldout5/predictions-heldout-freeze-5.yaml).
exec "$(dirname "$0")/steps_batch.sh" h5_tp2_S,h5_moe_ep2_T,h5_ddp2_S,h5_pp2_1f1b_S,h5_fsdp2_S 400
