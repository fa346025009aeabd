#!/bin/bash
# As run (from .devicework/, beside steps.py and comm.py) by the device tool, kind nvidia-h100-x4.
# Device call 2: the remaining pre-registered held-out steps, NCCL collectives and all-to-all
# (CUDA events and host-synchronised; concurrent groups and a pair alone), then repeats.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; nvidia-smi topo -m; } > "$R/env.txt" 2>&1
head -3 "$R/env.txt"
N=$(python3 -c 'import torch; print(torch.cuda.device_count())')
TR="python3 -m torch.distributed.run --standalone --nproc_per_node=$N"
echo "=== held-out steps $(date -u)" | tee -a "$L"
timeout 170 python3 "$D/steps.py" --driver --out "$R" --budget-s 160 --case-timeout-s 80 --only ho_tp4sp_B,ho_fsdp4_C_rc_mb2 2>&1 | grep -v "Warning: \[PG" | tee -a "$L"
echo "=== collectives, concurrent groups $(date -u)" | tee -a "$L"
timeout 200 $TR "$D/comm.py" --out "$R" --file comm.jsonl --ops all_reduce,all_gather,reduce_scatter,sendrecv,all_to_all --groups 2 --timing events,host_sync --budget-s 170 2>&1 | grep -v "is deprecated\|return func" | tee -a "$L"
echo "=== collectives, one pair alone $(date -u)" | tee -a "$L"
timeout 100 $TR "$D/comm.py" --out "$R" --file comm-solo.jsonl --solo --no-world --ops all_reduce,all_gather,reduce_scatter,sendrecv,all_to_all --groups 2 --timing events,host_sync --budget-s 75 2>&1 | grep -v "is deprecated\|return func" | tee -a "$L"
LEFT=$(( 560 - SECONDS ))
echo "=== repeats, ${LEFT} s left $(date -u)" | tee -a "$L"
if [ $LEFT -gt 60 ]; then
timeout $LEFT python3 "$D/steps.py" --driver --out "$R" --label repeat --budget-s $(( LEFT - 10 )) --case-timeout-s 60 --only ho_tp4_B,ho_pp4_1f1b_C,moe_ep4,ho_ddp4_A,ho_fsdp4_B,moe_ep2dp2 2>&1 | grep -v "Warning: \[PG" | tee -a "$L"
fi
date -u | tee -a "$L"
grep -h RESULT "$L"
