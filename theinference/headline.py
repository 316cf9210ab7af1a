"""The report's first line, "theinference VERSION grading COURSE": the CLI prints it before its heavy imports
(theinference.cli.early, as ANSI text), the terminal report's header after them (theinference.report.terminal,
as rich text). Light: no rich here."""

from theinference.untrusted import for_terminal


def headline_parts(version: str, course: str) -> list[tuple[str, str]]:
    """The first line as (text, style) pieces; a style is "" or one word rich and ANSI_STYLES both know."""
    return [(f"theinference {version}", "bold"), (" grading ", ""), (for_terminal(course), "cyan")]


def headline_lines(version: str, course: str, width: int) -> list[list[tuple[str, str]]]:
    """The first line's pieces, as one line when it fits width, else two: the course's path whole on its own line
    (a path cut where the screen ends cannot be copied; one longer than the screen runs past it, still whole)."""
    parts = headline_parts(version, course)
    if sum(len(text) for text, _ in parts) <= width:
        return [parts]
    (name, bold), (grading, plain), (path, cyan) = parts
    return [[(name, bold), (grading.rstrip(), plain)], [("  ", ""), (path, cyan)]]


ANSI_STYLES = {"bold": "\x1b[1m", "cyan": "\x1b[36m"}


def headline_ansi(version: str, course: str, color: bool, width: int = 160) -> str:
    """The first line for a terminal (styled with ANSI codes when color) or plain; two lines where it would run
    past width (headline_lines)."""

    def styled(text: str, style: str) -> str:
        return f"{ANSI_STYLES[style]}{text}\x1b[0m" if style and color else text

    return "\n".join("".join(styled(*part) for part in parts) for parts in headline_lines(version, course, width))
