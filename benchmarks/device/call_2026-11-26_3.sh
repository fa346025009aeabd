#!/bin/bash
# As run (from .devicework/) by the device tool, kind nvidia-h100-x4; comm_beside_compute.py from branch fidelity (3ffae0a) with torch.cuda.synchronize() added in medians().
# Device call 3: helper fidelity's request (communication beside compute), then repeats of the
# remaining held-out cases.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; nvidia-smi topo -m; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
TR="python3 -m torch.distributed.run --standalone --nproc_per_node=4"
echo "=== comm_beside_compute auto $(date -u)" | tee -a "$L"
timeout 120 $TR "$D/comm_beside_compute.py" --out "$R" 2>&1 | grep -v "is deprecated\|return func" | tee -a "$L"
echo "=== comm_beside_compute ring $(date -u)" | tee -a "$L"
NCCL_ALGO=Ring timeout 120 $TR "$D/comm_beside_compute.py" --out "$R" --tag ring 2>&1 | grep -v "is deprecated\|return func" | tee -a "$L"
LEFT=$(( 330 - SECONDS ))
echo "=== repeats, ${LEFT} s left $(date -u)" | tee -a "$L"
if [ $LEFT -gt 50 ]; then
timeout $LEFT python3 "$D/steps.py" --driver --out "$R" --label repeat --budget-s $(( LEFT - 5 )) --case-timeout-s 45 --only ho_tp2pp2_C,ho_pp4_int2_C,ho_tp4sp_B,ho_pp4_gpipe_C,ho_fsdp4_B_rc,ho_pp2dp2_C 2>&1 | grep -v "Warning: \[PG" | tee -a "$L"
fi
date -u | tee -a "$L"; wc -l "$R"/*.jsonl; grep -h RESULT "$L"
