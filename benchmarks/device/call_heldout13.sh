#!/bin/bash
# Thirteenth pre-registered held-out batch (issue 12 item 3), a 4-GPU box, run by the device tool
# after the model was frozen (tag heldout-freeze-13) and its predictions committed
# (heldout-predictions-13). Two calls (a call may run 10 minutes; each case takes about 30 s;
# the session's device time left after its helpers' measurements was about 21 minutes):
#   call_heldout13.sh A : every CASES13 case of steps_third.py and steps_alt.py once (label
#                         "first", the pre-registered measurement).
#   call_heldout13.sh B : NCCL collectives, CUDA events: a group of 4 and two pairs at once at
#                         28 KiB x 4^k (7x the calibrated sizes), a group of 3 at 42 KiB x 4^k
#                         (every rank's share 16-byte aligned); all-to-all with uniform, rotated
#                         and hot splits (comm.py); then the host-bound cases again ("repeat").
# $OUT set by the device tool; results in $OUT/r.tgz.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
THIRD=h13t_single_I,h13t_tp2_I,h13t_moe_ep2_O,h13t_ddp4_I,h13t_fsdp4_I_ac,h13t_tp4_I,h13t_pp4_1f1b_I,h13t_moe_ep4_O
ALT=h13_tp2sp_AA,h13_moe_ep2_AB,h13_ddp4_AA_straggler,h13_fsdp4_AA,h13_tp4sp_AA,h13_pp4_gpipe_AA,h13_pp4_int2_AA,h13_moe_ep4_AB
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
  A) steps steps_third.py first "$THIRD" 270
     steps steps_alt.py first "$ALT" 250 ;;
  B) steps steps_third.py first h13t_moe_ep4_O 45  # A's budget ran out before it (13:12 UTC)
     comm 4 2 28672 1879048192 comm-g4.jsonl 120
     comm 3 3 43008 704643072 comm-g3.jsonl 60
     steps steps_third.py repeat h13t_moe_ep4_O,h13t_moe_ep2_O 60
     steps steps_alt.py repeat h13_moe_ep4_AB,h13_moe_ep2_AB,h13_tp4sp_AA,h13_tp2sp_AA 110 ;;
esac
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$R"
