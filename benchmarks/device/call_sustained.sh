#!/bin/bash
# Sustained load and groups of 3 (issue 12), any 4-GPU box, about 4 minutes. $OUT set by the
# device tool; results in $OUT/r.tgz.
#  1. benchmarks/device/sustained.py on every GPU at once (as training loads a box), with
#     nvidia-smi sampling SM clock, power, temperature and throttle reasons every 100 ms: does a
#     GEMM's rate measured in a 30-iteration burst hold for seconds of load?
#  2. NCCL's own choice for a group of 3 GPUs against 4 (NCCL_DEBUG=INFO, GRAPH and TUNING):
#     heldout9 measured all-gather / reduce-scatter / all-to-all in a group of 3 at about half
#     the bus bandwidth of groups of 2 and 4, with all-reduce unaffected.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'
  nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,clocks.sm,power.limit,power.default_limit,enforced.power.limit,temperature.gpu --format=csv
  nvidia-smi topo -m; nvidia-smi nvlink -s -i 0 | head -30; lscpu | grep -E "^(Model name|CPU\(s\))"; } > "$R/env.txt" 2>&1
head -3 "$R/env.txt"
N=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active,utilization.gpu \
  --format=csv,noheader,nounits -lms 100 -f "$R/smi.csv" &
SMI=$!
PIDS=()
for i in $(seq 0 $((N - 1))); do
  CUDA_VISIBLE_DEVICES=$i timeout 200 python3 "$D/sustained.py" --out "$R" > "$R/sustained-gpu$i.log" 2>&1 &
  PIDS+=($!)
done
wait "${PIDS[@]}"
kill $SMI; sleep 1
grep -h "TFLOP" "$R"/sustained-gpu*.log | tee -a "$L"
comm() {  # nproc groups file
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING,ENV timeout 120 python3 -m torch.distributed.run --standalone \
    --nproc_per_node="$1" "$D/comm.py" --out "$R" --file "$3" --ops all_reduce,all_gather,reduce_scatter,all_to_all \
    --groups "$2" --timing events --min-bytes 268435456 --max-bytes 268435456 --budget-s 40 > "$R/nccl-$3.log" 2>&1
  grep -E "busbw|Channel|channels|Pattern|Ring|Tree|Algo|NVLS|P2P" "$R/nccl-$3.log" | grep -v "Warning" | head -40 | tee -a "$L"
}
comm 3 3 g3.jsonl
comm 4 4 g4.jsonl
date -u | tee -a "$L"
tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$R"
