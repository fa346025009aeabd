#!/bin/bash
# Collective device time without the host's call rate (issue 12; benchmarks/device/nccl_tuning.py):
# all-to-all, all-gather and reduce-scatter on all GPUs of a 2-GPU box (NPROC=4 on a 4-GPU box),
# 4 KiB - 256 MiB, each size timed twice: `device` (the stream sleeps while the host enqueues
# the calls, then the GPU runs them back to back) and `events` (back-to-back calls from Python,
# as data/measured/h100x2-pairs). NCCL's own choices (no NCCL_PROTO / channel override); its
# INIT and TUNING log for the same run goes to nccl-auto.*.log and tuning-choices.jsonl.
# What it answers: the all-to-all's fixed device cost per call (fabrics.yaml
# nccl.all_to_all.launch_extra_us was fitted on event-timed rows, which time the host).
# Device kind nvidia-h100-x2; about 1.5 minutes. Output: $OUT/r/.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"; N=${NPROC:-2}
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'; nvidia-smi topo -m; } > "$R/env.txt" 2>&1
head -2 "$R/env.txt"
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING NCCL_DEBUG_FILE="$R/nccl-auto.%h.%p.log" timeout 150 \
  python3 -m torch.distributed.run --standalone --nproc_per_node="$N" "$D/nccl_tuning.py" \
  --out "$R" --label auto --ops all_to_all,all_gather,reduce_scatter --timing device,events \
  --max-bytes 268435456 --budget-s 100 2>&1 | grep -v "Warning: \[PG" > "$R/log.txt"
echo "rc ${PIPESTATUS[0]}"; tail -4 "$R/log.txt"
python3 "$D/nccl_tuning.py" --parse "$R"/nccl-*.log > "$R/tuning-choices.jsonl"
date -u; wc -l "$R"/*.jsonl
