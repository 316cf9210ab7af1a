"""On PYTHONPATH, makes this interpreter one without the POSIX-only modules, as on Windows: importing fcntl,
resource, pwd, grp or termios raises ImportError (tests/test_portable_imports.py)."""

import sys

for name in ("fcntl", "resource", "pwd", "grp", "termios"):
    sys.modules[name] = None  # type: ignore[assignment]
