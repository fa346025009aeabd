#!/bin/bash
# Is eager PyTorch host-bound? Step time beside the host's issue time (step() returning) and
# full kernel profiles, for development cases (issue 12 item 4: host launch overhead of eager
# code). Run by the device tool (kind nvidia-h100-x4) from the repository root.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
python3 -c 'import torch; print("torch", torch.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])' | tee "$R/env.txt"
timeout 330 python3 "$D/steps.py" --driver --out "$R" --label host-issue --profile --budget-s 310 --case-timeout-s 70 \
  --only h2_tp4sp_D,h2_moe_ep4_N,ho_tp4sp_B,h2_tp2dp2_D,moe_ep4,h2_ddp4_D,h2_fsdp4_D 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|PROFILE|===|Error|error"
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
