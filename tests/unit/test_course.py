"""course.py: a course directory read: its theinference.toml checked field by field, its adapters found."""

import pytest

from theinference.course import CONFIG_NAME, CourseError, default_adapters, find_course, load_course


def _course(root, toml: str | None = None, adapters: str = "tests/adapters.py"):
    (root / adapters).parent.mkdir(parents=True, exist_ok=True)
    (root / adapters).write_text("")
    if toml is not None:
        (root / CONFIG_NAME).write_text(toml)
    return root


def test_a_course_without_a_config_uses_the_defaults(tmp_path):
    course = load_course(_course(tmp_path))
    assert course.root == tmp_path.resolve()
    assert course.adapters == tmp_path.resolve() / "tests" / "adapters.py"
    assert (course.weights, course.weights_setting, course.stages_dirs, course.timeout) == (None, None, (), None)


def test_every_setting_is_read_relative_to_the_course(tmp_path):
    toml = 'weights = "w/model.safetensors"\nadapters = "grading/a.py"\nstages_dirs = ["more"]\ntimeout = 12\n'
    course = load_course(_course(tmp_path, toml, adapters="grading/a.py"))
    root = tmp_path.resolve()
    assert course.adapters == root / "grading" / "a.py"
    assert (course.weights, course.weights_setting) == (root / "w" / "model.safetensors", "w/model.safetensors")
    assert (course.stages_dirs, course.timeout) == ((root / "more",), 12)


def test_the_typescript_editions_adapters_are_found(tmp_path):
    _course(tmp_path, adapters="tests/adapters.ts")
    assert default_adapters(tmp_path) == "tests/adapters.ts"
    assert load_course(tmp_path).adapters.name == "adapters.ts"
    assert default_adapters(tmp_path / "nowhere") == "tests/adapters.py"


@pytest.mark.parametrize(
    "toml, message",
    [
        ("weigths = 'x'", "field 'weigths': unknown field (known fields: weights, adapters, stages_dirs, timeout)"),
        ("timeout = '5'", "field 'timeout': wrong type str"),
        ("timeout = true", "field 'timeout': wrong type bool"),
        ("timeout = 0", "field 'timeout': must be > 0 seconds"),
        ("timeout = -1.5", "field 'timeout': must be > 0 seconds"),
        ("stages_dirs = 'more'", "field 'stages_dirs': wrong type str"),
        ("stages_dirs = [1]", "field 'stages_dirs': expected a list of paths"),
        ("weights = [", "cannot read"),
    ],
)
def test_a_wrong_setting_names_the_file_and_the_field(tmp_path, toml, message):
    _course(tmp_path, toml)
    with pytest.raises(CourseError) as refused:
        load_course(tmp_path)
    assert str(refused.value).startswith(f"{tmp_path.resolve() / CONFIG_NAME}: ")
    assert message in str(refused.value)


def test_a_timeout_of_nan_is_refused(tmp_path):
    _course(tmp_path, "timeout = nan")
    with pytest.raises(CourseError, match="field 'timeout'"):
        load_course(tmp_path)


def test_a_non_utf8_config_is_a_course_error(tmp_path):
    _course(tmp_path)
    (tmp_path / CONFIG_NAME).write_bytes(b"timeout = 5 # \xff\n")
    with pytest.raises(CourseError, match="cannot read"):
        load_course(tmp_path)


def test_missing_adapters_or_a_directory_in_their_place(tmp_path):
    (tmp_path / CONFIG_NAME).write_text("")
    with pytest.raises(CourseError, match="adapters file not found"):
        load_course(tmp_path)
    (tmp_path / "tests" / "adapters.py").mkdir(parents=True)
    with pytest.raises(CourseError, match="not a regular file"):
        load_course(tmp_path)


def test_no_course_directory(tmp_path):
    with pytest.raises(CourseError, match="course directory not found"):
        load_course(tmp_path / "missing")


def test_without_course_the_working_directorys_nearest_course_is_found(tmp_path, monkeypatch):
    _course(tmp_path / "c", "")
    (tmp_path / "c" / "src").mkdir()
    monkeypatch.chdir(tmp_path / "c" / "src")
    assert find_course(None).root == (tmp_path / "c").resolve()
    assert find_course(tmp_path / "c").root == (tmp_path / "c").resolve()  # --course DIR: that directory


def test_an_infinite_or_boolean_timeout_is_refused(tmp_path):
    for value in ("inf", "true"):
        _course(tmp_path, f"timeout = {value}")
        with pytest.raises(CourseError, match="field 'timeout'"):
            load_course(tmp_path)
