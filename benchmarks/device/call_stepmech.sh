#!/bin/bash
# stepmech (issue 12): mechanisms behind a single-GPU eager step's kernel times, after acgemm-h100x1.
# Four processes on four GPUs at once (about 90 s): GPU 0 (and GPU 3, a replicate) the GEMM
# clocks/duty-cycle phase, GPU 1 fused AdamW / clip against parameter count, GPU 2 profiler
# traces and host issue time. nvidia-smi samples every GPU's SM clock and power every 50 ms
# beside them (smi.csv). Run from the repository root; results in $OUT/stepk/
# (data/measured/stepmech-h100x4). As run on 2026-11-27 the script was copied beside this file
# as devreq/stepk/step_mechanisms.py (helper stepk's request).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
R=$OUT/stepk; mkdir -p "$R"
S=benchmarks/device/step_mechanisms.py
{ date -u; nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw,power.limit --format=csv; python3 -c "import torch; print(torch.__version__, torch.version.cuda)"; } > "$R/env.txt" 2>&1
Q=timestamp,index,clocks.sm,clocks.mem,power.draw,power.draw.instant,temperature.gpu,clocks_event_reasons.active,utilization.gpu
nvidia-smi --query-gpu=$Q --format=csv -c 1 > /dev/null 2>&1 || Q=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active,utilization.gpu
echo "epoch_at_start $(date +%s.%N)" >> "$R/env.txt"
nvidia-smi --query-gpu=$Q --format=csv -lms 50 > "$R/smi.csv" 2>&1 &
SMI=$!
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 $S --phase clocks --out "$R/clocks.jsonl" > "$R/log_clocks.txt" 2>&1 &
P0=$!
CUDA_VISIBLE_DEVICES=1 timeout 200 python3 $S --phase adam --out "$R/adam.jsonl" > "$R/log_adam.txt" 2>&1 &
P1=$!
CUDA_VISIBLE_DEVICES=3 timeout 200 python3 $S --phase clocks --out "$R/clocks-gpu3.jsonl" > "$R/log_clocks3.txt" 2>&1 &
P3=$!
mkdir -p "$R/trace"
CUDA_VISIBLE_DEVICES=2 timeout 200 python3 $S --phase trace --out "$R/trace/trace.jsonl" > "$R/log_trace.txt" 2>&1 &
P2=$!
wait $P0; echo "clocks rc $?" >> "$R/env.txt"
wait $P1; echo "adam rc $?" >> "$R/env.txt"
wait $P2; echo "trace rc $?" >> "$R/env.txt"
wait $P3; echo "clocks-gpu3 rc $?" >> "$R/env.txt"
kill $SMI
{ date -u; nvidia-smi --query-gpu=index,clocks.sm,temperature.gpu,power.draw --format=csv; } >> "$R/env.txt" 2>&1
