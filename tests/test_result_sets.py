"""Issue 17 items 4-6 and 9, issue 16 family 4: result folders are written as a set, output
folders that cannot be one are refused, JSON is finite and reruns are byte-identical, and
inputs that used to be ignored or crash are refused or honoured."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.commands import run_cmd
from simulator.commands.run_cmd import OUTPUT_FILES
from simulator.errors import ConfigError
from simulator.report.io import MARKER, check_out_dir
from tests.cli_batch import assert_refused, run_batch
from tests.conftest import small_topology, small_workload

WORK = small_workload("sets")


@pytest.fixture
def case_dir(tmp_path: Path) -> Path:
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(small_topology(2, 4)))
    (tmp_path / "work.yaml").write_text(yaml.safe_dump(WORK))
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(small_topology(1, 1)))
    return tmp_path


def test_unusable_output_folders_and_bad_overrides_exit_2(case_dir):
    (case_dir / "afile").write_text("x")
    (case_dir / "mine").mkdir()
    (case_dir / "mine" / "notes.txt").write_text("keep me")
    (case_dir / "s.yaml").write_text(
        yaml.safe_dump({"name": "s", "base": "work.yaml", "grid": {"seed": [1]}}))
    gpu = "topology.gpu={base: H100-SXM-80GB, %s}"
    cases = {
        # compare, plan and sweep check their folder before simulating, as run does (they
        # failed with an internal error after the work)
        "cmp_out_file": (["compare", "work.yaml", "--out", "afile"], "'afile' exists and is"),
        "plan_out_under_file": (
            ["plan", "work.yaml", "--gpus", "8", "--out", "afile/x"], "is a file, so"),
        "sweep_dev_null": (
            ["sweep", "s.yaml", "--out", "/dev/null", "--no-progress"], "is not a folder"),
        "out_file": (["run", "work.yaml", "--out", "afile"], "--out: 'afile' exists and is not"),
        "out_under_file": (["run", "work.yaml", "--out", "afile/x"], "is a file, so"),
        "dev_null": (["run", "work.yaml", "--out", "/dev/null"], "is not a folder"),
        "out_empty": (["run", "work.yaml", "--out", ""], "--out"),
        "out_other_files": (["run", "work.yaml", "--out", "mine"], "holds other files"),
        "gemm_eta0": (["run", "work.yaml", "--set", gpu % "gemm: {eta: 0}"], "gpu.gemm.eta"),
        "calibration": (["run", "work.yaml", "--set", gpu % "calibration: 5"], "calibration"),
        "memory_access": (
            ["run", "work.yaml", "--set", gpu % "memory_access: {fo: 1}"],
            "gpu.memory_access.fo: unknown key",
        ),
        "mtbf": (
            ["run", "work.yaml", "--set", "faults.reliability={gpu_mtbf_hours: 1e-300}"],
            "faults.reliability.gpu_mtbf_hours: the job of 8 GPUs fails every",
        ),
        "nic_gpu": (
            ["run", "work.yaml", "--set", "faults.links=[{kind: nic, node: 1, nic: 0, gpu: 3}]"],
            "faults.links[0].gpu",
        ),
        "coll_set_workload": (
            ["collective", "all_reduce", "--bytes", "1MiB", "--topology", "topo.yaml", "--set",
             "parallelism.tp=4"],
            "--set: parallelism.tp: only topology keys",
        ),
        "coll_bytes_inf": (
            ["collective", "all_reduce", "--bytes", "1e400", "--topology", "topo.yaml", "--json"],
            "--bytes: size must be in",
        ),
        "coll_one_gpu": (
            ["collective", "all_reduce", "--bytes", "1MiB", "--topology", "one.yaml", "--json"],
            "at least 2 GPUs",
        ),
    }
    outcomes = run_batch([argv for argv, _ in cases.values()], case_dir)
    for (name, (_, words)), o in zip(cases.items(), outcomes, strict=True):
        assert words in assert_refused(o), name
    assert (case_dir / "afile").read_text() == "x"
    assert sorted(p.name for p in (case_dir / "mine").iterdir()) == ["notes.txt"]
    assert not (case_dir / "results").exists()


def test_gpu_field_override_keeps_the_named_gpu(case_dir, capsys, monkeypatch):
    monkeypatch.chdir(case_dir)
    assert main(["run", "work.yaml", "--no-files", "--json", "--set",
                 "topology.gpu.hbm_GiB=96"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["gpu"] == "H100-SXM-80GB" and s["memory_gib"]["capacity"] == pytest.approx(96)


def test_a_layout_that_does_not_fit_is_a_result_naming_the_worst_gpu(case_dir, capsys,
                                                                     monkeypatch):
    # fits: false with a warning (not an error) that names the worst GPU and its stage, not
    # the engine's label of its process (c0.s0)
    monkeypatch.chdir(case_dir)
    assert main(["run", "work.yaml", "--no-files", "--json", "--set",
                 "topology.gpu.hbm_GiB=1"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["fits"] is False and s["memory_gib"]["total"] > s["memory_gib"]["capacity"]
    (warning,) = [w for w in s["warnings"] if w.startswith("does not fit")]
    assert re.search(r"\(worst: GPU \d+, stage \d+\)", warning), warning


def test_summary_json_is_byte_identical_and_stdout_keeps_the_wall_time(case_dir, capsys,
                                                                       monkeypatch):
    monkeypatch.chdir(case_dir)
    texts = []
    for _ in range(2):
        assert main(["run", "work.yaml", "--out", "r", "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["sim_wall_s"] > 0
        texts.append((case_dir / "r" / "summary.json").read_bytes())
    assert texts[0] == texts[1]
    assert b"sim_wall_s" not in texts[0]
    assert (case_dir / "r" / MARKER).exists()
    assert not [p for p in case_dir.iterdir() if p.name.startswith(".r.")]


def test_run_says_what_it_is_doing_on_a_terminal_only(case_dir, capsys, monkeypatch):
    # A folded run shows on stderr what it is doing (simulating, writing each file) through
    # rich, which draws nothing off a terminal: piped, stderr stays empty.
    seen: list[str] = []
    real = run_cmd.write_outputs

    def spy(result, out, loaded=None, on_file=None):
        def note(name: str) -> None:
            seen.append(name)
            on_file(name)

        return real(result, out, loaded, on_file=note)

    monkeypatch.setattr(run_cmd, "write_outputs", spy)
    monkeypatch.chdir(case_dir)
    assert main(["run", "work.yaml", "--out", "r"]) == 0
    assert seen == [n for n in OUTPUT_FILES.values() if n != "summary.json"]
    assert capsys.readouterr().err == ""


def test_a_run_keeps_the_compare_and_plan_files_of_its_folder(case_dir, monkeypatch):
    # compare and plan write into results/<name>, the folder a run replaces as a whole: the
    # run keeps their files (it deleted them), and takes a folder holding only theirs.
    monkeypatch.chdir(case_dir)
    folder = case_dir / "results" / "sets"
    assert main(["compare", "work.yaml", "--variant", "a:training.micro_batch=2"]) == 0
    assert main(["run", "work.yaml"]) == 0
    assert main(["plan", "work.yaml", "--gpus", "8", "--simulate", "1", "--top", "1"]) == 0
    shared = {"compare.csv", "compare.png", "compare.html", "plan.csv"}
    before = {n: (folder / n).read_bytes() for n in shared}
    assert main(["run", "work.yaml"]) == 0
    names = {p.name for p in folder.iterdir()}
    assert names == {*OUTPUT_FILES.values(), MARKER, *shared}
    assert {n: (folder / n).read_bytes() for n in shared} == before


def test_a_read_only_output_folder_is_named_so(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda *a, **k: False)
    flags = type("V", (), {"f_flag": os.ST_RDONLY})()
    monkeypatch.setattr(os, "statvfs", lambda p: flags)
    with pytest.raises(ConfigError) as e:
        check_out_dir(tmp_path / "x")
    assert str(e.value) == f"--out: cannot write into '{tmp_path}' (a read-only file system)"


def _consistent(out: Path) -> dict | None:
    """The folder's summary if the folder is one complete run, else an assertion error."""
    if not out.exists():
        return None
    names = {p.name for p in out.iterdir()}
    assert names == {*OUTPUT_FILES.values(), MARKER}, names
    s = json.loads((out / "summary.json").read_text())
    events = pd.read_parquet(out / "events.parquet")
    assert len(events) == s["trace_rows"]
    return s


