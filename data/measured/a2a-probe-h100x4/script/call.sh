#!/bin/bash
# a2a helper (issue 12): host time per collective call by kind and split kind; uneven all-to-all
# patterns (not heldout11's) at 2-512 MiB a rank. Three launches, ~3 minutes in all.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=devreq/a2a; R=$OUT/a2a; mkdir -p "$R"; L=$R/log.txt
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,clocks.max.sm --format=csv; lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core)"; } > "$R/env.txt" 2>&1
run() {  # nproc timeout log-tag args...
  local n=$1 t=$2 tag=$3; shift 3
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL_DEBUG_FILE="$R/nccl-$tag.%h.%p.log" \
  timeout "$t" python3 -m torch.distributed.run --standalone --nproc_per_node="$n" "$D/a2a_probe.py" \
    --out "$R" "$@" 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | tail -3
}
run 4 150 g4 --label first --phases host,large --groups g4,g2,g3solo,g2solo --reps 3 --budget-s 80
run 3 60 g3 --label first --phases host,large --groups g3 --reps 3 --budget-s 25
run 4 50 g4b --label second --phases host --groups g4,g2,g3solo,g2solo --reps 2
date -u | tee -a "$L"; wc -l "$R"/*.jsonl
