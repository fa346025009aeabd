#!/bin/bash
# emoe8 (issue 12): what a first launch of a cuBLAS kernel costs the host when nothing hides it,
# and what its drain waits for with an all-to-all queued before it on 4 processes.
# Phase 1 (4 single-process sweeps side by side, one GPU each, ~30-50 s): gemm_drain.py
# (benchmarks/device/gemm_drain.py, copy here) with the GPU idle before every call
# (--sleep-ms 0: the host time of a first launch itself, as in a forward after the count read),
# seed 0 and seed 1; and behind a 1 ms and a 3 ms spin (how much of it the spin hides).
# Phase 2 (~30 s): the seed-0 idle sweep again, alone on the box (contention of 4 processes).
# Phase 3 (4 processes, ~2 x 20 s): gemm_drain_a2a.py: a spin of 1 ms and an all_to_all_single
# queued before a new data-gradient GEMM, the ranks' hosts staggered by 2 ms (st2) or not (st0).
# About 2-3 minutes. Run from the repository root.
set -u
export NCCL_NVLS_ENABLE=0
D=$OUT/emoe8
mkdir -p $D
R=${SDIR:-devreq}/emoe8
{ nvidia-smi; nproc; python -c "import torch;print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; cat /proc/loadavg; } > $D/env.txt 2>&1
t0=$SECONDS
G=$R/gemm_drain.py
echo "== phase1 start $((SECONDS - t0)) s" >> $D/log.txt
CUDA_VISIBLE_DEVICES=0 timeout 80 python $G --tag idle --sleep-ms 0 --out $D ${QUICK:-} > $D/log-idle.txt 2>&1 &
CUDA_VISIBLE_DEVICES=1 timeout 80 python $G --tag idle-s1 --sleep-ms 0 --seed 1 --out $D ${QUICK:-} > $D/log-idle-s1.txt 2>&1 &
CUDA_VISIBLE_DEVICES=2 timeout 80 python $G --tag spin1 --sleep-ms 1 --out $D ${QUICK:-} > $D/log-spin1.txt 2>&1 &
CUDA_VISIBLE_DEVICES=3 timeout 80 python $G --tag spin3 --sleep-ms 3 --out $D ${QUICK:-} > $D/log-spin3.txt 2>&1 &
wait
echo "== phase2 start $((SECONDS - t0)) s" >> $D/log.txt
CUDA_VISIBLE_DEVICES=0 timeout 60 python $G --tag idle-alone --sleep-ms 0 --out $D ${QUICK:-} > $D/log-idle-alone.txt 2>&1
echo "== phase3 start $((SECONDS - t0)) s" >> $D/log.txt
A=$R/gemm_drain_a2a.py
timeout 45 torchrun --standalone --nproc_per_node=4 $A --tag st2 --stagger-ms 2 --out $D ${QUICK:-} >> $D/log.txt 2>&1
echo "== st2 rc $? $((SECONDS - t0)) s" >> $D/log.txt
[ $((SECONDS - t0)) -lt 190 ] && timeout 45 torchrun --standalone --nproc_per_node=4 $A --tag st0 --stagger-ms 0 --seed 6 --out $D ${QUICK:-} >> $D/log.txt 2>&1
echo "== end $((SECONDS - t0)) s" >> $D/log.txt
cat /proc/loadavg >> $D/env.txt
grep -h "RESULT\|== \|Error\|error" $D/log*.txt | tail -20
