"""terminals.py: whether output is plain, whether it is coloured, and the trust rule the early line asks."""

import io

import pytest
from rich.console import Console

from theinference.terminals import in_ci, is_plain, plain_console, untrusted_run, wants_color


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    "value, ci",
    [("true", True), ("TRUE", True), ("1", True), ("yes", True), ("", False), ("false", False), ("0", False)],
)
def test_ci_is_read_from_the_environment(monkeypatch, value, ci):
    monkeypatch.setenv("CI", value)
    assert in_ci() is ci


@pytest.mark.parametrize(
    "asked, gradescope, reads_course, ci, untrusted",
    [
        (False, False, True, False, False),  # a student's own `test`
        (True, False, True, False, True),  # --untrusted, `grade`
        (False, True, True, False, True),  # Gradescope output is a grade
        (False, False, True, True, True),  # CI grading a course directory
        (False, False, False, True, False),  # `stages check` in CI: the instructor's own subjects
    ],
)
def test_the_trust_rule(monkeypatch, asked, gradescope, reads_course, ci, untrusted):
    monkeypatch.setenv("CI", "true" if ci else "")
    assert untrusted_run(asked, gradescope, reads_course) is untrusted


def test_plain_off_a_terminal_or_in_ci(monkeypatch):
    assert is_plain(io.StringIO())
    assert not is_plain(Tty())
    monkeypatch.setenv("CI", "true")
    assert is_plain(Tty())


@pytest.mark.parametrize(
    "term, no_color, coloured",
    [("xterm-256color", "", True), ("dumb", "", False), ("unknown", "", False), ("xterm", "1", False)],
)
def test_colour_only_on_a_terminal_that_has_it(monkeypatch, term, no_color, coloured):
    monkeypatch.setenv("TERM", term)
    monkeypatch.setenv("NO_COLOR", no_color)
    assert wants_color(Tty()) is coloured
    assert not wants_color(io.StringIO())


def test_plain_console():
    assert plain_console(Console(file=io.StringIO()))
    assert plain_console(Console(file=io.StringIO(), force_terminal=True, no_color=True))
    assert not plain_console(Console(file=io.StringIO(), force_terminal=True, no_color=False))
