"""Without the POSIX-only modules (fcntl, resource, pwd, grp, termios: absent on Windows), every module imports and
the commands a student runs first work: `--version`, `stages list`, and grading the reference solution.

Proven on Linux by forcing: tests/portable/sitecustomize.py on PYTHONPATH removes those modules from every
interpreter started with it, the grader's and the student's processes alike."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from theinference import __version__
from theinference.grading.spec.stages import load_stages
from theinference.bundled import data_dir

PORTABLE = Path(__file__).parents[1] / "portable"
POSIX_ONLY = ("fcntl", "resource", "pwd", "grp", "termios")

# Imports every module of the package (its entry point __main__ aside: importing it runs the CLI); prints one line
# per module that fails, then how many imported.
IMPORT_ALL = f"""
import importlib, pkgutil, theinference
for name in {POSIX_ONLY!r}:
    try:
        __import__(name)
    except ImportError:
        continue
    raise SystemExit(f"{{name}} is importable: the sitecustomize did not run")
count = 0
for module in pkgutil.walk_packages(theinference.__path__, "theinference."):
    if module.name.endswith(".__main__"):
        continue
    try:
        importlib.import_module(module.name)
        count += 1
    except Exception as e:
        print(f"{{module.name}}: {{type(e).__name__}}: {{e}}")
print(f"imported {{count}}")
"""

# Appended to the graded copy's adapters: the student's process must run without resource too, or the case errors.
NO_RESOURCE_CHECK = """

try:
    import resource  # noqa: F401
except ImportError:
    pass
else:
    raise RuntimeError("the student's process could import resource: the forced platform did not reach it")
"""


def _without_posix(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """Run python ARGS with the POSIX-only modules absent (in it and in every Python process it starts)."""
    path = os.pathsep.join(p for p in (str(PORTABLE), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_every_module_imports_without_the_posix_only_modules(tmp_path):
    done = _without_posix("-c", IMPORT_ALL, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    *failures, summary = done.stdout.splitlines()
    assert failures == []
    assert int(summary.removeprefix("imported ")) > 100, summary  # the whole package, not a stub of it
    assert "Warning" not in done.stderr, done.stderr


@pytest.mark.slow
def test_the_first_commands_work_without_the_posix_only_modules(tmp_path, solution_course, tiny_path):
    version = _without_posix("-m", "theinference", "--version", cwd=tmp_path)
    assert (version.returncode, version.stdout, version.stderr) == (0, f"theinference {__version__}\n", "")

    listed = _without_posix("-m", "theinference", "stages", "list", "--course", str(solution_course), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    ids = [stage.id for stage in load_stages([data_dir("stages")])]
    rows = {line.split()[0]: line for line in listed.stdout.splitlines() if line.split() and line.split()[0] in ids}
    assert list(rows) == ids  # every built-in stage, in order
    assert "not graded ◀ next" in rows["forward"]

    # The reference solution (README's first command grades it), in a copy that also proves its process lacked
    # resource; a store cap small enough that every write evicts (its lock, without fcntl); a temp directory of its
    # own to see what the grader leaves there.
    adapters = solution_course / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text() + NO_RESOURCE_CHECK)
    temp = tmp_path / "temp"
    temp.mkdir()
    graded = _without_posix(
        *("-m", "theinference", "test", "--stage", "forward", "--course", str(solution_course)),
        *("--weights", str(tiny_path)),
        cwd=tmp_path,
        TMPDIR=str(temp),
        THEINFERENCE_CACHE_MAX_MB="1",
    )
    assert graded.returncode == 0, graded.stdout + graded.stderr
    assert "✔ forward" in graded.stdout and "1 of 1 stage(s) passed · 10/10 points" in graded.stdout
    assert "Traceback" not in graded.stderr and "Warning" not in graded.stderr, graded.stderr
    assert os.listdir(temp) == []  # no kernel lock to hold: no owner file, and its directories removed as it ends
    store = Path(os.environ["THEINFERENCE_CACHE"]) / "oracle"
    assert (store / "lock").is_file() and list((store / "outputs").iterdir()) == []  # evicted: the cap holds


@pytest.mark.slow
def test_the_suite_collects_without_what_windows_lacks():
    """The project's own CI runs this suite on Windows (.github/workflows/tests.yml): one module that imports fcntl, or
    calls os.geteuid in a skipif, at import is a collection error there, and pytest then runs nothing at all."""
    root = Path(__file__).parents[2]
    done = _without_posix("-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests", cwd=root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " collected" in done.stdout.splitlines()[-1] and "error" not in done.stdout.splitlines()[-1]
