#!/bin/bash
# Tenth pre-registered held-out batch (issue 12 item 3), a 4-GPU box, run by the device tool after
# the model was frozen (tag heldout-freeze-10) and its predictions committed
# (heldout-predictions-10). Two calls (a call may run 10 minutes):
#   call_heldout10.sh A : every CASES10 case of steps_third.py and steps_alt.py once (label
#                         "first", the pre-registered measurement).
#   call_heldout10.sh B : NCCL collectives, CUDA events: groups of 4 and pairs (two at once) at
#                         10 KiB x 4^k (2.5x the calibrated sizes); a group of 3 with every rank's
#                         share 16-byte aligned (15 KiB x 4^k) and one with it misaligned
#                         (20 KiB x 4^k); then the host-bound cases again (label "repeat").
# $OUT set by the device tool; results in $OUT/r.tgz.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
THIRD=h10t_single_E,h10t_fsdp2_E_ac,h10t_ddp4_E,h10t_fsdp4_E,h10t_tp4_E,h10t_pp4_1f1b_E,h10t_moe_ep4_F
ALT=h10_tp2sp_T,h10_ddp4_T_straggler,h10_fsdp4_T_ac,h10_pp4_gpipe_T,h10_pp4_1f1b_T
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
if [ "${1:-A}" = A ]; then
  steps steps_third.py first "$THIRD" 300
  steps steps_alt.py first "$ALT" 200
else
  comm 4 2 10240 671088640 comm-g4.jsonl 100
  comm 3 3 15360 251658240 comm-g3-aligned.jsonl 60
  comm 3 3 20480 335544320 comm-g3-misaligned.jsonl 60
  steps steps_alt.py repeat h10_tp2sp_T 60
  steps steps_third.py repeat h10t_moe_ep4_F 60
fi
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$R"
