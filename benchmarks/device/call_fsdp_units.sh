#!/bin/bash
# FSDP2's fixed cost per unit (fsdp_units.py) on the lent GPUs (issue 12: FSDP steps 9-11 % fast);
# run by the device tool from the repository root: call_fsdp_units.sh [GPUS] [TENSORS]
# (TENSORS > 1: the cost per parameter tensor, fsdp_units.py --tensors)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; } > "$R/env.txt" 2>&1
timeout 400 python3 -m torch.distributed.run --standalone --nproc_per_node="${1:-2}" "$D/fsdp_units.py" --out "$R" --tensors "${2:-1}" 2>&1 \
  | grep -v "Warning: \[PG" > "$R/log.txt"; tail -3 "$R/log.txt"
date -u >> "$R/env.txt"; cat "$R/fsdp_units.jsonl"
