#!/bin/bash
# Third pre-registered held-out batch (issue 12): run by the device tool (kind nvidia-h100-x4)
# after the model was frozen at tag heldout-freeze-3 (the host's time for eager code modelled)
# and its predictions committed (validation/heldout3/predictions-heldout-freeze-3.yaml).
exec "$(dirname "$0")/steps_batch.sh" h3_tp4sp_E,h3_moe_ep4_P,h3_tp2dp2_E,h3_ddp4_E,h3_pp2dp2_E,h3_tp4_E,h3_moe_ep2dp2_P 330
