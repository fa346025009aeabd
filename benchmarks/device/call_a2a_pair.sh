#!/bin/bash
# Two-way NVLink ports at middle sizes: the channels a peer, or the port? (issue 12, helper a2apair)
# NCCL all_to_all_single on 4x H100 through a2a_probe.py phase large (CUDA events between
# back-to-back calls): group of 4 uniform / incast (one way into rank 0) / incast_back (both
# ways), two pairs at once uniform / oneway, 64, 256, 512, 1024 MiB a rank, one launch per NCCL
# setting: default, NCCL_MAX_P2P_NCHANNELS 8, 16, 32, NCCL_MIN_P2P_NCHANNELS 64, default again
# (drift). NCCL 2.28.9 src/graph/paths.cc: p2pnChannels = max(min(nChannels, MAX_P2P), MIN_P2P),
# per peer min(pow2Up(36), p2pnChannels); src/enqueue.cc: a direction starts on nChannelsMin
# (per peer halved until x nRanks <= p2pnChannels) and doubles while a part is > 16 MiB.
# NCCL_DEBUG=INFO (INIT) lines with the channel counts kept in nccl_channels.txt. ~2 minutes.
# Run as devreq/a2apair/call.sh with a2a_probe.py beside it (data/measured/a2a-pair-h100x4).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=devreq/a2apair; R=$OUT/a2apair; mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv; } > "$R/env.txt" 2>&1
T0=$(date +%s)
for cfg in default max8 max16 max32 min64 default2; do
  if [ $(( $(date +%s) - T0 )) -gt 150 ]; then echo "skip $cfg (time)" | tee -a "$R/log.txt"; continue; fi
  unset NCCL_MAX_P2P_NCHANNELS NCCL_MIN_P2P_NCHANNELS
  case $cfg in
    max8) export NCCL_MAX_P2P_NCHANNELS=8;; max16) export NCCL_MAX_P2P_NCHANNELS=16;;
    max32) export NCCL_MAX_P2P_NCHANNELS=32;; min64) export NCCL_MIN_P2P_NCHANNELS=64;;
  esac
  echo "== $cfg $(date -u +%T) MAX=${NCCL_MAX_P2P_NCHANNELS:-} MIN=${NCCL_MIN_P2P_NCHANNELS:-}" | tee -a "$R/log.txt"
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 40 python3 -m torch.distributed.run --standalone --nproc_per_node=4 \
    "$D/a2a_probe.py" --out "$R" --label "$cfg" --phases large --groups g4,g2 \
    --patterns uniform,incast,incast_back,oneway --sizes 64,256,512,1024 --budget-s 25 > "$R/run_$cfg.txt" 2>&1
  echo "rc $?" >> "$R/log.txt"
  grep -E "p2p channels|NCCL version" "$R/run_$cfg.txt" | sed "s/^/$cfg: /" | sort -u | head -20 >> "$R/nccl_channels.txt"
  grep -E "^large|budget|Error|error" "$R/run_$cfg.txt" | grep -v "Warning" | tail -8 | tee -a "$R/log.txt"
  gzip -f "$R/run_$cfg.txt"
done
date -u | tee -a "$R/log.txt"; wc -l "$R"/*.jsonl
