#!/bin/bash
# What NCCL 2.28 chooses per size between a pair of H100s, and the device time of each call
# without the host's call rate (issue 12, pairs; benchmarks/device/nccl_tuning.py). Device kind
# nvidia-h100-x2 (runs on any 2-GPU box; also with --nproc 4 on a 4-GPU one: NPROC=4).
# Runs, each its own process group (NCCL reads its environment at init):
#   auto      NCCL's own choices; all-gather, reduce-scatter, all-reduce, all-to-all, 4 KiB-1 GiB,
#             device-bound and back-to-back event timing
#   simple, ll128   NCCL_PROTO forced, 64 KiB-256 MiB
#   ch8, ch16, ch32 NCCL_MIN_NCHANNELS = NCCL_MAX_NCHANNELS, 1 MiB-1 GiB
# Output: $OUT/r/tuning.jsonl (timings), tuning-choices.jsonl (NCCL's per-call algorithm,
# protocol and channels, from its TUNING log), nccl-*.log, env.txt. About 4-5 minutes.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; N=${NPROC:-2}
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi topo -m; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
run() {  # run LABEL LIMIT_S [VAR=VALUE ...] -- [nccl_tuning.py args]
  local label=$1 limit=$2; shift 2; local vars=()
  while [ "$1" != "--" ]; do vars+=("$1"); shift; done; shift
  env "${vars[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
    NCCL_DEBUG_FILE="$R/nccl-$label.%h.%p.log" timeout "$limit" \
    python3 -m torch.distributed.run --standalone --nproc_per_node="$N" "$D/nccl_tuning.py" \
    --out "$R" --label "$label" --budget-s $((limit - 40)) "$@" 2>&1 \
    | grep -v "Warning: \[PG" >> "$R/log.txt"
  echo "$label: rc ${PIPESTATUS[0]}, $(grep -c "\"label\": \"$label\"" "$R/tuning.jsonl") rows"
}
run auto 120 -- --timing device,events
run simple 60 NCCL_PROTO=Simple -- --ops all_gather,reduce_scatter,all_reduce --timing device --min-bytes 65536 --max-bytes 268435456
run ll128 60 NCCL_PROTO=LL128 -- --ops all_gather,reduce_scatter,all_reduce --timing device --min-bytes 65536 --max-bytes 268435456
for c in 8 16 32; do
  run ch$c 60 NCCL_MIN_NCHANNELS=$c NCCL_MAX_NCHANNELS=$c -- --ops all_gather,reduce_scatter,all_to_all --timing device --min-bytes 1048576
done
python3 "$D/nccl_tuning.py" --parse "$R"/nccl-*.log > "$R/tuning-choices.jsonl"
grep -h "coll channels\|threadThresholds" "$R"/nccl-auto.*.log | head -4
date -u; wc -l "$R"/*.jsonl
