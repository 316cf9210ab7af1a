"""The CLI's consoles: plain when not a terminal, in CI or with NO_COLOR (theinference.terminals decides; light:
rich is imported only to make a console). On a stream whose encoding is not UTF-8 (Windows' cp1252 when output is
redirected, PYTHONIOENCODING=ascii) every glyph it cannot encode is written as its ASCII fallback (GLYPHS), and any
other character it cannot encode as "?": never a UnicodeEncodeError, never bytes its reader would decode wrongly."""

import codecs
import functools
import os
import re
import sys

from theinference.terminals import is_plain

# A colour code: rich pads a table's last column and a wrapped text to the console's width with spaces, colour codes
# among them; a line ends where its text does (trim_padding).
_CODE = re.compile(r"\x1b\[[0-9;]*m")


# Each glyph the reports print (the report, cli and grading modules, the stage files' hints, the lessons) and what
# stands for it where the console's encoding cannot encode it. One cell for one where it may sit in a table's cell
# (rich lays a table out before this translation, so a wider stand-in would push the columns after it).
GLYPHS = {
    "✔": "+",  # a stage's or a cell's mark: passed
    "✘": "x",  # failed, error, crashed
    "⏱": "!",  # timed out
    "✅": "+",
    "❌": "x",
    "◀": "<",  # ◀ first, ◀ next
    "▼": "v",
    "Δ": "d",  # max |Δ|
    "·": "-",  # a separator, and a stage not started
    "×": "x",
    "—": "-",
    "–": "-",
    "│": "|",
    "…": "...",  # cp1252 has it; on an ASCII stream a fold row and a cut token text move two cells
    "→": "->",
    "↔": "<->",
    "≤": "<=",  # wider than its cell, but true (a fold row's bound): that one row's later columns move a cell
    "≥": ">=",
    "²": "^2",
}
# Families of glyphs, each replaced whole where any of its glyphs cannot be encoded, so that one sparkline never mixes
# two ramps (cp437 has two of the eight blocks).
FAMILIES = (
    ("▁▂▃▄▅▆▇█✕", "_.-:=+*#x"),  # a sparkline's levels and its NaN row: the report's own ASCII ramp (report.terminal)
    ("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏", "|/-\\|/-\\|/"),  # rich's spinner on a live line: a turning bar
)


@functools.cache
def fallbacks(encoding: str) -> dict[int, str]:
    """The table (for str.translate) of the glyphs that encoding cannot encode, each to its fallback."""

    def encodes(text: str) -> bool:
        try:
            text.encode(encoding)
        except UnicodeEncodeError:
            return False
        return True

    table = {ord(glyph): plain for glyph, plain in GLYPHS.items() if not encodes(glyph)}
    for glyphs, plain in FAMILIES:
        if not encodes(glyphs):
            table.update(zip(map(ord, glyphs), plain))
    return table


def encodable(text: str, encoding: str | None) -> str:
    """text as a stream of that encoding can write it: glyphs it cannot encode as their fallbacks, other characters it
    cannot encode (a student's message, a path) as "?". A stream without an encoding takes any text."""
    if encoding is None:
        return text
    try:
        text.encode(encoding)
        return text
    except UnicodeEncodeError:
        pass
    except LookupError:  # a name Python does not know: nothing tells what it can encode
        return text
    text = text.translate(fallbacks(encoding))
    return text.encode(encoding, "replace").decode(encoding)


def write_document(stream, text: str) -> None:
    """Write a document a program reads (JUnit's XML, which declares UTF-8; GitHub's annotations, read as UTF-8) to
    stream in UTF-8 whatever the stream's own encoding: cp1252 would refuse its Δ or write its · as a byte that
    reader decodes wrongly."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None or _is_utf8(getattr(stream, "encoding", None)):
        stream.write(text)
        return
    stream.flush()
    buffer.write(text.encode("utf-8"))
    buffer.flush()


def _is_utf8(encoding: str | None) -> bool:
    try:
        return encoding is not None and codecs.lookup(encoding).name == "utf-8"
    except LookupError:
        return False


def _trim_line(line: str) -> str:
    """line without the spaces it ends with; the colour codes among them are kept, in order. One pass from the end
    (a regular expression over the spaces backtracked cubically on a long gap of spaces inside a line)."""
    end, codes = len(line), []
    while end:
        if line[end - 1] == " ":
            end -= 1
            continue
        start = line.rfind("\x1b[", max(0, end - 32), end) if line[end - 1] == "m" else -1
        if start < 0 or not _CODE.fullmatch(line, start, end):
            break
        codes.append(line[start:end])
        end = start
    return line[:end] + "".join(reversed(codes))


def trim_padding(text: str) -> str:
    """text whose every line that ends (in \\n or \\r\\n) loses its trailing spaces (_trim_line); the unfinished last
    line is left as it is, since more of it may follow."""
    if " \n" not in text and " \r\n" not in text and "m\n" not in text and "m\r\n" not in text:
        return text  # nothing to trim: most writes
    lines = text.split("\n")
    for i, line in enumerate(lines[:-1]):
        cr = line.endswith("\r")
        lines[i] = _trim_line(line[:-1] if cr else line) + ("\r" if cr else "")
    return "\n".join(lines)


class TrimmedLines:
    """A stream whose lines lose the spaces they end with (their colour codes are kept), and whose text is made
    encodable for it (encodable); all else passes through."""

    def __init__(self, stream):
        self.stream = stream
        self._encoding = getattr(stream, "encoding", None)

    def write(self, text: str) -> int:
        trimmed = trim_padding(text)
        self.stream.write(encodable(trimmed, self._encoding))
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


def console_for(stream, width: int | None = None):
    """A rich Console on stream (width: the terminal's, else COLUMNS, else 160, unless given); plain (no colour) when not a
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
        # rich reads COLUMNS itself: a log or pipe says its width that way (a CI log viewer, `COLUMNS=80 ... | less`)
        width=width or (None if stream.isatty() or os.environ.get("COLUMNS", "").isdigit() else 160),
    )


def err_console():
    return console_for(sys.stderr)
