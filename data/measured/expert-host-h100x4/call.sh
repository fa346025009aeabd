#!/bin/bash
# emoe2: host time of steps_alt.py's eager expert section on one H100 (about 30-45 s).
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/emoe2"
{ nvidia-smi -L; python -c "import torch; print(torch.__version__, torch.version.cuda)"; \
  lscpu | grep -E 'Model name|^CPU\(s\)|MHz'; } > "$OUT/emoe2/env.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 100 python benchmarks/device/expert_host.py --out "$OUT/emoe2" \
  > "$OUT/emoe2/log.txt" 2>&1
echo "rc=$?" >> "$OUT/emoe2/log.txt"
