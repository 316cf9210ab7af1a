"""Text from submissions (messages, tracebacks, output, paths) made safe where people read it.

A student's exception message or print can hold terminal escape sequences (`\\x1b[2J` clears
a TA's screen), carriage returns that overwrite a line, bidirectional overrides that reorder
it, or Markdown that breaks out of a code block. Every renderer passes such text through here.
"""

import re

# C0 and C1 controls but newline and tab, DEL, and the bidirectional embeddings, overrides and isolates.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_BACKTICKS = re.compile("`+")


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def for_terminal(text: str) -> str:
    """Control characters shown escaped (ESC -> '\\x1b'); newlines and tabs kept."""
    return _CONTROL.sub(_escaped, text)


def markdown_code_block(text: str) -> str:
    """A fenced code block that nothing in text can close: the fence is longer than any backtick run in it."""
    longest = max((len(run) for run in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{for_terminal(text)}\n{fence}"


def workflow_data(text: str) -> str:
    """The message of a GitHub workflow command (`::error ...::MESSAGE`), escaped per GitHub's rules."""
    return for_terminal(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def workflow_property(text: str) -> str:
    """A property value of a GitHub workflow command (`file=`, `title=`)."""
    return workflow_data(text).replace(":", "%3A").replace(",", "%2C")
