#!/bin/bash
# Pre-register every prediction of the twelfth batch at the frozen tag, once, before measuring:
#   git tag heldout-freeze-12 && git worktree add /tmp/frozen12 heldout-freeze-12
#   bash validation/heldout12/predict_all.sh /tmp/frozen12
# Steps on both 4-GPU box kinds (a 1- or 2-GPU case runs on that many GPUs of the box), then
# the collectives (in the frozen checkout, copied back here).
set -e
CO=${1:?frozen checkout}; T=heldout-freeze-12; P="python validation/heldout/predict.py --checkout $CO --tag $T --dir validation/heldout12"
X1=h12t_single_J; X2=h12t_ddp2_J,h12t_fsdp2_J_ac,h12t_moe_ep2_K,h12_tp2sp_N
X4=h12t_fsdp4_J,h12t_tp4_J,h12t_pp4_1f1b_J,h12t_moe_ep4_K,h12_ddp4_N_straggler,h12_fsdp4_N_ac,h12_tp4sp_N,h12_pp4_1f1b_N,h12_pp4_int2_N,h12_moe_ep4_L
$P --glob 'h12*.yaml' --only $X1 --suffix=-x1 --boxes h100x1=validation/heldout6/h100x1.yaml,h200x1=validation/heldout6/h200x1.yaml
$P --glob 'h12*.yaml' --only $X2 --suffix=-x2 --boxes h100x2=topologies/h100x2-nvswitch.yaml,h200x2=topologies/h200x2-nvswitch.yaml
$P --glob 'h12*.yaml' --only $X4 --suffix=-x4 --boxes h100x4=topologies/h100x4-nvswitch.yaml,h200x4=topologies/h200x4-nvswitch.yaml
for b in h100x4 h200x4; do (cd "$CO" && python validation/heldout12/predict_collectives.py --box $b) && cp "$CO/validation/heldout12/predictions-collectives-$b.yaml" validation/heldout12/; done
n=$(python - <<'PY'
import glob, yaml
seen = set()
for f in glob.glob("validation/heldout12/predictions-heldout-freeze-12-*.yaml"):
    for c, boxes in yaml.safe_load(open(f))["cases"].items():
        assert all("error" not in b for b in boxes.values()), (f, c, boxes)
        assert len(boxes) == 2, (f, c, sorted(boxes))
        seen.add(c)
cases = {p.split("/")[-1][:-5] for p in glob.glob("validation/heldout12/h12*.yaml")}
assert seen == cases, sorted(cases ^ seen)
for b in ("h100x4", "h200x4"):
    rows = yaml.safe_load(open(f"validation/heldout12/predictions-collectives-{b}.yaml"))["rows"]
    assert len(rows) == 2 * 9 * 6 + 8 * 6, (b, len(rows))
print(len(seen))
PY
)
echo "every one of the $n cases predicted on both boxes, and the collectives"
