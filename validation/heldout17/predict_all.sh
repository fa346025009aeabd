#!/bin/bash
# Pre-register every prediction of the seventeenth batch at the frozen tag, once, before measuring:
#   git tag heldout-freeze-17 && git worktree add /tmp/frozen17 heldout-freeze-17
#   bash validation/heldout17/predict_all.sh /tmp/frozen17
# Steps on both 4-GPU box kinds (a 1- or 2-GPU case runs on that many GPUs of the box), then
# the collectives (in the frozen checkout, copied back): validation/batch.py predict_all (this
# script's shell body until the batch was measured, same commands and checks).
set -e
python validation/batch.py predict-all 17 "${1:?frozen checkout}"
