#!/bin/bash
# Sixth pre-registered held-out batch (issue 12), 2-GPU box (kind nvidia-h100-x2, or
# nvidia-h200-x2 if that is what comes: the env.txt it writes says which): the cases of the
# second measuring script, steps_alt.py, run after the model was frozen (tag heldout-freeze-6)
# and its predictions committed. The machine's description first, then one torchrun per case.
# Usage: call_heldout6.sh [CASES [BUDGET_S]]   (default: the 2-GPU batch, 360 s; $OUT set by the
# device tool). call_heldout6_x4.sh runs the 4-GPU cases through this script.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
X2=h6_single_U,h6_single_V,h6_ddp2_U,h6_ddp2_U_straggler,h6_fsdp2_U,h6_fsdp2_V_ac,h6_tp2_U,h6_tp2sp_V,h6_pp2_1f1b_V,h6_pp2_int2_V,h6_moe_ep2_W
CASES=${1:-$X2}; BUDGET=${BUDGET:-${2:-360}}
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
timeout $(( BUDGET + 20 )) python3 "$D/steps_alt.py" --driver --out "$R" --label first --budget-s "$BUDGET" \
  --case-timeout-s 75 --only "$CASES" 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|===|Error|error"
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
