#!/bin/bash
# Diagnosis of the eighth held-out batch's largest misses (issue 12/10), 4-GPU box, after
# that batch was published (so whatever it changes makes heldout8 a development set):
# DTensor TP + SP on shape Z (-25..-32 %), FSDP2 4 with checkpointing (-13.5 %), the third
# script's hand-written TP 4 (-12.1 %), and eager MoE with a learned router (+24..+33 %).
# Each case is timed as in the batch, then one more step runs under torch.profiler
# (profile.jsonl), and MoE cases write every layer call's rows per local expert
# (expert_rows-CASE-rN.json: the M of each expert GEMM, for the cuBLAS shape-cache model).
# h6_tp2sp_V (DTensor TP + SP that fitted) is profiled beside Z for contrast. $OUT set by the
# device tool.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
python3 "$D/steps_alt.py" --driver --profile --expert-rows --out "$R" --label diagnosis9 --budget-s 300 --case-timeout-s 80 \
  --only "${ALT:-h8_tp2sp_Z,h6_tp2sp_V,h8_tp4sp_Z,h8_fsdp4_Z_ac,h8_moe_ep2_Q,h8_moe_ep4_Q}" 2>&1 | grep -v "Warning: \[PG" | tee "$R/log_alt.txt" | grep -E "RESULT|PROFILE|===|Error|error"
python3 "$D/steps_third.py" --driver --profile --expert-rows --out "$R" --label diagnosis9 --budget-s 200 --case-timeout-s 80 \
  --only "${THIRD:-h8t_tp4_A,h8t_moe_ep2_B,h8t_moe_ep4_B}" 2>&1 | grep -v "Warning: \[PG" | tee "$R/log_third.txt" | grep -E "RESULT|PROFILE|===|Error|error"
date -u; wc -l "$R"/*.jsonl; cd "$OUT" && tar czf r.tgz r && rm -rf r
