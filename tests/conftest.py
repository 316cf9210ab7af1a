"""Shared fixtures: tiny synthetic weights, an isolated user environment, course builders."""

import os
import shutil
import subprocess
import sys
import textwrap
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import typer.testing
from typer.testing import CliRunner

from theinference.cli.app import app
from theinference.bundled import data_dir
from theinference.model.synth import write_synthetic
from theinference.model.weights import load_model
from theinference.model.weights_choice import synthetic_path
from theinference.proc.sandbox import ALLOW_ROOT_ENV

# typer builds the click command from the app again on every CliRunner.invoke (0.17 s on an idle machine, before the
# command runs; a test run invokes the CLI in-process hundreds of times). Built once per app here, as the installed
# `theinference` builds it once per process; each invocation still gets its own click context. The one setting typer
# reads while building (whether the completion options detect the shell) is part of the key.
_built_commands: dict[tuple[int, str | None], tuple[object, object]] = {}
_build_command = typer.testing._get_command


def _command_once(typer_app):
    key = (id(typer_app), os.environ.get("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION"))
    if key not in _built_commands:
        _built_commands[key] = (typer_app, _build_command(typer_app))
    return _built_commands[key][1]


typer.testing._get_command = _command_once

# Run as root with a Python that user nobody cannot read (pyenv under /root) and no bubblewrap,
# untrusted grading refuses to run student code at all. The suite grades its own fixtures, so it
# consents; the tests of that refusal (test_integrity_levels.py) take the consent away.
os.environ[ALLOW_ROOT_ENV] = "1"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny synthetic checkpoint (2 layers, 128 wide, vocab 50257), made once per test run."""
    out = tmp_path_factory.mktemp("weights") / "tiny"
    write_synthetic(out, preset="tiny", seed=0)
    return out


@pytest.fixture(scope="session")
def tiny_path(tiny_dir) -> Path:
    return tiny_dir / "model.safetensors"


@pytest.fixture(scope="session")
def proof_cache(tmp_path_factory) -> Path:
    """A user cache holding the synthetic `proof` preset cache-scaling runs on, made once per test run:
    point THEINFERENCE_CACHE at it (the preset is 40 MB and takes a second or two to make)."""
    cache = tmp_path_factory.mktemp("proof-cache")
    write_synthetic(synthetic_path("proof", {"THEINFERENCE_CACHE": str(cache)}).parent, preset="proof", seed=0)
    return cache


@pytest.fixture(scope="session")
def gallery_cache(tmp_path_factory) -> Path:
    """A user cache the gradings of the bundled galleries share (point THEINFERENCE_CACHE at it): its oracle store
    keeps the oracle's and the bug oracles' outputs for the tiny weights, which every `stages check` of a gallery
    (either edition, any mechanism) otherwise computes again. Shared by the xdist workers of one run (the store is
    safe for concurrent runs: oracle/store.py), never across runs."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "gallery-cache"
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture(scope="session")
def _worker_lock_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("grader-locks")
    path.chmod(0o700)
    return str(path)


@pytest.fixture(autouse=True)
def cost_lock_of_this_worker(_worker_lock_dir, monkeypatch):
    """The graders this test process runs in-process share their cost-stage lock with each other only, not with
    every root grader on the machine (the other xdist worker's, another checkout's): a test's untrusted grading
    otherwise waits, idle, for each cost stage graded anywhere else (63 s for a 5 s stage beside a cache-proof
    batch). The lock's own semantics across graders are tested in test_costlock.py; graders started as
    subprocesses (test_isolation.py's neighbours, the as-nobody runs) still take the machine's."""
    monkeypatch.setattr("theinference.grading.drive.grader.lock_dir", lambda: _worker_lock_dir)


@pytest.fixture(scope="session")
def tiny_model(tiny_path):
    return load_model(tiny_path)


def _isolate(monkeypatch, root: Path) -> None:
    """isolated_env's settings under root (also for a session fixture's gradings, solution_run)."""
    home = root / "home"
    home.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    for var, name in (("XDG_CACHE_HOME", "cache"), ("XDG_CONFIG_HOME", "config"), ("XDG_STATE_HOME", "state")):
        monkeypatch.setenv(var, str(home / name))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / "data"))
    monkeypatch.setenv("THEINFERENCE_CACHE", str(root / "user-cache"))
    monkeypatch.setenv("HF_HOME", str(root / "hf-home"))
    monkeypatch.chdir(root)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("THEINFERENCE_WEIGHTS", raising=False)
    monkeypatch.delenv("CI", raising=False)  # CI=true makes `test` untrusted; tests that need it set it
    monkeypatch.setenv(
        "COLUMNS", "160"
    )  # the width reports take off a terminal without COLUMNS (tests of 80: their own)
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """No test reads or writes the real user's home, caches or config, nor depends on the directory pytest
    was started in; output is plain at a fixed width. Subprocesses inherit all of it."""
    _isolate(monkeypatch, tmp_path)


