"""Whether output is plain: the one answer every console, progress line and renderer asks (light: os only, so
the early first line can ask it before anything heavy is imported)."""

import os


def in_ci() -> bool:
    """Whether we run in CI ($CI): output is a log, and grading is untrusted."""
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def untrusted_run(asked: bool, gradescope: bool = False, reads_course: bool = True) -> bool:
    """The trust rule (theinference.trust), here so the early first line can ask it too: a run is untrusted when
    asked (`--untrusted`, `grade`), for Gradescope output, and in CI for every command that reads a course
    directory (`stages check` grades the instructor's own subjects). Only the run's plan and the early line ask."""
    return asked or gradescope or (reads_course and in_ci())


def is_plain(stream) -> bool:
    """Whether output on stream gets plain lines, not colour and redrawn bars: off a terminal, or in CI."""
    return in_ci() or not stream.isatty()


def wants_color(stream) -> bool:
    """Whether styled text on stream gets colour: not plain, no NO_COLOR, a TERM that has it (as rich decides)."""
    return not is_plain(stream) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") not in ("dumb", "unknown")


def plain_console(console) -> bool:
    """Whether a rich Console gets plain output (no colour, ASCII tables and sparklines): one made plain by
    is_plain (cli.consoles.console_for), one off a terminal, or NO_COLOR."""
    return not console.is_terminal or console.no_color
