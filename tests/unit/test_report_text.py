"""report/text.py: the short plain-text summaries the CI renderers (GitHub, JUnit, Gradescope) share."""

from theinference.grading.judge.results import Diagnosis, Guarantee, Status
from theinference.report.text import (
    REPEATS_NAMED,
    both_figures,
    case_summary,
    cross_case_summary,
    group_cases,
    grouped_summary,
    guarantee_text,
    repeated_note,
    run_summary,
    scaling_summary,
    stage_summary,
    timed_calls,
)

from .builders import HOSTILE, case, check_snapshot, error_case, failing_case, mixed_run, run, scaling, stage


def test_stage_summaries_snapshot():
    text = "\n\n----\n\n".join(stage_summary(s) for s in mixed_run().stages) + "\n"
    check_snapshot("text_stage_summaries.txt", text)


def test_run_summary_counts_stages_and_points():
    assert run_summary(mixed_run()) == "2 of 5 stages passed, 20/50 points"
    half = run([stage(points=2.5, max_points=5)])
    assert run_summary(half) == "1 of 1 stages passed, 2.5/5 points"


def test_stage_summary_head_line():
    head = stage_summary(mixed_run().stages[1]).splitlines()[0]
    assert head == "per-step-identity: fail · 1/2 cases · 0/10 points"


def test_a_passing_stage_shows_no_case_but_a_timed_one():
    assert stage_summary(stage()) == "prove-one-layer: pass · 1/1 cases · 10/10 points"
    cost = stage_summary(mixed_run().stages[4])
    assert "cost: pass" in cost and "CPU time per token, counted by the grader (cgroup)" in cost


def test_case_summary_gives_status_message_location_shape_hint_and_traceback():
    text = case_summary(error_case(diagnosis=Diagnosis("no-pattern", "no shape", "Look at the mask.")))
    assert text.splitlines()[:4] == [
        "broken: error — ValueError: bad shape",
        "at tests/adapters.py:3",
        "shape: no-pattern — no shape",
        "hint: Look at the mask.",
    ]
    assert text.endswith("ValueError: bad shape")  # the traceback, last


def test_case_summary_escapes_the_students_text():
    text = case_summary(error_case(message=HOSTILE, traceback=HOSTILE, at=("a\x1b[31m.py", 1)))
    assert "\x1b" not in text and "\r" not in text and "\u202e" not in text
    assert text.count("\\x1b[2J") == 2 and "a\\x1b[31m.py:1" in text


def test_a_finding_names_the_bug_and_its_evidence():
    found = Diagnosis("no-pattern", "no shape", "", bugs=("wpe-off-by-one",), evidence="equals GPT-2 with it to 3e-7")
    assert "finding: wpe-off-by-one: equals GPT-2 with it to 3e-7" in case_summary(failing_case(diagnosis=found))
    ruled_out = Diagnosis("no-pattern", "no shape", "", evidence="none of the 12 known bugs")
    assert "known bugs: none of the 12 known bugs" in case_summary(failing_case(diagnosis=ruled_out))


def test_identical_outcomes_are_grouped_and_counted():
    cases = [error_case(f"c{i}") for i in range(REPEATS_NAMED + 2)] + [failing_case("other")]
    groups = group_cases(cases)
    assert [len(g) for g in groups] == [REPEATS_NAMED + 2, 1]
    note = repeated_note(groups[0])
    assert note == "same error in 6 more cases (c1, c2, c3, c4, c5, …)"
    assert repeated_note(groups[1]) == ""
    summaries = grouped_summary(cases)
    assert len(summaries) == 2 and summaries[0].endswith(note)


def test_repeated_note_says_failure_or_error_and_singular():
    assert repeated_note([failing_case("a"), failing_case("b")]) == "same failure in 1 more case (b)"
    assert repeated_note([error_case("a"), error_case("b")]) == "same error in 1 more case (b)"


def test_cases_differing_in_message_are_not_grouped():
    assert len(group_cases([error_case("a", "ValueError: x"), error_case("b", "ValueError: y")])) == 2


def test_cross_case_summary_only_for_a_failing_stage_read_across_cases():
    across = Diagnosis("first-decode-row-off", "only the first decode row is off", "Append k and v first.")
    failing = stage("single-step", Status.FAIL, [failing_case()], cross_case=across)
    assert cross_case_summary(failing).splitlines() == [
        "single-step, read across its cases:",
        "shape: first-decode-row-off — only the first decode row is off",
        "hint: Append k and v first.",
    ]
    assert cross_case_summary(stage(cross_case=across)) == ""  # passed
    assert cross_case_summary(stage("x", Status.FAIL, [failing_case()])) == ""  # not read across


def test_scaling_summary_of_a_cached_run():
    text = scaling_summary(case(scaling=scaling()))
    assert "8 tokens 10 ms/token, 480 tokens 10 ms/token" in text
    assert "(a) ratio 1.00 (at most 2)" in text and "(b) 20% of the oracle's full recompute (at most 35%)" in text


def test_scaling_summary_of_a_stopped_call_is_a_lower_bound():
    stopped = scaling(seconds=(0.08, 30.0), stopped_at=480)
    text = scaling_summary(case(scaling=stopped))
    assert "480 tokens > 62.5 ms/token (stopped)" in text
    assert "(a lower bound: that call was stopped)" in text
    assert "(a) ratio at least 6.25" in text


def test_scaling_summary_when_the_longest_call_never_ran():
    text = scaling_summary(case(scaling=scaling(seconds=(None, None))))
    assert "no call finished" in text and "not judged: the case ended before its 480-token call" in text


def test_scaling_summary_says_what_an_incomplete_meter_proves():
    self_check = scaling_summary(case(scaling=scaling(guarantee=Guarantee.SELF_CHECK, accounting="process tree")))
    assert "a self-check, not a grade of record" in self_check
    assert "the process tree does not count a process that ends without being waited for" in self_check
    assert guarantee_text(Guarantee.UNPROVABLE, "process tree").startswith("not provable in grading mode")
    assert guarantee_text(Guarantee.RECORD, "cgroup") == ""


def test_scaling_summary_carries_the_weights_note():
    text = scaling_summary(case(scaling=scaling(weights_note="on the proof preset: the graded weights are tiny")))
    assert "(cgroup) (on the proof preset: the graded weights are tiny):" in text


def test_both_figures_as_the_terminal_states_them():
    assert both_figures(scaling()) == (
        "(a) per-token cost ×1.00 from 8 to 480 tokens (at most ×2 passes) · "
        "(b) 480 tokens cost 20% of the oracle's full recompute here (at most 35% passes)"
    )
    assert both_figures(scaling(seconds=(0.08, None))) == ""


def test_timed_calls_mentions_diagnostic_ones_only_when_there_are_some():
    assert timed_calls(6, 0) == "6 timed calls"
    assert timed_calls(8, 2) == "6 timed calls (and 2 diagnostic ones, which tell no-cache from too-slow)"
