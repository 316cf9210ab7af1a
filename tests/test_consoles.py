"""cli/consoles.py: a console's lines end where their text does, at a cost linear in the line."""

import pytest

from theinference.cli.consoles import trim_padding


@pytest.mark.parametrize(
    "text, trimmed",
    [
        ("row   \n", "row\n"),
        ("row \x1b[0m  \r\n", "row\x1b[0m\r\n"),  # colour codes among the padding are kept, in order
        ("a \x1b[1m \x1b[0m \nb  \n", "a\x1b[1m\x1b[0m\nb\n"),
        ("unfinished   ", "unfinished   "),  # more of the line may follow
        ("a  b\n", "a  b\n"),  # spaces inside a line stay
        ("sum\x1b[0m\n", "sum\x1b[0m\n"),
        ("", ""),
    ],
)
def test_trailing_spaces_go_and_colour_codes_stay(text, trimmed):
    assert trim_padding(text) == trimmed


def test_a_long_gap_of_spaces_inside_lines_costs_no_backtracking():
    # The regular expression this replaced took about a second for one such line, cubic in the gap's length: a
    # progress.json value with a long run of spaces made `stages list` take 10 s. 200 lines of a 20,000-space gap
    # each would take it days.
    text = ("a" + " " * 20_000 + "b" + " " * 50 + "\n") * 200
    assert trim_padding(text) == ("a" + " " * 20_000 + "b\n") * 200
