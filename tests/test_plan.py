"""The run's plan (grading/drive/plan.py): every setting resolved once, by one function, and only read after."""

import ast
import dataclasses
import shutil
from pathlib import Path

import pytest

import theinference
from theinference.bundled import data_dir
from theinference.course import CourseError, load_course
from theinference.errors import UsageError
from theinference.grading.drive.plan import CourseNeed, RunOptions, plan_run, timeouts
from theinference.grading.judge.grade import GradeContext, student_job
from theinference.grading.oracle.registry import resolve_oracle
from theinference.grading.spec.timeouts import Timeouts
from theinference.model.weights import load_model
from theinference.proc.limits import Limits

PACKAGE = Path(theinference.__file__).parent


def _course(tmp_path: Path, toml: str = "") -> Path:
    """A copy of the starter with a stage of its own in stages/ and these theinference.toml lines added."""
    course = tmp_path / "course"
    shutil.copytree(data_dir("course") / "starter", course)
    (course / "stages").mkdir()
    text = (data_dir("stages") / "forward.toml").read_text()
    text = text.replace('id = "forward"', 'id = "own-stage"').replace('aliases = ["runForward"]', "aliases = []")
    (course / "stages" / "own-stage.toml").write_text(text.replace("order = 10", "order = 98"))
    config = course / "theinference.toml"
    config.write_text(config.read_text() + toml)
    return course


def test_a_trusted_plan_reads_the_courses_stages_and_timeout_and_an_untrusted_one_neither(tmp_path):
    course = _course(tmp_path, "\ntimeout = 7\n")
    trusted = plan_run(course)
    assert trusted.trusted and trusted.notices == ()
    assert "own-stage" in [s.id for s in trusted.stages()]
    assert trusted.timeouts == Timeouts(command_line=None, course=7)
    untrusted = plan_run(course, untrusted=True)
    assert untrusted.untrusted and untrusted.course is not None and untrusted.course.timeout is None
    assert "own-stage" not in [s.id for s in untrusted.stages()]
    assert untrusted.timeouts == Timeouts(command_line=None, course=None)
    assert any("`timeout`" in n for n in untrusted.notices) and any("stages/" in n for n in untrusted.notices)
    assert untrusted.oracle_cache().store is None and trusted.oracle_cache().store is not None


def test_ci_and_gradescope_output_make_a_course_run_untrusted_but_not_the_instructors_stages_check(
    tmp_path, monkeypatch
):
    course = _course(tmp_path)
    assert plan_run(course, gradescope=True).untrusted
    monkeypatch.setenv("CI", "true")
    assert plan_run(course).untrusted
    assert plan_run(course, need=CourseNeed.OPTIONAL).untrusted  # `stages list` lists what `test` would grade
    assert plan_run(need=CourseNeed.NONE).trusted  # `stages check`: the instructor's own subjects
    assert plan_run(need=CourseNeed.NONE, untrusted=True).untrusted  # `grade`


def test_the_timeout_rule_is_the_command_line_then_the_course_then_the_stage(tmp_path):
    stage = next(s for s in plan_run(need=CourseNeed.NONE).stages() if s.id == "forward")
    assert Timeouts().for_stage(stage) == stage.timeout
    assert Timeouts(course=7).for_stage(stage) == 7 and Timeouts(course=7).chosen_by_course
    assert Timeouts(command_line=3, course=7).for_stage(stage) == 3
    assert not Timeouts(command_line=3, course=7).chosen_by_course
    assert plan_run(_course(tmp_path, "\ntimeout = 7\n"), timeout=3).timeouts.for_stage(stage) == 3


def test_a_plan_cannot_be_changed_and_its_limits_hold_no_timeout_or_trust(tmp_path):
    plan = plan_run(_course(tmp_path), timeout=3, memory_limit_mb=512, seed="11")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.trusted = False  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.options.timeout = 9  # type: ignore[misc]
    assert plan.options == RunOptions(
        limits=Limits(memory_mb=512), timeout=3, seed=11, first_exact=True
    )  # the setting is in one place: Limits has no timeout and no trust field to disagree with it
    assert {f.name for f in dataclasses.fields(Limits)} == {"memory_mb", "env", "run_dir_mb"}


def test_plan_run_says_what_is_wrong_with_a_setting(tmp_path, monkeypatch):
    with pytest.raises(UsageError, match="--seed takes an integer or 'random', not 'soon'"):
        plan_run(need=CourseNeed.NONE, seed="soon")
    monkeypatch.chdir(tmp_path)  # no course here or above
    with pytest.raises(CourseError, match="no course directory here"):
        plan_run()
    assert plan_run(need=CourseNeed.OPTIONAL).course is None  # `stages list` outside a course


