#!/bin/bash
# Pre-register every prediction of the thirteenth batch at the frozen tag, once, before measuring:
#   git tag heldout-freeze-13 && git worktree add /tmp/frozen13 heldout-freeze-13
#   bash validation/heldout13/predict_all.sh /tmp/frozen13
# Steps on both 4-GPU box kinds (a 1- or 2-GPU case runs on that many GPUs of the box), then
# the collectives (in the frozen checkout, copied back here).
set -e
CO=${1:?frozen checkout}; T=heldout-freeze-13; P="python validation/heldout/predict.py --checkout $CO --tag $T --dir validation/heldout13"
X1=h13t_single_I; X2=h13t_tp2_I,h13t_moe_ep2_O,h13_tp2sp_AA,h13_moe_ep2_AB
X4=h13t_ddp4_I,h13t_fsdp4_I_ac,h13t_tp4_I,h13t_pp4_1f1b_I,h13t_moe_ep4_O,h13_ddp4_AA_straggler,h13_fsdp4_AA,h13_tp4sp_AA,h13_pp4_gpipe_AA,h13_pp4_int2_AA,h13_moe_ep4_AB
$P --glob 'h13*.yaml' --only $X1 --suffix=-x1 --boxes h100x1=validation/heldout6/h100x1.yaml,h200x1=validation/heldout6/h200x1.yaml
$P --glob 'h13*.yaml' --only $X2 --suffix=-x2 --boxes h100x2=topologies/h100x2-nvswitch.yaml,h200x2=topologies/h200x2-nvswitch.yaml
$P --glob 'h13*.yaml' --only $X4 --suffix=-x4 --boxes h100x4=topologies/h100x4-nvswitch.yaml,h200x4=topologies/h200x4-nvswitch.yaml
for b in h100x4 h200x4; do (cd "$CO" && python validation/heldout13/predict_collectives.py --box $b) && cp "$CO/validation/heldout13/predictions-collectives-$b.yaml" validation/heldout13/; done
n=$(python - <<'PY'
import glob, yaml
seen = set()
for f in glob.glob("validation/heldout13/predictions-heldout-freeze-13-*.yaml"):
    for c, boxes in yaml.safe_load(open(f))["cases"].items():
        assert all("error" not in b for b in boxes.values()), (f, c, boxes)
        assert len(boxes) == 2, (f, c, sorted(boxes))
        seen.add(c)
cases = {p.split("/")[-1][:-5] for p in glob.glob("validation/heldout13/h13*.yaml")}
assert seen == cases, sorted(cases ^ seen)
for b in ("h100x4", "h200x4"):
    rows = yaml.safe_load(open(f"validation/heldout13/predictions-collectives-{b}.yaml"))["rows"]
    assert len(rows) == 2 * 9 * 6 + 8 * 6, (b, len(rows))
print(len(seen))
PY
)
echo "every one of the $n cases predicted on both boxes, and the collectives"
