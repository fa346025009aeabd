#!/bin/bash
# Issue 13 on one 8-GPU NVSwitch node (device kind nvidia-h100-x8 or nvidia-h200-x8), in one call
# of at most 10 minutes: copy this file, steps.py and comm.py into an ignored folder that the
# call carries (e.g. .devicework/), then run `bash .devicework/run_node8.sh`. Writes under $OUT/r.
# Predictions first (validation/node8/README.md). NVLink SHARP stays off, as the machines require.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; nvidia-smi topo -m; } > "$R/env.txt" 2>&1
N=$(python3 -c 'import torch; print(torch.cuda.device_count())')
TR="python3 -m torch.distributed.run --standalone --nproc_per_node=$N"
echo "=== training steps $(date -u)" | tee -a "$L"
timeout 300 python3 "$D/steps.py" --driver --out "$R" --budget-s 290 --case-timeout-s 70 \
  --only x8_tp8_B,x8_tp8sp_B,x8_tp4dp2_B,x8_tp2pp4_C,x8_pp8_int2_C,x8_fsdp8_B,x8_ddp8_A,x8_moe_ep8,x8_moe_ep4dp2 \
  2>&1 | grep -v "Warning: \[PG" | tee -a "$L"
echo "=== collectives: groups of 8, 4, 2 at once $(date -u)" | tee -a "$L"
timeout 200 $TR "$D/comm.py" --out "$R" --file comm.jsonl --groups 2,4 --timing events,host_sync \
  --ops all_reduce,all_gather,reduce_scatter,all_to_all,sendrecv --max-bytes 4294967296 --budget-s 180 \
  2>&1 | grep -v "is deprecated\|return func" | tee -a "$L"
echo "=== collectives: one group of 4 / one pair alone $(date -u)" | tee -a "$L"
timeout 80 $TR "$D/comm.py" --out "$R" --file comm-alone.jsonl --solo --no-world --groups 2,4 --timing events \
  --ops all_reduce,all_gather,reduce_scatter,all_to_all --budget-s 70 2>&1 | grep -v "is deprecated\|return func" | tee -a "$L"
date -u | tee -a "$L"; grep -h RESULT "$L"
