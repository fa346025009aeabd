#!/bin/bash
# Megatron-Core's PyTorch MoE permutation pieces (moe_permute.py) and FP8 / bf16 GEMMs at the
# Mixtral expert shapes on one H100, about a minute; run from the repository root. Copy
# $OUT/nemo2/* to data/measured/moe-permute-h100x1/.
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT/nemo2"
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv > "$OUT/nemo2/gpu.txt" 2>&1
CUDA_VISIBLE_DEVICES=0 timeout 200 python benchmarks/device/moe_permute.py > "$OUT/nemo2/permute.jsonl" 2> "$OUT/nemo2/stderr.txt"
echo "rc=$?" >> "$OUT/nemo2/stderr.txt"
