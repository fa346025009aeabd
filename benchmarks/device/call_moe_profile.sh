#!/bin/bash
# Diagnosis of eager MoE steps (issue 10/12), 2-GPU box: why steps_alt.py's MoE steps run
# 30-54 % slower than the simulator predicts while steps.py's fit. One more step of each case
# under torch.profiler after timing (profile.jsonl: kernels, GPU busy and idle, host syncs,
# the aten ops of most host time). $OUT set by the device tool.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
python3 "$D/steps_alt.py" --driver --profile --out "$R" --label profile --budget-s 200 --case-timeout-s 75 \
  --only "${ALT:-h7_moe_ep2_Y,h6_moe_ep2_W,h7_ddp2_X}" 2>&1 | grep -v "Warning: \[PG" | tee "$R/log_alt.txt" | grep -E "RESULT|PROFILE|===|Error|error"
python3 "$D/steps.py" --driver --profile --out "$R" --label profile --budget-s 120 \
  --only "${STEPS:-h5_moe_ep2_T,h4x2_moe_ep2_R}" 2>&1 | grep -v "Warning: \[PG" | tee "$R/log_steps.txt" | grep -E "RESULT|PROFILE|===|Error|error"
date -u; wc -l "$R"/*.jsonl; cd "$OUT" && tar czf r.tgz r && rm -rf r
