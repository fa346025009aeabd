#!/bin/bash
# As run (from .devicework/, beside steps.py and comm.py) by the device tool, kind nvidia-h100-x4.
# Device call 1 (issue 12 held-out steps, issue 10 all-to-all and MoE steps).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
set -o pipefail
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"
{ date -u; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "cudnn", torch.backends.cudnn.version())'; nvidia-smi; nvidia-smi topo -m; nvidia-smi -q -d CLOCK | head -40; env | grep -E "NCCL|NVSHMEM|TORCH_SYMM"; } > "$R/env.txt" 2>&1
head -3 "$R/env.txt"
N=$(python3 -c 'import torch; print(torch.cuda.device_count())')
echo "=== all_to_all (events) on $N GPUs"; date -u
timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node=$N "$D/comm.py" --out "$R" \
  --file alltoall.jsonl --ops all_to_all --groups 2 --timing events --budget-s 110 2>&1 | tee "$R/log_comm.txt"
echo "=== steps"; date -u
timeout ${STEPS_S:-420} python3 "$D/steps.py" --driver --out "$R" --budget-s $(( ${STEPS_S:-420} - 15 )) --case-timeout-s 80 \
  --only ${CASES:-moe_ep1,moe_ep2,moe_ep4,moe_ep2dp2,ho_pp4_1f1b_C,ho_fsdp4_B,ho_ddp4_A,ho_tp4_B,ho_pp4_gpipe_C,ho_pp4_int2_C,ho_tp2pp2_C,ho_pp2dp2_C,ho_fsdp4_B_rc,ho_fsdp4_C_rc_mb2} 2>&1 | tee "$R/log_steps.txt"
date -u
grep -h RESULT "$R/log_steps.txt"
