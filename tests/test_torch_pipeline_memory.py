"""``parallelism.pp_runtime: torch``: what torch.distributed.pipelining holds beside the saved
activations (simulator/model/pipeline_memory.py), checked against closed forms."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.config.load import load_workload
from simulator.engine.build import build_plan, make_job
from simulator.engine.sim import CountingEnvironment
from simulator.model.pipeline_memory import torch_pipeline_memory
from simulator.plan import Candidate
from simulator.plan_estimate import Estimator
from simulator.run import make_machine, resolve_loaded, simulate

ROOT = Path(__file__).resolve().parents[1]
#: steps_alt.py's GPT-2 shape T on 4 stages: autocast over fp32 weights, 8 micro-batches of 2
GPIPE = ROOT / "validation" / "heldout10" / "h10_pp4_gpipe_T.yaml"


def _plan(loaded):
    job = make_job(loaded.workload, loaded.topology, resolve_loaded(loaded), make_machine(loaded))
    return build_plan(job, env=CountingEnvironment())[0]


def _activations(memory, stage: int) -> tuple[float, float]:
    """(peak, end) of the 'activations' records of pipeline stage ``stage``, frees first at
    equal times (as the summary's peak takes them)."""
    g = memory[(memory["proc"] == f"c0.s{stage}") & (memory["what"] == "activations")]
    tot = g.sort_values(["t_s", "delta_bytes"], kind="stable")["delta_bytes"].cumsum()
    return float(tot.max()), float(tot.iloc[-1])


def test_sizes_are_the_closed_forms():
    """One layer's weight copies are its GEMM weights at 2 bytes (GPT: QKV 3h^2, projection
    h^2, MLP 2 x 4h^2); the head's h x V; a stage boundary b s h in the fp32 stream; the logits
    b s V at 2 bytes. bf16 weights (no autocast copies) and fused code (a bf16 stream) differ."""
    m = load_workload(GPIPE).workload.model
    h, b, s, V = m.hidden, 2, m.seq_len, m.vocab
    tm = torch_pipeline_memory(m, micro_batch=b, microbatches=8, tp=1, sequence_parallel=False,
                               kernels="eager", param_dtype="fp32")  # fmt: skip
    assert tm.layer_cast == 12 * h * h * 2
    assert tm.head_cast == h * V * 2
    assert tm.boundary == b * s * h * 4
    assert tm.logits == b * s * V * 2
    bf16 = torch_pipeline_memory(m, micro_batch=b, microbatches=8, tp=1, sequence_parallel=False,
                                 kernels="eager", param_dtype="bf16")  # fmt: skip
    assert bf16.layer_cast == bf16.head_cast == 0.0 and bf16.boundary == b * s * h * 2
    # a middle stage's kept output and the receive buffer its input is: the same size
    assert tm.per_microbatch(False, False) == 0.0
    assert tm.per_microbatch(True, False) == -tm.per_microbatch(False, True) == tm.boundary
    assert tm.buffers(False, False) == 2 * 8 * tm.boundary


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_in_flight_closed_form(schedule):
    """Peak activations of stage s < p-1: k micro-batches' saved tensors and kept outputs, with
    k = m for GPipe (every forward before any backward) and min(m, p - s) for torch's 1F1B
    (its warm-up, ``Schedule1F1B``), plus what the stage holds once a step: its receive buffers
    and one set of weight copies (autocast's cache) however many micro-batches are in flight.
    At the step's end only the buffers remain, and on the last stage every micro-batch's
    logits (kept in ``output_chunks`` until the next step)."""
    loaded = load_workload(GPIPE, [f"parallelism.pp_schedule={schedule}"])
    plan = _plan(loaded)
    tm, p, m = plan.torch_memory, plan.pp, plan.microbatches
    memory = simulate(loaded).memory
    for s in range(p):
        first, last = s == 0, s == p - 1
        peak, end = _activations(memory, s)
        assert end == pytest.approx(tm.buffers(first, last) + (m * tm.logits if last else 0.0))
        if last:
            continue
        layers = len(plan.layers_of(s, 0))
        per_mb = layers * plan.act_bytes_layer + (plan.act_bytes_embed if first else 0.0)
        k = m if schedule == "gpipe" else min(m, p - s)
        want = (k * (per_mb + tm.per_microbatch(first, last)) + tm.buffers(first, last)
                + tm.casts(layers, last))
        assert peak == pytest.approx(want, rel=1e-12)


def test_megatron_runtime_keeps_per_microbatch_casts():
    """The default runtime holds none of it, and counts the weight copies with each micro-batch
    (Megatron-style loops enter autocast per micro-batch): a middle stage's GPipe peak is then
    larger by (m - 1) copies, less the receive buffers torch keeps."""
    torch_run = load_workload(GPIPE)
    mega = load_workload(GPIPE, ["parallelism.pp_runtime=megatron"])
    tp, mp = _plan(torch_run), _plan(mega)
    assert mp.torch_memory is None
    tm, m = tp.torch_memory, tp.microbatches
    assert mp.act_bytes_layer == pytest.approx(tp.act_bytes_layer + tm.layer_cast)
    layers = len(tp.layers_of(1, 0))
    got = _activations(simulate(mega).memory, 1)[0] - _activations(simulate(torch_run).memory, 1)[0]
    assert got == pytest.approx((m - 1) * tm.casts(layers, False) - tm.buffers(False, False))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_plan_prescreen_counts_the_same(schedule):
    """``plan``'s memory pre-screen counts what the engine does under this runtime, but for two
    things it never modelled for eager code: it takes the gradients as made from the start (the
    engine makes them at the first backward) and leaves out the loss's working set. Without
    the runtime's accounting the GPipe estimate would be 5.7 GiB above the engine's peak."""
    loaded = load_workload(GPIPE, [f"parallelism.pp_schedule={schedule}"])
    machine = make_machine(loaded)
    est = Estimator(loaded.workload, loaded.topology, machine)
    cand = Candidate(1, 4, 1, 2, 0, "none", schedule, 1, False)
    got = est.memory_bytes(cand, est.resolve(cand)[1])
    sim = simulate(loaded, machine=machine).summary["memory_gib"]["allocated"] * 2**30
    plan = _plan(loaded)
    slack = max(max(plan.lazy_grad_mem(p) for p in plan.procs), plan.act_bytes_head_transient)
    assert abs(got - sim) <= slack


@pytest.mark.parametrize("param_dtype,width", [("fp32", 4), ("bf16", 2)])
def test_pipeline_sends_carry_the_residual_stream(param_dtype, width):
    """A stage sends its output, the residual stream: fp32 in eager code under autocast over
    fp32 weights (the embedding and the residual additions return fp32), bf16 with bf16
    weights: ``b s h`` elements of that width each way."""
    loaded = load_workload(GPIPE, [f"training.param_dtype={param_dtype}"])
    m = loaded.workload.model
    ev = simulate(loaded).events
    sends = ev[ev["stream"] == "pp"]
    assert len(sends) and (sends["bytes"] == 2 * m.seq_len * m.hidden * width).all()


def _cast_s(ev, stage: int) -> float:
    """Seconds of stage ``stage``'s forward weight and bias casts over the step, read from the
    event records' parts (``name:seconds``) via the op names ending in ``_wcast`` / ``_bcast``."""
    g = ev[(ev["proc"] == f"c0.s{stage}") & (ev["kind"] == "fwd")]
    return float(sum(sum(float(p.split(":")[1]) for p in parts.split(";")
                         if p.split(":")[0].endswith(("_wcast", "_bcast")))
                     for parts in g["parts"]))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_autocast_casts_each_weight_once_a_step(schedule):
    """steps_alt.py runs ``schedule.step()`` inside one autocast region, whose cache keeps each
    fp32 weight's bf16 copy for the step: the forward casts cost once a step, 1/m of what
    m micro-batches each casting would (the same workload under Megatron's runtime, whose
    ``auto`` region is a micro-batch's), and the key says so for any runtime. The forward gets shorter by at most what the casts lose (where
    the host's launches bound a stretch, less) and by a clear part of it."""
    sets = [f"parallelism.pp_schedule={schedule}"]
    torch_ev = simulate(load_workload(GPIPE, sets)).events
    mega_ev = simulate(load_workload(GPIPE, [*sets, "parallelism.pp_runtime=megatron"])).events
    m = 8
    for stage in (0, 3):
        once, every = _cast_s(torch_ev, stage), _cast_s(mega_ev, stage)
        assert every > 0 and once == pytest.approx(every / m, rel=1e-9)
        t_f = torch_ev[(torch_ev["proc"] == f"c0.s{stage}") & (torch_ev["kind"] == "fwd")]
        m_f = mega_ev[(mega_ev["proc"] == f"c0.s{stage}") & (mega_ev["kind"] == "fwd")]
        busy = float((m_f["end_s"] - m_f["start_s"]).sum() - (t_f["end_s"] - t_f["start_s"]).sum())
        assert 0.5 * (every - once) < busy <= (every - once) * (1 + 1e-9)
    forced = simulate(load_workload(GPIPE, [*sets, "parallelism.pp_runtime=megatron",
                                            "training.autocast_region=step"])).events
    assert _cast_s(forced, 0) == pytest.approx(_cast_s(torch_ev, 0), rel=1e-12)
    per_mb = simulate(load_workload(GPIPE, [*sets, "training.autocast_region=microbatch"])).events
    assert _cast_s(per_mb, 0) == pytest.approx(_cast_s(mega_ev, 0), rel=1e-12)


def test_bf16_weights_have_no_casts_to_share():
    """With bf16 parameters there is no weight cast, so the runtime changes no forward time."""
    sets = ["training.param_dtype=bf16"]
    a = simulate(load_workload(GPIPE, sets)).events
    b = simulate(load_workload(GPIPE, [*sets, "parallelism.pp_runtime=megatron"])).events
    fa, fb = a[a["kind"] == "fwd"], b[b["kind"] == "fwd"]
    assert _cast_s(a, 0) == _cast_s(b, 0) == 0.0
    assert float((fa["end_s"] - fa["start_s"]).sum()) == pytest.approx(
        float((fb["end_s"] - fb["start_s"]).sum()), rel=1e-12)
