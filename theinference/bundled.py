"""Where the files that ship with the package live, installed or in a checkout."""

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_dir(name: str) -> Path:
    """Return the bundled `stages` or `course` directory."""
    # A wheel carries them under theinference/_data; a source checkout has them at the top.
    installed = _PACKAGE / "_data" / name
    return installed if installed.is_dir() else _PACKAGE.parent / name


def asset(name: str) -> Path:
    """Return a file from theinference/assets."""
    return _PACKAGE / "assets" / name
