"""The report's first line, "theinference VERSION grading COURSE": the CLI prints it before its heavy imports
(theinference.cli.early), the terminal report's header after them (theinference.report.terminal)."""

from rich.text import Text

from theinference.untrusted import for_terminal


def headline(version: str, course: str) -> Text:
    return Text.assemble((f"theinference {version}", "bold"), " grading ", (for_terminal(course), "cyan"))
