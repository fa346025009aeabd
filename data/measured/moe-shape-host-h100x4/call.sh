#!/bin/bash
# emoe3: host cost of new expert-GEMM row counts, allocator stats beside it, one H100 (~25-40 s).
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/emoe3"
{ nvidia-smi -L; nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv; \
  python -c "import torch; print(torch.__version__, torch.version.cuda)"; \
  lscpu | grep -E 'Model name|^CPU\(s\)|MHz'; uptime; } > "$OUT/emoe3/env.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 90 python benchmarks/device/moe_shape_host.py --rows-dir data/measured/diagnosis9-h100x4 \
  --out "$OUT/emoe3" > "$OUT/emoe3/log.txt" 2>&1
echo "rc=$?" >> "$OUT/emoe3/log.txt"
