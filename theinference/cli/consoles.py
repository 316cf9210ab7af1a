"""The CLI's consoles: plain when not a terminal, in CI or with NO_COLOR (theinference.terminals decides; light:
rich is imported only to make a console)."""

import re
import sys

from theinference.terminals import is_plain

# Spaces (and the colour codes among them) that end a line: rich pads a table's last column and a wrapped
# text to the console's width; a line ends where its text does.
_PADDING = re.compile(r"(?:[ ]|\x1b\[[0-9;]*m)*[ ](?:[ ]|\x1b\[[0-9;]*m)*(?=\r?\n)")
_CODE = re.compile(r"\x1b\[[0-9;]*m")


class TrimmedLines:
    """A stream whose lines lose the spaces they end with (their colour codes are kept); all else passes through."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        self.stream.write(_PADDING.sub(lambda m: "".join(_CODE.findall(m.group())), text))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def console_for(stream, width: int | None = None):
    """A rich Console on stream (width: the terminal's, else 160, unless given); plain (no colour) when not a
    terminal, in CI or with NO_COLOR; its lines end where their text does (TrimmedLines). Not annotated:
    typing alone costs the early first line a few percent of its budget."""
    from typing import IO, cast

    from rich.console import Console

    plain = is_plain(stream)
    return Console(
        file=cast(IO[str], TrimmedLines(stream)),  # writes and delegates like the stream it wraps
        no_color=plain or None,
        highlight=False,
        soft_wrap=False,
        force_terminal=False if plain else None,
        width=width or (None if stream.isatty() else 160),
    )


def err_console():
    return console_for(sys.stderr)
