#!/bin/bash
# Ring all-gather / reduce-scatter between pairs and in groups of 4 (issue 12, helper coll4):
# why back-to-back ring/Simple calls of 2 MiB - 1 GiB run 10-29 % slower than the collective
# model. Device-timed (nccl_tuning.py: `device` = the GPU runs k calls back to back, host
# ahead; `single` = one call at a time on the device, the stream held by a sleep while the host
# enqueues it), NCCL's own choices logged per call (channels), then variants that move one NCCL
# parameter each: NCCL_BUFFSIZE (Simple's chunk = BUFFSIZE/8 x 4, slice half of it),
# NCCL_MAX_NCHANNELS, NCCL_P2P_READ_ENABLE. 4x H100 box (nvidia-h100-x4); about 2 minutes.
# Output: $OUT/coll4/ (jsonl, env, parsed tuning choices, logs gzipped); copied to
# data/measured/ring-simple-h100x4/. nccl_tuning.py lies beside this script.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(cd "$(dirname "$0")" && pwd); R=$OUT/coll4; mkdir -p "$R"; T0=$(date +%s)
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv; nvidia-smi topo -m; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
left() { echo $((145 - $(date +%s) + T0)); }
run() {  # run LABEL NPROC LIMIT_S ARGS... (env variables set by the caller)
  local label=$1 n=$2 lim=$3; shift 3
  [ "$(left)" -lt 12 ] && { echo "skip $label (time)"; return; }
  [ "$lim" -gt "$(left)" ] && lim=$(left)
  timeout "$lim" python3 -m torch.distributed.run --standalone --nproc_per_node="$n" \
    "$D/nccl_tuning.py" --out "$R" --file "g$n.jsonl" --label "$label" "$@" 2>&1 \
    | grep -v "Warning: \[PG" >> "$R/log.txt"
  echo "$label g$n rc ${PIPESTATUS[0]} at $(( $(date +%s) - T0 )) s"
}
ALL="--ops all_gather,reduce_scatter,all_reduce --timing device,single --min-bytes 2097152 --max-bytes 1073741824 --factor 2 --budget-s 22"
VAR="--ops all_gather,reduce_scatter --timing device --min-bytes 4194304 --max-bytes 1073741824 --factor 4 --budget-s 8"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_DEBUG_FILE="$R/nccl-auto4.%h.%p.log" run auto 4 40 $ALL
CUDA_VISIBLE_DEVICES=0,1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_DEBUG_FILE="$R/nccl-auto2.%h.%p.log" run auto 2 35 $ALL
CUDA_VISIBLE_DEVICES=0,1 NCCL_BUFFSIZE=16777216 run buff16M 2 20 $VAR
CUDA_VISIBLE_DEVICES=0,1 NCCL_BUFFSIZE=1048576 run buff1M 2 20 $VAR
CUDA_VISIBLE_DEVICES=0,1 NCCL_MAX_NCHANNELS=12 run ch12 2 20 $VAR
CUDA_VISIBLE_DEVICES=0,1 NCCL_P2P_READ_ENABLE=1 run p2pread 2 20 $VAR
NCCL_BUFFSIZE=16777216 run buff16M 4 20 $VAR
python3 "$D/nccl_tuning.py" --parse "$R"/nccl-*.log > "$R/tuning-choices.jsonl"
gzip -f "$R"/nccl-*.log
date -u; wc -l "$R"/*.jsonl
