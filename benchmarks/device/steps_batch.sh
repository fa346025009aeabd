#!/bin/bash
# A batch of steps.py cases on the lent GPUs, with the machine's description first; what each
# pre-registered held-out batch's call script runs (call_heldout3.sh, call_heldout4.sh, ...).
# Usage: steps_batch.sh CASES [BUDGET_S]   (CASES comma-separated; $OUT set by the device tool)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
CASES=$1; BUDGET=${BUDGET:-${2:-330}}
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
timeout $(( BUDGET + 20 )) python3 "$D/steps.py" --driver --out "$R" --label first --budget-s "$BUDGET" --case-timeout-s 60 \
  --only "$CASES" 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|===|Error|error"
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
