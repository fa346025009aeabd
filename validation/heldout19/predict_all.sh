#!/bin/bash
# Pre-register every prediction of the nineteenth batch at the frozen tag, once, before measuring:
#   git tag heldout-freeze-19 && git worktree add /tmp/frozen19 heldout-freeze-19
#   bash validation/heldout19/predict_all.sh /tmp/frozen19
# Steps on both 4-GPU box kinds (a 1- or 2-GPU case runs on that many GPUs of the box), then
# the collectives (in the frozen checkout, copied back): validation/batch.py predict_all (this
# script's shell body until the batch was measured, same commands and checks).
set -e
python validation/batch.py predict-all 19 "${1:?frozen checkout}"
