#!/bin/bash
# Nineteenth pre-registered held-out batch (issue 10: eager MoE with learned and forced routing,
# EP x DP; collectives timed two ways), a 4-GPU box, run by the device tool after the model was
# frozen (tag heldout-freeze-19) and its predictions committed (heldout-predictions-19). Calls:
#   call_heldout19.sh A : every dense CASES19 case of steps_third.py once (label "first").
#   call_heldout19.sh B : every dense CASES19 case of steps_alt.py once (label "first").
#   call_heldout19.sh C : steps.py's forced-routing MoE cases (heldout19_first.py: EP 1, 2, 4 and
#                         EP 2 x expert DP 2, uniform and skewed routing in one process each,
#                         label "first").
#   call_heldout19.sh D : NCCL collectives (comm.py): CUDA events after every call in a group of 4
#                         and two pairs at once at 36 KiB x 4^k and in a group of 3 at
#                         30 KiB x 4^k (every rank's share 16-byte aligned); then loop timing (50
#                         calls between one pair of CUDA events) in a group of 4 and two pairs at
#                         36 KiB x 4^k up to 144 MiB; all-to-all with uniform, rotated and hot
#                         splits.
#   call_heldout19.sh E : the four learned-router MoE cases (steps_third.py BB, steps_alt.py BD,
#                         EP 2 and 4) once (label "first"), measured last so that a second set of
#                         predictions (tag heldout-revised-19) can be committed before them.
#   call_heldout19.sh BC: B then C in one call.
# $OUT set by the device tool; results in $OUT/r.tgz.
D=$(dirname "$0"); CALL=${1:-A}
THIRD=h19t_single_BA,h19t_tp2_BA,h19t_ddp4_BA,h19t_fsdp4_BA,h19t_tp4_BA,h19t_pp4_1f1b_BA
ALT=h19_single_BC,h19_tp2sp_BC,h19_ddp4_BC,h19_fsdp4_BC,h19_pp4_1f1b_BC,h19_pp4_int2_BC
FIRST=h19f_moe_ep1_Z,h19f_moe_ep2_Z,h19f_moe_ep4_Z,h19f_moe_ep2dp2_Z
# shellcheck source=heldout_lib.sh
. "$D/heldout_lib.sh"
case "$CALL" in
  A) steps steps_third.py first "$THIRD" 330 ;;
  B) steps steps_alt.py first "$ALT" 330 ;;
  C) steps steps.py first "$FIRST" 240 110 ;;
  BC) steps steps_alt.py first "$ALT" 250
      steps steps.py first "$FIRST" 240 110 ;;
  E) steps steps_third.py first h19t_moe_ep2_BB,h19t_moe_ep4_BB 200
     steps steps_alt.py first h19_moe_ep2_BD,h19_moe_ep4_BD 200 ;;
  D) comm 4 2 36864 603979776 comm-g4.jsonl 150
     comm 3 3 30720 125829120 comm-g3.jsonl 70
     comm 4 2 36864 150994944 comm-loop.jsonl 90 loop ;;
esac
finish
