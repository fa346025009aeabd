#!/bin/bash
# lead (issue 10): expert rows (every MoE call's rows per local expert, warm-up included) of the
# learned-router eager MoE cases at EP 4 of the third script, which earlier logs lacked, and the
# seventeenth batch's (scored) learned-router cases; unchanged scripts with --expert-rows.
set -u
export NCCL_NVLS_ENABLE=0
O=$OUT/rows; mkdir -p $O/a $O/b $O/x4
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/env.txt 2>&1
one() { # dir gpus n script case
  local t0=$(date +%s)
  CUDA_VISIBLE_DEVICES=$2 timeout 60 torchrun --standalone --nproc_per_node=$3 \
    benchmarks/device/$4 --case $5 --out $O/$1 --expert-rows --label rows > $O/$1/log-$5.txt 2>&1
  echo "$5 rc=$? wall=$(( $(date +%s) - t0 ))s" >> $O/$1/phases.txt
}
( for c in h17_moe_ep2_AV h14_moe_ep2_AF; do one a 0,1 2 steps_alt.py $c; done ) &
( for c in h17t_moe_ep2_AR h14t_moe_ep2_AD; do one b 2,3 2 steps_third.py $c; done ) &
wait
for c in h17t_moe_ep4_AR h15t_moe_ep4_AH h14t_moe_ep4_AD; do one x4 0,1,2,3 4 steps_third.py $c; done
one x4 0,1,2,3 4 steps_alt.py h17_moe_ep4_AV
