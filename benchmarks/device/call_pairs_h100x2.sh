#!/bin/bash
# NCCL collectives between a pair of H100s (issue 12), run by the device tool (kind
# nvidia-h100-x2) after their predictions were committed (validation/pairs-h100x2/predictions.yaml,
# tag pairs-h100x2-freeze): all-reduce, all-gather, reduce-scatter, all-to-all (uniform splits
# first), 4 KiB - 1 GiB, CUDA-event timing.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi topo -m; } > "$R/env.txt" 2>&1
timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node=2 "$D/comm.py" --out "$R" \
  --ops all_reduce,all_gather,reduce_scatter,all_to_all --groups 2 --timing events --budget-s 260 2>&1 \
  | grep -v "Warning: \[PG" | tee "$R/log.txt" | tail -12
date -u | tee -a "$R/log.txt"; wc -l "$R"/*.jsonl
