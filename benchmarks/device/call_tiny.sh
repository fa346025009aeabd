#!/bin/bash
# Host time per launched kernel of eager PyTorch training code: the cases of steps.py at hidden
# 256 and 128-token sequences (same layers, schemes and micro-batches), where the GPU work is
# tiny and the step is bound by the host; with --profile for the kernel counts. Run by the
# device tool (kind nvidia-h100-x4) from the repository root.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
python3 -c 'import torch; print("torch", torch.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])' | tee "$R/env.txt"
timeout 330 python3 "$D/steps.py" --driver --tiny --out "$R" --label tiny --profile --budget-s 310 --case-timeout-s 60 \
  --only h2_tp4sp_D,h2_moe_ep4_N,h2_ddp4_D,h2_tp2dp2_D,ho_tp4sp_B,moe_ep4,ho_tp4_B,h2_fsdp4_D,h2_pp4_1f1b_D,h2_moe_ep2dp2_N,ho_pp4_1f1b_C 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|PROFILE|Error|error"
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
