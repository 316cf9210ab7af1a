"""Synthetic weights: greedy continuations that vary, and <|endoftext|> that comes back."""

import itertools

import pytest

from theinference.model import gpt2 as oracle
from theinference.model.copycircuit import EOT
from theinference.bundled import data_dir
from theinference.grading.spec.stages import load_stages
from theinference.model.synth import write_synthetic
from theinference.model.weights import load_model

GREEDY_CASES = next(s for s in load_stages([data_dir("stages")]) if s.id == "greedy").cases


@pytest.fixture(scope="module", params=[0, 1, 2, 3])
def seeded_tiny(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"tiny-seed{request.param}")
    return load_model(write_synthetic(out, preset="tiny", seed=request.param))


@pytest.mark.parametrize("case", GREEDY_CASES, ids=lambda c: c.name)
@pytest.mark.slow
def test_greedy_continuations_vary(seeded_tiny, case):
    tokens = oracle.greedy(seeded_tiny.params, case.inputs["prompt"], case.inputs["n_new"], seeded_tiny.config.n_head)
    longest_run = max(len(list(run)) for _, run in itertools.groupby(tokens))
    assert longest_run <= 2, tokens
    assert len(set(tokens)) >= len(tokens) / 2, tokens


@pytest.mark.slow
def test_some_greedy_case_generates_end_of_text(seeded_tiny):
    generated = [
        oracle.greedy(seeded_tiny.params, c.inputs["prompt"], c.inputs["n_new"], seeded_tiny.config.n_head)
        for c in GREEDY_CASES
    ]
    assert any(EOT in tokens for tokens in generated)


def test_wpe_stays_smooth_outside_the_positional_channel(tiny_model):
    # The position bugs' shapes (error grows with position) rest on a smooth wpe.
    wpe = tiny_model.params["wpe"]["weight"][:, :64]
    step = abs(wpe[1:] - wpe[:-1]).mean()
    assert step < 0.2 * abs(wpe - wpe.mean(axis=0)).mean()
