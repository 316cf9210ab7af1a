"""The first line of `theinference test`'s report within a moment of Enter, before the CLI's heavy imports.

Importing the grader (numpy, the oracle, the stage machinery) takes a second or more on a busy machine.
For a plain `test` whose report streams to stdout, this module reads just enough of the command line to
find the course and prints the report's first line ("theinference VERSION grading COURSE") before
anything heavy is imported; the streamed header then leaves that line out. Whenever the command line is
anything else, or is not plain to read here (help, another format, --output, --watch, an option it does
not know), it prints nothing and the report prints its whole header as before.
"""

import sys
from pathlib import Path

from theinference import __version__
from theinference.course import find_course_root
from theinference.headline import headline

# `test`'s options that take a value (tests/test_first_verdict.py checks this against the command itself).
VALUE_OPTIONS = frozenset(
    {
        "--stage",
        "--course",
        "--weights",
        "--timeout",
        "--format",
        "--output",
        "--stages-dir",
        "--seed",
        "--memory-limit",
    }
)
FLAG_OPTIONS = frozenset({"--all", "--untrusted", "--all-cases", "--no-diagnosis", "--allow-root"})

shown: str | None = None  # the course whose headline is on screen


def _test_options(argv: list[str]) -> dict[str, str] | None:
    """The value options of a `test` command line, or None when this module should stay silent."""
    if not argv or argv[0] != "test":
        return None
    values: dict[str, str] = {}
    rest = iter(argv[1:])
    for arg in rest:
        name, eq, value = arg.partition("=")
        if name in VALUE_OPTIONS:
            value = value if eq else next(rest, "")
            if not value or value.startswith("-"):
                return None  # a value missing (or an option where it should be): click says what it says
            values[name] = value
        elif eq or name not in FLAG_OPTIONS:
            return None  # --help, --watch, a typo, a stray argument: click will say what it says
    return values


def _course(values: dict[str, str]) -> Path | None:
    if "--course" in values:
        root = Path(values["--course"]).resolve()
        return root if root.is_dir() else None
    return find_course_root(Path.cwd())


def announce(argv: list[str]) -> None:
    """Print the report's first line now if `test` will stream its report to stdout."""
    global shown
    try:
        values = _test_options(argv)
        if values is None or values.get("--format", "rich") != "rich" or "--output" in values:
            return
        root = _course(values)
    except (OSError, ValueError):
        return
    if root is None:
        return
    from theinference.cli.consoles import console_for

    console = console_for(sys.stdout)
    console.print(headline(__version__, str(root)), overflow="fold")
    console.file.flush()
    shown = str(root)
