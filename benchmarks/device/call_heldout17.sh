#!/bin/bash
# Seventeenth pre-registered held-out batch (issue 10: eager MoE with learned and forced routing,
# EP x DP), a 4-GPU box, run by the device tool after the model was frozen (tag heldout-freeze-17)
# and its predictions committed (heldout-predictions-17). Three calls:
#   call_heldout17.sh A : every CASES17 case of steps_third.py once (label "first").
#   call_heldout17.sh B : every CASES17 case of steps_alt.py once (label "first").
#   call_heldout17.sh C : steps.py's forced-routing MoE cases (heldout17_first.py: EP 1, 2, 4 and
#                         EP 2 x expert DP 2, uniform and skewed routing in one process each,
#                         label "first"); then NCCL collectives, CUDA events: a group of 4 and two
#                         pairs at once at 12 KiB x 4^k (3x the calibrated sizes), a group of 3 at
#                         6 KiB x 4^k (every rank's share 16-byte aligned); all-to-all with
#                         uniform, rotated and hot splits (comm.py).
# $OUT set by the device tool; results in $OUT/r.tgz.
D=$(dirname "$0"); CALL=${1:-A}
THIRD=h17t_single_AQ,h17t_tp2_AQ,h17t_ddp4_AQ,h17t_fsdp4_AQ,h17t_tp4_AQ,h17t_pp4_1f1b_AQ,h17t_moe_ep2_AR,h17t_moe_ep4_AR
ALT=h17_single_AU,h17_pp2_1f1b_AU,h17_ddp4_AU,h17_fsdp4_AU_ac,h17_tp4sp_AU,h17_pp4_gpipe_AU,h17_moe_ep2_AV,h17_moe_ep4_AV
FIRST=h17f_moe_ep1_X,h17f_moe_ep2_X,h17f_moe_ep4_X,h17f_moe_ep2dp2_X
# shellcheck source=heldout_lib.sh
. "$D/heldout_lib.sh"
case "$CALL" in
  A) steps steps_third.py first "$THIRD" 330 ;;
  B) steps steps_alt.py first "$ALT" 330 ;;
  C) steps steps.py first "$FIRST" 260 110
     comm 4 2 12288 805306368 comm-g4.jsonl 120
     comm 3 3 6144 402653184 comm-g3.jsonl 60 ;;
  # added after A-C had run (23:47 UTC), with the device time left: every MoE case again
  D) steps steps_third.py repeat h17t_moe_ep2_AR,h17t_moe_ep4_AR 80
     steps steps_alt.py repeat h17_moe_ep2_AV,h17_moe_ep4_AV 70
     steps steps.py repeat "$FIRST" 170 110 ;;
esac
finish
