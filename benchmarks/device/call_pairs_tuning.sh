#!/bin/bash
# Why pair collectives of 4-64 MiB run slower than modelled (issue 12): on 2 GPUs (kind
# nvidia-h100-x2), all-gather / reduce-scatter / all-reduce / all-to-all from 1 to 256 MiB,
# CUDA-event timing, under NCCL's own choice with its tuning log (NCCL_DEBUG_SUBSYS=TUNING:
# algorithm, protocol and channel count per call), then with the protocol forced to Simple, and
# with the channel count forced to 32 (those two: all-gather and reduce-scatter only). Each variant writes its own comm-TAG.jsonl and log-TAG.txt.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/tuning; mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi topo -m; } > "$R/env.txt" 2>&1
run() {  # TAG OPS BUDGET, then environment assignments
  local tag=$1 ops=$2 budget=$3; shift 3
  env "$@" timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node=2 "$D/comm.py" \
    --out "$R" --file "comm-$tag.jsonl" --ops "$ops" \
    --groups 2 --timing events --min-bytes 1048576 --max-bytes 268435456 --budget-s "$budget" \
    > "$R/log-$tag.txt" 2>&1
  echo "$tag rc=$? $(wc -l < "$R/comm-$tag.jsonl") rows"
}
run auto all_gather,reduce_scatter,all_reduce,all_to_all 100 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING
run simple all_gather,reduce_scatter 50 NCCL_PROTO=Simple
run ch32 all_gather,reduce_scatter 50 NCCL_MIN_NCHANNELS=32 NCCL_MAX_NCHANNELS=32
grep -h -m 40 -i "algo\|proto\|channel" "$R/log-auto.txt" | head -60
date -u
