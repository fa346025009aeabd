#!/bin/bash
# Pre-register every prediction of the fourteenth batch at the frozen tag, once, before measuring:
#   git tag heldout-freeze-14 && git worktree add /tmp/frozen14 heldout-freeze-14
#   bash validation/heldout14/predict_all.sh /tmp/frozen14
# Steps on both 4-GPU box kinds (a 1- or 2-GPU case runs on that many GPUs of the box), then
# the collectives (in the frozen checkout, copied back here).
set -e
CO=${1:?frozen checkout}; T=heldout-freeze-14; P="python validation/heldout/predict.py --checkout $CO --tag $T --dir validation/heldout14"
X1=h14t_single_AC; X2=h14t_fsdp2_AC,h14t_moe_ep2_AD,h14_tp2sp_AE,h14_moe_ep2_AF
X4=h14t_ddp4_AC,h14t_fsdp4_AC_ac,h14t_tp4_AC,h14t_pp4_1f1b_AC,h14t_moe_ep4_AD,h14_ddp4_AE_straggler,h14_fsdp4_AE_ac,h14_tp4sp_AE,h14_pp4_1f1b_AE,h14_pp4_int2_AE,h14_moe_ep4_AF
$P --glob 'h14*.yaml' --only $X1 --suffix=-x1 --boxes h100x1=validation/heldout6/h100x1.yaml,h200x1=validation/heldout6/h200x1.yaml
$P --glob 'h14*.yaml' --only $X2 --suffix=-x2 --boxes h100x2=topologies/h100x2-nvswitch.yaml,h200x2=topologies/h200x2-nvswitch.yaml
$P --glob 'h14*.yaml' --only $X4 --suffix=-x4 --boxes h100x4=topologies/h100x4-nvswitch.yaml,h200x4=topologies/h200x4-nvswitch.yaml
for b in h100x4 h200x4; do (cd "$CO" && python validation/heldout14/predict_collectives.py --box $b) && cp "$CO/validation/heldout14/predictions-collectives-$b.yaml" validation/heldout14/; done
n=$(python - <<'PY'
import glob, yaml
seen = set()
for f in glob.glob("validation/heldout14/predictions-heldout-freeze-14-*.yaml"):
    for c, boxes in yaml.safe_load(open(f))["cases"].items():
        assert all("error" not in b for b in boxes.values()), (f, c, boxes)
        assert len(boxes) == 2, (f, c, sorted(boxes))
        seen.add(c)
cases = {p.split("/")[-1][:-5] for p in glob.glob("validation/heldout14/h14*.yaml")}
assert seen == cases, sorted(cases ^ seen)
for b in ("h100x4", "h200x4"):
    rows = yaml.safe_load(open(f"validation/heldout14/predictions-collectives-{b}.yaml"))["rows"]
    assert len(rows) == 2 * 9 * 6 + 8 * 6, (b, len(rows))
print(len(seen))
PY
)
echo "every one of the $n cases predicted on both boxes, and the collectives"
