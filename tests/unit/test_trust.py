"""trust.py: what a submission may decide (nothing, when untrusted) and what its processes may see."""

import os

import pytest

from theinference import WEIGHTS_ENV
from theinference.bundled import data_dir
from theinference.course import Course, CourseError
from theinference.trust import allowed_env, stage_origin, untrusted_course


def test_only_allow_listed_variables_reach_a_student_process():
    environ = {
        "PATH": "/usr/bin",
        "HOME": "/home/s",
        "LC_ALL": "C.UTF-8",
        "LC_CTYPE": "C",
        WEIGHTS_ENV: "/w/model.safetensors",
        "OMP_NUM_THREADS": "1",
        "GITHUB_TOKEN": "ghp_secret",
        "AWS_SECRET_ACCESS_KEY": "x",
        "ACTIONS_RUNTIME_TOKEN": "y",
        "THEINFERENCE_ALLOW_ROOT": "1",
        "LC_": "not a locale variable",
        "lc_all": "lower case",
        "XLC_ALL": "prefixed",
    }
    assert allowed_env(environ) == {
        "PATH": "/usr/bin",
        "HOME": "/home/s",
        "LC_ALL": "C.UTF-8",
        "LC_CTYPE": "C",
        WEIGHTS_ENV: "/w/model.safetensors",
        "OMP_NUM_THREADS": "1",
    }


def _course(root, **fields) -> Course:
    (root / "tests").mkdir(parents=True, exist_ok=True)
    adapters = root / "tests" / "adapters.py"
    adapters.touch()
    return Course(root=root, adapters=fields.pop("adapters", adapters), **fields)


def test_untrusted_reading_drops_the_courses_choices_with_a_notice_each(tmp_path):
    course = _course(
        tmp_path / "c",
        weights=tmp_path / "mine.safetensors",
        weights_setting="mine.safetensors",
        stages_dirs=(tmp_path / "extra",),
        timeout=999.0,
    )
    (course.root / "stages").mkdir()
    (course.root / "stages" / "easy.toml").write_text("")
    read, notices = untrusted_course(course)
    assert (read.weights, read.weights_setting, read.stages_dirs, read.timeout) == (None, None, (), None)
    assert read.adapters == (course.root / "tests" / "adapters.py").resolve()
    assert [n.split(":")[0] for n in notices] == [
        "ignored the submission's theinference.toml `weights`",
        "ignored the submission's theinference.toml `stages_dirs`",
        "ignored the submission's theinference.toml `timeout`",
        "ignored the submission's stages/ directory",
    ]


def test_a_course_that_chose_nothing_gets_no_notice(tmp_path):
    course = _course(tmp_path / "c")
    (course.root / "stages").mkdir()  # a stages/ with no stage file in it is nothing ignored
    assert untrusted_course(course)[1] == []


def test_adapters_outside_the_submission_are_refused(tmp_path):
    outside = tmp_path / "grader-secrets.py"
    outside.write_text("")
    with pytest.raises(CourseError, match="the adapters file must be inside the submission"):
        untrusted_course(_course(tmp_path / "c", adapters=outside))


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")
def test_adapters_linked_out_of_the_submission_are_refused(tmp_path):
    outside = tmp_path / "elsewhere.py"
    outside.write_text("")
    course = _course(tmp_path / "c")
    course.adapters.unlink()
    course.adapters.symlink_to(outside)
    with pytest.raises(CourseError, match="must be inside the submission"):
        untrusted_course(course)


def test_where_a_stage_file_comes_from(tmp_path):
    extra = tmp_path / "instructor"
    extra.mkdir()
    assert stage_origin((data_dir("stages") / "forward.toml").resolve(), [extra]) == "built-in"
    assert stage_origin((extra / "bonus.toml").resolve(), [extra]) == "--stages-dir"
    assert stage_origin((tmp_path / "course" / "stages" / "bonus.toml").resolve(), [extra]) == "course"