def _bundled_files() -> dict[str, tuple[int, int]]:
    """Every file of the bundled course and stages (installed or in this checkout): path -> (size, mtime)."""
    found = {}
    for name in ("course", "stages"):
        for path in sorted(data_dir(name).rglob("*")):
            if path.is_file() or path.is_symlink():
                stat = path.lstat()
                found[str(path)] = (stat.st_size, stat.st_mtime_ns)
    return found


@pytest.fixture(scope="session", autouse=True)
def bundled_course_untouched():
    """Tests grade copies: after the whole run the bundled course and stages are as they were (no progress,
    no bytecode, no output left in them)."""
    before = _bundled_files()
    yield
    after = _bundled_files()
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    assert not changed, f"the test run wrote into the bundled course or stages: {changed[:10]}"


@pytest.fixture
def solution_course(tmp_path) -> Path:
    """A fresh copy of the bundled reference solution."""
    dest = tmp_path / "solution"
    shutil.copytree(data_dir("course") / "solution", dest)
    return dest


@pytest.fixture(scope="session")
def solution_run(tmp_path_factory, tiny_path, _worker_lock_dir):
    """`theinference test --course SOLUTION --weights TINY *args` through the real CLI (in-process), graded once per
    test run for each args: tests that only read what one grading of the bundled solution shows share it instead
    of grading it again. Each args grades its own copy of the solution (progress from one grading never changes
    another's report), in isolated_env's settings, from its own directory (a relative --output lands in
    `result.root`); the click Result is returned with `course` and `root` set.
    A test that changes the course, the environment or the weights grades its own (solution_course)."""
    runs: dict[tuple[str, ...], object] = {}

    def run(*args):
        key = tuple(str(a) for a in args)
        if key not in runs:
            root = tmp_path_factory.mktemp("solution-run")
            course = shutil.copytree(data_dir("course") / "solution", root / "solution")
            with pytest.MonkeyPatch.context() as monkeypatch:
                _isolate(monkeypatch, root)
                monkeypatch.setattr("theinference.grading.drive.grader.lock_dir", lambda: _worker_lock_dir)
                argv = ["test", "--course", str(course), "--weights", str(tiny_path), *key]
                result = CliRunner().invoke(app, argv, catch_exceptions=False)
            result.course, result.root = course, root
            runs[key] = result
        return runs[key]

    return run


@contextmanager
def leased_uid():
    """A uid no grading on this machine is using, leased as a root grader leases its students' (nobody, else a free
    uid below it: proc.sandbox.lease_uid), and held while a grader the test runs as that uid runs.

    A grader run as a non-root user takes no lease (it cannot write root's lease directory), so a root grader elsewhere
    (the other xdist worker's, another checkout's) could lease that uid for its student meanwhile and, after that
    student's run, kill every process of the uid: this grader with them (exit -9, no output, 3 s into a batch). Held
    here, no root grader leases it. Any free uid serves (the grader only needs to be someone other than root): two
    such tests in two test processes each take their own instead of waiting for each other's whole run."""
    from theinference.proc.sandbox import lease_uid

    uid, fd = lease_uid(set())
    try:
        yield uid
    finally:
        os.close(fd)


def write_adapters(course: Path, source: str) -> Path:
    """Make `course` a course whose tests/adapters.py is `source` (and src/ from the solution)."""
    if not (course / "src").exists():
        shutil.copytree(data_dir("course") / "solution" / "src", course / "src")
    (course / "tests").mkdir(parents=True, exist_ok=True)
    path = course / "tests" / "adapters.py"
    path.write_text(textwrap.dedent(source))
    return path


@pytest.fixture
def cli():
    """Invoke the real CLI in-process; returns the click Result (exit_code, output)."""
    runner = CliRunner()

    def invoke(*args):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke


