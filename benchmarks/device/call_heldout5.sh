#!/bin/bash
# Fifth pre-registered held-out batch, 2-GPU boxes (issue 12): run by the device tool (kind nvidia-h100-x2 or nvidia-h200-x2)
# after the model was frozen at tag heldout-freeze-5 (host clock with the MoE routing rate)
# and its predictions committed (validation/heldout5/predictions-heldout-freeze-5.yaml).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
BUDGET=${BUDGET:-400}
timeout $(( BUDGET + 20 )) python3 "$D/steps.py" --driver --out "$R" --label first --budget-s "$BUDGET" --case-timeout-s 60 \
  --only h5_tp2_S,h5_moe_ep2_T,h5_ddp2_S,h5_pp2_1f1b_S,h5_fsdp2_S 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|===|Error|error"
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
