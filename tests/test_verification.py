"""Greedy verification in one teacher-forced forward: same verdicts as recompute, exact ties accepted."""

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import write_adapters
from theinference.model import gpt2 as oracle
from theinference.course import load_course
from theinference.grading.judge.grade import GradeContext, grade
from theinference.grading.tools.mutants import build_mutant, load_mutants
from theinference.bundled import data_dir
from theinference.grading.spec.stages import load_stages

COURSE = data_dir("course")
GREEDY = next(s for s in load_stages([data_dir("stages")]) if s.id == "greedy")
SUBJECTS = ["solution"] + [m.name for m in load_mutants(COURSE / "mutants")]


def _recomputed_verdicts(model, prompt: list[int], tokens: list[int]) -> list[str]:
    """The slow way: a full recompute of prompt + tokens[:k] for every step k."""
    verdicts = []
    for k, token in enumerate(tokens):
        ids = prompt + tokens[:k]
        row = oracle.logits(model.params, ids, model.config.n_head, rows=slice(len(ids) - 1, len(ids)))[0]
        best = int(np.argmax(row))
        tie = float(row[best]) - float(row[token]) <= GREEDY.check.tie_rtol * float(np.abs(row).max())
        verdicts.append("match" if token == best else "near-tie" if tie else "mismatch")
        if verdicts[-1] == "mismatch":
            break
    return verdicts


@pytest.mark.slow
@pytest.mark.parametrize("subject", SUBJECTS)
def test_teacher_forced_verdicts_equal_recompute(subject, tiny_model, tmp_path):
    course = shutil.copytree(COURSE / "solution", tmp_path / "solution")
    if subject != "solution":
        mutant = next(m for m in load_mutants(COURSE / "mutants") if m.name == subject)
        course = build_mutant(mutant, course, tmp_path / subject)
    result = grade(GREEDY, GradeContext(course=load_course(course), model=tiny_model))
    for case in result.cases:
        if not case.got_tokens:  # wrong shape: nothing to walk
            continue
        prompt = case.inputs["prompt"]
        assert [s.verdict for s in case.steps] == _recomputed_verdicts(tiny_model, prompt, case.got_tokens), case.name


@pytest.mark.slow
def test_an_exact_tie_is_accepted_and_noted(cli, tiny_dir, tiny_model, tmp_path):
    prompt, n_new = [464, 2068], 4
    first = oracle.greedy(tiny_model.params, prompt, n_new, tiny_model.config.n_head)
    # A twin of the first generated token: same wte row, so equal logits everywhere (an exact tie)
    # and the same path after it. np.argmax takes the lower id: the oracle keeps `first[0]`.
    twin = max(t for t in range(first[0] + 1, 50257) if t not in prompt + first)
    weights = tmp_path / "weights"
    weights.mkdir()
    tensors = load_file(str(tiny_dir / "model.safetensors"))
    tensors["wte.weight"][twin] = tensors["wte.weight"][first[0]]
    save_file(tensors, str(weights / "model.safetensors"))
    shutil.copy(tiny_dir / "config.json", weights / "config.json")
    stages = tmp_path / "stages"
    stages.mkdir()
    (stages / "g.toml").write_text(
        GREEDY.source.read_text()
        .split("[[case]]")[0]
        .replace('id = "greedy"', 'id = "tie-greedy"')
        .replace("../course/lessons/", str(COURSE / "lessons") + "/")
        + f'[[case]]\nname = "tie"\nprompt = {prompt}\nn_new = {n_new}\n'
    )
    write_adapters(tmp_path / "course", f"def run_greedy(prompt_ids, n_new):\n    return {[twin] + first[1:]}\n")
    args = [
        "test",
        "--course",
        tmp_path / "course",
        "--weights",
        weights,
        "--stages-dir",
        stages,
        "--stage",
        "tie-greedy",
    ]
    result = cli(*args, "--format", "json")
    assert result.exit_code == 0
    [step, *_] = json.loads(result.stdout)["stages"][0]["cases"][0]["steps"]
    assert (step["verdict"], step["gap"], step["expected"]) == ("near-tie", 0.0, first[0])
    assert "step 1: near-tie accepted (gap 0 ≤" in cli(*args).stdout  # the first token
