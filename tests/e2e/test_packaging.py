"""The README's two commands in either order, repeated: grading the bundled course writes nothing into it,
and the wheel holds exactly the files git tracks (plus its own metadata), whatever lies beside them."""

import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import theinference
from theinference import __version__
from theinference.bundled import BUNDLED_MARK, data_dir
from theinference.grading.spec.stages import load_stages

STAGES = [s.id for s in load_stages([data_dir("stages")])]

# The checkout these tests live in (CI installs the package as a wheel, so the package itself is not in it).
REPO = Path(__file__).resolve().parents[2]
# Top-level directory in the checkout -> where the wheel carries it.
PACKAGED = {
    "theinference": "theinference",
    "stages": "theinference/_data/stages",
    "course": "theinference/_data/course",
}
DIST_INFO = {"METADATA", "WHEEL", "RECORD", "entry_points.txt"}
# What grading, Python, tools or an older theinference may leave in a checkout; git ignores every one.
LEFT_BEHIND = [
    "course/solution/.theinference/progress.json",
    "course/starter/.theinference/progress.json",
    "course/solution/src/__pycache__/kvcache.cpython-311.pyc",
    "course/solution/tests/__pycache__/adapters.cpython-311.pyc",
    "theinference/__pycache__/cli.cpython-311.pyc",
    "theinference/grading/stray.pyc",
    "stages/__pycache__/x.pyc",
    "course/lessons/build/notes.txt",
    "course/mutants/dist/x.whl",
    "theinference/x.egg-info/PKG-INFO",
]


def _tracked() -> list[str] | None:
    """The files git tracks in this checkout (as they are in the working tree), or None outside one."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return None
    done = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, text=True)
    if done.returncode != 0:
        return None
    return sorted(f for f in done.stdout.split("\0") if f and (REPO / f).is_file())


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _fresh_checkout(tracked: list[str], dest: Path) -> Path:
    """A copy of exactly the tracked files: what `git clone` of this working tree gives."""
    for name in tracked:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, dest / name)
    return dest


def _build_wheel(checkout: Path, out: Path) -> Path:
    """Build the wheel as `pip install .` does: hatchling, the backend pyproject.toml names, in the checkout."""
    done = subprocess.run(
        [sys.executable, "-c", f"from hatchling.build import build_wheel; print(build_wheel({str(out)!r}))"],
        cwd=checkout,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return out / done.stdout.split()[-1]


@pytest.mark.slow
@pytest.mark.skipif(_tracked() is None, reason="needs a git checkout of theinference")
@pytest.mark.skipif(importlib.util.find_spec("hatchling") is None, reason="building the wheel needs hatchling")
def test_the_wheel_holds_exactly_the_tracked_files_after_grading_the_bundled_solution(cli, tmp_path, tiny_path):
    tracked = _tracked()
    assert tracked is not None
    checkout = _fresh_checkout(tracked, tmp_path / "checkout")
    # The README's first command, in the fresh checkout (tiny weights for speed).
    graded = cli("test", "--all", "--course", checkout / "course" / "solution", "--weights", tiny_path)
    assert graded.exit_code == 0, graded.stdout
    assert "progress not kept" in graded.stderr and "bundled with theinference" in graded.stderr
    assert _files(checkout) == set(tracked), "grading wrote into the checkout"

    for name in LEFT_BEHIND:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text("left behind\n")
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=REPO,
        input="\n".join(LEFT_BEHIND),
        capture_output=True,
        text=True,
    ).stdout.split()
    assert ignored == LEFT_BEHIND, "each planted file must be one git ignores"

    wheel = _build_wheel(checkout, tmp_path / "dist")
    names = set(zipfile.ZipFile(wheel).namelist())
    info = f"theinference-{__version__}.dist-info"
    predicted = {
        f"{PACKAGED[top]}/{rest}" for top, _, rest in (f.partition("/") for f in tracked) if top in PACKAGED and rest
    }
    predicted |= {f"{info}/{name}" for name in DIST_INFO}
    assert names == predicted, (sorted(names - predicted), sorted(predicted - names))


def _bundled_copy(tmp_path: Path) -> Path:
    """The bundled course as another source checkout holds it (course/ beside theinference/): the bundled course.
    (A copy alone, marker and all, is the instructor's own: tests/test_authoring.py.)"""
    course = shutil.copytree(data_dir("course"), tmp_path / "course", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "theinference").mkdir()
    shutil.copy(Path(theinference.__file__).parent / "bundled.py", tmp_path / "theinference" / "bundled.py")
    assert (course / BUNDLED_MARK).is_file()
    return course


def test_the_bundled_solution_keeps_no_progress_and_says_so(cli, tmp_path, tiny_path):
    solution = _bundled_copy(tmp_path) / "solution"
    before = _files(solution)
    result = cli("test", "--course", solution, "--weights", tiny_path)
    assert result.exit_code == 0
    notice = " ".join(result.stderr.split())
    assert f"progress not kept: {solution} belongs to the course bundled with theinference" in notice
    assert "`theinference init DIR` makes a course of your own" in notice
    assert _files(solution) == before and not (solution / ".theinference").exists()
    # Nothing remembered: the next plain `test` grades the first stage again, and `stages list` shows none graded.
    again = json.loads(cli("test", "--course", solution, "--weights", tiny_path, "--format", "json").stdout)
    assert [s["id"] for s in again["stages"]] == STAGES[:1] and again["status"] == "pass"
    listing = cli("stages", "list", "--course", solution)
    assert listing.stdout.count("not graded") == len(STAGES)


def test_progress_an_older_version_left_in_the_bundled_course_is_not_read(cli, tmp_path, tiny_path):
    solution = _bundled_copy(tmp_path) / "solution"
    progress = solution / ".theinference" / "progress.json"
    progress.parent.mkdir()
    passed = {s: {"status": "pass", "at": "2026-01-01T00:00:00"} for s in STAGES[:2]}
    progress.write_text(json.dumps({"format_version": 1, "stages": passed}))
    listing = cli("stages", "list", "--course", solution)
    assert listing.stdout.count("not graded") == len(STAGES)
    result = cli("test", "--course", solution, "--weights", tiny_path, "--format", "json")
    assert [s["id"] for s in json.loads(result.stdout)["stages"]] == STAGES[:1]
    assert json.loads(progress.read_text())["stages"] == passed  # left as it was, not rewritten


def test_a_course_copied_out_of_the_bundle_keeps_its_progress(cli, tmp_path, tiny_path):
    solution = shutil.copytree(_bundled_copy(tmp_path) / "solution", tmp_path / "mine")
    result = cli("test", "--course", solution, "--weights", tiny_path)
    assert result.exit_code == 0 and "progress not kept" not in result.stderr
    recorded = json.loads((solution / ".theinference" / "progress.json").read_text())["stages"]
    assert recorded[STAGES[0]]["status"] == "pass"
