#!/bin/bash
# Data for the uneven all-to-all gaps left open on 2026-11-27 (validation/heldout12/README.md):
# receiver-hot (recv2, recv44), sender-hot (send4) and comm.py's rotated 4:3:2:1 split with every
# part 16-byte aligned (rot4321), beside the uniform exchange, in a group of 4 at 32 MiB-1 GiB a
# rank, two launches for repeatability (labels a, b). benchmarks/device/a2a_probe.py, phase
# large (CUDA events between back-to-back calls). About 2 minutes. Results: $OUT/r.tgz.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv; lscpu | grep -E "^(Model name|CPU\(s\))"; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
for label in a b; do
  timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node=4 "$D/a2a_probe.py" \
    --out "$R" --label "$label" --phases large --groups g4 --patterns uniform,recv2,recv44,send4,rot4321 \
    --sizes 32,64,128,256,512,1024 --budget-s 120 2>&1 | grep -v "Warning: \[PG" | tee -a "$R/log.txt" | tail -3
done
date -u | tee -a "$R/log.txt"; wc -l "$R"/*.jsonl
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$R"
