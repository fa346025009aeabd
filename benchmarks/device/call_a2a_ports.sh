#!/bin/bash
# Is an NVLink port loaded one way faster than one loaded both ways, and does comm.py's
# receiver-hot split run faster per hot-rank byte than the probe's recv2 in the same process?
# Group of 4: uniform, hot (comm.py's 55:15:15:15), recv2 (2:1:1:1), incast (every rank to rank
# 0: rank 0 receives 3 parts, sends none), incast_back (rank 0 also sends one part to each);
# two pairs at once: uniform, oneway (rank 1 -> 0 only), hot (7:3). 64, 256, 1024 MiB a rank,
# CUDA events between back-to-back calls (a2a_probe.py phase large), two launches (a, b; the
# order reversed in b). incast_back's parts are a quarter of incast's at the same size (compare
# incast 64 / 256 MiB with incast_back 256 / 1024). About 2 minutes. Results: $OUT/a2ahot/.
# Run as devreq/a2ahot/call.sh with a2a_probe.py beside it (data/measured/a2a-ports-h100x4).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=devreq/a2ahot; R=$OUT/a2ahot; mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv; } > "$R/env.txt" 2>&1
for label in a b; do
  if [ $label = a ]; then P4=uniform,hot,recv2,incast,incast_back; else P4=incast_back,incast,recv2,hot,uniform; fi
  timeout 55 python3 -m torch.distributed.run --standalone --nproc_per_node=4 "$D/a2a_probe.py" \
    --out "$R" --label "$label" --phases large --groups g4,g2 --patterns "$P4,oneway" \
    --sizes 64,256,1024 --budget-s 40 2>&1 | grep -v "Warning: \[PG" | tee -a "$R/log.txt" | tail -4
done
date -u | tee -a "$R/log.txt"; wc -l "$R"/*.jsonl
