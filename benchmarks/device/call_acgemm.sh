#!/bin/bash
# acgemm (issue 12, fourteenth batch, shape AC): the GEMMs of one block and of the LM head of
# steps_third.py, on ONE H100, bf16, CUDA events; shapes AC, I (control) and J; the fp32
# cross-entropy, a whole block and the tail by events and under the profiler, and the
# single-GPU steps h14t_single_AC / h13t_single_I timed and profiled. About 1 minute.
# Run from the repository root; results in $OUT/acgemm/ (data/measured/acgemm-h100x1).
# (As run on 2026-11-27 the script was copied beside call.sh as devreq/acgemm/block_gemms.py.)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0
R=$OUT/acgemm; mkdir -p "$R"
{ date -u; nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv; } > "$R/env.txt" 2>&1
timeout 200 python3 benchmarks/device/block_gemms.py --out "$R/block_gemms.jsonl" --shapes AC,I,J > "$R/log.txt" 2>&1
echo "rc $?" >> "$R/log.txt"
{ date -u; nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv; } >> "$R/env.txt" 2>&1
tail -3 "$R/log.txt"
