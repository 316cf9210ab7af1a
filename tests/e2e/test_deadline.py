"""A run's absolute deadline (`grade --finish-by`) and the confinement it demands (`--require-isolation`)."""

import csv
import dataclasses
import datetime
import json
import shutil
import textwrap
import time

import pytest

from conftest import scaled, write_adapters
from theinference.bundled import data_dir
from test_fingerprint import mutant_course
from theinference.cli.options import IsolationLevel
from theinference.errors import UsageError
from theinference.grading.drive.grader import Grader
from theinference.grading.drive.plan import (
    ISOLATION_LEVELS,
    CourseNeed,
    IsolationTooWeak,
    RunOptions,
    check_isolation,
    plan_run,
)
from theinference.grading.drive.session import select_stages
from theinference.proc.sandbox import Isolation


def test_the_nearer_of_the_budget_and_the_absolute_deadline_ends_the_run():
    soon = RunOptions(submission_timeout=600, finish_by=time.time() + 100)
    assert 99 <= soon.deadline()[1] <= 100  # the grader started late: the absolute deadline is the nearer
    assert RunOptions(submission_timeout=50, finish_by=time.time() + 100).deadline()[1] == 50
    assert RunOptions(finish_by=time.time() - 5).deadline()[1] == 0  # already past: nothing more runs
    assert RunOptions().deadline() == (None, None)


@pytest.mark.parametrize(
    "text, when",
    [("1764633540", 1764633540.0), ("2026-12-01T23:59:00Z", 1796169540.0), ("2026-12-02T00:59:00+01:00", 1796169540.0)],
)
def test_finish_by_takes_unix_seconds_or_an_iso_time_with_its_zone(text, when):
    assert plan_run(need=CourseNeed.NONE, finish_by=text).options.finish_by == when


@pytest.mark.parametrize("text", ["soon", "2026-12-01T23:59:00"])
def test_finish_by_refuses_a_time_it_cannot_place(text):
    with pytest.raises(UsageError, match="--finish-by takes Unix seconds"):
        plan_run(need=CourseNeed.NONE, finish_by=text)


def test_grade_refuses_a_bad_finish_by_before_grading(cli, tmp_path, tiny_path):
    result = cli("grade", tmp_path / "a", "--weights", tiny_path, "--finish-by", "tonight", "--out", tmp_path / "g.csv")
    assert result.exit_code == 2 and "--finish-by takes Unix seconds" in result.stderr
    assert not (tmp_path / "g.csv").exists()


def _grader(plan) -> Grader:
    choice, model, _ = plan.load_weights()
    return Grader(weights=choice, model=model, launcher=plan.launcher(), cache=plan.oracle_cache(), plan=plan)


def test_stages_the_deadline_passed_before_they_started_are_not_run(solution_course, tiny_path):
    past = str(datetime.datetime.now(datetime.UTC).timestamp() - 1)
    plan = plan_run(solution_course, weights=str(tiny_path), finish_by=past)
    with _grader(plan) as grader:
        stages = select_stages(plan.stages(), ["prove-one-layer", "cache-scaling"])
        run = grader.grade(plan.course, stages)
    assert [(s.id, s.status, s.points, s.max_points) for s in run.stages] == [
        (s.id, "timeout", 0.0, s.points) for s in stages
    ]
    messages = {c.message for s in run.stages for c in s.cases}
    assert messages == {"not run: the submission's time budget of 0 s ran out before this stage started"}


@pytest.mark.slow
def test_known_bugs_are_matched_only_while_time_is_left(tmp_path, tiny_path):
    _, course = mutant_course("missing-attn-scale", tmp_path)
    plan = plan_run(course, weights=str(tiny_path))
    options = dataclasses.replace(plan.options, fingerprint=False)
    with _grader(plan) as grader:
        stages = select_stages(plan.stages(), ["prove-one-layer"])
        run = grader.grade(plan.course, stages, options)
        late = grader.fingerprint(stages, run, options, until=time.monotonic())
        run = grader.grade(plan.course, stages, options)
        in_time = grader.fingerprint(stages, run, options, until=time.monotonic() + 3600)
    assert late.stages[0].status == in_time.stages[0].status == "fail"  # the verdict never waits for the match
    assert late.stages[0].diagnosis is not None and late.stages[0].diagnosis.bugs == ()
    assert "known bugs not matched for prove-one-layer: the time budget ran out" in late.notices
    assert in_time.stages[0].diagnosis.bugs == ("missing-scale",)  # the mutant, named as the stage names it
    assert not any("not matched" in n for n in in_time.notices)


def test_the_cli_offers_every_isolation_level_strongest_first():
    assert [level.value for level in IsolationLevel] == list(ISOLATION_LEVELS)


