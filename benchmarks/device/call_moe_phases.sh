#!/bin/bash
# emoe (issue 10): per-phase host + CUDA-event timeline of eager MoE layer calls inside real
# steps of steps_alt.py (h11_moe_ep4_M, h8_moe_ep4_Q) and steps_third.py (h12t_moe_ep4_K), each
# also at tiny widths (host-only time). About 3 minutes on 4x H100.
set -u
export NCCL_NVLS_ENABLE=0
OUT_DIR="$OUT/emoe"
mkdir -p "$OUT_DIR"
P=benchmarks/device/moe_phases.py
{ nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; python -c "import torch; print(torch.__version__, torch.cuda.nccl.version())"; } > "$OUT_DIR/env.txt" 2>&1
run() {  # script case [--tiny]
  local t0=$(python -c "import time; print(time.time())")
  timeout 75 torchrun --standalone --nproc_per_node=4 $P --script "$1" --case "$2" --out "$OUT_DIR" ${3:-} >> "$OUT_DIR/log.txt" 2>&1
  local rc=$?
  echo "{\"script\": \"$1\", \"case\": \"$2\", \"flag\": \"${3:-}\", \"rc\": $rc, \"wall_s\": $(python -c "import time; print(round(time.time() - $t0, 1))")}" >> "$OUT_DIR/phases_runs.jsonl"
}
run alt h11_moe_ep4_M
run third h12t_moe_ep4_K
run alt h11_moe_ep4_M --tiny
run third h12t_moe_ep4_K --tiny
run alt h8_moe_ep4_Q
run alt h12_moe_ep4_L
