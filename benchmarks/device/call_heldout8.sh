#!/bin/bash
# Eighth pre-registered held-out batch (issue 12 item 3): the cases of the third measuring
# script, steps_third.py (a Llama-style model, hand-written TP / 1F1B / MoE dispatch), run after
# the model was frozen and its predictions committed. The machine's description first, then one
# torchrun per case. Usage: call_heldout8.sh [CASES [BUDGET_S]]   (default: the 2-GPU batch,
# 360 s; $OUT set by the device tool). For the 4-GPU box pass the h8t_*4_* cases.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
X2=h8t_single_A,h8t_ddp2_A,h8t_fsdp2_A,h8t_fsdp2_A_ac,h8t_tp2_A,h8t_pp2_1f1b_A,h8t_moe_ep2_B
X4=h8t_ddp4_A,h8t_fsdp4_A,h8t_tp4_A,h8t_pp4_1f1b_A,h8t_moe_ep4_B
CASES=${1:-$X2}; [ "$CASES" = x4 ] && CASES=$X4; BUDGET=${BUDGET:-${2:-360}}
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
timeout $(( BUDGET + 20 )) python3 "$D/steps_third.py" --driver --out "$R" --label first --budget-s "$BUDGET" \
  --case-timeout-s 75 --only "$CASES" 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|===|Error|error"
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
tar -C "$OUT" -czf "$OUT/r.tgz" r
