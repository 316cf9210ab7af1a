"""The walk of one `theinference test --stage per-step-identity`: the package's modules and functions it calls.

Grades a copy of the bundled solution on tiny weights twice in this process (the first run makes the weights and
fills the oracle cache), profiling the second with sys.setprofile and threading.setprofile: every function of
the package called in the grader's process (any thread; the student's processes are not counted), and the modules
they are in. Run it on two checkouts to compare their shape:

    python bench/walk.py            # modules, functions called, calls made
    python bench/walk.py --list     # and each module with how many of its functions were called
"""

import contextlib
import io
import os
import shutil
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import theinference

PACKAGE = str(Path(theinference.__file__).parent)


def _run(course: Path) -> None:
    from theinference.cli.app import app

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            app(["test", "--stage", "per-step-identity", "--course", str(course), "--weights", "tiny"])
        except SystemExit:
            pass


def walk(course: Path) -> tuple[set[tuple[str, int, str]], int]:
    """The package's functions (file, line, name) the run called, and how many calls it made to them."""
    called: set[tuple[str, int, str]] = set()
    calls = 0

    def profile(frame, event, arg):
        nonlocal calls
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(PACKAGE) and code.co_name != "<module>":
            called.add((code.co_filename, code.co_firstlineno, code.co_name))
            calls += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        _run(course)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    return called, calls


def main() -> None:
    from theinference.bundled import data_dir

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("THEINFERENCE_CACHE", str(Path(tmp) / "cache"))
        course = Path(tmp) / "course"
        shutil.copytree(data_dir("course") / "solution", course)
        _run(course)  # weights made, oracle outputs stored
        called, calls = walk(course)
    modules = Counter(os.path.relpath(f, PACKAGE) for f, _, _ in called)
    print(f"modules: {len(modules)}  functions called: {len(called)}  calls: {calls}")
    if "--list" in sys.argv:
        for module, n in sorted(modules.items()):
            print(f"  {module}: {n}")


if __name__ == "__main__":
    main()
