#!/bin/bash
# Host time of DTensor tensor parallelism per op beside its plain-tensor equivalent
# (dtensor_host.py; issue 12 item 4), on 2 GPUs: run by the device tool (kind nvidia-h100-x2)
# from the repository root. One folder $OUT/r: env.txt, log.txt, dtensor_host.jsonl.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
timeout 170 python3 -m torch.distributed.run --standalone --nproc_per_node=2 "$D/dtensor_host.py" --out "$R" 2>&1 \
  | grep -v "Warning: \[PG" | tee "$R/log.txt" | grep -E "DTHOST|Error|error"
date -u | tee -a "$R/log.txt"; wc -l "$R"/*.jsonl
