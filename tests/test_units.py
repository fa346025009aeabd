"""Issue 15 item 12: one unit per quantity. The gradient bucket is in MiB (2^20 bytes), as
PyTorch DDP's ``bucket_cap_mb`` counts it, under ``grad_bucket_MB`` or ``grad_bucket_MiB``
(one of them); the ``collective`` table shows the JSON's ``launch_s`` in µs beside the time
in µs. (A link's trace counter has one name in both of its modes: tests/test_report.py.)"""

from __future__ import annotations

import json
import math

from simulator.cli import main
from tests.conftest import ROOT, SMALL_MODEL, small_topology, write_case
from tests.test_engine import run_case

H = SMALL_MODEL["hidden"]
#: fp32 gradient bytes of one GELU layer of SMALL_MODEL: 12 h^2 weights + 13 h biases/norms.
LAYER_GRAD = 4 * (12 * H * H + 13 * H)


def dp_buckets(tmp_path, training: dict) -> list[float]:
    """Bytes of each data-parallel gradient bucket of one step, in issue order."""
    res = run_case(
        tmp_path,
        training={"global_batch": 8, "overlap_grad_reduce": True, **training},
        parallelism={"pp": 1, "dp": 8, "tp": 1},
    )
    ev = res.events
    ev = ev[(ev["stream"] == "dp") & ev["name"].str.contains("bucket")]
    first = ev.groupby("name", sort=False)["bytes"].first()
    order = sorted(first.index, key=lambda n: int(n.rsplit(" ", 1)[-1]))
    return [float(first[n]) for n in order]


def test_bucket_size_is_in_mib(tmp_path):
    """A bucket closes once it holds at least cap x 2^20 bytes, whole layers at a time: with
    cap x 10^6 <= 2 layers < cap x 2^20, a bucket takes ceil(cap x 2^20 / layer) = 3 layers
    (2 if the key meant 10^6 bytes), so the 8 layers go out in ceil(8 / 3) = 3 buckets."""
    cap = 0.99 * 2 * LAYER_GRAD / 1e6  # MiB
    assert cap * 1e6 <= 2 * LAYER_GRAD < cap * 2**20
    k = math.ceil(cap * 2**20 / LAYER_GRAD)
    assert k == 3
    for key in ("grad_bucket_MB", "grad_bucket_MiB"):
        buckets = dp_buckets(tmp_path, {key: cap})
        assert len(buckets) == math.ceil(8 / k), (key, buckets)
        # the middle bucket holds k whole layers (the first and last add the tiny LM head
        # and embedding of the 8-token vocabulary)
        assert buckets[1] == LAYER_GRAD * k
        assert sum(buckets) >= 8 * LAYER_GRAD


def test_both_bucket_keys_at_once_are_refused(tmp_path, capsys):
    work = {"name": "w", "model": SMALL_MODEL, "training": {"global_batch": 8},
            "parallelism": {"tp": 8}}  # fmt: skip
    path = write_case(tmp_path, work, small_topology(1, 8))
    sets = ["--set", "training.grad_bucket_MB=25", "--set", "training.grad_bucket_MiB=25"]
    rc = main(["run", str(path), "--no-files", *sets])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "grad_bucket_MiB" in err and "give one" in err


def test_collective_table_shows_launch_in_microseconds(capsys):
    topo = str(ROOT / "topologies" / "dgx-h100-ndr-8node.yaml")
    args = ["collective", "all_reduce", "--bytes", "1e8", "--topology", topo]
    assert main([*args, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"{res['launch_s'] * 1e6:,.1f} µs" in out and "launch_s" not in out
    assert f"{res['time_s'] * 1e6:,.1f} µs" in out and " us" not in out

