"""Whether output is plain: off a terminal or in CI; colour also needs no NO_COLOR and a TERM that has it."""

import io

import pytest
from rich.console import Console

from theinference.terminals import is_plain, plain_console, wants_color


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    "stream, env, plain, color",
    [
        (Tty(), {}, False, True),
        (io.StringIO(), {}, True, False),
        (Tty(), {"CI": "true"}, True, False),
        (Tty(), {"NO_COLOR": "1"}, False, False),
        (Tty(), {"TERM": "dumb"}, False, False),
    ],
)
def test_plain_and_colour(monkeypatch, stream, env, plain, color):
    for name in ("CI", "NO_COLOR", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (is_plain(stream), wants_color(stream)) == (plain, color)


def test_a_console_off_a_terminal_or_without_colour_renders_plain():
    assert plain_console(Console(file=io.StringIO()))
    assert plain_console(Console(file=io.StringIO(), force_terminal=True, no_color=True))
    assert not plain_console(Console(file=io.StringIO(), force_terminal=True, no_color=False))
