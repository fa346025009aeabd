#!/bin/bash
# moe helper (issue 10): grouped expert GEMMs at the published MoE rows' shapes, one GPU each.
# GPU 0: every configuration; GPU 1 (at the same time): the Qwen3 ones again (a second card).
# About 1-2 minutes; budget 170 s a process.
set -u
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/moe/gpu0" "$OUT/moe/gpu1"
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit,driver_version --format=csv > "$OUT/moe/nvidia-smi.csv" 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 benchmarks/device/grouped_gemm.py --out "$OUT/moe/gpu0" --budget-s 170 > "$OUT/moe/gpu0/log.txt" 2>&1 &
P0=$!
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 benchmarks/device/grouped_gemm.py --out "$OUT/moe/gpu1" --budget-s 120 \
  --only qwen3_e4_m4096,qwen3_e16_m1024,qwen3_e16_m512,qwen3_e16_m256 > "$OUT/moe/gpu1/log.txt" 2>&1 &
P1=$!
wait $P0; echo "gpu0 rc=$?" >> "$OUT/moe/rc.txt"
wait $P1; echo "gpu1 rc=$?" >> "$OUT/moe/rc.txt"
tail -5 "$OUT/moe/gpu0/log.txt"
