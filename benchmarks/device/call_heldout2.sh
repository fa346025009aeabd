#!/bin/bash
# Second pre-registered held-out batch (issue 12): run by the device tool (kind nvidia-h100-x4)
# after the model was frozen at tag heldout-freeze-2 and its predictions committed
# (validation/heldout2/predictions-heldout-freeze-2.yaml). Cases in priority order; the driver
# stops starting cases when its budget is spent.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; nvidia-smi topo -m; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
BUDGET=${BUDGET:-300}
timeout $(( BUDGET + 20 )) python3 "$D/steps.py" --driver --out "$R" --label first --budget-s "$BUDGET" --case-timeout-s 60 \
  --only h2_moe_ep4_N,h2_tp4sp_D,h2_pp4_1f1b_D,h2_fsdp4_D,h2_moe_ep2dp2_N,h2_ddp4_D,h2_tp2dp2_D 2>&1 | grep -v "Warning: \[PG" | tee -a "$L"
date -u | tee -a "$L"; wc -l "$R"/*.jsonl; grep -h RESULT "$L"
