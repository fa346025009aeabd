#!/bin/bash
# Fourteenth pre-registered held-out batch (issue 12 item 3), a 4-GPU box, run by the device tool
# after the model was frozen (tag heldout-freeze-14) and its predictions committed
# (heldout-predictions-14). Three calls (a call may run 10 minutes; each case takes about 30 s;
# in the thirteenth batch one call for both scripts ran out of budget before its last case):
#   call_heldout14.sh A : every CASES14 case of steps_third.py once (label "first", the
#                         pre-registered measurement).
#   call_heldout14.sh B : every CASES14 case of steps_alt.py once (label "first").
#   call_heldout14.sh C : NCCL collectives, CUDA events: a group of 4 and two pairs at once at
#                         20 KiB x 4^k (5x the calibrated sizes), a group of 3 at 30 KiB x 4^k
#                         (every rank's share 16-byte aligned); all-to-all with uniform, rotated
#                         and hot splits (comm.py); then the host-bound cases again ("repeat").
# $OUT set by the device tool; results in $OUT/r.tgz.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
THIRD=h14t_single_AC,h14t_fsdp2_AC,h14t_moe_ep2_AD,h14t_ddp4_AC,h14t_fsdp4_AC_ac,h14t_tp4_AC,h14t_pp4_1f1b_AC,h14t_moe_ep4_AD
ALT=h14_tp2sp_AE,h14_moe_ep2_AF,h14_ddp4_AE_straggler,h14_fsdp4_AE_ac,h14_tp4sp_AE,h14_pp4_1f1b_AE,h14_pp4_int2_AE,h14_moe_ep4_AF
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; nvidia-smi topo -m; lscpu | grep -E "^(Model name|CPU\(s\))"; } > "$R/env-$1.txt" 2>&1
head -2 "$R/env-$1.txt"
steps() {  # script label cases budget
  timeout $(( $4 + 30 )) python3 "$D/$1" --driver --out "$R" --label "$2" --budget-s "$4" \
    --case-timeout-s 80 --only "$3" 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|===|Error|error"
}
comm() {  # nproc groups min_bytes max_bytes file budget
  timeout $(( $6 + 40 )) python3 -m torch.distributed.run --standalone --nproc_per_node="$1" "$D/comm.py" \
    --out "$R" --file "$5" --ops all_reduce,all_gather,reduce_scatter,all_to_all --groups "$2" \
    --timing events --min-bytes "$3" --max-bytes "$4" --budget-s "$6" 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | tail -2
}
case "${1:-A}" in
  A) steps steps_third.py first "$THIRD" 330 ;;
  B) steps steps_alt.py first "$ALT" 330 ;;
  C) comm 4 2 20480 1342177280 comm-g4.jsonl 120
     comm 3 3 30720 503316480 comm-g3.jsonl 60
     steps steps_third.py repeat h14t_moe_ep4_AD,h14t_moe_ep2_AD 60
     steps steps_alt.py repeat h14_moe_ep4_AF,h14_moe_ep2_AF,h14_tp4sp_AE,h14_tp2sp_AE 110 ;;
esac
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$R"
