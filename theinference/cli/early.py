"""The first line of `theinference test`'s report within a moment of Enter, before the CLI's heavy imports.

Importing the grader (numpy, rich, typer, the oracle, the stage machinery) takes a second or more on a busy
machine. For a `test` whose report streams to stdout (and `test --watch`, whose first screen replaces it),
this module reads just enough of the command line to find the course and prints the report's first line
("theinference VERSION grading COURSE") before anything heavy is imported: it imports only the standard
library's os and sys, and the package's light modules (courseroot, headline, consoles;
tests/e2e/test_first_verdict.py checks). The streamed header then leaves that line out. Whenever the command
line is anything else, or is not plain to read here (help, another format, --output, an option it does not
know, --watch with untrusted grading), it prints nothing and the report prints its whole header as before.
"""

import os
import sys

from theinference import __version__
from theinference.terminals import untrusted_run, wants_color
from theinference.courseroot import find_root
from theinference.headline import headline_ansi

# `test`'s options that take a value (tests/e2e/test_first_verdict.py checks this against the command itself).
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
        "--require-isolation",
    }
)
FLAG_OPTIONS = frozenset({"--all", "--untrusted", "--all-cases", "--no-diagnosis", "--allow-root", "--watch", "--poll"})

shown: str | None = None  # the course whose headline is on screen


def _test_options(argv: list[str]) -> dict[str, str] | None:
    """The value options of a `test` command line, or None when this module should stay silent."""
    if not argv or argv[0] != "test":
        return None
    values: dict[str, str] = {}
    flags: set[str] = set()
    rest = iter(argv[1:])
    for arg in rest:
        name, eq, value = arg.partition("=")
        if name in VALUE_OPTIONS:
            value = value if eq else next(rest, "")
            if not value or value.startswith("-"):
                return None  # a value missing (or an option where it should be): click says what it says
            values[name] = value
        elif eq or name not in FLAG_OPTIONS:
            return None  # --help, a typo, a stray argument: click will say what it says
        else:
            flags.add(name)
    if "--watch" in flags and untrusted_run("--untrusted" in flags, values.get("--format") == "gradescope"):
        return None  # a usage error follows, not a report
    return values


def _course(values: dict[str, str]) -> str | None:
    if "--course" in values:
        root = os.path.realpath(values["--course"])
        return root if os.path.isdir(root) else None
    return find_root(os.getcwd())


def _width(stream) -> int:
    """The width the report's console will have (cli.consoles.console_for, as rich decides it): COLUMNS when set,
    else the terminal's, else 160."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit():
        return int(columns)
    try:
        return os.get_terminal_size(stream.fileno()).columns if stream.isatty() else 160
    except (OSError, ValueError, AttributeError):
        return 80


def announce(argv: list[str]) -> None:
    """Print the report's first line now if `test` will stream its report to stdout."""
    global shown
    try:
        values = _test_options(argv)
        if values is None or values.get("--format", "rich") != "rich" or "--output" in values:
            return
        root = _course(values)
        if root is None:
            return
        sys.stdout.write(headline_ansi(__version__, root, wants_color(sys.stdout), _width(sys.stdout)) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):  # ValueError: a path stdout's encoding cannot write, too
        return
    shown = root
