"""Autograder bundles: a Gradescope autograder.zip and a GitHub Actions workflow that grade a class.

Both carry this very version of theinference as a wheel, the instructor's stage directories and
the instructor's weights (a synthetic preset made where grading runs, or a file), and grade with
`theinference grade`, which never reads a submission's own stages, weights or timeouts.
"""

import base64
import dataclasses
import datetime
import hashlib
import importlib.metadata
import importlib.util
import math
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from theinference.sizes import size_text
from theinference.files import atomic_file
from theinference import __version__
from theinference.bundled import asset
from theinference.model.synth import PRESETS
from theinference.model.weights import check_entries, expected_shapes, infer_config, read_header
from theinference.errors import ConfigError

LARGE_WEIGHTS_MB = 100  # above this, bundling the file makes uploads slow: say so, suggest a preset
EXECUTABLE, READABLE = 0o755 << 16, 0o644 << 16  # zip external_attr: Unix modes rwxr-xr-x, rw-r--r--


class AutograderError(ConfigError):
    """The bundle cannot be made (no wheel, unreadable weights, a path outside the repository)."""


@dataclass(frozen=True)
class Weights:
    """The instructor's weights: a synthetic preset made where grading runs, or a file carried along."""

    preset: str = "gpt2"
    seed: int = 0
    file: Path | None = None

    @property
    def size(self) -> int:
        """Bytes of the checkpoint graded against (a preset's float32 tensors, or the file's size)."""
        if self.file is not None:
            return self.file.stat().st_size
        return 4 * sum(math.prod(shape) for shape in expected_shapes(PRESETS[self.preset]).values())


@dataclass(frozen=True)
class Container:
    """A Gradescope container's resources, as an assignment's Autograder Settings set them."""

    cpus: float
    memory_mb: int
    timeout_minutes: int

    def fits_in(self, other: "Container") -> bool:
        return (
            self.cpus <= other.cpus
            and self.memory_mb <= other.memory_mb
            and self.timeout_minutes <= other.timeout_minutes
        )

    def __str__(self) -> str:
        return f"{self.cpus:g} CPU, {size_text(self.memory_mb << 20)} of memory, a {self.timeout_minutes} min timeout"


# What Gradescope gives an assignment unless the instructor raises it (its autograder documentation: half a
# virtual CPU, 768 MB, a 10 minute timeout).
GRADESCOPE_DEFAULT = Container(cpus=0.5, memory_mb=768, timeout_minutes=10)
# Memory: the grader and one student process besides the graded weights (Python, numpy, the cache proof's own
# weights, the page cache), and the graded weights about three times over (the grader's model, its oracle's work
# on them, the student's process's copy). Measured with the reference solution in a memory cgroup on one CPU: the
# tiny preset (26 MB) peaked at 484 MB, gpt2 (475 MB) at 1525 MB with room to spare and at 1201 MB, to full marks,
# in the 1900 MB this rule gives it (page cache reclaimed).
MEMORY_BASE_MB = 400
MEMORY_PER_WEIGHTS = 3
TIMEOUT_SLACK = 30  # seconds past the time budget before Gradescope's own timeout: unpacking, starting
RESULTS_MARGIN = 30  # seconds before the time budget ends when the grader stops and writes the results


