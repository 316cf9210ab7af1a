"""Where the files that ship with the package live, installed or in a checkout."""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent

# The file that marks the bundled course directory, in a source checkout and in the wheel alike.
BUNDLED_MARK = "BUNDLED"
MARK_TEXT = "This directory is the course that ships with theinference"


def data_dir(name: str) -> Path:
    """Return the bundled `stages` or `course` directory."""
    # A wheel carries them under theinference/_data; a source checkout has them at the top.
    installed = _PACKAGE / "_data" / name
    return installed if installed.is_dir() else _PACKAGE.parent / name


def asset(name: str) -> Path:
    """Return a file from theinference/assets."""
    return _PACKAGE / "assets" / name


def bundled_course_dir(path: Path) -> Path | None:
    """The bundled course directory that path lies in (the installed one, or a source checkout's), or None.

    A copy of it (`cp -r` for authoring) carries the marker file along but is the instructor's own
    course: a marker counts only where the package keeps its data, beside a `theinference` package.
    """
    path = path.resolve()
    return next((p for p in (path, *path.parents) if _is_mark(p / BUNDLED_MARK) and _beside_package(p)), None)


def _beside_package(course: Path) -> bool:
    """Whether course is a package's data (theinference/_data/course) or a checkout's (course/ beside theinference/)."""
    if course == data_dir("course").resolve():
        return True
    holder = course.parent.parent if course.parent.name == "_data" else course.parent / "theinference"
    return (holder / "bundled.py").is_file()


def _is_mark(path: Path) -> bool:
    try:
        return path.is_file() and path.read_text().startswith(MARK_TEXT)
    except (OSError, UnicodeDecodeError):
        return False
