#!/bin/bash
# dt4 helper (issue 12): per-rank host spread of steps_alt.py's DTensor TP + SP step beside a
# plain eager step in the same processes (devreq/dt4/dtensor_spread.py; imports
# benchmarks/device/steps_alt.py from the repository), TP 4 and TP 2 alternating launches, tiny
# width and the h11_tp4sp_P shape at 16 layers; one steps_alt.py h11_tp4sp_P run in between.
# About 3-3.5 minutes. Results: $OUT/dt4/
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=devreq/dt4; R=$OUT/dt4; mkdir -p "$R"; T0=$SECONDS
{ date -u; nproc; lscpu | grep -E "^CPU\(s\)|Model name|Thread|Core|Socket|NUMA|MHz"; cat /proc/loadavg; \
  grep "^cpu " /proc/stat; \
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; } > "$R/env.txt" 2>&1
run() {  # label n
  local label=$1 n=$2 t0=$SECONDS
  timeout 75 python3 -m torch.distributed.run --standalone --nproc_per_node=$n "$D/dtensor_spread.py" \
    --out "$R" --label "$label" 2>&1 | grep -v "Warning: \[PG" >> "$R/log.txt"
  echo "=== $label n=$n rc=${PIPESTATUS[0]} $((SECONDS - t0)) s $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$R/log.txt"
}
run w4a 4
run w2a 2
if [ $((SECONDS - T0)) -lt 110 ]; then
  t0=$SECONDS
  timeout 50 python3 benchmarks/device/steps_alt.py --driver --only h11_tp4sp_P --case-timeout-s 45 --budget-s 48 \
    --label dt4 --out "$R/steps" 2>&1 | grep -v "Warning: \[PG" | tail -3 >> "$R/log.txt"
  echo "=== steps_alt h11_tp4sp_P $((SECONDS - t0)) s $(date -u +%T)" | tee -a "$R/log.txt"
fi
[ $((SECONDS - T0)) -lt 150 ] && run w4b 4
[ $((SECONDS - T0)) -lt 190 ] && run w2b 2
grep -E "DTSPREAD|RESULT" "$R/log.txt"
{ date -u; grep "^cpu " /proc/stat; } >> "$R/env.txt"
date -u | tee -a "$R/log.txt"
