#!/bin/bash
# emoe6 (issue 12): what an expert GEMM at a new row count synchronises on.
# Phase 1 (4 single-process sweeps side by side, one GPU each, ~45 s): benchmarks/device/
# gemm_drain.py (copy here): steps_alt.py's expert GEMMs (h14 AF 2304x4096, h13 AB 1792x3072)
# at 160 new row counts each, a spin kernel of 8 ms queued before every call, then 40 seen
# counts again; kernels per call named by a profiled replay. Variants: lazy (default),
# eager (CUDA_MODULE_LOADING=EAGER), cublaslt (preferred_blas_library), lazy + native
# backtraces of the main thread during long calls.
# Phase 2 (4 processes, ~80 s): moe_bwd_host.py h14_moe_ep4_AF --a2a nccl as emoe5 ran it,
# then the same with --prewarm (the expert GEMMs at a grid of row counts before the warm-up).
# About 2-2.5 minutes. Run from the repository root.
set -u
export NCCL_NVLS_ENABLE=0
D=$OUT/emoe6
mkdir -p $D
R=${SDIR:-devreq}/emoe6
{ nvidia-smi; nproc; python -c "import torch;print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"
  pip list 2>/dev/null | grep -i "nvidia\|torch"; which cc gcc gdb py-spy perf; cat /proc/loadavg; } > $D/env.txt 2>&1
SO=/tmp/emoe6-bt.so
rm -f $SO
cc -O1 -shared -fPIC -o $SO $R/gemm_drain_bt.c >> $D/env.txt 2>&1 || cp $R/gemm_drain_bt.prebuilt.so $SO
t0=$SECONDS
G=$R/gemm_drain.py
echo "== phase1 start $((SECONDS - t0)) s" >> $D/log.txt
CUDA_VISIBLE_DEVICES=0 timeout 90 python $G --tag lazy --out $D ${QUICK:-} > $D/log-lazy.txt 2>&1 &
CUDA_VISIBLE_DEVICES=1 CUDA_MODULE_LOADING=EAGER timeout 90 python $G --tag eager --out $D ${QUICK:-} > $D/log-eager.txt 2>&1 &
CUDA_VISIBLE_DEVICES=2 timeout 90 python $G --tag cublaslt --blas cublaslt --out $D ${QUICK:-} > $D/log-cublaslt.txt 2>&1 &
CUDA_VISIBLE_DEVICES=3 timeout 90 python $G --tag lazybt --backtrace $SO --out $D ${QUICK:-} > $D/log-lazybt.txt 2>&1 &
wait
echo "== phase1 end $((SECONDS - t0)) s" >> $D/log.txt
S=$R/moe_bwd_host.py  # benchmarks/device/moe_bwd_host.py with --prewarm
C=h14_moe_ep4_AF
run4 () { # tag extra
  echo "== $1 start $((SECONDS - t0)) s" >> $D/log.txt
  timeout 80 torchrun --standalone --nproc_per_node=4 $S --case $C --a2a nccl --tag $1 --out $D $2 ${QUICK:-} >> $D/log.txt 2>&1
  echo "== $1 rc $? end $((SECONDS - t0)) s" >> $D/log.txt
}
run4 nccl4 ""
[ $((SECONDS - t0)) -lt 170 ] && run4 nccl4pre --prewarm
cat /proc/loadavg >> $D/env.txt
rm -f $SO
grep -h "RESULT\|== \|Error\|error" $D/log*.txt | tail -20
