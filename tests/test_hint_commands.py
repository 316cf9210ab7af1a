"""Every command a stage's hint or a lesson names runs as printed, in a student's course."""

import re
import shlex

import pytest

from theinference.bundled import data_dir

COMMAND = re.compile(r"`(theinference [^`]+)`")


def _printed_commands() -> list[str]:
    texts = [p.read_text() for p in sorted((data_dir("stages")).glob("*.toml"))]
    texts += [p.read_text() for p in sorted((data_dir("course") / "lessons").glob("*.md"))]
    return sorted({m.group(1) for text in texts for m in COMMAND.finditer(text)})


def test_hints_and_lessons_name_commands():
    names = _printed_commands()
    assert any(c.startswith("theinference oracle --stage") for c in names), names
    assert "theinference test --stage greedy" in names


@pytest.mark.slow
@pytest.mark.parametrize("command", _printed_commands())
def test_a_printed_command_runs_as_printed(command, cli, solution_course, tiny_path, monkeypatch):
    monkeypatch.chdir(solution_course)
    monkeypatch.setenv("THEINFERENCE_WEIGHTS", str(tiny_path))  # the student's configured weights, fast
    result = cli(*shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
    for out in re.findall(r"--out (\S+)", command):
        assert (solution_course / out).stat().st_size > 0
