"""Issue 17 item 9: an error names the field to change. A product of parallel sizes that
does not divide the cluster names the dimension that breaks it (pp, not tp); a ``compare
--variant`` error names the variant, and ``--variant`` (not ``--set``) for the variant's own
keys; ``plan --gpus N`` says whether no layout divides N or none that divides fits."""

from __future__ import annotations

import pytest

from simulator.cli import main
from tests.conftest import ROOT, SMALL_MODEL, small_topology, write_case

WORKLOAD = {
    "name": "w",
    "model": SMALL_MODEL,
    "training": {"global_batch": 16, "micro_batch": 1},
    "parallelism": {"tp": 2, "pp": 2, "zero": 1},
}


def one_error(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("sets", "field"),
    [
        (["parallelism.pp=3"], "parallelism.pp"),  # tp*pp = 6 does not divide 16 GPUs
        (["parallelism.tp=3"], "parallelism.tp"),
        (["parallelism.pp=3", "parallelism.dp=2"], "parallelism.pp"),
        (["parallelism.dp=2"], "parallelism.dp"),  # 2*2*2 = 8 != 16: only dp is wrong
    ],
)
def test_layout_product_names_the_breaking_dimension(tmp_path, capsys, sets, field):
    path = write_case(tmp_path, WORKLOAD, small_topology(2, 8))
    argv = ["run", str(path), "--no-files"] + [a for s in sets for a in ("--set", s)]
    err = one_error(capsys, argv)
    assert f": {field}: " in err


def test_variant_errors_name_the_variant(tmp_path, capsys):
    path = write_case(tmp_path, {**WORKLOAD, "parallelism": {"tp": 8}}, small_topology(1, 8))
    base = ["compare", str(path), "--no-files", "--workers", "1"]
    err = one_error(capsys, [*base, "--variant", "nokey:foo"])
    assert err.startswith("error: --variant: variant 'nokey': ")
    err = one_error(capsys, [*base, "--variant", "typo:parallelism.tpp=2"])
    assert "variant 'typo'" in err and "--variant: parallelism.tpp: no such key" in err
    # a bad GPU name is found only when the variant is simulated; it is the variant's
    # topology.gpu, not the topology file's gpu
    err = one_error(capsys, [*base, "--variant", "gpu:topology.gpu=H999"])
    assert err.startswith("error: variant 'gpu': --variant: topology.gpu: unknown GPU 'H999'")
    err = one_error(capsys, [*base, "--variant", "g:topology.gpu.hbm_GiB=-3"])
    assert err.startswith("error: variant 'g': --variant: topology.gpu.hbm_GiB: ")
    # a key every configuration shares is still --set's
    err = one_error(capsys, [*base, "--variant", "v:parallelism.zero=2", "--set", "x.y=1"])
    assert err.startswith("error: --set: x.y: ")


def test_plan_says_no_layout_fits_memory(tmp_path, capsys):
    """A 8B model on 1 GPU: the one layout divides, but needs far more than 80 GB."""
    err = one_error(
        capsys, ["plan", str(ROOT / "workloads" / "llama3-8b.yaml"), "--gpus", "1", "--no-files"]
    )
    assert "fits in GPU memory" in err and "must divide" not in err
