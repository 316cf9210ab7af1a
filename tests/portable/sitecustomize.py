"""On PYTHONPATH, makes this interpreter one without the POSIX-only modules, as on Windows: importing fcntl,
resource, pwd, grp or termios raises ImportError (tests/e2e/test_portable_imports.py)."""

import sys

# psutil has a backend of its own on each platform; its Linux one binds resource, which its Windows one never
# imports: it is loaded before resource goes, so that what runs here is what runs there.
import psutil  # type: ignore[import-untyped]  # noqa: F401

for name in ("fcntl", "resource", "pwd", "grp", "termios"):
    sys.modules[name] = None  # type: ignore[assignment]
