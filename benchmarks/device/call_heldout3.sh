#!/bin/bash
# Third pre-registered held-out batch (issue 12): run by the device tool (kind nvidia-h100-x4)
# after the model was frozen at tag heldout-freeze-3 (the host's time for eager code modelled)
# and its predictions committed (validation/heldout3/predictions-heldout-freeze-3.yaml).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
BUDGET=${BUDGET:-330}
timeout $(( BUDGET + 20 )) python3 "$D/steps.py" --driver --out "$R" --label first --budget-s "$BUDGET" --case-timeout-s 60 \
  --only h3_tp4sp_E,h3_moe_ep4_P,h3_tp2dp2_E,h3_ddp4_E,h3_pp2dp2_E,h3_tp4_E,h3_moe_ep2dp2_P 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|===|Error|error"
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
