#!/bin/bash
# firstseen (issue 10), first round, as run (the request's call.sh; the request folder was
# removed after the run, this copy is rebuilt from it with the same lines).
# Per case up to three fresh processes of devreq/firstseen/route_replay.py (a copy of
# benchmarks/device/route_replay.py at the branch's commit of 03:33 UTC):
#   a: learned (counts logged; cold), then replay (the same counts, warm)
#   b: prewarm (a's counts' expert GEMM shapes run once, allocator emptied), then replay
#   c: replay_cold (a's counts first in a fresh process), for two cases
# Processes are chained (--wait-file/--done-file): no two time at once; the next one's start
# overlaps the current one's timing. EP 2 processes alternate GPU pairs 0,1 / 2,3 and build
# while the other pair times (--wait-at run); EP 4 ones wait before touching a GPU.
# Launch guards keep the call near 3.5 minutes; the order is the priority (a b or c process
# runs only where its a process ran). Everything is packed into ONE file, $OUT/firstseen.tgz.
NAME=firstseen
set -u
export NCCL_NVLS_ENABLE=0
D=devreq/$NAME
O=$OUT/$NAME
mkdir -p "$O"
{ nvidia-smi -L; python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())"; } > "$O/env.txt" 2>&1
T0=$(date +%s)
i=0
prev=""
prev_kind=""  # "2:0", "2:1" or "4": the previous process's GPUs
pair=0

# job SCRIPT CASE EP TAG VARIANTS [FROM-TAG]
job() {
  local script=$1 case=$2 ep=$3 tag=$4 variants=$5 from=${6:-}
  i=$((i + 1))
  local go="$O/.go.$i" done="$O/.done.$i" at=setup vis=0,1,2,3 kind=4
  if [ "$ep" = 2 ]; then
    vis=$([ $pair = 0 ] && echo 0,1 || echo 2,3)
    kind="2:$pair"
    if [ "${prev_kind%%:*}" = 2 ] && [ "$prev_kind" != "$kind" ]; then at=run; fi
    pair=$((1 - pair))
  fi
  local extra=()
  if [ -n "$from" ]; then extra=(--replay-from "$O" --from-tag "$from"); fi
  (
    CUDA_VISIBLE_DEVICES=$vis timeout 110 torchrun --standalone --nproc_per_node="$ep" \
      "$D/route_replay.py" --script "$script" --case "$case" --out "$O" --tag "$tag" \
      --variants "$variants" "${extra[@]}" --wait-file "$prev" --wait-at "$at" \
      --go-file "$go" --done-file "$done" ${QUICK:+--quick} > "$O/log-$case-$tag.txt" 2>&1
    rc=$?
    echo "$case $tag rc=$rc gpus=$vis wait-at=$at variants=$variants end=$(( $(date +%s) - T0 )) s" >> "$O/phases.txt"
    touch "$done" "$go"
  ) &
  prev=$done
  prev_kind=$kind
  while [ ! -e "$go" ]; do sleep 0.1; done  # at most one process waits behind the timing one
}

guard() { [ $(( $(date +%s) - T0 )) -lt "$1" ]; }
LAUNCHED=" "
# run SCRIPT CASE EP TAG VARIANTS GUARD [FROM-TAG]: launch if before GUARD s and (for a b or c
# process) its a process was launched
run() {
  if [ -n "${7:-}" ] && [[ "$LAUNCHED" != *" $2-$7 "* ]]; then return; fi
  guard "$6" || return
  LAUNCHED="$LAUNCHED$2-$4 "
  job "$1" "$2" "$3" "$4" "$5" "${7:-}"
}
A=learned,replay
B=prewarm,replay
# EP 2: a processes launched until 70 s, b until 90 s
run third h12t_moe_ep2_K 2 a $A 70
run alt h6_moe_ep2_W 2 a $A 70
run third h12t_moe_ep2_K 2 b $B 90 a
run alt h6_moe_ep2_W 2 b $B 90 a
run third h12t_moe_ep2_K 2 c replay_cold 80 a
run third h11t_moe_ep2_H 2 a $A 70
run alt h8_moe_ep2_Q 2 a $A 70
run third h11t_moe_ep2_H 2 b $B 90 a
run alt h8_moe_ep2_Q 2 b $B 90 a
run third h14t_moe_ep2_AD 2 a $A 70
run third h8t_moe_ep2_B 2 a $A 70
run third h14t_moe_ep2_AD 2 b $B 90 a
run third h8t_moe_ep2_B 2 b $B 90 a
# EP 4: a processes launched until 140 s, b until 165 s
run alt h8_moe_ep4_Q 4 a $A 140
run third h14t_moe_ep4_AD 4 a $A 140
run alt h8_moe_ep4_Q 4 b $B 165 a
run third h14t_moe_ep4_AD 4 b $B 165 a
run alt h8_moe_ep4_Q 4 c replay_cold 150 a
for spec in "alt h12_moe_ep4_L" "third h12t_moe_ep4_K" "alt h6_moe_ep4_W" "third h11t_moe_ep4_H"; do
  set -- $spec
  run $1 $2 4 a $A 140
  run $1 $2 4 b $B 165 a
done
wait
echo "total $(( $(date +%s) - T0 )) s" >> "$O/phases.txt"
rm -f "$O"/.go.* "$O"/.done.*
tar czf "$OUT/$NAME.tgz" -C "$OUT" "$NAME" && rm -rf "$O"
