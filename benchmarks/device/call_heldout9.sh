#!/bin/bash
# Ninth pre-registered held-out batch (issue 12 item 3), 4x H100, run by the device tool after
# the model was frozen (tag heldout-freeze-9) and its predictions committed
# (heldout-predictions-9). Two calls (a call may run 10 minutes):
#   call_heldout9.sh A : every CASES9 case of steps_third.py and steps_alt.py once (label
#                        "first", the pre-registered measurement), then NCCL collectives in a
#                        group of 3 GPUs (a group size never measured before), CUDA events.
#   call_heldout9.sh B : the host-bound cases again and one GPU-bound case (label "repeat":
#                        the run-to-run spread, data/measured/diagnosis9-h100x4/README.md), then
#                        collectives of 4 GPUs and pairs at sizes 1.5x the calibrated ones
#                        (6 KiB x 4^k), CUDA events.
# $OUT set by the device tool; results in $OUT/r.tgz.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
THIRD=h9t_single_C,h9t_fsdp2_C,h9t_tp2_C,h9t_moe_ep2_D,h9t_ddp4_C,h9t_fsdp4_C_ac,h9t_tp4_C,h9t_pp4_1f1b_C,h9t_moe_ep4_D
ALT=h9_tp4sp_R,h9_fsdp4_R,h9_pp4_int2_R,h9_ddp4_R_straggler,h9_moe_ep4_S
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; nvidia-smi topo -m; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
steps() {  # script label cases budget
  timeout $(( $4 + 30 )) python3 "$D/$1" --driver --out "$R" --label "$2" --budget-s "$4" \
    --case-timeout-s 80 --only "$3" 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|===|Error|error"
}
comm() {  # nproc groups min_bytes file budget
  timeout $(( $5 + 40 )) python3 -m torch.distributed.run --standalone --nproc_per_node="$1" "$D/comm.py" \
    --out "$R" --file "$4" --ops all_reduce,all_gather,reduce_scatter,all_to_all --groups "$2" \
    --timing events --min-bytes "$3" --budget-s "$5" 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | tail -3
}
if [ "${1:-A}" = A ]; then
  steps steps_third.py first "$THIRD" 300
  steps steps_alt.py first "$ALT" 170
  comm 3 3 4096 comm-g3.jsonl 60
else
  steps steps_alt.py repeat h9_tp4sp_R,h9_moe_ep4_S 80
  steps steps_third.py repeat h9t_moe_ep2_D,h9t_moe_ep4_D,h9t_tp4_C 130
  comm 4 2 6144 comm-g4-offset.jsonl 90
fi
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$R"
