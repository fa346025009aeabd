#!/bin/bash
# Host time of Megatron-Core's MoE layer (megatron_moe_host.py) on 2 GPUs; run by the device
# tool (kind nvidia-h100-x2) from the repository root, with the megatron-core wheel carried:
#   here, once:  echo /.whl/ >> .git/info/exclude
#                python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#                  --implementation cp --platform manylinux_2_28_x86_64 -d .whl megatron-core==0.19.2
#   device run:  carry [".whl"], command: bash benchmarks/device/call_megatron_moe_host.sh
# (about 2-3 minutes). Copy $OUT/r/* to data/measured/megatron-moe-host-h100x2/.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export CUDA_DEVICE_MAX_CONNECTIONS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/megatron_core-*.whl && export PYTHONPATH=/tmp/site || exit 1
D=$(dirname "$0"); R=$OUT/r; mkdir -p "$R"
python3 -c 'import torch, megatron.core as m; print("torch", torch.__version__, torch.cuda.nccl.version(), "megatron-core", getattr(m, "__version__", "?"), [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])' | tee "$R/env.txt"
timeout 500 python3 -m torch.distributed.run --standalone --nproc_per_node=2 "$D/megatron_moe_host.py" --out "$R" 2>&1 \
  | grep -v "Warning: \[PG" | tee "$R/log.txt" | grep -E "MCOREHOST|Error|error"
date -u | tee -a "$R/log.txt"
