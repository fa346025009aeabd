#!/bin/bash
# firstseen2 (issue 10), second round, as run (the request's call.sh; the request folder was
# removed after the run, this copy is rebuilt from it with the same commands): the h 2304 cases
# AF (steps_alt.py) and AH (steps_third.py), with round 1's prewarm split.
# Per case fresh processes of devreq/firstseen2/route_replay.py (= benchmarks/device/route_replay.py):
#   a: learned (counts logged; cold), then replay (the same counts, warm)
#   b: prewarm (a's counts' expert GEMM shapes run once, allocator emptied), then replay
# Chaining and guards as round 1 (call1/call.sh). Everything is packed into ONE file,
# $OUT/firstseen2.tgz.
NAME=firstseen2
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
# EP 4 AF first (its cold and warm prices are known from routerdiag: 0.296-0.300 / 0.222-0.228 s)
run alt h14_moe_ep4_AF 4 a $A 60
run alt h14_moe_ep4_AF 4 b $B 80 a
# EP 2: a processes launched until 110 s, b until 135 s
run third h15t_moe_ep2_AH 2 a $A 110
run alt h14_moe_ep2_AF 2 a $A 110
run third h15t_moe_ep2_AH 2 b $B 135 a
run alt h14_moe_ep2_AF 2 b $B 135 a
# EP 4 AH if time is left
run third h15t_moe_ep4_AH 4 a $A 140
run third h15t_moe_ep4_AH 4 b $B 165 a
wait
echo "total $(( $(date +%s) - T0 )) s" >> "$O/phases.txt"
rm -f "$O"/.go.* "$O"/.done.*
tar czf "$OUT/$NAME.tgz" -C "$OUT" "$NAME" && rm -rf "$O"
