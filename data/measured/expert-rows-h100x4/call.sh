#!/bin/bash
# helper emoe9 (issue 10/12): expert rows (every MoE call's rows per local expert, warm-up
# included) and step times of existing eager MoE cases, to compare their routers' row-count
# statistics (correlation, zero share, new counts and kernel bands per step) with the
# collapsing router's constant (fitted on h8_moe_ep*_Q only) and the stable router's.
# Unchanged scripts (benchmarks/device/steps_alt.py, steps_third.py) with --expert-rows.
# 2-GPU cases run two at a time (GPUs 0,1 and 2,3), then the 4-GPU cases alone. ~3 min.
set -u
export NCCL_NVLS_ENABLE=0
O=$OUT/emoe9
mkdir -p $O/a $O/b $O/x4
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/env.txt 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())" >> $O/env.txt 2>&1
one() { # dir gpus n script case
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=$2 timeout 75 torchrun --standalone --nproc_per_node=$3 \
    benchmarks/device/$4 --case $5 --out $O/$1 --expert-rows --label emoe9 > $O/$1/log-$5.txt 2>&1
  echo "$5 rc=$? wall=$(( $(date +%s) - t0 ))s" >> $O/$1/phases.txt
}
( for c in h6_moe_ep2_W h7_moe_ep2_Y h15_moe_ep2_AJ h14_moe_ep2_AF; do one a 0,1 2 steps_alt.py $c; done ) &
( for c in h15t_moe_ep2_AH h12t_moe_ep2_K h13t_moe_ep2_O h11t_moe_ep2_H; do one b 2,3 2 steps_third.py $c; done ) &
wait
for c in h6_moe_ep4_W h12_moe_ep4_L h15_moe_ep4_AJ; do one x4 0,1,2,3 4 steps_alt.py $c; done
ls -la $O/*
