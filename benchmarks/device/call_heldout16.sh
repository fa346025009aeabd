#!/bin/bash
# Sixteenth pre-registered held-out batch (MoE-heavy: issue 10; issue 12 item 3), a 4-GPU box,
# run by the device tool after the model was frozen (tag heldout-freeze-16) and its predictions committed
# (heldout-predictions-16). Three calls (a call may run 10 minutes; each case takes about 30 s;
# in the thirteenth batch one call for both scripts ran out of budget before its last case):
#   call_heldout16.sh A : every CASES16 case of steps_third.py once (label "first", the
#                         pre-registered measurement).
#   call_heldout16.sh B : every CASES16 case of steps_alt.py once (label "first").
#   call_heldout16.sh C : NCCL collectives, CUDA events: a group of 4 and two pairs at once at
#                         20 KiB x 4^k (5x the calibrated sizes), a group of 3 at 27 KiB x 4^k
#                         (every rank's share 16-byte aligned); all-to-all with uniform, rotated
#                         and hot splits (comm.py); then the fine-grained EP 4 MoE
#                         cases again ("repeat").
# $OUT set by the device tool; results in $OUT/r.tgz.
D=$(dirname "$0"); CALL=${1:-A}
THIRD=h16t_single_AK,h16t_ddp4_AK,h16t_tp4_AK,h16t_pp4_1f1b_AK,h16t_moe_ep2_AL,h16t_moe_ep4_AL,h16t_moe_ep2_AM,h16t_moe_ep4_AM
ALT=h16_ddp4_AN_straggler,h16_fsdp4_AN,h16_tp4sp_AN,h16_pp4_int2_AN,h16_moe_ep2_AO,h16_moe_ep4_AO,h16_moe_ep2_AP,h16_moe_ep4_AP
# shellcheck source=heldout_lib.sh
. "$D/heldout_lib.sh"
case "$CALL" in
  A) steps steps_third.py first "$THIRD" 330 ;;
  B) steps steps_alt.py first "$ALT" 330 ;;
  C) comm 4 2 20480 1342177280 comm-g4.jsonl 120
     comm 3 3 27648 452984832 comm-g3.jsonl 60
     steps steps_third.py repeat h16t_moe_ep4_AM 40
     steps steps_alt.py repeat h16_moe_ep4_AP 40 ;;
  # added after A-C had run (21:06 UTC), with the device time left: the other six MoE cases again
  D) steps steps_third.py repeat h16t_moe_ep2_AL,h16t_moe_ep4_AL,h16t_moe_ep2_AM 100
     steps steps_alt.py repeat h16_moe_ep2_AO,h16_moe_ep4_AO,h16_moe_ep2_AP 90 ;;
esac
finish
