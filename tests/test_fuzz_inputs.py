"""Random typed and mistyped workloads fed to ``run`` (issue 16): every one ends in exit 0 or
exit 2 -- never 1, an internal failure -- within the batch's subprocess timeout, and an
invalid one leaves no output folder.

Hypothesis draws batches of mutations of a small valid workload: 1-3 keys set to values of
the right type, the wrong type, absurd sizes, NaN and infinities, nested junk. A bounded
number of examples keeps the suite fast.
"""

from __future__ import annotations

import copy
import json

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_batch import run_batch
from tests.conftest import small_topology, small_workload

BASE = small_workload("fuzz")

KEYS = [
    "model.layers", "model.hidden", "model.heads", "model.kv_heads", "model.seq_len",
    "model.vocab", "model.ffn_hidden", "model.activation", "training.global_batch",
    "training.micro_batch", "training.grad_bucket_MB", "training.tokens", "training.precision",
    "training.recompute", "training.overlap_grad_reduce", "parallelism.tp", "parallelism.pp",
    "parallelism.dp", "parallelism.zero", "parallelism.sequence_parallel",
    "parallelism.virtual_stages", "parallelism.stage_layers", "parallelism.pp_schedule",
    "faults.stragglers", "faults.links", "faults.reliability", "seed", "name", "model.layerz",
]

SCALARS = st.one_of(
    st.integers(min_value=-3, max_value=64),
    st.sampled_from([0, 1, 2, 4, 8, 10**6, 10**12, 10**30, -(10**9)]),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([0.5, 2.0, 1e-300, 1e300]),
    st.booleans(),
    st.none(),
    st.text(max_size=8),
    st.sampled_from(["2", "true", "1f1b", "interleaved", "gelu", "full", "fp8", "../x"]),
)
VALUES = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=5),
    st.dictionaries(st.sampled_from(["gpu", "node", "slowdown", "kind", "nic", "x"]), SCALARS,
                    max_size=3),
    st.lists(st.dictionaries(st.sampled_from(["gpu", "slowdown", "kind", "bandwidth_factor"]),
                             SCALARS, max_size=3), max_size=2),
)
MUTATION = st.lists(st.tuples(st.sampled_from(KEYS), VALUES), min_size=1, max_size=3)


def mutate(changes: list[tuple[str, object]]) -> dict:
    work = copy.deepcopy(BASE)
    for key, value in changes:
        cur = work
        *parents, last = key.split(".")
        for part in parents:
            cur = cur.setdefault(part, {})
        cur[last] = value
    return work


@settings(max_examples=3, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(MUTATION, min_size=12, max_size=12))
def test_random_workloads_exit_0_or_2_and_leave_nothing_when_refused(tmp_path, batch):
    case_dir = tmp_path / f"b{abs(hash(json.dumps(batch, default=str))) % 10**8}"
    case_dir.mkdir()
    (case_dir / "topo.yaml").write_text(yaml.safe_dump(small_topology(2, 4)))
    argvs = []
    for i, changes in enumerate(batch):
        text = yaml.safe_dump(mutate(changes), allow_unicode=True)
        (case_dir / f"w{i}.yaml").write_text(text)
        argvs.append(["run", f"w{i}.yaml", "--out", f"out{i}", "--json"])
    # The subprocess timeout is the wall-time ceiling of the whole batch.
    for i, o in enumerate(run_batch(argvs, case_dir, timeout=300)):
        assert o.rc in (0, 2), (batch[i], o.rc, o.err)
        assert "Traceback" not in o.err
        if o.rc == 2:
            assert o.err.startswith("error: ") and o.err.count("\n") == 1, (batch[i], o.err)
            assert not (case_dir / f"out{i}").exists(), batch[i]
        else:
            assert json.loads(o.out)["step_time_s"] > 0
    assert not (case_dir / "results").exists()
