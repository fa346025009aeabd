# What every pre-registered held-out batch's device calls share (sourced by call_heldoutN.sh
# since the sixteenth; earlier batches keep their own copy, as they ran): the environment, the
# box's description in $R/env-CALL.txt, and two runners. Needs $OUT (set by the device tool),
# the call's name as $1 of the sourcing script, and D (the folder of the scripts).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
R=$OUT/r; mkdir -p "$R"; L=$R/log.txt
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit --format=csv; nvidia-smi topo -m; lscpu | grep -E "^(Model name|CPU\(s\))"; } > "$R/env-$CALL.txt" 2>&1
head -2 "$R/env-$CALL.txt"

steps() {  # script label cases budget [case timeout, 80 s]: the cases one after another, each in a fresh torchrun
  timeout $(( $4 + 30 )) python3 "$D/$1" --driver --out "$R" --label "$2" --budget-s "$4" \
    --case-timeout-s "${5:-80}" --only "$3" 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | grep -E "RESULT|===|Error|error"
}

comm() {  # nproc groups min_bytes max_bytes file budget [timing, events]: NCCL collectives
  timeout $(( $6 + 40 )) python3 -m torch.distributed.run --standalone --nproc_per_node="$1" "$D/comm.py" \
    --out "$R" --file "$5" --ops all_reduce,all_gather,reduce_scatter,all_to_all --groups "$2" \
    --timing "${7:-events}" --min-bytes "$3" --max-bytes "$4" --budget-s "$6" 2>&1 | grep -v "Warning: \[PG" | tee -a "$L" | tail -2
}

finish() {  # the call's end time, the rows written, everything packed into $OUT/r.tgz
  date -u | tee -a "$L"; wc -l "$R"/*.jsonl
  tar -C "$OUT" -czf "$OUT/r.tgz" r && rm -rf "$R"
}
