#!/bin/bash
# All-to-all on 4x H200 NVSwitch, measured after its predictions were pre-registered (tag
# alltoall-h200-freeze, validation/alltoall-h200x4/predictions.yaml). Device kind nvidia-h200-x4.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi topo -m; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
timeout 280 python3 -m torch.distributed.run --standalone --nproc_per_node=4 "$D/comm.py" --out "$R" \
  --file alltoall.jsonl --ops all_to_all --groups 2 --timing events --budget-s 250 2>&1 | grep -v "Warning: \[PG" | tail -30 > "$R/log.txt"
tail -5 "$R/log.txt"; wc -l "$R"/*.jsonl