@pytest.mark.parametrize(
    "level, required, refused",
    [
        ("sandbox", "sandbox", False),
        ("namespaces", "sandbox", True),
        ("sandbox", "namespaces", False),
        ("subreaper", "unprivileged", True),
        ("process-group", "process-group", False),
    ],
)
def test_a_weaker_level_than_required_is_refused(level, required, refused):
    isolation = Isolation(level, f"the {level} level")
    if refused:
        with pytest.raises(IsolationTooWeak, match=f"weaker {level} level"):
            check_isolation(isolation, required)
    else:
        check_isolation(isolation, required)


def test_test_refuses_to_grade_below_the_required_level(cli, tmp_path, tiny_path):
    course = write_adapters(tmp_path / "course", "def run_layer_equiv(seq_ids):\n    return [[0.0]]\n").parent.parent
    # A student's own `test` runs trusted, in the fast zygote: no sandbox.
    result = cli("test", "--course", course, "--weights", tiny_path, "--require-isolation", "sandbox")
    assert result.exit_code == 2
    words = " ".join(result.stderr.split())
    assert "--require-isolation sandbox: student code would run at the weaker subreaper level" in words
    assert "nothing was graded" in words and "apparmor_restrict_unprivileged_userns" in words


@pytest.mark.slow
def test_submissions_graded_side_by_side_each_get_their_own_findings(cli, tmp_path, tiny_path):
    # grade's submission budget defers every match until the verdicts are in: each submission's arrays stay its own
    # while two are graded at once.
    names = ["missing-attn-scale", "c-proj-transposed"]
    built = {name: mutant_course(name, tmp_path / "subs") for name in names}
    out = tmp_path / "grades.csv"
    args = ["--stage", "prove-one-layer", "--weights", tiny_path, "--jobs", "2", "--out", out]
    assert cli("grade", *(course for _, course in built.values()), *args).exit_code == 0
    rows = {r["id"]: r for r in csv.DictReader(out.open(newline=""))}
    for name, (mutant, _) in built.items():
        stage, _, bugs = rows[name]["finding"].partition(": ")
        assert stage == "prove-one-layer" and set(bugs.split(", ")) <= set(mutant.fingerprint[stage]), rows[name]


def _solution_but(tmp_path, name: str, adapter: str, body: str):
    """A copy of the reference solution whose adapter `adapter` is replaced by one running body."""
    course = tmp_path / name
    shutil.copytree(data_dir("course") / "solution", course)
    adapters = course / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text() + f"\n\ndef {adapter}(*args):\n{textwrap.indent(body, '    ')}\n")
    return course


@pytest.mark.slow
def test_a_stage_that_hangs_leaves_the_later_stages_their_budget(cli, tmp_path, tiny_path):
    # forward loops forever; the later stage is the reference's. The budget is shorter than the loop's own CPU
    # budget (5 s at least), so the submission's clock runs out inside forward: before, prove-one-layer was then
    # "not run" and got 0 points.
    course = _solution_but(tmp_path, "loops", "run_forward", "while True:\n    pass")
    out = tmp_path / "grades.csv"
    budget = scaled(4)
    args = ["--stage", "forward", "--stage", "prove-one-layer", "--submission-timeout", budget]
    result = cli("grade", course, "--weights", tiny_path, *args, "--out", out)
    assert result.exit_code == 0, result.stderr
    [row] = csv.DictReader(out.open(newline=""))
    assert (row["forward.status"], row["forward.points"]) == ("timeout", "0")
    assert (row["prove-one-layer.status"], row["prove-one-layer.points"]) == ("pass", "10"), row
    assert "prove-one-layer" not in row["regrade"]


def test_stages_the_deadline_left_unrun_are_listed_for_regrading(cli, tmp_path, tiny_path, solution_course):
    out, json_out = tmp_path / "grades.csv", tmp_path / "grades.json"
    past = str(time.time() - 1)
    args = ["--stage", "forward", "--stage", "prove-one-layer", "--finish-by", past, "--json", json_out]
    result = cli("grade", solution_course, "--weights", tiny_path, *args, "--out", out)
    assert result.exit_code == 0, result.stderr
    [row] = csv.DictReader(out.open(newline=""))
    assert row["regrade"] == "forward, prove-one-layer" and row["points"] == "0"
    [sub] = json.loads(json_out.read_text())["submissions"]
    assert sub["regrade"] == ["forward", "prove-one-layer"]
    words = " ".join(result.stderr.split())
    assert "1 submission(s) to regrade" in words and f"{solution_course.name} (forward, prove-one-layer)" in words


def test_a_run_within_its_budget_has_nothing_to_regrade(cli, tmp_path, tiny_path, solution_course):
    out = tmp_path / "grades.csv"
    result = cli("grade", solution_course, "--weights", tiny_path, "--stage", "forward", "--out", out)
    [row] = csv.DictReader(out.open(newline=""))
    assert row["forward.status"] == "pass" and row["regrade"] == "" and row["too_slow"] == ""
    assert "to regrade" not in result.stderr
