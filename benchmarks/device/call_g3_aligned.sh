#!/bin/bash
# A group of 3 with 16-byte-aligned shares (issue 12; data/measured/sustained-h100x4 README):
# comm.py gives each rank elems // n elements, so the ninth batch's group-of-3 sizes
# (4 KiB x 4^k) left every rank's share off a 16-byte boundary. Here the whole buffer is
# 3 x 2^k bytes (each rank's share 2^k), 3 MiB .. 192 MiB, so every share is aligned; the
# same ops, CUDA events. Then benchmarks/device/call_diagnosis10.sh. 4-GPU box, ~7 minutes.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(dirname "$0"); A=$OUT/g3a; mkdir -p "$A"
timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node=3 "$D/comm.py" --out "$A" \
  --file g3-aligned.jsonl --ops all_reduce,all_gather,reduce_scatter,all_to_all --groups 3 --timing events \
  --min-bytes 3145728 --max-bytes 201326592 --budget-s 90 2>&1 | grep -v "Warning: \[PG" | tail -3
python3 - "$A/g3-aligned.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l); print(r["op"], r.get("splits", ""), r["bytes"], round(r["busbw_GBps"], 1))
PY
bash "$D/call_diagnosis10.sh"
tar -C "$OUT" -czf "$OUT/g3a.tgz" g3a && rm -rf "$A"
