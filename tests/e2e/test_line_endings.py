"""Files saved with Windows line endings (CRLF) load and grade like LF ones: a course's tests/adapters.py (and its
src/), and an instructor's stage file given by --stages-dir."""

import dataclasses

import pytest

from theinference.bundled import data_dir
from theinference.grading.spec.stages import load_stage


def _crlf(text: str) -> bytes:
    return text.replace("\r\n", "\n").replace("\n", "\r\n").encode()


@pytest.mark.slow
def test_adapters_with_crlf_line_endings_grade_like_lf_ones(cli, solution_course, tiny_path):
    sources = sorted(solution_course.rglob("*.py"))
    assert solution_course / "tests" / "adapters.py" in sources
    for path in sources:
        path.write_bytes(_crlf(path.read_text()))
    result = cli("test", "--stage", "forward", "--course", solution_course, "--weights", tiny_path)
    assert result.exit_code == 0, result.output
    assert "1 of 1 stage(s) passed · 10/10 points" in result.output


def _stage_text() -> str:
    """The built-in forward stage as an instructor's own: another id, its lesson by absolute path, and a hint that
    spans lines (a multi-line string, where a CR could survive into the text)."""
    text = (data_dir("stages") / "forward.toml").read_text()
    lesson = data_dir("course") / "lessons" / "forward.md"
    for old, new in (
        ('id = "forward"', 'id = "forward-crlf"'),
        ('lesson = "../course/lessons/forward.md"', f"lesson = {str(lesson)!r}"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    # The no-pattern hint as a multi-line string (a line of its own in the file; its text is found again below)
    lines = text.split("\n")
    [i] = [k for k, line in enumerate(lines) if line.startswith('no-pattern = "Suspects: anything inside')]
    hint = lines[i].removeprefix('no-pattern = "').removesuffix('"')
    lines[i] = 'no-pattern = """' + hint.replace("Suspects: anything inside", "Suspects: anything\ninside", 1) + '"""'
    return "\n".join(lines)


@pytest.mark.slow
def test_a_stage_file_with_crlf_line_endings_loads_and_grades_like_an_lf_one(cli, solution_course, tiny_path, tmp_path):
    lf, crlf = tmp_path / "lf", tmp_path / "crlf"
    for directory, data in ((lf, _stage_text().encode()), (crlf, _crlf(_stage_text()))):
        directory.mkdir()
        (directory / "forward-crlf.toml").write_bytes(data)
    assert b"\r\n" in (crlf / "forward-crlf.toml").read_bytes() and b"\r" not in (lf / "forward-crlf.toml").read_bytes()
    from_lf, from_crlf = load_stage(lf / "forward-crlf.toml"), load_stage(crlf / "forward-crlf.toml")
    assert dataclasses.replace(from_crlf, source=from_lf.source) == from_lf
    assert from_crlf.hints["no-pattern"].startswith("Suspects: anything\ninside")

    result = cli(
        *("test", "--stage", "forward-crlf", "--stages-dir", crlf, "--course", solution_course),
        *("--weights", tiny_path),
    )
    assert result.exit_code == 0, result.output
    assert "forward-crlf" in result.output and "1 of 1 stage(s) passed · 10/10 points" in result.output
