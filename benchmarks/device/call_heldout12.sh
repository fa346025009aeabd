#!/bin/bash
# Twelfth pre-registered held-out batch (issue 12 item 3), a 4-GPU box, run by the device tool
# after the model was frozen (tag heldout-freeze-12) and its predictions committed
# (heldout-predictions-12). Two calls (a call may run 10 minutes; each case takes about 25 s):
#   call_heldout12.sh A : every CASES12 case of steps_third.py and steps_alt.py once (label
#                         "first", the pre-registered measurement).
#   call_heldout12.sh B : NCCL collectives, CUDA events: a group of 4 and two pairs at once at
#                         20 KiB x 4^k (5x the calibrated sizes), a group of 3 at 30 KiB x 4^k
#                         (every rank's share 16-byte aligned); all-to-all with uniform, rotated
#                         and hot splits (comm.py); then the host-bound cases again ("repeat").
# $OUT set by the device tool; results in $OUT/r.tgz.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
THIRD=h12t_single_J,h12t_ddp2_J,h12t_fsdp2_J_ac,h12t_moe_ep2_K,h12t_fsdp4_J,h12t_tp4_J,h12t_pp4_1f1b_J,h12t_moe_ep4_K
ALT=h12_tp2sp_N,h12_ddp4_N_straggler,h12_fsdp4_N_ac,h12_tp4sp_N,h12_pp4_1f1b_N,h12_pp4_int2_N,h12_moe_ep4_L
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
  A) steps steps_third.py first "$THIRD" 250
     steps steps_alt.py first "$ALT" 220 ;;
  B) steps steps_third.py first h12t_moe_ep4_K 45  # A's budget ran out before it (10:14 UTC)
     comm 4 2 20480 1342177280 comm-g4.jsonl 130
     comm 3 3 30720 503316480 comm-g3.jsonl 70
     steps steps_third.py repeat h12t_moe_ep4_K,h12t_moe_ep2_K 60
     steps steps_alt.py repeat h12_moe_ep4_L,h12_tp4sp_N,h12_tp2sp_N 85 ;;
esac
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$R"
