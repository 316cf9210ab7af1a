"""Where a course is: the names that mark its directory, and the nearest such ancestor (light: the CLI's
early first line uses it before anything heavy is imported, so os.path, not pathlib)."""

import os

CONFIG_NAME = "theinference.toml"
DEFAULT_ADAPTERS = "tests/adapters.py"
# Where adapters are looked for, in order: the Python edition's, then the TypeScript edition's.
ADAPTERS_CANDIDATES = (
    DEFAULT_ADAPTERS,
    "tests/adapters.ts",
    "tests/adapters.mts",
    "tests/adapters.js",
    "tests/adapters.mjs",
)


def find_root(start: str) -> str | None:
    """The nearest ancestor of start (itself included, symbolic links resolved) holding theinference.toml or
    tests/adapters.py (or .ts, ...)."""
    directory = os.path.realpath(start)
    while True:
        if os.path.isfile(os.path.join(directory, CONFIG_NAME)) or any(
            os.path.isfile(os.path.join(directory, a)) for a in ADAPTERS_CANDIDATES
        ):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent
