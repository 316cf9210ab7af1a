"""grading/judge/evidence.py: what the passing cases and the other stages say, added to a failing diagnosis."""

from theinference.grading.judge.evidence import add_run_evidence, other_stages, passing_pattern, stage_evidence
from theinference.grading.judge.results import Diagnosis, Status

from .builders import TOKENS, case, failing_case, replace, row, run, stage

GROWS = Diagnosis("error-grows", "the error grows", "hint")


def _case(name, status, prompt_len, **fields):
    fields.setdefault("diagnosis", GROWS if status == Status.FAIL else None)
    return case(name, status, inputs={"prompt": list(range(prompt_len)), "cont": [1, 2]}, **fields)


def test_only_the_one_token_prompt_passes():
    s = stage("per-step-identity", Status.FAIL, [_case("one", Status.PASS, 1), _case("two", Status.FAIL, 2)])
    assert passing_pattern(s, n_layer=2).startswith("only the one-token prompt passes (one): what ignores")


def test_only_the_one_token_sequence_passes():
    cases = [case("one", Status.PASS, inputs={"seq": [5]}), failing_case("many", inputs={"seq": [5, 6, 7]})]
    assert passing_pattern(stage("forward", Status.FAIL, cases), 2).startswith("only the one-token sequence passes")


def test_only_the_case_at_one_position_passes_and_n_layer_is_suspected():
    def one_row(name, status, position):
        r = replace(row(0, 0.0 if status == Status.PASS else 1.0), position=position)
        return case(name, status, rows=[r], inputs={"prompt": [1, 2, 3], "next_id": 4})

    cases = [one_row("at-2", Status.PASS, 2), one_row("at-5", Status.FAIL, 5), one_row("at-9", Status.FAIL, 9)]
    text = passing_pattern(stage("decode-step", Status.FAIL, cases), n_layer=2)
    assert text.startswith("only the case at position 2 passes (at-2): a position fixed at 2")
    assert "(2 is also n_layer" in text
    assert "n_layer" not in passing_pattern(stage("decode-step", Status.FAIL, cases), n_layer=12)


def test_nothing_is_said_when_all_fail_or_nothing_separates_them():
    assert passing_pattern(stage("x", Status.FAIL, [_case("a", Status.FAIL, 1), _case("b", Status.FAIL, 2)]), 2) == ""
    mixed = [_case("a", Status.PASS, 1), _case("b", Status.FAIL, 1), _case("c", Status.FAIL, 3)]
    assert passing_pattern(stage("x", Status.FAIL, mixed), 2) == ""
    errors_only = [_case("a", Status.PASS, 1), _case("b", Status.ERROR, 3, diagnosis=None)]
    assert passing_pattern(stage("x", Status.ERROR, errors_only), 2) == ""  # an error is no graded answer


def test_forward_passing_points_at_the_cached_path():
    failing = stage("per-step-identity", Status.FAIL, [_case("a", Status.FAIL, 2)])
    this_run = run([stage("forward"), failing])
    assert other_stages(failing, "per-step-logits", this_run, {}, "tiny").startswith(
        "forward passes on these weights (in this run), so the difference is in code only the cached path runs"
    )
    recorded = {"forward": {"status": "pass", "weights": "tiny"}}
    alone = run([failing])
    assert "(in this course's recorded progress)" in other_stages(failing, "per-step-logits", alone, recorded, "tiny")
    assert other_stages(failing, "per-step-logits", alone, recorded, "gpt2") == ""  # other weights: no evidence
    assert other_stages(failing, "logits", this_run, {}, "tiny") == ""  # not a cached oracle


def test_this_runs_failure_outweighs_a_recorded_pass():
    failing = stage("per-step-identity", Status.FAIL, [_case("a", Status.FAIL, 2)])
    forward_failed = run([stage("forward", Status.FAIL, [failing_case()]), failing])
    recorded = {"forward": {"status": "pass", "weights": "tiny"}}
    assert other_stages(failing, "per-step-logits", forward_failed, recorded, "tiny") == ""


def test_per_step_identity_passing_points_greedy_at_the_loop():
    greedy = stage("greedy", Status.FAIL, [failing_case()], check=TOKENS)
    text = other_stages(greedy, "greedy", run([stage("per-step-identity"), greedy]), {}, "tiny")
    assert text.startswith("per-step-identity passes on these weights (in this run), so every logit is right")


def test_the_evidence_is_added_to_every_failing_diagnosis_and_nothing_else():
    found = Diagnosis("error-grows", "grows", "hint", bugs=("wpe",), evidence="equals GPT-2 with it")
    cases = [
        _case("one", Status.PASS, 1),
        _case("two", Status.FAIL, 2, diagnosis=found),
        _case("three", Status.FAIL, 3),
    ]
    failing = stage("per-step-identity", Status.FAIL, cases)
    result = add_run_evidence(run([stage("forward"), failing]), {"per-step-identity": "per-step-logits"}, 2, {}, "t")
    forward, graded = result.stages
    assert forward == stage("forward")
    assert graded.cases[0] == cases[0]
    two, three = graded.cases[1].diagnosis.evidence, graded.cases[2].diagnosis.evidence
    assert two.startswith("equals GPT-2 with it; from the run: only the one-token prompt passes")
    assert three.startswith("from the run: only the one-token prompt passes")
    assert "; forward passes on these weights (in this run)" in three
    assert failing.cases[1].diagnosis.evidence == "equals GPT-2 with it"  # the original is unchanged


def test_a_stage_with_nothing_to_add_is_returned_as_it_was():
    failing = stage("per-step-identity", Status.FAIL, [_case("a", Status.FAIL, 2)])
    assert stage_evidence(failing, "per-step-logits", run([failing]), 2, {}, "tiny") is failing
    passed = stage()
    assert stage_evidence(passed, "per-step-logits", run([stage("forward"), passed]), 2, {}, "tiny") is passed


def test_a_stage_read_across_its_cases_gets_the_evidence_in_its_headline():
    across = Diagnosis("first-decode-row-off", "across", "")
    failing = stage("decode-step", Status.FAIL, [_case("a", Status.FAIL, 2)], cross_case=across)
    result = stage_evidence(failing, "decode-step-logits", run([stage("forward"), failing]), 2, {}, "tiny")
    assert result.diagnosis.evidence.startswith("from the run: forward passes on these weights")
