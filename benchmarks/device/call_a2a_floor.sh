#!/bin/bash
# Helper a2asmall (issue 10): all-to-all's small-message floor timed two ways (CUDA events per
# call as comm.py, and a loop of 100 calls over one event pair), uniform / rotated / hot splits,
# groups of 4 and 2 (pairs at once), 4 KiB-4 MiB, with each rank's scheduler counters (launch a
# first times small collectives before, then after, its first all-to-all); three
# launches (a: default, pin: main threads pinned to one CPU each, b: default again); and
# one-side-narrow pairs at 128 / 448 / 1024 MiB (launch a). About 2 minutes. Results: $OUT/a2asmall/.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/a2asmall;  # run as devreq/a2asmall/call.sh, a2a_floor.py beside it
 mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv; lscpu; echo "siblings:"; cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list 2>/dev/null | sort -u | head -8; grep MHz /proc/cpuinfo | sort | uniq -c | head; cat /sys/devices/system/cpu/cpu0/cpufreq/scaling_governor 2>/dev/null; uptime; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
run() {  # label, phases, extra args
  timeout 100 python3 -m torch.distributed.run --standalone --nproc_per_node=4 "$D/a2a_floor.py" \
    --out "$R" --label "$1" --phases "$2" "${@:3}" 2>&1 | grep -v "Warning: \[PG" | tee -a "$R/log.txt" | tail -4
}
run a order,floor,narrow
run pin floor --pin
run b floor
date -u | tee -a "$R/log.txt"; wc -l "$R"/*.jsonl
