#!/bin/bash
# Pre-register every prediction of the eleventh batch at the frozen tag, once, before measuring:
#   git tag heldout-freeze-11 && git worktree add /tmp/frozen11 heldout-freeze-11
#   bash validation/heldout11/predict_all.sh /tmp/frozen11
# Steps on both 4-GPU box kinds (a 1- or 2-GPU case runs on that many GPUs of the box), then
# the collectives (in the frozen checkout, copied back here).
set -e
CO=${1:?frozen checkout}; T=heldout-freeze-11; P="python validation/heldout/predict.py --checkout $CO --tag $T --dir validation/heldout11"
X1=h11t_single_G; X2=h11t_tp2_G,h11t_moe_ep2_H,h11_ddp2_P_straggler
X4=h11t_ddp4_G,h11t_fsdp4_G_ac,h11t_tp4_G,h11t_pp4_1f1b_G,h11t_moe_ep4_H,h11_ddp4_P,h11_fsdp4_P,h11_tp4sp_P,h11_pp4_gpipe_P,h11_pp4_int2_P,h11_moe_ep4_M
$P --glob 'h11*.yaml' --only $X1 --suffix=-x1 --boxes h100x1=validation/heldout6/h100x1.yaml,h200x1=validation/heldout6/h200x1.yaml
$P --glob 'h11*.yaml' --only $X2 --suffix=-x2 --boxes h100x2=topologies/h100x2-nvswitch.yaml,h200x2=topologies/h200x2-nvswitch.yaml
$P --glob 'h11*.yaml' --only $X4 --suffix=-x4 --boxes h100x4=topologies/h100x4-nvswitch.yaml,h200x4=topologies/h200x4-nvswitch.yaml
for b in h100x4 h200x4; do (cd "$CO" && python validation/heldout11/predict_collectives.py --box $b) && cp "$CO/validation/heldout11/predictions-collectives-$b.yaml" validation/heldout11/; done
n=$(python - <<'PY'
import glob, yaml
seen = set()
for f in glob.glob("validation/heldout11/predictions-heldout-freeze-11-*.yaml"):
    for c, boxes in yaml.safe_load(open(f))["cases"].items():
        assert all("error" not in b for b in boxes.values()), (f, c, boxes)
        assert len(boxes) == 2, (f, c, sorted(boxes))
        seen.add(c)
cases = {p.split("/")[-1][:-5] for p in glob.glob("validation/heldout11/h11*.yaml")}
assert seen == cases, sorted(cases ^ seen)
for b in ("h100x4", "h200x4"):
    rows = yaml.safe_load(open(f"validation/heldout11/predictions-collectives-{b}.yaml"))["rows"]
    assert len(rows) == 2 * 9 * 6 + 8 * 6, (b, len(rows))
print(len(seen))
PY
)
echo "every one of the $n cases predicted on both boxes, and the collectives"
