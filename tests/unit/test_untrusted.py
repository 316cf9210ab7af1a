"""untrusted.py: a submission's text made safe where people read it (terminals, Markdown, GitHub commands)."""

import re

import pytest

from theinference.untrusted import for_terminal, markdown_code_block, workflow_data, workflow_property


@pytest.mark.parametrize(
    "text, shown",
    [
        ("\x1b[2J", "\\x1b[2J"),  # clears a TA's screen
        ("ok\rFAKE PASS", "ok\\x0dFAKE PASS"),  # overwrites the line
        ("\u202eevil", "\\u202eevil"),  # reorders it
        ("\u2066x\u2069", "\\u2066x\\u2069"),
        ("\x9b31m", "\\x9b31m"),  # a C1 control sequence introducer
        ("\x7f", "\\x7f"),
        ("\x00", "\\x00"),
        ("line one\n\tindented", "line one\n\tindented"),  # newlines and tabs kept
        ("héllo 世界 ✓", "héllo 世界 ✓"),  # ordinary Unicode kept
    ],
)
def test_for_terminal(text, shown):
    assert for_terminal(text) == shown


def test_a_code_block_nothing_inside_can_close():
    text = "before\n```\n# heading\n````` more"
    block = markdown_code_block(text)
    fence = re.match(r"`+", block)[0]
    assert len(fence) == 6 and block == f"{fence}text\n{text}\n{fence}"
    assert markdown_code_block("plain").startswith("```text\n")


def test_a_code_block_escapes_controls_too():
    assert "\x1b" not in markdown_code_block("\x1b[31mred")


def test_workflow_data_keeps_one_command_on_one_line():
    data = workflow_data("a\nb\r\n100%")
    assert "\n" not in data and "\r" not in data
    assert data == "a%0Ab\\x0d%0A100%25"


def test_workflow_property_escapes_the_property_separators():
    assert workflow_property("src/a,b:c.py") == "src/a%2Cb%3Ac.py"
    assert workflow_property("50%\n") == "50%25%0A"  # '%' first, so no escape is escaped twice
