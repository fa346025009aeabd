#!/bin/bash
# The spread of per-process host speed (benchmarks/device/host_spread.py, copied here as
# devreq/host/host_spread.py): n = 1, 2, 4 ranks issuing the same host-bound eager stream,
# without a collective (solo), with an all-reduce every block (layer) and with a .tolist()
# sync every block (sync); three launches of n = 4 for the spread between launches, one with
# each rank bound to its own cores (--pin), one with OMP_NUM_THREADS=4. About 3 minutes.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/host; mkdir -p "$R"
{ date -u; nproc; lscpu | grep -E "^CPU\(s\)|Model name|Thread|Core|Socket|NUMA|MHz"; \
  python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; \
  nvidia-smi topo -m; } > "$R/env.txt" 2>&1
run() {  # label n extra-args...
  local label=$1 n=$2; shift 2
  local t0=$SECONDS
  timeout 60 python3 -m torch.distributed.run --standalone --nproc_per_node=$n "$D/host_spread.py" \
    --out "$R/$label" --label "$label" $HS_EXTRA "$@" 2>&1 | grep -v "Warning: \[PG" >> "$R/log.txt"
  echo "=== $label n=$n rc=${PIPESTATUS[0]} $((SECONDS - t0)) s $(date -u +%T)" | tee -a "$R/log.txt"
}
run n1 1 --modes solo
run n2 2
run n4a 4
run n4b 4
run n4c 4
run n4pin 4 --pin
OMP_NUM_THREADS=4 run n4omp4 4
grep -E "SPREAD" "$R/log.txt" | grep "round 1" | head -40
date -u | tee -a "$R/log.txt"
