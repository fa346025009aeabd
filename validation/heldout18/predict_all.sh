#!/bin/bash
# Pre-register every prediction of the eighteenth batch at the frozen tag, once, before measuring:
#   git tag heldout-freeze-18 && git worktree add /tmp/frozen18 heldout-freeze-18
#   bash validation/heldout18/predict_all.sh /tmp/frozen18
# Steps on both 4-GPU box kinds (a 1- or 2-GPU case runs on that many GPUs of the box), then
# the collectives (in the frozen checkout, copied back): validation/batch.py predict_all (this
# script's shell body until the batch was measured, same commands and checks).
set -e
python validation/batch.py predict-all 18 "${1:?frozen checkout}"
