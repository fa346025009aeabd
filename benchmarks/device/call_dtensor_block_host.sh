#!/bin/bash
# Host time of steps_alt.py's DTensor TP + SP model per layer, tiny (hidden 256) and at the eighth
# held-out batch's shape Z (hidden 2560), 20 layers each, gc on and off (dtensor_block_host.py;
# issue 12 item 4). 4-GPU box (kind nvidia-h100-x4), about 4 minutes: TP 2 on two of its GPUs and
# TP 4, each launched twice (one torchrun per launch: the spread from one process to the next).
# One folder $OUT/r: env.txt, log.txt, dtensor_block_host_w{2,4}-{a,b}.jsonl.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"
{ date -u; python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "python", sys.version.split()[0])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket|NUMA)"; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
for launch in a b; do
  for n in 2 4; do
    timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node=$n "$D/dtensor_block_host.py" --out "$R/tmp" 2>&1 \
      | grep -v "Warning: \[PG" | tee -a "$R/log.txt" | grep -E "DTBLOCK|Error|error"
    mv "$R/tmp/dtensor_block_host_w$n.jsonl" "$R/dtensor_block_host_w$n-$launch.jsonl"
  done
done
rmdir "$R/tmp"; date -u | tee -a "$R/log.txt"; wc -l "$R"/*.jsonl
