#!/bin/bash
# Kernel profiles of three cases of the second held-out batch (issue 12), taken after their
# held-out result was published (tag heldout-predictions-2): from here on they are development
# cases. Run by the device tool (kind nvidia-h100-x4) from the repository root.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
python3 -c 'import torch; print("torch", torch.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])' | tee "$R/env.txt"
timeout 250 python3 "$D/steps.py" --driver --out "$R" --label profile --profile --budget-s 230 --case-timeout-s 75 \
  --only h2_tp4sp_D,h2_moe_ep4_N,h2_tp2dp2_D 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|PROFILE|===|Error|error"
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
