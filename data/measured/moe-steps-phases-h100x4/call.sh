#!/bin/bash
# emoe10 (issue 10): steps.py's forced-route eager MoE steps (shape M) -- host time per step at
# tiny width for EP 1 / 2 / 2x2 / 4, a per-phase timeline (host clock + CUDA events) of the
# full-width EP 1 and EP 4 steps and of the tiny EP 1 step, and one profiled full EP 1 step.
# Run from the repository root; results under $OUT/emoe10/. About 3 minutes.
set -u
export NCCL_NVLS_ENABLE=0
R=$OUT/emoe10
mkdir -p $R/tiny $R/phases $R/profile
T0=$(date +%s)
left() { echo $(( 200 - ($(date +%s) - T0) )); }
{ nvidia-smi; nvidia-smi topo -m; python3 -c "import torch;print(torch.__version__, torch.version.cuda)"; nproc; } > $R/env.txt 2>&1
# 1. tiny widths (hidden 256, seq 128, expert FFN 512): the host's own time per step
timeout 80 python3 benchmarks/device/steps.py --driver --tiny --label tiny --out $R/tiny \
  --only moe_ep1,moe_ep2,moe_ep2dp2,moe_ep4 --case-timeout-s 40 --budget-s 75 > $R/log-tiny.txt 2>&1
echo "tiny done $(( $(date +%s) - T0 )) s" >> $R/log.txt
# 2. phase timelines, full width, both routings
timeout 35 python3 devreq/emoe10/moe_phases.py --script steps --case moe_ep1 --routing both \
  --out $R/phases > $R/log-phases-ep1.txt 2>&1
echo "phases ep1 done $(( $(date +%s) - T0 )) s" >> $R/log.txt
L=$(left); [ $L -gt 20 ] && timeout $(( L < 40 ? L : 40 )) torchrun --standalone --nproc_per_node=4 \
  devreq/emoe10/moe_phases.py --script steps --case moe_ep4 --routing both --out $R/phases \
  > $R/log-phases-ep4.txt 2>&1
echo "phases ep4 done $(( $(date +%s) - T0 )) s" >> $R/log.txt
L=$(left); [ $L -gt 15 ] && timeout $(( L < 25 ? L : 25 )) python3 devreq/emoe10/moe_phases.py --script steps \
  --case moe_ep1 --routing both --tiny --out $R/phases > $R/log-phases-ep1-tiny.txt 2>&1
echo "phases ep1 tiny done $(( $(date +%s) - T0 )) s" >> $R/log.txt
# 3. one profiled full-width EP 1 step per routing (kernel time by kind, GPU idle, host ops)
L=$(left); [ $L -gt 20 ] && timeout $(( L < 40 ? L : 40 )) python3 benchmarks/device/steps.py --driver \
  --profile --label profile --out $R/profile --only moe_ep1 --case-timeout-s 38 --budget-s 39 \
  > $R/log-profile.txt 2>&1
echo "profile done $(( $(date +%s) - T0 )) s" >> $R/log.txt
