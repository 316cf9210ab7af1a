"""Every command a stage's hint or a lesson names runs as printed, in a student's course."""

import re
import shlex

import pytest

from theinference.bundled import data_dir

COMMAND = re.compile(r"`(theinference [^`]+)`")
PLACEHOLDERS = {"DIR": "new-course"}  # a word in capitals stands for the student's own choice


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
    # The GPT-2-shape preset is 500 MB to make: the command runs with the tiny weights in its place (the preset
    # names themselves are tested with the weights choice).
    args = [str(tiny_path) if arg == "gpt2" else PLACEHOLDERS.get(arg, arg) for arg in shlex.split(command)[1:]]
    result = cli(*args)
    assert result.exit_code == 0, result.output
    for out in re.findall(r"--out (\S+)", command):
        assert (solution_course / out).stat().st_size > 0
