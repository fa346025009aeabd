#!/bin/bash
# dtensor helper (issue 12): does DTensor's host cost per unit / per layer / per step grow with
# the TP degree? Run from the repository root on a 4x H100 box; about 3-4 minutes.
# 1. benchmarks/device/dtensor_step_host.py (steps_alt.py's DTensor TP + SP step by phase: fwd,
#    bwd, wpe all-reduce, opt.step, zero_grad, wall; plus the same AdamW on plain tensors),
#    widths tiny and N at 2 and 24 layers, on 2 ranks then 4 ranks.
# 2. benchmarks/device/dtensor_host.py (per-unit DTensor host cost, committed) on 2 then 4 ranks.
# 3. if time is left: one profiled step of h12_tp4sp_N (steps_alt.py --profile).
# Results: $OUT/dtensor/{env.txt,log.txt,dtensor_step_host_w{2,4}.jsonl,dtensor_host_w{2,4}.jsonl,steps/}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
R=$OUT/dtensor; mkdir -p "$R"; T0=$(date +%s)
{ date -u; python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "python", sys.version.split()[0])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA)"; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
for n in 2 4; do
  echo "=== step_host w$n $(date -u +%T)" | tee -a "$R/log.txt"
  timeout 80 python3 -m torch.distributed.run --standalone --nproc_per_node=$n benchmarks/device/dtensor_step_host.py --out "$R" 2>&1 \
    | grep -v "Warning: \[PG" | tee -a "$R/log.txt" | grep -E "DTSTEP|Error|error"
done
for n in 2 4; do
  echo "=== dtensor_host w$n $(date -u +%T)" | tee -a "$R/log.txt"
  mkdir -p "$R/tmp"
  timeout 90 python3 -m torch.distributed.run --standalone --nproc_per_node=$n benchmarks/device/dtensor_host.py --out "$R/tmp" 2>&1 \
    | grep -v "Warning: \[PG" | tee -a "$R/log.txt" | grep -E "DTHOST|Error|error"
  mv "$R/tmp/dtensor_host.jsonl" "$R/dtensor_host_w$n.jsonl" 2>/dev/null; rm -rf "$R/tmp"
done
if [ $(( $(date +%s) - T0 )) -lt 200 ]; then
  echo "=== profile h12_tp4sp_N $(date -u +%T)" | tee -a "$R/log.txt"
  timeout 60 python3 benchmarks/device/steps_alt.py --driver --only h12_tp4sp_N --profile --warmup 2 --steps 3 \
    --case-timeout-s 55 --budget-s 58 --label profile --out "$R/steps" 2>&1 | grep -v "Warning: \[PG" | tail -5 | tee -a "$R/log.txt"
fi
date -u | tee -a "$R/log.txt"; wc -l "$R"/*.jsonl
