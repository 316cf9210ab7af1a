"""The mistakes issue 34 found misdiagnosed are named exactly, in both editions, and every failure shape whose cause
can lie inside one block sends the student to the layer-by-layer export with keys that export really has."""

import re
import shutil
from pathlib import Path

import pytest

from test_typescript import TS, node_modules  # noqa: F401  # the fixture: tsx for the TypeScript course
from theinference.bundled import data_dir
from theinference.grading.spec.stages import load_stages
from theinference.grading.tools.export import oracle_arrays

EXPORT = "`theinference oracle --stage forward --out expected.npz`"
# Shapes whose cause can be inside one block, by stage: a NaN in the cached path is a masked row's (its hint says
# so), and shifted-by-one is the adapter's order of recording, outside every block.
INSIDE_A_BLOCK = {
    "forward": ("error-grows", "first-ok-then-flat", "all-rows-off", "nonfinite-row", "no-pattern"),
    "decode-step": ("error-grows", "first-ok-then-flat", "all-rows-off", "no-pattern"),
    "per-step-identity": ("error-grows", "first-ok-then-flat", "first-decode-row-off", "all-rows-off", "no-pattern"),
}
NEW_MUTANTS = {  # mutant -> the stage it shows in -> the bug named there
    "no-mlp-residual": {"forward": "no-mlp-residual"},
    "no-attn-residual": {"per-step-identity": "no-attn-residual"},
    "softmax-over-queries": {"forward": "softmax-over-queries", "per-step-identity": "softmax-over-queries"},
}


def _stages():
    return {s.id: s for s in load_stages([data_dir("stages")])}


@pytest.mark.parametrize("stage_id", sorted(INSIDE_A_BLOCK))
def test_every_shape_that_can_lie_inside_a_block_names_the_layer_by_layer_export(stage_id):
    hints = _stages()[stage_id].hints
    for shape in INSIDE_A_BLOCK[stage_id]:
        assert EXPORT in hints[shape], (stage_id, shape)


@pytest.mark.parametrize("stage_id", ["prove-one-layer", "single-step-attention"])
def test_every_shape_of_a_one_layer_stage_names_its_own_export_and_a_key_it_has(stage_id, tiny_model):
    """Their output is layer 0's attention sublayer: the cause is always inside that block, and their export holds it."""
    stage = _stages()[stage_id]
    arrays = oracle_arrays(stage, tiny_model, stage.cases[:1])
    for shape, hint in stage.hints.items():
        assert f"`theinference oracle --stage {stage_id} --out expected.npz`" in hint, shape
        for key in re.findall(r"'(<case>\.[^']+)'", hint):
            assert key.replace("<case>", stage.cases[0].name) in arrays, (shape, key)


def test_the_keys_the_hints_name_are_keys_of_the_export(tiny_model):
    stages = _stages()
    forward = stages["forward"]
    arrays = oracle_arrays(forward, tiny_model, forward.cases[:1])
    case = forward.cases[0].name
    named = {k for s in INSIDE_A_BLOCK for h in stages[s].hints.values() for k in re.findall(r"'(<case>\.[^']+)'", h)}
    assert named == {"<case>.block<i>.attn", "<case>.block<i>.mlp"}
    for key in named:
        for i in range(tiny_model.config.n_layer):
            assert key.replace("<case>", case).replace("<i>", str(i)) in arrays


def test_the_suspects_of_a_whole_model_difference_name_the_residual_and_the_softmax_axis():
    stages = _stages()
    for stage_id in ("forward", "decode-step", "per-step-identity", "prove-one-layer", "single-step-attention"):
        hint = stages[stage_id].hints["all-rows-off"]
        assert "residual" in hint and "softmax" in hint, stage_id


@pytest.mark.slow
def test_the_ts_mutants_of_issue_34_are_named(cli, tmp_path, tiny_path, node_modules):  # noqa: F811
    source = tmp_path / "ts"
    shutil.copytree(TS, source, ignore=shutil.ignore_patterns("node_modules"))
    if node_modules is not None:
        (source / "node_modules").symlink_to(node_modules, target_is_directory=True)
    mutants = [*NEW_MUTANTS, "forward-cached-every-row"]
    result = cli(
        "stages",
        "check",
        "--source",
        source,
        "--weights",
        tiny_path,
        "--stage",
        "forward",
        "--stage",
        "per-step-identity",
        *(a for m in mutants for a in ("--mutant", m)),
    )
    assert result.exit_code == 0, result.output
    assert "0 mismatches, 0 problems" in result.output and "✘" not in result.output
    rows = {line.split("|")[0].strip(): line for line in result.output.splitlines() if "|" in line}
    assert "prefill-first-row" in result.output  # forwardCached's every row: prefill's [0], not positions
    assert all(m in rows for m in mutants)


@pytest.mark.slow
def test_a_python_mutant_of_issue_34_is_named_by_test(cli, tmp_path, tiny_path, monkeypatch):
    """Through `theinference test`, as the student sees it: the finding, and the hint that says what to change."""
    from theinference.grading.tools.mutants import build_mutant, load_mutant

    mutant = load_mutant(data_dir("course") / "mutants" / "no-mlp-residual" / "manifest.toml")
    course = build_mutant(mutant, data_dir("course") / "solution", tmp_path / "student")
    result = cli("test", "--course", course, "--weights", tiny_path, "--stage", "forward")
    assert result.exit_code == 1, result.output
    out = " ".join(result.output.split())
    assert "finding: no-mlp-residual" in out and "not one of the known bugs" not in out
    assert "x = x + mlp(ln_2(x))" in out


def test_the_ts_starter_says_forward_cached_returns_the_last_row_only():
    """prefill and decodeStep read forwardCached's [0]: its comments must not promise every new row's logits."""
    text = (Path(TS) / "starter" / "src" / "kvcache.ts").read_text()
    comment = text[: text.index("export function forwardCached")].rsplit("}\n", 1)[1]
    assert "last new row only" in comment and "[1][nVocab]" in comment
    assert "forwardCached(w, ids, cache, 0)[0]" in text and "forwardCached(w, [tokenId], cache, pos)[0]" in text


@pytest.mark.slow
def test_a_greedy_loop_choosing_its_first_token_from_prefills_first_row_is_named(tiny_model):
    from theinference.grading.judge import loops
    from theinference.model import gpt2

    params, n_head = tiny_model.params, tiny_model.config.n_head
    prompt, n_new = [464, 3139, 286, 4881, 318], 6

    def greedy(first_row: int) -> list[int]:  # what the student's loop returns, computed by recompute
        out = [int(gpt2.logits(params, prompt, n_head)[first_row].argmax())]
        while len(out) < n_new:
            out.append(int(gpt2.logits(params, prompt + out, n_head)[-1].argmax()))
        return out

    wrong, right = greedy(0), greedy(-1)
    assert wrong != right  # these weights tell them apart at this prompt
    [bug] = [b for b in loops.loop_bugs(tiny_model) if b.name == "greedy-prefill-first-row"]
    assert loops.reproduces(bug, tiny_model, prompt, n_new, wrong, 1e-4) == ""
    assert loops.reproduces(bug, tiny_model, prompt, n_new, right, 1e-4) is None
