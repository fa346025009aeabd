#!/bin/bash
# As run (from .devicework/) by the device tool, kind nvidia-h100-x4; comm_beside_compute.py from branch fidelity (3ffae0a) with torch.cuda.synchronize() added in medians().
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
TR="python3 -m torch.distributed.run --standalone --nproc_per_node=4"
echo "=== comm_beside_compute auto $(date -u)" | tee -a "$L"
timeout 110 $TR "$D/comm_beside_compute.py" --out "$R" 2>&1 | grep -v "is deprecated\|return func" | tail -20 | tee -a "$L"
echo "=== comm_beside_compute ring $(date -u)" | tee -a "$L"
NCCL_ALGO=Ring timeout 110 $TR "$D/comm_beside_compute.py" --out "$R" --tag ring 2>&1 | grep -v "is deprecated\|return func" | tail -20 | tee -a "$L"
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
