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
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
THIRD=h16t_single_AK,h16t_ddp4_AK,h16t_tp4_AK,h16t_pp4_1f1b_AK,h16t_moe_ep2_AL,h16t_moe_ep4_AL,h16t_moe_ep2_AM,h16t_moe_ep4_AM
ALT=h16_ddp4_AN_straggler,h16_fsdp4_AN,h16_tp4sp_AN,h16_pp4_int2_AN,h16_moe_ep2_AO,h16_moe_ep4_AO,h16_moe_ep2_AP,h16_moe_ep4_AP
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
     comm 3 3 27648 452984832 comm-g3.jsonl 60
     steps steps_third.py repeat h16t_moe_ep4_AM 40
     steps steps_alt.py repeat h16_moe_ep4_AP 40 ;;
esac
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$R"
