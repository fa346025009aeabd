#!/bin/bash
# routerdiag, second call (issue 10). Essential: both cases below (about 2.5 min in all).
# Per case two fresh processes: (a) the learned step (cold), the logged counts replayed warm,
# the simulator's counts; (b) the SAME logged counts replayed first in a fresh process (cold),
# then the learned step rebuilt (same seeds: the same counts, now warm), then the replay warm.
# Everything is packed into ONE file, $OUT/routerdiag.tgz.
set -u
export NCCL_NVLS_ENABLE=0
D=devreq/routerdiag
O=$OUT/routerdiag
mkdir -p "$O"
{ nvidia-smi -L; python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; } > "$O/env.txt" 2>&1
for spec in "third h15t_moe_ep2_AH 2" "alt h14_moe_ep4_AF 4"; do
  set -- $spec
  t=$(date +%s)
  timeout 60 torchrun --standalone --nproc_per_node="$3" "$D/route_replay.py" --script "$1" \
    --case "$2" --out "$O" --tag a --variants learned,replay,model \
    --model-counts "$D/model_counts.json" > "$O/log-$2-a.txt" 2>&1
  echo "$2 a rc=$? wall=$(( $(date +%s) - t )) s" >> "$O/phases.txt"
  t=$(date +%s)
  timeout 60 torchrun --standalone --nproc_per_node="$3" "$D/route_replay.py" --script "$1" \
    --case "$2" --out "$O" --tag b --replay-from "$O" --from-tag a \
    --variants replay_cold,learned,replay > "$O/log-$2-b.txt" 2>&1
  echo "$2 b rc=$? wall=$(( $(date +%s) - t )) s" >> "$O/phases.txt"
done
tar -C "$O" -czf "$OUT/routerdiag.tgz" . && rm -rf "$O"
