#!/bin/bash
# Fourth pre-registered held-out batch, its 2-GPU cases (issue 12): run by the device tool (kind nvidia-h100-x2 or nvidia-h200-x2)
# after the model was frozen at tag heldout-freeze-4 (the host as a second clock beside each GPU)
# and its predictions committed (validation/heldout4/predictions-heldout-freeze-4-x2.yaml).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
BUDGET=${BUDGET:-400}
timeout $(( BUDGET + 20 )) python3 "$D/steps.py" --driver --out "$R" --label first --budget-s "$BUDGET" --case-timeout-s 60 \
  --only h4x2_tp2sp_F,h4x2_moe_ep2_R,h4x2_ddp2_G,h4x2_pp2_int2_F,h4x2_fsdp2_F_rc 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|===|Error|error"
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
