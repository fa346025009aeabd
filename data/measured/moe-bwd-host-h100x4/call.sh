#!/bin/bash
# emoe5 (issue 12): where the host time of steps_alt.py's eager expert backward goes with 4
# processes. h14_moe_ep4_AF (steps_alt.py's own build_moe / step), marks per phase and per
# expert, per-thread CPU, 2 profiled steps; variants: NCCL exchanges (as the script), local
# copies in place of every MoE exchange (4 processes), the same in 1 process (EP 4 emulated).
# About 2.5-3.5 minutes. Run from the repository root.
set -u
export NCCL_NVLS_ENABLE=0
D=$OUT/emoe5
mkdir -p $D
S=${SDIR:-devreq}/emoe5/moe_bwd_host.py  # in the repository: benchmarks/device/moe_bwd_host.py
C=h14_moe_ep4_AF
{ nvidia-smi; nproc; lscpu | head -20; python -c "import torch;print(torch.__version__, torch.cuda.nccl.version())"; cat /proc/loadavg; } > $D/env.txt 2>&1
t0=$SECONDS
run4 () { # tag a2a
  echo "== $1 start $((SECONDS - t0)) s" >> $D/log.txt
  timeout 60 torchrun --standalone --nproc_per_node=4 $S --case $C --a2a $2 --tag $1 --out $D ${QUICK:-} >> $D/log.txt 2>&1
  echo "== $1 rc $? end $((SECONDS - t0)) s" >> $D/log.txt
}
run1 () {
  echo "== $1 start $((SECONDS - t0)) s" >> $D/log.txt
  CUDA_VISIBLE_DEVICES=0 timeout 60 python $S --case $C --a2a local --emulate-ep 4 --tag $1 --out $D ${QUICK:-} >> $D/log.txt 2>&1
  echo "== $1 rc $? end $((SECONDS - t0)) s" >> $D/log.txt
}
run4 nccl4 nccl
run4 local4 local
run1 local1
[ $((SECONDS - t0)) -lt 150 ] && run4 nccl4b nccl
[ $((SECONDS - t0)) -lt 165 ] && run4 local4b local
cat /proc/loadavg >> $D/env.txt
grep -h "RESULT\|== \|Error\|error" $D/log.txt | tail -20
