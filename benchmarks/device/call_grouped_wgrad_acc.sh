#!/bin/bash
# moe helper, second round (issue 10): expert wgrads accumulated in place into fp32 main_grad
# (one GPU, about 30 s).
set -u
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/moe2"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 benchmarks/device/grouped_wgrad_acc.py --out "$OUT/moe2" > "$OUT/moe2/log.txt" 2>&1
echo "rc=$?" >> "$OUT/moe2/log.txt"
tail -3 "$OUT/moe2/log.txt"
