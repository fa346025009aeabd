#!/bin/bash
# Host time of eager PyTorch calls one kind at a time (host_ops.py), on 4 GPUs; run by the
# device tool (kind nvidia-h100-x4) from the repository root.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"
python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])' | tee "$R/env.txt"
for k in 32 64; do
  timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node=4 "$D/host_ops.py" --out "$R/k$k" -k $k 2>&1 | grep -v "Warning: \[PG" | tee -a "$R/log.txt" | grep -E "HOSTOP|Error|error"
done
date -u | tee -a "$R/log.txt"
# the third held-out batch's cases shrunk to host-bound widths (steps.py --tiny), for the fit
timeout 250 python3 "$D/steps.py" --driver --tiny --out "$R/tiny3" --label tiny3 --budget-s 230 --case-timeout-s 60 \
  --only h3_tp4sp_E,h3_tp4_E,h3_tp2dp2_E,h3_ddp4_E,h3_pp2dp2_E,h3_moe_ep4_P 2>&1 | grep -v "Warning: \[PG" | tee -a "$R/log.txt" | grep -E "RESULT|Error|error"
date -u | tee -a "$R/log.txt"
