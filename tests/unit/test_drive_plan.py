"""grading/drive/plan.py: the settings a command's plan resolves without a course (tests/test_plan.py grades
through plans; here: --finish-by, the run's deadline, --require-isolation, the options a plan hands on)."""

import datetime
import time

import pytest

from theinference.errors import UsageError
from theinference.grading.drive.plan import (
    ISOLATION_LEVELS,
    CourseNeed,
    IsolationTooWeak,
    RunOptions,
    check_isolation,
    plan_run,
)
from theinference.proc.sandbox import Isolation


def _plan(**settings):
    return plan_run(need=CourseNeed.NONE, **settings)


def test_finish_by_takes_unix_seconds_or_an_iso_time_with_its_zone():
    assert _plan(finish_by="1796000000").options.finish_by == 1796000000.0
    moment = datetime.datetime(2026, 12, 1, 23, 59, tzinfo=datetime.timezone.utc)
    assert _plan(finish_by="2026-12-01T23:59:00Z").options.finish_by == moment.timestamp()
    assert _plan(finish_by="2026-12-02T00:59:00+01:00").options.finish_by == moment.timestamp()
    assert _plan().options.finish_by is None


@pytest.mark.parametrize("text", ["2026-12-01T23:59:00", "tomorrow", "2026-13-01T00:00:00Z", ""])
def test_finish_by_refuses_a_time_without_a_zone_or_no_time(text):
    with pytest.raises(UsageError, match="--finish-by takes Unix seconds .* or an ISO 8601 time with its zone"):
        _plan(finish_by=text)


def test_finish_by_refuses_nan():
    with pytest.raises(UsageError, match="--finish-by"):
        _plan(finish_by="nan")


def test_seed_words_are_resolved_once():
    assert _plan(seed="7").options.seed == 7
    assert isinstance(_plan(seed="random").options.seed, int)
    assert _plan().options.seed is None


def test_settings_reach_the_options_unchanged():
    options = _plan(timeout=4.5, memory_limit_mb=512, all_cases=True, diagnosis=False, first_exact=False).options
    assert (options.timeout, options.limits.memory_mb) == (4.5, 512)
    assert (options.all_cases, options.diagnosis, options.first_exact) == (True, False, False)
    assert _plan(memory_limit_mb=0).options.limits.memory_mb is None  # 0: no cap
    assert _plan(submission_timeout=0).options.submission_timeout is None


def test_no_deadline_without_a_budget_or_an_end():
    assert RunOptions().deadline() == (None, None)


def test_the_deadline_is_the_nearer_of_the_budget_and_finish_by():
    before = time.monotonic()
    end, budget = RunOptions(submission_timeout=60).deadline()
    assert budget == 60.0 and before + 60 <= end <= time.monotonic() + 60
    _, budget = RunOptions(submission_timeout=60, finish_by=time.time() + 10).deadline()
    assert 9.0 <= budget <= 10.0
    _, budget = RunOptions(submission_timeout=5, finish_by=time.time() + 1000).deadline()
    assert budget == 5.0


def test_a_finish_by_already_past_leaves_no_time():
    end, budget = RunOptions(finish_by=time.time() - 30).deadline()
    assert budget == 0.0 and end < time.monotonic()


def _isolation(level: str) -> Isolation:
    return Isolation(level, f"{level} confinement")


@pytest.mark.parametrize("level", ISOLATION_LEVELS)
def test_a_level_as_strong_as_required_or_stronger_passes(level):
    check_isolation(_isolation("sandbox"), level)
    check_isolation(_isolation(level), level)


def test_a_weaker_level_than_required_is_refused_saying_what_to_do():
    with pytest.raises(IsolationTooWeak) as refused:
        check_isolation(_isolation("subreaper"), "sandbox")
    message = str(refused.value)
    assert message.startswith("--require-isolation sandbox: student code would run at the weaker subreaper level")
    assert "nothing was graded" in message and "apt-get install bubblewrap" in message
    with pytest.raises(IsolationTooWeak, match="grade where the unprivileged level is available"):
        check_isolation(_isolation("process-group"), "unprivileged")


def test_trust_is_decided_by_the_plan(monkeypatch):
    assert _plan().trusted and not _plan(untrusted=True).trusted and not _plan(gradescope=True).trusted
    monkeypatch.setenv("CI", "true")
    assert _plan().trusted  # a command that reads no course (`stages check`) stays the instructor's
    assert not plan_run(need=CourseNeed.OPTIONAL).trusted