def write_quick_scaling_stage(directory: Path, longest: int = 320) -> Path:
    """The built-in cache-scaling stage as `quick-scaling` at test-sized lengths (8 and 320 tokens, two
    rounds): the reference cache still passes both tests (about 16% of a recompute at 320, 35% passes),
    and a recompute is stopped after a few seconds of CPU instead of nine. A smaller `longest` serves tests
    of the stage's plumbing, not of its cost (its oracle generation is a full recompute per token)."""
    text = (data_dir("stages") / "cache-scaling.toml").read_text()
    lesson = data_dir("course") / "lessons" / "cache-scaling.md"
    for old, new in (
        ('id = "cache-scaling"', 'id = "quick-scaling"'),
        ("lengths = [8, 480]", f"lengths = [8, {longest}]"),
        ('lesson = "../course/lessons/cache-scaling.md"', f"lesson = {str(lesson)!r}"),
        ("repeats = 3", "repeats = 2"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "quick-scaling.toml").write_text(text)
    return directory


# A fresh interpreter importing numpy on an idle 2-core machine takes about this long (numpy 2, Python 3.11).
IDLE_START_SECONDS = 0.25


_measured: list[tuple[float, float]] = []  # (when, factor): one measurement serves the next few seconds' tests


def slowdown() -> float:
    """How many times slower than an idle machine this one starts a student's process right now (at least 1).

    A test whose deadline must cover student processes starting (a fresh interpreter importing numpy: 0.25 s
    idle, seconds on a busy machine) scales that deadline by this factor, measured when it needs it (or in
    the last 10 s), instead of hoping the machine is idle. It only ever lengthens a deadline."""
    if _measured and time.monotonic() - _measured[-1][0] < 10:
        return _measured[-1][1]
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import numpy"], check=True, capture_output=True)
    _measured.append((time.monotonic(), max(1.0, (time.perf_counter() - started) / IDLE_START_SECONDS)))
    return _measured[-1][1]


def scaled(seconds: float) -> float:
    """seconds scaled by the machine's slowdown now, to a tenth of a second (as a --timeout or budget)."""
    return round(seconds * slowdown(), 1)


@pytest.fixture(autouse=True)
def reap_students_zombies():
    """After each test: reap the zombies of non-root uids (the students') reparented to this process.

    A grader run in-process (CliRunner) makes the test process a subreaper, so a killed student's processes end as
    its zombies; nothing else waits for them, and each counts against its uid's RLIMIT_NPROC until reaped: a fork
    bomb's 1500 left every later run as nobody unable to fork (a whole CI run's sandbox tests failed)."""
    yield
    for pid, zombie, uid in my_children():
        if zombie and uid != 0:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue


def _child_pids() -> list[str]:
    """The pids of this process's children: the kernel's own list per thread (/proc/self/task/*/children, read in
    microseconds), else every pid on the machine (a kernel without that list; a scan of every /proc entry cost
    each test 25 ms idle and far more beside a fork bomb's leftovers)."""
    try:
        tasks = os.listdir("/proc/self/task")
        return [pid for tid in tasks for pid in Path(f"/proc/self/task/{tid}/children").read_text().split()]
    except OSError:
        return [entry for entry in os.listdir("/proc") if entry.isdigit()]


def my_children():
    """(pid, is a zombie, uid) of each process whose parent is this test process, read from /proc (none without it)."""
    if not os.path.isdir("/proc/self"):
        return
    me = os.getpid()
    for entry in _child_pids():
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
            if int(fields[b"PPid"]) == me:
                yield int(entry), fields[b"State"].strip().startswith(b"Z"), int(fields[b"Uid"].split()[0])
        except (OSError, KeyError, ValueError):
            continue


# What these modules prove are Linux mechanisms: bubblewrap, namespaces, cgroups, uids leased as root, /proc. On
# macOS and Windows (the project's own CI matrix, .github/workflows/tests.yml) they skip, saying so; a single test
# elsewhere that needs Linux carries @pytest.mark.linux.
LINUX_ONLY = {
    "test_sandbox.py": "bubblewrap and its sandbox are Linux's",
    "test_integrity.py": "the integrity attacks are proven against Linux's confinement (namespaces, cgroups, uids)",
    "test_integrity_levels.py": "the confinement levels below the sandbox are Linux's (unshare, uids, the subreaper)",
    "test_interrupt.py": "it checks process groups and the subreaper through /proc",
}


E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:  # the folder is the mark: `-m "not slow and not e2e"` is the everyday run
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.e2e)
    if sys.platform == "linux":
        return
    for item in items:
        reason = LINUX_ONLY.get(item.path.name)
        if reason is None and item.get_closest_marker("linux") is not None:
            reason = "it proves a Linux mechanism"
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=f"Linux only: {reason}"))
