#!/bin/bash
# Host time of Megatron-Core's DeepEP routing map, unfused and fused (multihot_host.py), one
# process per GPU on 4x H100 at once; run from the repository root with the megatron-core
# wheel carried (as call_megatron_moe_host.sh: pip download --no-deps megatron-core==0.19.2
# into .whl/). Under a minute. Copy $OUT/zoo/* to data/measured/multihot-host-h100x4/.
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$OUT/zoo"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/megatron_core-*.whl && export PYTHONPATH=/tmp/site || exit 1
python3 -c "import megatron.core, torch; print('megatron-core', megatron.core.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))" 2>&1 | tee "$OUT/zoo/versions.txt"
timeout 150 torchrun --standalone --nproc_per_node=4 benchmarks/device/multihot_host.py "$OUT/zoo" 2>&1 | grep -v "USDT\|Warning" | tail -40 | tee "$OUT/zoo/log.txt"
