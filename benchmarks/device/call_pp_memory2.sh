#!/bin/bash
# Issue 12, helper pipe, second call (under a minute on 4x H100): benchmarks/device/pp_memory_probe.py
# again (the first call's probe stopped on the first stage's receive placeholders, 2.11's
# _RootArgPlaceholder having no buffer): torch.distributed.pipelining's memory action by action for
# steps_alt.py's h10_pp4_gpipe_T and h10_pp4_1f1b_T -- the script's own step, autocast's weight-cast
# cache off (cache_enabled=False), and step(return_outputs=False). Results under $OUT/pipe/.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
D=$(cd "$(dirname "$0")" && pwd); R=$OUT/pipe; mkdir -p "$R"
python3 -c 'import torch; print("torch", torch.__version__, [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])' > "$R/env2.txt" 2>&1
timeout 90 python3 -m torch.distributed.run --standalone --nproc_per_node=4 "$D/pp_memory_probe.py" \
  --out "$R" 2>&1 | grep -v "Warning: \[PG" | grep -E "PROBE|Error|error|Traceback|File " | head -40 | tee "$R/log_probe2.txt"
date -u; ls -la "$R"
