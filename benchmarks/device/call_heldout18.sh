#!/bin/bash
# Eighteenth pre-registered held-out batch (issue 10: eager MoE with learned and forced routing,
# EP x DP; collectives timed two ways), a 4-GPU box, run by the device tool after the model was
# frozen (tag heldout-freeze-18) and its predictions committed (heldout-predictions-18). Calls:
#   call_heldout18.sh A : every CASES18 case of steps_third.py once (label "first").
#   call_heldout18.sh B : every CASES18 case of steps_alt.py once (label "first").
#   call_heldout18.sh C : steps.py's forced-routing MoE cases (heldout18_first.py: EP 1, 2, 4 and
#                         EP 2 x expert DP 2, uniform and skewed routing in one process each,
#                         label "first").
#   call_heldout18.sh D : NCCL collectives (comm.py): CUDA events after every call in a group of 4
#                         and two pairs at once at 20 KiB x 4^k (5x the calibrated sizes) and in a
#                         group of 3 at 24 KiB x 4^k (every rank's share 16-byte aligned); then
#                         loop timing (50 calls between one pair of CUDA events) in a group of 4
#                         and two pairs at 20 KiB x 4^k up to 80 MiB; all-to-all with uniform,
#                         rotated and hot splits.
# $OUT set by the device tool; results in $OUT/r.tgz.
D=$(dirname "$0"); CALL=${1:-A}
THIRD=h18t_single_AW,h18t_tp2_AW,h18t_ddp4_AW,h18t_fsdp4_AW,h18t_tp4_AW,h18t_pp4_1f1b_AW,h18t_moe_ep2_AX,h18t_moe_ep4_AX
ALT=h18_single_AY,h18_tp2sp_AY,h18_ddp4_AY_straggler,h18_fsdp4_AY,h18_pp4_1f1b_AY,h18_pp4_int2_AY,h18_moe_ep2_AZ,h18_moe_ep4_AZ
FIRST=h18f_moe_ep1_Y,h18f_moe_ep2_Y,h18f_moe_ep4_Y,h18f_moe_ep2dp2_Y
# shellcheck source=heldout_lib.sh
. "$D/heldout_lib.sh"
case "$CALL" in
  A) steps steps_third.py first "$THIRD" 330 ;;
  B) steps steps_alt.py first "$ALT" 330 ;;
  C) steps steps.py first "$FIRST" 240 110 ;;
  D) comm 4 2 20480 1342177280 comm-g4.jsonl 150
     comm 3 3 24576 402653184 comm-g3.jsonl 70
     comm 4 2 20480 83886080 comm-loop.jsonl 90 loop ;;
  # added after A-D had run and been scored (01:45 UTC), with the device time left: the
  # learned-router MoE cases and the widest-spread dense case (FSDP 4 AW) again
  E) steps steps_third.py repeat h18t_moe_ep2_AX,h18t_moe_ep4_AX,h18t_fsdp4_AW 150
     steps steps_alt.py repeat h18_moe_ep2_AZ,h18_moe_ep4_AZ 80 ;;
esac
finish