def needs(weights: Weights, time_budget: float) -> Container:
    """The container grading needs with these weights within time_budget seconds."""
    large = weights.size > LARGE_WEIGHTS_MB << 20
    memory = MEMORY_BASE_MB + MEMORY_PER_WEIGHTS * (weights.size >> 20)
    return Container(
        # The reference solution took 105 s on tiny at half a CPU, 193 s on gpt2 at one CPU (a busy machine's):
        # half a CPU would leave gpt2 little of a 540 s budget.
        cpus=1.0 if large else GRADESCOPE_DEFAULT.cpus,
        memory_mb=-(-memory // 100) * 100,  # rounded up to 100 MB
        timeout_minutes=math.ceil((time_budget + TIMEOUT_SLACK) / 60),
    )


def finish_margin(time_budget: float) -> int:
    """Seconds between the grader's deadline and the end of the time budget: enough to write the results after a
    stage cut short, never more than half the budget."""
    return int(min(time_budget // 2, max(RESULTS_MARGIN, time_budget // 10)))


@dataclass(frozen=True)
class Grading:
    """What every submission is graded with: the instructor's stages and limits."""

    stages_dirs: list[Path] = field(default_factory=list)
    stage_ids: list[str] = field(default_factory=list)
    timeout: float | None = None
    memory_mb: int | None = None
    cases_seed: str | None = None

    def grade_args(self, stages_dirs: list[str]) -> list[str]:
        """`theinference grade` options, with the stage directories as they are named where grading runs."""
        args = [arg for d in stages_dirs for arg in ("--stages-dir", d)]
        args += [arg for s in self.stage_ids for arg in ("--stage", s)]
        if self.timeout is not None:
            args += ["--timeout", str(self.timeout)]
        if self.memory_mb is not None:
            args += ["--memory-limit", str(self.memory_mb)]
        if self.cases_seed is not None:
            args += ["--seed", self.cases_seed]
        return args


def source_tree() -> Path | None:
    """The checkout theinference runs from (editable install or source tree), if it is one."""
    root = Path(__file__).resolve().parents[3]  # theinference/grading/tools/ -> the checkout
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        name = tomllib.loads(pyproject.read_text()).get("project", {}).get("name")
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return root if name == "theinference" else None


def build_wheel(dest: Path) -> Path:
    """Build this very version's wheel into dest: from the source tree, else from the installed files."""
    root = source_tree()
    if root is None:
        return repack_installed(dest)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(dest), str(root)]
    if importlib.util.find_spec("hatchling") is not None:
        command.insert(4, "--no-build-isolation")  # the installed backend: no download needed
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(dest.glob("theinference-*.whl"))
    if done.returncode != 0 or not wheels:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise AutograderError(
            f"building theinference's wheel from {root} failed ({' '.join(command[2:4])} ...):\n{tail}\n"
            "Its build backend, hatchling, comes from PyPI unless installed: `pip install hatchling`, "
            "or pass --wheel PATH."
        )
    return wheels[-1]


# What pip adds to an installed distribution's metadata (not part of the wheel it came from).
_INSTALL_ONLY = frozenset({"INSTALLER", "REQUESTED", "direct_url.json", "RECORD"})


def _installed() -> tuple[Path, "importlib.metadata.Distribution"]:
    """The directory this theinference is installed in, and its distribution (found there, not elsewhere on
    sys.path: another theinference may be installed too)."""
    site = Path(__file__).resolve().parents[3]  # theinference/grading/tools/ -> the install's directory
    found = [d for d in importlib.metadata.distributions(path=[str(site)]) if d.metadata["Name"] == "theinference"]
    if not found or found[0].files is None:
        raise AutograderError(
            f"theinference in {site} has no installed record to build its wheel from: pass --wheel PATH "
            "(the theinference wheel it was installed from)"
        )
    return site, found[0]


def repack_installed(dest: Path) -> Path:
    """This installed version's wheel, made again from its installed files (a pip install of a wheel): the files
    its RECORD lists under the install's directory, compiled bytecode and pip's own additions left out."""
    site, dist = _installed()
    info = f"theinference-{__version__}.dist-info"
    tag = next(
        (
            line.split(":", 1)[1].strip()
            for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")
        ),
        "py3-none-any",
    )
    files = []
    for entry in dist.files or []:
        path = Path(entry)
        if path.parts[0] == ".." or "__pycache__" in path.parts or path.suffix == ".pyc":
            continue  # scripts pip wrote into bin/, bytecode compiled at install
        if path.parts[0] == info and path.name in _INSTALL_ONLY:
            continue
        files.append(path)
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / f"theinference-{__version__}-{tag}.whl"
    record = []
    with atomic_file(out, binary=True) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path in sorted(files):
            data = (site / path).read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            wheel.writestr(path.as_posix(), data)
            record.append(f"{path.as_posix()},sha256={digest},{len(data)}")
        record.append(f"{info}/RECORD,,")
        wheel.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return out


def check_wheel(path: Path) -> list[str]:
    """Raise if path is not a theinference wheel; return warnings (another version than this one)."""
    parts = path.name.split("-")
    if not path.is_file() or path.suffix != ".whl" or len(parts) < 3 or parts[0] != "theinference":
        raise AutograderError(f"{path}: not a theinference wheel (theinference-VERSION-...whl)")
    if parts[1] != __version__:
        return [
            f"{path.name} is theinference {parts[1]}, not this version ({__version__}): "
            "the bundle's scripts are written for this version's command line"
        ]
    return []


# What a wheel without the solution leaves out: the reference solution, and the mutants (edits of it).
SOLUTION_PARTS = ("theinference/_data/course/solution/", "theinference/_data/course/mutants/")


def strip_solution(wheel: Path, dest_dir: Path) -> Path:
    """A copy of wheel in dest_dir (same name) without the reference solution and the mutants (RECORD updated).

    A course graded for credit ships the grader to students' graders (Gradescope, CI): the bundled
    solution would then be one copy away. `stages check` and `theinference demo` need it; `grade` does not.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / wheel.name
    if out.resolve() == wheel.resolve():
        raise AutograderError(f"{wheel}: the wheel without the solution would overwrite it; choose another directory")
    with zipfile.ZipFile(wheel) as src, atomic_file(out, binary=True) as f, zipfile.ZipFile(f, "w") as dst:
        for info in src.infolist():
            if info.filename.startswith(SOLUTION_PARTS):
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not line.startswith(SOLUTION_PARTS)).encode()
            dst.writestr(info, data, compress_type=info.compress_type)
    return out


def obtain_wheel(wheel: Path | None, workdir: Path) -> tuple[Path, list[str]]:
    """The given wheel (checked), else one built from the source tree into workdir."""
    if wheel is not None:
        return wheel, check_wheel(wheel)
    return build_wheel(workdir), []


def check_weights_file(path: Path) -> list[str]:
    """Raise WeightsError if the file is not a usable GPT-2 checkpoint; warn if it is large."""
    entries, data_start = read_header(path)
    check_entries(path, entries, infer_config(path, entries), path.stat().st_size - data_start)
    size = path.stat().st_size
    if size > LARGE_WEIGHTS_MB << 20:
        return [
            f"the bundle carries {size_text(size)} of weights ({path}); uploads that large are slow and "
            "may be refused: --preset makes synthetic weights during setup instead"
        ]
    return []


def bundle_env(wheel_name: str, weights: Weights, grading: Grading, stages_dirs: list[str], time_budget: float) -> str:
    """bundle.env: the settings setup.sh and run_autograder read (shell assignments)."""
    lines = [
        f"# Written by `theinference autograder gradescope` (theinference {__version__}).",
        f"WHEEL={shlex.quote(wheel_name)}",
        f"WEIGHTS_PRESET={shlex.quote(weights.preset if weights.file is None else '')}",
        f"WEIGHTS_SEED={weights.seed}",
        # Seconds from run_autograder's start; the grader stops FINISH_MARGIN seconds before, so whatever it has
        # not graded by then is reported as timed out and the stages graded keep their points.
        f"TIME_BUDGET={math.ceil(time_budget)}",
        f"FINISH_MARGIN={finish_margin(math.ceil(time_budget))}",
        f"GRADE_ARGS=({shlex.join(grading.grade_args(stages_dirs))})",
    ]
    return "\n".join(lines) + "\n"


def _add_tree(bundle: zipfile.ZipFile, directory: Path, prefix: str) -> None:
    for path in sorted(directory.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            bundle.write(path, f"{prefix}/{path.relative_to(directory).as_posix()}")


def _add_text(bundle: zipfile.ZipFile, name: str, text: str, mode: int) -> None:
    info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
    info.external_attr = mode
    info.compress_type = zipfile.ZIP_DEFLATED
    bundle.writestr(info, text)


def write_gradescope_bundle(out: Path, wheel: Path, weights: Weights, grading: Grading, time_budget: float) -> None:
    """Write autograder.zip: setup.sh, run_autograder, bundle.env, the wheel, stages and weights."""
    stage_names = [f"stages/{i}-{d.resolve().name}" for i, d in enumerate(grading.stages_dirs, 1)]
    with atomic_file(out, binary=True) as f, zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as bundle:
        for script in ("setup.sh", "run_autograder"):
            _add_text(bundle, script, asset(f"autograder/{script}").read_text(), EXECUTABLE)
        _add_text(bundle, "bundle.env", bundle_env(wheel.name, weights, grading, stage_names, time_budget), READABLE)
        bundle.write(wheel, wheel.name, compress_type=zipfile.ZIP_STORED)
        for directory, name in zip(grading.stages_dirs, stage_names):
            _add_tree(bundle, directory, name)
        if weights.file is not None:
            # Random-looking floats do not compress: store them, and save the time.
            bundle.write(weights.file, "weights/model.safetensors", compress_type=zipfile.ZIP_STORED)
            config = weights.file.parent / "config.json"
            if config.is_file():
                bundle.write(config, "weights/config.json")


def copy_wheel(wheel: Path, dest_dir: Path) -> Path:
    """Put the wheel in dest_dir, replacing older theinference wheels there."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    for old in dest_dir.glob("theinference-*.whl"):
        if old.name != wheel.name:
            old.unlink()
    target = dest_dir / wheel.name
    if wheel.resolve() != target.resolve():
        shutil.copyfile(wheel, target)
    return target


def repo_path(path: Path, repo: Path) -> str:
    """path relative to the repository root, as a workflow names it; outside the repository is an error."""
    try:
        return path.resolve().relative_to(repo.resolve()).as_posix()
    except ValueError:
        raise AutograderError(
            f"{path} is outside the repository ({repo}): the workflow can only use files committed to it"
        ) from None


def parse_deadline(text: str) -> str:
    """An ISO 8601 date and time with its time zone ('2026-12-01T23:59:00+01:00', or Z for UTC), normalized."""
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise AutograderError(
            f"--deadline {text!r}: not an ISO 8601 date and time (e.g. 2026-12-01T23:59:00Z)"
        ) from None
    if moment.tzinfo is None:
        raise AutograderError(
            f"--deadline {text}: give its time zone (e.g. {moment.isoformat()}Z for UTC, or {moment.isoformat()}+01:00)"
        )
    return moment.isoformat()


def render_workflow(
    repo: Path, shards: int, wheel: Path, weights: Weights, grading: Grading, roster: Path, deadline: str | None = None
) -> str:
    """The GitHub Actions workflow that grades the roster's repositories on `shards` machines; with a deadline
    (see parse_deadline), each repository's last commit before it on its default branch."""
    if weights.file is None:
        weights_path = "weights/model.safetensors"
        command = f"theinference weights synth --preset {weights.preset} --seed {weights.seed} --out weights"
    else:
        weights_path = repo_path(weights.file, repo)
        command = f"theinference weights info {shlex.quote(weights_path)}"
    stages = [repo_path(d, repo) for d in grading.stages_dirs]
    if grading.cases_seed == "random":
        # One seed for the whole run, so every shard grades the same random cases.
        grading = dataclasses.replace(grading, cases_seed="${{ github.run_id }}")
    values = {
        "VERSION": __version__,
        "SHARDS": str(shards),
        "SHARD_LIST": ", ".join(map(str, range(1, shards + 1))),
        "WHEEL_PATH": shlex.quote(repo_path(wheel, repo)),
        "ROSTER": shlex.quote(repo_path(roster, repo)),
        "WEIGHTS_COMMAND": command,
        "GRADE_ARGS": shlex.join(["--weights", weights_path, *grading.grade_args(stages)]),
        "DEADLINE": deadline or "",
        "WHEN": (
            f"Each repository is graded at the last commit of its default branch dated before\n# {deadline} "
            "(the commit's own date: git records no push time)."
            if deadline
            else "Each repository's default branch is graded as it is when the\n# run starts."
        ),
    }
    text = asset("autograder/grade.yml").read_text()
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    return text
