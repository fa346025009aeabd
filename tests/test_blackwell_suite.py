"""The Blackwell suite's models are the models NeMo ran: the model FLOPs per token the
simulator counts for each row equal the row's published model TFLOP/s per GPU over its tokens/s
per GPU (the NeMo tables give both), so no row can silently inherit another model family's
settings from the suite's defaults (the 405B rows once ran with GPT-3's GELU MLP)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.config.suite import load_suite
from simulator.model.transformer import model_flops_per_step
from simulator.validate import load_case

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "validation/published-blackwell.yaml"

#: (case, published model TFLOP/s per GPU, tokens/s per GPU), from the case's source (NeMo
#: 25.04 performance summary, DGX-GB200 table; the rows that publish both columns)
PUBLISHED = [
    ("nemo-25.04-gpt3-175b-gb200-fp8-128gpu", 1942.0, 1804.0),
    ("nemo-25.04-llama3.1-405b-gb200-fp8-128gpu", 1763.0, 665.0),
]


@pytest.mark.parametrize("name,tflops,tokens", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_model_flops_per_token_match_the_published_columns(name, tflops, tokens):
    suite = load_suite(SUITE)
    idx, case = next((i, c) for i, c in enumerate(suite.cases) if c.name == name)
    assert name in case.source or str(int(tflops)) in case.source.replace(",", "")
    loaded = load_case(SUITE, suite.defaults, case.model_dump(), idx)
    m = loaded.workload.model
    # NeMo / Megatron-Bridge count attention over the full s x s matrix (non-causal)
    per_token = model_flops_per_step(m, 1, causal=False) / m.seq_len
    assert per_token == pytest.approx(tflops * 1e12 / tokens, rel=0.02)
