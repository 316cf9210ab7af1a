"""The student's course directory and its optional `theinference.toml`.

theinference.toml (every field optional):

  weights     path of model.safetensors (or its directory), relative to the course root, or the name of a
              synthetic preset (`tiny`, `gpt2`) as `--weights` takes it
  adapters    path of the adapters file (default tests/adapters.py; the TypeScript edition's
              tests/adapters.ts, .mts, .js or .mjs when there is no .py, run by Node: proc/node.py)
  stages_dirs list of extra stage directories, relative to the course root
  timeout     seconds per adapter call, overriding every stage's own timeout

A submission is untrusted: in `grade`, `test --untrusted`, CI and Gradescope output its
weights, stages_dirs and timeout are ignored with a notice (theinference.trust.untrusted_course).
"""

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from theinference.courseroot import ADAPTERS_CANDIDATES, CONFIG_NAME, DEFAULT_ADAPTERS, find_root
from theinference.errors import ConfigError

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "weights": str,
    "adapters": str,
    "stages_dirs": list,
    "timeout": (int, float),
}


class CourseError(ConfigError):
    """The course directory or its configuration is unusable."""


@dataclass(frozen=True)
class Course:
    root: Path
    adapters: Path
    weights: Path | None = None
    weights_setting: str | None = None  # the `weights` text as written: a preset's name only when alone (`tiny`)
    stages_dirs: tuple[Path, ...] = field(default_factory=tuple)
    timeout: float | None = None


def find_course_root(start: Path) -> Path | None:
    """The nearest ancestor of start (itself included) holding theinference.toml or tests/adapters.py (or .ts, ...)."""
    root = find_root(str(start))
    return None if root is None else Path(root)


def course_root(course_dir: Path | None) -> Path | None:
    """The course every command works on: --course DIR if given, else the working directory's nearest course
    ancestor (find_course_root); None when there is none."""
    return course_dir.resolve() if course_dir is not None else find_course_root(Path.cwd())


def find_course(course_dir: Path | None) -> "Course | None":
    """The course at course_root(course_dir), loaded; None when there is none (commands that work without one)."""
    root = course_root(course_dir)
    return None if root is None else load_course(root)


def _read_config(path: Path) -> dict:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # a BOM: what Windows Notepad writes
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise CourseError(f"{path}: cannot read: {e}") from e
    for key, value in data.items():
        if key not in _FIELDS:
            raise CourseError(f"{path}: field '{key}': unknown field (known fields: {', '.join(_FIELDS)})")
        if isinstance(value, bool) or not isinstance(value, _FIELDS[key]):
            raise CourseError(f"{path}: field '{key}': wrong type {type(value).__name__}")
    if any(not isinstance(d, str) for d in data.get("stages_dirs", [])):
        raise CourseError(f"{path}: field 'stages_dirs': expected a list of paths")
    timeout = data.get("timeout", 1)
    if isinstance(timeout, bool) or not math.isfinite(timeout) or timeout <= 0:  # TOML has nan and inf
        raise CourseError(f"{path}: field 'timeout': must be > 0 seconds (a finite number), not {timeout!r}")
    return data


def default_adapters(root: Path) -> str:
    """The adapters file a course without an `adapters` setting uses: the first candidate that exists."""
    return next((a for a in ADAPTERS_CANDIDATES if (root / a).is_file()), DEFAULT_ADAPTERS)


def load_course(root: Path) -> Course:
    """Read the course at root; the adapters file must exist."""
    root = root.resolve()
    if not root.is_dir():
        raise CourseError(f"{root}: course directory not found")
    config_path = root / CONFIG_NAME
    data = _read_config(config_path) if config_path.is_file() else {}
    adapters = root / data.get("adapters", default_adapters(root))
    if not adapters.is_file():
        why = "not a regular file" if adapters.exists() else "adapters file not found"
        raise CourseError(f"{adapters}: {why} (the grader calls the functions in it)")
    return Course(
        root=root,
        adapters=adapters,
        weights=(root / data["weights"]) if "weights" in data else None,
        weights_setting=data.get("weights"),
        stages_dirs=tuple(root / d for d in data.get("stages_dirs", [])),
        timeout=data.get("timeout"),
    )
