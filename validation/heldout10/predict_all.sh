#!/bin/bash
# Pre-register every prediction of the tenth batch at the frozen tag, once, before measuring:
#   git tag heldout-freeze-10 && git worktree add /tmp/frozen10 heldout-freeze-10
#   bash validation/heldout10/predict_all.sh /tmp/frozen10
# Steps on both 4-GPU box kinds (a 1- or 2-GPU case runs on that many GPUs of the box), then
# the collectives (in the frozen checkout, copied back here).
set -e
CO=${1:?frozen checkout}; T=heldout-freeze-10; P="python validation/heldout/predict.py --checkout $CO --tag $T --dir validation/heldout10"
X1=h10t_single_E; X2=h10t_fsdp2_E_ac,h10_tp2sp_T
X4=h10t_ddp4_E,h10t_fsdp4_E,h10t_tp4_E,h10t_pp4_1f1b_E,h10t_moe_ep4_F,h10_ddp4_T_straggler,h10_fsdp4_T_ac,h10_pp4_gpipe_T,h10_pp4_1f1b_T
$P --glob 'h10*.yaml' --only $X1 --suffix=-x1 --boxes h100x1=validation/heldout6/h100x1.yaml,h200x1=validation/heldout6/h200x1.yaml
$P --glob 'h10*.yaml' --only $X2 --suffix=-x2 --boxes h100x2=topologies/h100x2-nvswitch.yaml,h200x2=topologies/h200x2-nvswitch.yaml
$P --glob 'h10*.yaml' --only $X4 --suffix=-x4 --boxes h100x4=topologies/h100x4-nvswitch.yaml,h200x4=topologies/h200x4-nvswitch.yaml
for b in h100x4 h200x4; do (cd "$CO" && python validation/heldout10/predict_collectives.py --box $b) && cp "$CO/validation/heldout10/predictions-collectives-$b.yaml" validation/heldout10/; done
n=$(python - <<'PY'
import glob, yaml
seen = set()
for f in glob.glob("validation/heldout10/predictions-heldout-freeze-10-*.yaml"):
    for c, boxes in yaml.safe_load(open(f))["cases"].items():
        assert all("error" not in b for b in boxes.values()), (f, c, boxes)
        seen.add(c)
cases = {p.split("/")[-1][:-5] for p in glob.glob("validation/heldout10/h10*.yaml")}
assert seen == cases, sorted(cases ^ seen)
print(len(seen))
PY
)
echo "every one of the $n cases predicted on both boxes"
