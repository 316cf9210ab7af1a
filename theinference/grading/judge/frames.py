"""Where in the course an error happened, read from the traceback a student's process sent.

That traceback is the student's text: any bytes at all. It is only searched for `File "...",
line N` lines, and a name counts only if it is absolute and resolves to a file inside the
course directory; whatever else it says is ignored.
"""

import os
import re
from pathlib import Path

_FRAME = re.compile(r'^[ \t]*File "([^"\n]{1,4096})", line ([0-9]{1,9})\b', re.MULTILINE)
MAX_FRAMES = 200  # the deepest frames are looked at first; a longer list is a recursion or a forgery


def course_file(root: Path, name: str) -> Path | None:
    """name, resolved, if it is an absolute path to a file inside the (resolved) course directory root."""
    if not os.path.isabs(name):  # a relative name would resolve against the grader's own directory
        return None
    try:
        path = Path(name).resolve()
        return path if path.is_relative_to(root) and path.is_file() else None
    except (OSError, ValueError, RuntimeError):  # a NUL byte, a loop of links
        return None


def deepest_course_frame(traceback: str, root: Path) -> tuple[str, int] | None:
    """The last frame of traceback in a file of the course directory: (its path relative to root, line)."""
    if not traceback:
        return None
    root = root.resolve()
    for match in list(_FRAME.finditer(traceback))[-MAX_FRAMES:][::-1]:
        path, line = course_file(root, match.group(1)), int(match.group(2))
        if path is not None and line > 0:
            return path.relative_to(root).as_posix(), line
    return None
