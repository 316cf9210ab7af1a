"""The CLI's consoles: plain when not a terminal, in CI or with NO_COLOR (light: the early header uses it)."""

import os
import sys

from rich.console import Console


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def is_plain(stream) -> bool:
    """Whether output on stream gets plain lines, not colour and redrawn bars: off a terminal, or in CI."""
    return in_ci() or not stream.isatty()


def console_for(stream) -> Console:
    """A console on stream; plain (no colour) when not a terminal, in CI or with NO_COLOR."""
    plain = is_plain(stream)
    return Console(
        file=stream,
        no_color=plain or None,
        highlight=False,
        soft_wrap=False,
        force_terminal=False if plain else None,
        width=None if stream.isatty() else 160,
    )


def err_console() -> Console:
    return console_for(sys.stderr)
