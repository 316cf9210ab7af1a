"""What a submission may decide: nothing, when grading is untrusted.

The instructor's side (built-in stages, --stages-dir, --weights, the command line, the
environment) is trusted; a submission (adapters, src/, its stages/, its theinference.toml,
.theinference/) is not. Untrusted grading (`grade`, `test --untrusted`, CI, Gradescope output)
ignores the submission's stages, weights, stage directories and timeout, and gives student
processes only the environment variables named here.
"""

import dataclasses
import re
from pathlib import Path

from theinference import WEIGHTS_ENV
from theinference.course import Course, CourseError
from theinference.bundled import data_dir

# Variables a student process (and the zygote it is forked from) may see in untrusted mode:
# what the interpreter, locale and BLAS need (PWD: bubblewrap sets it to the working directory).
# Anything else (tokens, passwords, CI credentials under whatever name) is left out.
ENV_ALLOWED = frozenset(
    {
        "PATH",
        "HOME",
        "PWD",
        "USER",
        "LOGNAME",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TMPDIR",
        "TEMP",
        "TMP",
        "TERM",
        "COLUMNS",
        "NO_COLOR",
        "SYSTEMROOT",
        "COMSPEC",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        WEIGHTS_ENV,
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
        "PYTHONHASHSEED",
        "PYTHONDONTWRITEBYTECODE",
        "OPENBLAS_NUM_THREADS",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "BLIS_NUM_THREADS",
        "GOTO_NUM_THREADS",
    }
)
_ENV_ALLOWED_PATTERN = re.compile(r"LC_[A-Z]+")


def allowed_env(environ) -> dict:
    """Only the allow-listed variables of environ."""
    return {k: v for k, v in environ.items() if k in ENV_ALLOWED or _ENV_ALLOWED_PATTERN.fullmatch(k)}


def untrusted_course(course: Course) -> tuple[Course, list[str]]:
    """The course without the settings a submission may not choose, and a notice for each one ignored."""
    notices = []
    for name, value in (("weights", course.weights), ("stages_dirs", course.stages_dirs), ("timeout", course.timeout)):
        if value:
            notices.append(
                f"ignored the submission's theinference.toml `{name}`: untrusted grading uses the instructor's"
            )
    if (course.root / "stages").is_dir() and any((course.root / "stages").glob("*.toml")):
        notices.append(
            "ignored the submission's stages/ directory: untrusted grading uses the instructor's stages only"
        )
    adapters = course.adapters.resolve()
    if not adapters.is_relative_to(course.root.resolve()):
        raise CourseError(f"{course.adapters}: the adapters file must be inside the submission ({course.root})")
    return dataclasses.replace(
        course, adapters=adapters, weights=None, weights_setting=None, stages_dirs=(), timeout=None
    ), notices


def stage_origin(source: Path, extra_dirs: list[Path]) -> str:
    """Where a loaded stage file comes from: "built-in", "--stages-dir" (the instructor's) or "course" (the submission's)."""
    if source.is_relative_to(data_dir("stages").resolve()):
        return "built-in"
    if any(source.is_relative_to(Path(d).resolve()) for d in extra_dirs):
        return "--stages-dir"
    return "course"