def test_a_batch_reads_each_submission_as_its_plan_reads_courses(tmp_path):
    plan = plan_run(need=CourseNeed.NONE, untrusted=True, timeout=4)
    submission = plan.for_course(load_course(_course(tmp_path, "\ntimeout = 99\n")))
    assert submission.course is not None and submission.course.timeout is None and submission.course.weights is None
    assert len(submission.notices) == 3  # the starter's weights = "tiny", timeout, stages/
    assert submission.timeouts.for_stage(plan.stages()[0]) == 4
    assert submission.stage_dirs == plan.stage_dirs  # its stages stay the plan's


def test_a_reloaded_plan_sees_a_stage_dir_added_to_the_courses_toml(tmp_path):
    course = _course(tmp_path)
    plan = plan_run(course)
    extra = course / "extra"
    shutil.copytree(course / "stages", extra)
    (extra / "own-stage.toml").rename(extra / "probe.toml")
    text = (extra / "probe.toml").read_text().replace('id = "own-stage"', 'id = "probe"')
    (extra / "probe.toml").write_text(text.replace("order = 98", "order = 99"))
    (course / "theinference.toml").write_text(
        (course / "theinference.toml").read_text() + '\nstages_dirs = ["extra"]\n'
    )
    assert "probe" not in [s.id for s in plan.stages()]
    assert "probe" in [s.id for s in plan.reloaded().stages()]


def test_the_student_job_takes_its_timeout_and_environment_from_the_plan(tmp_path, tiny_path):
    course = _course(tmp_path, "\ntimeout = 7\n")
    model = load_model(tiny_path)
    stage = next(s for s in plan_run(course).stages() if s.id == "forward")
    for plan, seconds in ((plan_run(course), 7), (plan_run(course, untrusted=True), stage.timeout)):
        assert plan.course is not None
        ctx = GradeContext(
            course=plan.course,
            model=model,
            limits=plan.options.limits,
            timeouts=timeouts(plan.course, plan.options),
            untrusted=plan.untrusted,
        )
        job = student_job(stage, ctx, resolve_oracle(stage.oracle, stage.source))
        assert job.timeout == seconds and job.untrusted is plan.untrusted and job.limits is plan.options.limits


def test_stages_show_tells_the_timeout_test_would_use(cli, tmp_path):
    course = _course(tmp_path, "\ntimeout = 7\n")
    shown = cli("stages", "show", "forward", "--course", course)
    assert shown.exit_code == 0, shown.output
    assert "timeout 7 s (the course's theinference.toml)" in shown.stdout


# The settings resolved by the plan, and the only modules that may call what resolves them.
RESOLVERS = {
    "stage_dirs": {"grading/drive/plan.py"},
    "untrusted_course": {"grading/drive/plan.py"},
    "obtain_weights": {"grading/drive/plan.py"},
    "default_launcher": {"grading/drive/plan.py", "grading/drive/grader.py"},  # the grader's default field
    "resolve_seed": {"grading/drive/plan.py"},
    "untrusted_run": {"grading/drive/plan.py", "cli/early.py"},  # early: whether a usage error follows
    "AdapterJob": {"grading/judge/grade.py"},  # student_job, the one constructor
    "Limits": {"grading/drive/plan.py", "proc/limits.py"},
}


def _calls(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else "")
        elif isinstance(node, ast.Attribute) and node.attr == "default_launcher":
            names.add("default_launcher")  # field(default_factory=default_launcher)
        elif isinstance(node, ast.Name) and node.id == "default_launcher" and isinstance(node.ctx, ast.Load):
            names.add("default_launcher")
    return names


@pytest.mark.slow
def test_every_setting_is_resolved_in_one_place():
    found: dict[str, set[str]] = {name: set() for name in RESOLVERS}
    for path in PACKAGE.rglob("*.py"):
        module = path.relative_to(PACKAGE).as_posix()
        for name in _calls(ast.parse(path.read_text(encoding="utf-8"))) & set(RESOLVERS):
            found[name].add(module)
    wrong = {name: sorted(where - RESOLVERS[name]) for name, where in found.items() if where - RESOLVERS[name]}
    assert wrong == {}, f"resolved outside the plan: {wrong}"
    assert all(found[name] for name in RESOLVERS)  # each is still called somewhere: the table is not stale
