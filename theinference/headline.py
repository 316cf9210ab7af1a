"""The report's first line, "theinference VERSION grading COURSE": the CLI prints it before its heavy imports
(theinference.cli.early, as ANSI text), the terminal report's header after them (theinference.report.terminal,
as rich text). Light: no rich here."""

from theinference.untrusted import for_terminal


def headline_parts(version: str, course: str) -> list[tuple[str, str]]:
    """The first line as (text, style) pieces; a style is "" or one word rich and ANSI_STYLES both know."""
    return [(f"theinference {version}", "bold"), (" grading ", ""), (for_terminal(course), "cyan")]


ANSI_STYLES = {"bold": "\x1b[1m", "cyan": "\x1b[36m"}


def headline_ansi(version: str, course: str, color: bool) -> str:
    """The first line for a terminal (styled with ANSI codes when color) or plain."""
    parts = headline_parts(version, course)
    if not color:
        return "".join(text for text, _ in parts)
    return "".join(f"{ANSI_STYLES[style]}{text}\x1b[0m" if style else text for text, style in parts)
