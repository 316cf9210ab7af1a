"""A greedy stage's listed built-in bugs: a right loop over GPT-2 with that bug, matched like a loop mistake.

Each loop is written out here by full recompute (model/defective.py's logits over the prompt as the prefill block
and every generated token as one decode step), independently of loops.py's one teacher-forced pass.
"""

import numpy as np
import pytest

from theinference.grading.judge import loops
from theinference.grading.oracle.bugs import BUILTIN_BUGS
from theinference.grading.spec.stages import StageError, load_stage
from theinference.model import defective
from theinference.model.defective import Defects

PROMPT, N_NEW, TIE = [464, 2068, 7586], 4, 1e-4
LISTED = ["missing-scale", "mask-on-decode", "no-self-attention", "position-zero"]


def run_buggy_loop(model, defects: Defects) -> list[int]:
    tokens: list[int] = []
    for _ in range(N_NEW):
        ids = PROMPT + tokens
        step = Defects(**{**defects.__dict__, "prefill": len(PROMPT)})
        row = defective.logits(model.params, ids, model.config.n_head, step, rows=slice(len(ids) - 1, len(ids)))[0]
        tokens.append(int(np.argmax(row)))
    return tokens


@pytest.mark.parametrize("name", LISTED)
def test_a_loop_over_gpt2_with_a_listed_bug_is_named_as_that_bug(tiny_model, name):
    tokens = run_buggy_loop(tiny_model, BUILTIN_BUGS[name].defects)
    assert tokens != run_buggy_loop(tiny_model, Defects())  # the bug shows in these tokens
    listed = loops.listed_loop_bugs(LISTED)
    assert [b.name for b in listed] == LISTED
    matched = [b.name for b in listed if loops.reproduces(b, tiny_model, PROMPT, N_NEW, tokens, TIE) is not None]
    assert name in matched
    if name != "position-zero":  # (a decode step at wpe[0] is also the loop mistake "feeds token i at position 0")
        mistakes = loops.loop_bugs(tiny_model)
        assert not [b.name for b in mistakes if loops.reproduces(b, tiny_model, PROMPT, N_NEW, tokens, TIE) is not None]


def test_a_right_loop_matches_no_listed_bug(tiny_model):
    tokens = run_buggy_loop(tiny_model, Defects())
    for bug in loops.listed_loop_bugs(LISTED):
        assert loops.reproduces(bug, tiny_model, PROMPT, N_NEW, tokens, TIE) is None, bug.name


def test_only_the_model_bugs_are_a_loops(tiny_model):
    names = [b.name for b in loops.listed_loop_bugs(["cache-not-cleared", "shared-cache", "missing-scale", "x.py:f"])]
    assert names == ["missing-scale"]


GREEDY = """\
format_version = 1
id = "greedy-check"
title = "A greedy stage"
order = 90
lesson = "lesson.md"
adapter = "run_greedy"
oracle = "greedy"
compare = "COMPARE"
timeout = 10
points = 5
bugs = ["BUG"]
SCALING
[tie]
rtol = 1e-4

[[case]]
name = "a"
prompt = [1, 2]
n_new = 3
"""
SCALING = """
[scaling]
lengths = [4, 8]
repeats = 1
prompt_tokens = 4
max_ratio = 3.0
max_fraction = 0.3
weights = "proof"
"""


def _stage(tmp_path, compare: str, bug: str):
    text = GREEDY.replace("COMPARE", compare).replace("BUG", bug)
    path = tmp_path / "stage.toml"
    path.write_text(
        text.replace("SCALING\n", SCALING if compare == "scaling" else "").replace(
            "n_new = 3\n", "" if compare == "scaling" else "n_new = 3\n"
        )
    )
    return path


def test_a_tokens_stage_lists_built_in_bugs_of_the_model(tmp_path):
    assert load_stage(_stage(tmp_path, "tokens", "missing-scale")).bugs == ("missing-scale",)


def test_a_tokens_stage_is_refused_a_bug_no_loop_computes_and_told_which_can(tmp_path):
    with pytest.raises(
        StageError, match=r"cannot be computed for oracle 'greedy'; built-in bugs that can: missing-scale"
    ):
        load_stage(_stage(tmp_path, "tokens", "cache-not-cleared"))


def test_a_scaling_stage_is_refused_built_in_bugs(tmp_path):
    with pytest.raises(StageError, match=r'a "scaling" stage is judged on cost'):
        load_stage(_stage(tmp_path, "scaling", "missing-scale"))
