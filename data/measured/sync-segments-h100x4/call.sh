#!/bin/bash
# esync (2026-11-27 14:34-14:39 UTC, batched by the lead; the copy of devreq/esync/call.sh with the
# scripts' paths in the repository): host synchronisations cutting a host-bound stream into
# segments (sync_segments.py) on 4, 2 and 1 ranks and again on 4; then first-use GEMM kernel
# loads in a fresh process (first_use.py), lazy module loading and EAGER as a control.
# The lead re-ran the two 4-rank launches in a second call (NOTE.txt).
set -u
export NCCL_NVLS_ENABLE=0
D=benchmarks/device
O=$OUT/esync
mkdir -p $O
{ nproc; lscpu | head -20; nvidia-smi -L; python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; } > $O/env.txt 2>&1
for spec in "4 a" "2 a" "1 a" "4 b"; do
  set -- $spec
  timeout 75 torchrun --standalone --nproc_per_node=$1 $D/sync_segments.py --out $O --label $2 \
    >> $O/log.txt 2>&1 || echo "sync_segments w$1 $2 rc=$?" >> $O/log.txt
done
timeout 40 python $D/first_use.py --out $O --label lazy >> $O/log.txt 2>&1 || echo "first_use lazy rc=$?" >> $O/log.txt
CUDA_MODULE_LOADING=EAGER timeout 60 python $D/first_use.py --out $O --label eager >> $O/log.txt 2>&1 || echo "first_use eager rc=$?" >> $O/log.txt
tail -20 $O/log.txt
