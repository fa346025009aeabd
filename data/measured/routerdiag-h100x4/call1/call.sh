#!/bin/bash
# routerdiag (issue 10): a learned-router eager MoE step against the same step with its routes
# forced (the logged counts replayed, with and without the gate; the simulator's counts).
# Four development cases, one torchrun each (6 variants x 9 steps + a rebuild), about 3 min.
set -u
export NCCL_NVLS_ENABLE=0
D=devreq/routerdiag
O=$OUT/routerdiag
mkdir -p "$O"
{ nvidia-smi; python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; } > "$O/env.txt" 2>&1
for spec in "third h15t_moe_ep2_AH 2" "alt h14_moe_ep2_AF 2" "third h15t_moe_ep4_AH 4" "alt h14_moe_ep4_AF 4"; do
  set -- $spec
  t=$(date +%s)
  timeout 75 torchrun --standalone --nproc_per_node="$3" "$D/route_replay.py" --script "$1" \
    --case "$2" --out "$O" --model-counts "$D/model_counts.json" > "$O/log-$2.txt" 2>&1
  echo "$2 rc=$? wall=$(( $(date +%s) - t )) s" >> "$O/phases.txt"
done
cp "$D/model_counts.json" "$O/"
