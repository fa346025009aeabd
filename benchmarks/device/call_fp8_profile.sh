#!/bin/bash
# FP8 GEMMs beside bf16 (issue 11) and kernel profiles of development training steps (issues
# 10, 12): run by the device tool (kind nvidia-h100-x4) from the repository root.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; } > "$R/env.txt" 2>&1
head -3 "$R/env.txt"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 "$D/gemm_fp8.py" --out "$R" --budget-s 170 2>&1 | tee -a "$L" | tail -40
BUDGET=${BUDGET:-280}
timeout $(( BUDGET + 20 )) python3 "$D/steps.py" --driver --out "$R" --label profile --profile --budget-s "$BUDGET" --case-timeout-s 75 \
  --only ho_tp4sp_B,moe_ep4,ho_tp4_B,moe_ep2dp2,ho_fsdp4_B_rc,ho_fsdp4_B 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|PROFILE|===|Error|error" 
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