def test_kill_9_while_writing_never_leaves_a_mixed_or_partial_folder(case_dir, monkeypatch):
    """Fork a run, kill it at a random moment, and look at the folder: it holds either the
    previous run's complete set or the new one's, never a mix and never events without a
    summary. Bounded: 12 kills with delays spread over one run's duration."""
    monkeypatch.chdir(case_dir)
    rng = random.Random(17)
    out = case_dir / "k"
    t0 = time.perf_counter()
    assert _fork_run(["run", "work.yaml", "--out", "k", "--json"], None) == 0
    full = time.perf_counter() - t0
    first = _consistent(out)
    seen_rows = {first["trace_rows"]}
    for i in range(12):
        gb = 8 * (2 + i % 3)  # a different step, so a mix of two runs shows
        argv = ["run", "work.yaml", "--out", "k", "--json", "--set",
                f"training.global_batch={gb}"]
        _fork_run(argv, rng.uniform(0.0, 1.2 * full))
        s = _consistent(out)
        assert s is not None, "the previous complete run was lost"
        seen_rows.add(s["trace_rows"])
    stale = [p.name for p in case_dir.iterdir() if p.name.startswith(".k.")]
    # stale staging folders of killed runs are removed by the next run
    _fork_run(["run", "work.yaml", "--out", "k", "--json"], None)
    assert not [p for p in case_dir.iterdir() if p.name.startswith(".k.")], stale
    _consistent(out)


def _fork_run(argv: list[str], kill_after: float | None) -> int:
    pid = os.fork()
    if pid == 0:  # child: run the command, never return into pytest
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            rc = main(argv)
        finally:
            os._exit(locals().get("rc", 1))
    if kill_after is not None:
        time.sleep(kill_after)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)
