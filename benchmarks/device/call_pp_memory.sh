#!/bin/bash
# Issue 12, helper pipe (about 2.5 minutes on 4x H100): (1) benchmarks/device/pp_memory_probe.py:
# torch.distributed.pipelining's memory action by action for steps_alt.py's h10_pp4_gpipe_T and
# h10_pp4_1f1b_T (the script's own step, autocast's weight-cast cache off, no output chunks) and
# the running torch's source of the functions that decide it; (2) steps_third.py's hand-written
# 1F1B (h10t_pp4_1f1b_E, +10.4 % slow in heldout10) once more with the
# profiler record (per rank: busy, NCCL and idle GPU time, kernels, top host ops), to tell a
# host-bound stage from a GPU-bound one; (3) it and h8t_pp4_1f1b_A tiny. Results under $OUT/pipe/.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(cd "$(dirname "$0")" && pwd); R=$OUT/pipe; mkdir -p "$R"
python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])' > "$R/env.txt" 2>&1
cat "$R/env.txt"
timeout 50 python3 -m torch.distributed.run --standalone --nproc_per_node=4 "$D/pp_memory_probe.py" \
  --out "$R" --source 2>&1 | grep -v "Warning: \[PG" | tail -20 | tee "$R/log_probe.txt"
timeout 37 python3 "$D/steps_third.py" --driver --profile --out "$R" --label pipe --budget-s 36 \
  --case-timeout-s 35 --only h10t_pp4_1f1b_E 2>&1 | grep -v "Warning: \[PG" \
  | tee "$R/log_third.txt" | grep -E "RESULT|PROFILE|===|Error|error"
# (3) the same two cases tiny (head dim 16, 128-token sequences): host-bound steps of this
# script (bf16 weights, no autocast), for its host time per launched kernel.
timeout 62 python3 "$D/steps_third.py" --driver --tiny --profile --out "$R/tiny" --label pipe-tiny \
  --budget-s 61 --case-timeout-s 30 --only h10t_pp4_1f1b_E,h8t_pp4_1f1b_A 2>&1 | grep -v "Warning: \[PG" \
  | tee "$R/log_tiny.txt" | grep -E "RESULT|PROFILE|===|Error|error"
date -u; ls -la "$R" "$R/tiny"
