"""Attacks that broke outside the sandbox (issue: integrity at the weaker levels), through the real CLI.

Each test runs the attack at the level where it broke (a PATH without bubblewrap or unshare, a
grader run as root with a Python user nobody cannot read, plain `test`), shows it fails to gain
credit or damage anything, and, where the protection can be switched off, that it worked without.
"""

import contextlib
import hashlib
import itertools
import json
import os
import platform
import shutil
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import as_nobody

from conftest import leased_uid, my_children, scaled, write_adapters, write_quick_scaling_stage
from test_runner import SOLUTION_IMPORTS
from theinference.bundled import data_dir
from theinference.grading.spec.stages import load_stages
from theinference.proc.sandbox import ALLOW_ROOT_ENV, ALLOW_WEAK_ENV, NOBODY, reachable_by_others, submission_uids

STAGE = "prove-one-layer"
needs_linux = pytest.mark.skipif(sys.platform != "linux", reason="the subreaper monitor is Linux-only")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
PYTHON_PRIVATE = not reachable_by_others(Path(sys.executable))


def _grader(*args, env: dict, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "theinference", *map(str, args)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


def _run(*args, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "theinference", *map(str, args)], env=env, capture_output=True, timeout=timeout
    )
    return done


def _live(pid: str) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _left_behind(marker: str, course: Path | None = None, grader_pid: int | None = None) -> list[int]:
    """Live processes with marker in their command line, working in course, or started for grader_pid (a zygote)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        if int(entry) == os.getpid() or not _live(entry):
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            cwd = os.readlink(f"/proc/{entry}/cwd") if course else ""
            environ = Path(f"/proc/{entry}/environ").read_bytes() if grader_pid else b""
        except OSError:
            continue
        if (
            marker.encode() in cmdline
            or (course and cwd == str(course.resolve()))
            or (grader_pid and f"THEINFERENCE_GRADER_PID={grader_pid}".encode() in environ.split(b"\0"))
        ):
            found.append(int(entry))
    return found


def _wait_for(predicate, seconds: float = 120.0) -> bool:
    """Poll until predicate() holds; False if it never did (a generous bound, never a timing assertion)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def _kill(pids: list[int]) -> None:
    for pid in pids:  # only what this test started (found by its own unique marker)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --- 1. Silent root fallback ----------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not IS_ROOT, reason="the grader is not run as root here")
@pytest.mark.skipif(not PYTHON_PRIVATE, reason="this Python is readable by user nobody: nothing would run as root")
def test_untrusted_grading_refuses_to_run_student_code_as_root(tmp_path, tiny_path):
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    target = private / "owned.txt"
    write_adapters(
        tmp_path / "c",
        SOLUTION_IMPORTS + f"def run_layer_equiv(seq_ids):\n    open({str(target)!r}, 'w').write('owned')\n"
        "    return _solve(seq_ids)\n",
    )
    (tmp_path / "empty-bin").mkdir()
    env = {**os.environ, "PATH": str(tmp_path / "empty-bin"), "CI": "true"}  # no bwrap, no unshare
    env.pop(ALLOW_ROOT_ENV, None)
    args = ("test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", STAGE, "--format", "json")
    refused = _run(*args, env=env)
    assert refused.returncode == 2, refused.stderr.decode()
    message = " ".join(refused.stderr.decode().split())
    assert "refusing to run student code as root" in message and "apt-get install bubblewrap" in message
    assert not target.exists()
    # The same submission, with the instructor's explicit consent: it writes where only root may, and the report says.
    consented = _run(*args, "--allow-root", env=env)
    assert target.read_text() == "owned"
    assert "AS ROOT" in json.loads(consented.stdout)["isolation"]["summary"]


# --- 2. Subreaper escape: the student kills its monitor and leaves a daemon -----------------------------------------

FORGER = (
    SOLUTION_IMPORTS
    + """\
import os, signal, subprocess, sys, time

# Waits for the grader's results file, then replaces it with a forged pass.
FORGE = '''
import os, sys, time
path = sys.argv[1]
for _ in range(600):
    time.sleep(0.05)
    if os.path.exists(path):
        time.sleep(0.3)
        open(path, "w").write('{"status": "pass", "forged": true}')
        break
'''

_done = []

def run_layer_equiv(seq_ids):
    if not _done:  # once: afterwards its parent is no longer the monitor
        subprocess.Popen([sys.executable, "-c", FORGE, RESULTS, MARKER], start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.kill(os.getppid(), signal.SIGKILL)  # the monitor, which would have killed the daemon
        _done.append(1)
    return _solve(seq_ids)
"""
)
# The grader without its last lines of defence: it adopts no orphans, kills no strays, and makes no cgroup (whose
# removal kills whatever is left in it: as root, every run has one).
UNPROTECTED = (
    "import sys, theinference.proc.strays as s; s.adopt_orphans = lambda: None; s.kill_strays = lambda: 0; "
    "import theinference.proc.accounting as a; a.Cgroup.create = classmethod(lambda cls, *args: None); "
    "sys.argv[0] = 'theinference'; from theinference.cli.app import main; main()"
)


@pytest.mark.slow
@needs_linux
@pytest.mark.parametrize("launcher", ["zygote", "subprocess"])
def test_a_student_that_kills_its_monitor_gets_an_error_and_its_daemon_dies(tmp_path, tiny_path, launcher):
    marker, results = f"forger-{uuid.uuid4()}", tmp_path / "results.json"
    write_adapters(tmp_path / "c", FORGER.replace("RESULTS, MARKER", f"{str(results)!r}, {marker!r}"))
    env = {**os.environ, "THEINFERENCE_LAUNCHER": launcher}
    args = ["test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", STAGE, "--format", "json"]
    done = _run(*args, "--output", results, env=env)
    assert done.returncode == 1, done.stderr.decode()
    time.sleep(1.5)  # what a surviving forger would need to strike
    assert _left_behind(marker) == []
    doc = json.loads(results.read_text())
    assert "forged" not in doc and doc["stages"][0]["status"] == "error"
    assert "killed its monitor" in doc["stages"][0]["cases"][0]["message"]
    # Without the grader adopting and killing what the dead monitor left, the daemon forges the results.
    results.unlink()  # the forger strikes once the grader has written them
    unprotected = subprocess.run(
        [sys.executable, "-c", UNPROTECTED, *map(str, args), "--output", results],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert unprotected.returncode == 1, unprotected.stderr.decode()
    try:
        assert _wait_for(lambda: "forged" in results.read_text(), 60)
    finally:
        _kill(_left_behind(marker))


# --- 6. A SIGKILLed grader leaves nothing running -------------------------------------------------------------------

SLEEPER = """\
import subprocess, sys, time

def run_layer_equiv(seq_ids):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", MARKER], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(300)
"""


@pytest.mark.slow
@needs_linux
@pytest.mark.parametrize("mode", ["zygote", "subprocess", "untrusted"])
def test_sigkilling_the_grader_leaves_no_student_process_running(tmp_path, tiny_path, mode):
    marker, course = f"sleeper-{uuid.uuid4()}", tmp_path / "c"
    write_adapters(course, SLEEPER.replace("MARKER", repr(marker)))
    env = {
        **os.environ,
        "THEINFERENCE_LAUNCHER": "subprocess" if mode == "subprocess" else "zygote",
        "CI": "true" if mode == "untrusted" else "false",
    }
    grader = _grader("test", "--course", course, "--weights", tiny_path, "--stage", STAGE, "--timeout", "600", env=env)
    try:
        assert _wait_for(lambda: _left_behind(marker) != [] or grader.poll() is not None), "the sleeper never started"
        assert grader.poll() is None, grader.stderr.read().decode() if grader.stderr else ""
        grader.kill()
        grader.wait()
        # Monitors see the grader die (PR_SET_PDEATHSIG, end-of-file) and kill their trees; the zygote dies with it.
        assert _wait_for(lambda: _left_behind(marker, course, grader.pid) == [], scaled(20)), _left_behind(
            marker, course, grader.pid
        )
    finally:
        _kill(_left_behind(marker))
        grader.kill()
        grader.wait()


# --- 6. The temp directories a SIGKILLed grader leaves are removed by the next grader, a live one's never -----------


def _ours(directory: Path) -> set[str]:
    return {name for name in os.listdir(directory) if name.startswith("theinference-")}


@pytest.mark.slow
@needs_linux
def test_the_next_grader_removes_a_sigkilled_graders_temp_dirs_and_none_of_a_live_ones(tmp_path, tiny_path,
                                                                                        solution_course):  # fmt: skip
    import tempfile

    grader_tmp = Path(tempfile.mkdtemp(prefix="ti-left-"))  # short: the zygote's socket goes there too
    env = {**os.environ, "TMPDIR": str(grader_tmp), "THEINFERENCE_LAUNCHER": "zygote"}
    markers, graders = [f"sleeper-{uuid.uuid4()}", f"sleeper-{uuid.uuid4()}"], []
    for marker, name in zip(markers, ("killed", "live")):
        write_adapters(tmp_path / name, SLEEPER.replace("MARKER", repr(marker)))

    def start(name: str, marker: str) -> tuple[subprocess.Popen, set[str]]:
        """A grader whose student sleeps; the temp dirs it made (its zygote's and its student's run directory)."""
        before = _ours(grader_tmp)
        grader = _grader("test", "--course", tmp_path / name, "--weights", tiny_path, "--stage", STAGE,
                         "--timeout", "600", env=env)  # fmt: skip
        graders.append(grader)
        assert _wait_for(lambda: _left_behind(marker) != [] or grader.poll() is not None), "the sleeper never started"
        assert grader.poll() is None, grader.stderr.read().decode() if grader.stderr else ""
        made = {name for name in _ours(grader_tmp) - before if "-owner-" not in name}
        assert any(name.startswith("theinference-run-") for name in made), made
        return grader, made

    try:
        killed, left = start("killed", markers[0])
        killed.kill()
        killed.wait()
        assert _wait_for(lambda: _left_behind(markers[0]) == [], scaled(20))  # its students died with it
        assert left <= _ours(grader_tmp)  # what the kernel cannot clean up for it
        live, in_use = start("live", markers[1])
        done = _run("test", "--course", solution_course, "--weights", tiny_path, "--stage", STAGE, env=env)
        assert done.returncode == 0, done.stderr.decode()
        remaining = _ours(grader_tmp)
        assert not left & remaining, left & remaining
        assert in_use <= remaining, in_use - remaining
        assert live.poll() is None  # and the live grader's student still runs, its directories intact
    finally:
        for grader in graders:
            grader.kill()
            grader.wait()
        _kill(_left_behind(markers[0]) + _left_behind(markers[1]))
        shutil.rmtree(grader_tmp, ignore_errors=True)


# --- 6. `stages check` stops on SIGTERM like `test` -----------------------------------------------------------------


@pytest.mark.slow
@needs_linux
def test_stages_check_stops_at_the_first_sigterm_and_kills_its_students(tmp_path, tiny_path):
    marker, source = f"starter-{uuid.uuid4()}", tmp_path / "course"
    shutil.copytree(Path(__file__).parents[2] / "course" / "solution", source / "solution")
    # The starter (graded after the solution, with the other subjects in parallel) hangs in a marked process.
    write_adapters(
        source / "starter",
        f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', 'import time; time.sleep(300)', {marker!r}])\n",
    )
    checker = _grader(
        "stages",
        "check",
        "--source",
        source,
        "--weights",
        tiny_path,
        "--stage",
        STAGE,
        "--timeout",
        "600",
        env=dict(os.environ),
    )
    try:
        assert _wait_for(lambda: _left_behind(marker) != [] or checker.poll() is not None), "the starter never ran"
        assert checker.poll() is None, checker.stderr.read().decode() if checker.stderr else ""
        checker.send_signal(signal.SIGTERM)
        assert checker.wait(timeout=120) == 128 + signal.SIGTERM
        assert _wait_for(lambda: _left_behind(marker) == [], 20)
    finally:
        _kill(_left_behind(marker))
        checker.kill()
        checker.wait()


# --- 3. The batch: a leftover run directory is reported, never exit 3 ------------------------------------------------


def test_a_run_directory_that_cannot_be_removed_costs_no_grades(cli, tmp_path, tiny_path, monkeypatch):
    from types import SimpleNamespace

    from theinference.proc import runner

    for name in ("a", "b"):
        write_adapters(tmp_path / "subs" / name, SOLUTION_IMPORTS + "def run_layer_equiv(s):\n    return _solve(s)\n")
    # As when another submission's process keeps creating files in it while it is removed.
    monkeypatch.setattr(runner, "shutil", SimpleNamespace(rmtree=lambda *a, **k: None))
    monkeypatch.setattr(runner, "LEFTOVERS", [])
    monkeypatch.setattr("theinference.cli.grade.LEFTOVERS", runner.LEFTOVERS)
    out = tmp_path / "grades.csv"
    result = cli("grade", tmp_path / "subs" / "a", tmp_path / "subs" / "b", "--stage", STAGE, "--weights", tiny_path,
                 "--out", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "run directory(ies) could not be removed" in " ".join(result.output.split())
    rows = out.read_text().splitlines()
    assert len(rows) == 3 and all(",pass," in row for row in rows[1:])
    for leftover in runner.LEFTOVERS:
        shutil.rmtree(leftover)


@pytest.mark.skipif(not IS_ROOT, reason="only root gives student code a uid of its own")
def test_each_submission_runs_as_a_uid_no_other_grading_on_this_machine_holds():
    from theinference.proc.launch import SubprocessLauncher
    from theinference.proc.sandbox import NOBODY, Isolation

    ours, theirs = (SubprocessLauncher(Isolation("unprivileged", "as nobody", run_as=NOBODY)) for _ in range(2))
    uids = [ours._uid_for(course) for course in ("/a", "/b", "/c", "/a")]
    assert len(set(uids)) == 3 and uids[3] == uids[0]  # a batch: one uid per submission
    other = theirs._uid_for("/a")  # another grader at the same time: none of ours
    assert other not in uids
    ours.close()
    again = SubprocessLauncher(Isolation("unprivileged", "as nobody", run_as=NOBODY))
    assert again._uid_for("/a") in uids  # released with the launcher (and by the kernel when a grader dies)
    theirs.close()
    again.close()


UID_REPORTER = """\
import os

def run_layer_equiv(seq_ids):
    print("running as uid", os.getuid())
    raise RuntimeError("done")
"""


@pytest.mark.slow
@needs_linux
@pytest.mark.skipif(not IS_ROOT, reason="only root gives student code a uid of its own")
def test_two_gradings_at_once_never_run_their_students_as_one_uid(tmp_path, tiny_path):
    """Another grader holds the first uid (nobody): this one's student runs as another, so neither can signal the
    other's processes or write into its run directory."""
    from theinference.proc.sandbox import lease_uid

    held, lease = lease_uid(set())
    try:
        write_adapters(tmp_path / "c", UID_REPORTER)
        args = ("test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", STAGE, "--format", "json")
        doc = json.loads(_run(*args, env={**os.environ, "CI": "true"}).stdout)
    finally:
        os.close(lease)
    stdout = doc["stages"][0]["cases"][0]["stdout"]
    uid = int(stdout.split("running as uid ")[1].split()[0])
    assert uid not in (0, held), stdout


@needs_linux
@pytest.mark.skipif(not IS_ROOT, reason="only root leases uids for students")
def test_a_uid_that_runs_processes_is_not_leased_to_a_student(monkeypatch):
    """A grader running as nobody takes no lease: a root grader must still not run its students as nobody then."""
    from theinference.proc import sandbox

    busy, free = list(sandbox.submission_uids())[-4:-2]  # uids no other test here takes (nobody is the first)
    monkeypatch.setattr(sandbox, "submission_uids", lambda: iter([busy, free]))
    other_grader = subprocess.Popen(["setpriv", f"--reuid={busy}", f"--regid={busy}", "--clear-groups", "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while not sandbox.runs_processes(busy) and time.monotonic() < deadline:
            time.sleep(0.05)
        held, lease = sandbox.lease_uid(set())
        os.close(lease)
    finally:
        other_grader.kill()
        other_grader.wait()
    assert held == free
    assert not sandbox.runs_processes(busy)


# --- 4. Root follows a student's symlink ----------------------------------------------------------------------------


def test_grade_writes_its_results_through_no_planted_symlink(cli, tmp_path, tiny_path):
    write_adapters(tmp_path / "subs" / "a", SOLUTION_IMPORTS + "def run_layer_equiv(s):\n    return _solve(s)\n")
    victim = tmp_path / "root-only.txt"
    victim.write_text("precious\n")
    shared = tmp_path / "shared"  # a directory a student can write into
    shared.mkdir()
    for name in ("grades.csv", "grades.csv.tmp", ".grades.csv.tmp"):
        (shared / name).symlink_to(victim)
    result = cli(
        "grade", tmp_path / "subs" / "a", "--stage", STAGE, "--weights", tiny_path, "--out", shared / "grades.csv"
    )
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "precious\n"
    grades = shared / "grades.csv"
    assert not grades.is_symlink() and "pass" in grades.read_text()


# --- 5. Weights poisoning --------------------------------------------------------------------------------------------

POISONER = """\
import numpy as np
import theinference
from safetensors.numpy import load_file, save_file

def run_layer_equiv(seq_ids):
    path = theinference.weights_path()
    save_file({k: np.zeros_like(v) for k, v in load_file(path).items()}, path, metadata={"format": "pt"})
    return np.zeros((len(seq_ids), 128))
"""
ZERO_WORK = "import numpy as np\ndef run_layer_equiv(seq_ids):\n    return np.zeros((len(seq_ids), 128))\n"


@pytest.mark.slow
def test_a_poisoned_preset_is_remade_before_any_grading_uses_it(cli, tmp_path, solution_course):
    from theinference.model.synth import made_digest
    from theinference.model.weights_choice import synthetic_path

    write_adapters(tmp_path / "hostile", POISONER)
    write_adapters(tmp_path / "lazy", ZERO_WORK)
    common = ("--stage", STAGE, "--weights", "tiny", "--format", "json")
    cli("test", "--course", tmp_path / "hostile", *common)  # plain test of a hostile course: it runs as the user
    made = synthetic_path("tiny")
    assert not np_any(made), "the hostile course did not zero the cached checkpoint"
    # Untrusted grading checks it, makes it again (never exit 2), says so in the report, and grades on true weights.
    remade = cli("test", "--untrusted", "--course", tmp_path / "lazy", *common)
    assert remade.exit_code == 1, remade.output
    doc = json.loads(remade.stdout)
    assert doc["points"] == 0
    assert any(str(made) in n and "was altered since it was made" in n for n in doc["notices"]), doc["notices"]
    assert hashlib.sha256(made.read_bytes()).hexdigest() == made_digest("tiny", 0)
    # Plain test does the same, and the honest solution passes again.
    cli("test", "--course", tmp_path / "hostile", *common)
    assert cli("test", "--course", solution_course, *common).exit_code == 0
    assert hashlib.sha256(made.read_bytes()).hexdigest() == made_digest("tiny", 0)
    # Without the check, the poisoned checkpoint gives the zero-work submission every point.
    cli("test", "--course", tmp_path / "hostile", *common)
    unverified = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, theinference.model.weights_choice as w; w.preset_problem = lambda *a: None; "
            "sys.argv[0] = 'theinference'; from theinference.cli.app import main; main()",
            "test",
            "--untrusted",
            "--course",
            tmp_path / "lazy",
            *common,
        ],
        env=dict(os.environ),
        capture_output=True,
        timeout=300,
    )
    assert unverified.returncode == 0 and json.loads(unverified.stdout)["status"] == "pass"


@pytest.mark.slow
def test_a_poisoned_proof_preset_is_remade_in_untrusted_grading(cli, tmp_path, solution_course, proof_cache, tiny_path):
    """cache-scaling's own weights, made in the same cache a student's plain `test` could write, are checked too:
    one altered is made again (a notice in the stage's weights note), never exit 2 for every later grading."""
    from theinference.model.synth import made_digest
    from theinference.model.weights_choice import synthetic_path

    made = synthetic_path("proof")
    shutil.copytree(synthetic_path("proof", {"THEINFERENCE_CACHE": str(proof_cache)}).parent, made.parent)
    with open(made, "r+b") as f:  # one weight changed: the last tensor's last bytes (zeros as made)
        f.seek(-4, os.SEEK_END)
        f.write(b"\x01\x02\x03\x04")
    stages = write_quick_scaling_stage(tmp_path / "stages", longest=32)  # its plumbing only, not its cost
    args = ("--course", solution_course, "--weights", tiny_path, "--stages-dir", stages, "--stage", "quick-scaling")
    graded = cli("test", "--untrusted", *args, "--format", "json")
    assert graded.exit_code in (0, 1), graded.output
    note = json.loads(graded.stdout)["stages"][0]["cases"][0]["scaling"]["weights_note"]
    assert str(made) in note and "was altered since it was made" in note, note
    assert hashlib.sha256(made.read_bytes()).hexdigest() == made_digest("proof", 0)


def np_any(path: Path) -> bool:
    from safetensors.numpy import load_file

    return any(v.any() for v in load_file(path).values())


def test_the_known_digest_of_the_tiny_preset_is_what_it_makes(tiny_path):
    from theinference.model.synth import PRESET_DIGESTS, SYNTH_VERSION

    # One digest per OpenBLAS kernel family: this machine's must be among them (the table is not stale).
    assert hashlib.sha256(tiny_path.read_bytes()).hexdigest() in PRESET_DIGESTS[("tiny", 0, SYNTH_VERSION)]


def _runs_openblas_kernels(flag: str) -> str:
    """Why OpenBLAS cannot be told to use the kernels that need this CPU flag here ("" if it can)."""
    from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

    if platform.machine() not in ("x86_64", "AMD64"):
        return "OpenBLAS's x86 kernel families exist on x86 only"
    if not any(lib.get("internal_api") == "openblas" for lib in threadpool_info()):
        return "numpy here does not use OpenBLAS"
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "no /proc/cpuinfo to read the CPU's flags from"
    return "" if flag in flags else f"this CPU lacks {flag}: those kernels would not run"


@pytest.mark.slow
@pytest.mark.parametrize("kernels, flag", [("Haswell", "avx2"), ("SkylakeX", "avx512f"), ("Sandybridge", "avx")])
def test_the_tiny_preset_made_with_each_blas_kernel_family_is_in_the_known_digests(kernels, flag):
    """The same code makes other bytes with other BLAS kernels (a CPU without AVX-512, say): each is known."""
    from theinference.model.synth import PRESET_DIGESTS, SYNTH_VERSION

    if why := _runs_openblas_kernels(flag):
        pytest.skip(why)

    made = subprocess.run(
        [sys.executable, "-c", "from theinference.model.synth import made_digest; print(made_digest('tiny', 0))"],
        env={**os.environ, "OPENBLAS_CORETYPE": kernels},
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert made.stdout.strip() in PRESET_DIGESTS[("tiny", 0, SYNTH_VERSION)]


def test_a_machine_that_makes_other_bytes_checks_against_its_own_digest(tmp_path, tiny_dir, monkeypatch):
    """Another CPU or numpy may draw other bytes than the known digest's: the preset is then checked against
    what this machine makes (drawn in memory), so an intact one is used and an altered one still refused."""
    from safetensors.numpy import load_file, save_file

    from theinference.model import synth

    monkeypatch.setitem(synth.PRESET_DIGESTS, ("tiny", 0, synth.SYNTH_VERSION), ("0" * 64,))
    monkeypatch.setattr(synth, "_MADE", {})
    intact = tiny_dir / "model.safetensors"
    assert synth.preset_problem(intact, "tiny", 0) is None
    altered = tmp_path / "tiny"
    shutil.copytree(tiny_dir, altered)
    tensors = load_file(altered / "model.safetensors")
    tensors["ln_f.bias"] = tensors["ln_f.bias"] + 1
    save_file(tensors, altered / "model.safetensors", metadata={"format": "pt"})
    assert "the file was changed" in (synth.preset_problem(altered / "model.safetensors", "tiny", 0) or "")


# --- 8. Copies of the reference solution, and of each other ---------------------------------------------------------


SHARED_HELPER = """

def top_tokens(params, ids, n_head, k=5):
    logits, _ = prefill(params, ids, n_head)
    order = np.argsort(-logits[-1])[:k]
    return [(int(t), float(logits[-1][t])) for t in order if logits[-1][t] > logits[-1].mean()]
"""


@pytest.mark.slow
def test_grade_flags_a_disguised_copy_of_the_solution_and_two_identical_submissions(cli, tmp_path, tiny_path):
    from theinference.bundled import data_dir

    subs, solution = tmp_path / "subs", data_dir("course") / "solution"
    shutil.copytree(solution, subs / "copier")
    kvcache = subs / "copier" / "src" / "kvcache.py"
    disguised = kvcache.read_text().replace("params", "weights_by_name").replace("    ", "        ")
    kvcache.write_text("# my own work\n\n" + disguised.replace("\n\n", "\n\n\n# think\n"))
    for twin in ("twin-a", "twin-b"):
        shutil.copytree(solution, subs / twin)
        path = subs / twin / "src" / "kvcache.py"
        path.write_text(path.read_text() + SHARED_HELPER)
    shutil.copytree(data_dir("course") / "starter", subs / "honest")  # not started: nothing to flag
    args = [*sorted(subs.iterdir()), "--stage", STAGE, "--weights", tiny_path]
    assert cli("grade", *args, "--out", tmp_path / "grades.csv").exit_code == 0
    import csv

    rows = {r["id"]: r for r in csv.DictReader((tmp_path / "grades.csv").open())}
    assert rows["copier"]["copy_of"] == "reference-solution 100%: src/gpt2.py src/kvcache.py tests/adapters.py"
    assert rows["copier"]["status"] == "pass"  # a flag, never a silent zero
    assert (
        rows["twin-a"]["copy_of"]
        == "reference-solution 93%: src/gpt2.py src/kvcache.py tests/adapters.py; twin-b 100%: src/kvcache.py"
    )
    assert rows["honest"]["copy_of"] == ""
    cli("grade", *args, "--format", "json", "--out", tmp_path / "grades.json")
    doc = {s["id"]: s for s in json.loads((tmp_path / "grades.json").read_text())["submissions"]}
    twin = doc["twin-b"]["copy_of"][1]
    assert (twin["of"], twin["files"], twin["similarity"]) == ("twin-a", ["src/kvcache.py"], 1.0)
    assert "def top_tokens" in "".join(r["text"] for r in twin["regions"])  # the passage they share


# --- 1. (Gradescope) run_autograder fails closed; 8. bundles without the solution ----------------------------------


def test_run_autograder_discards_results_a_killed_grader_leaves_behind(cli, tmp_path, tiny_path):
    from test_autograder import build, run_autograder

    from theinference import __version__

    root = build(cli, tmp_path, _fake_wheel(tmp_path / "dist" / f"theinference-{__version__}-py3-none-any.whl"),
                 "--weights", tiny_path)  # fmt: skip
    fake = tmp_path / "fake-bin"
    fake.mkdir()
    # A grader killed mid-run while something else (a student's daemon) writes full marks where results go.
    forged = '{"score": 75, "output": "forged", "tests": []}'
    (fake / "theinference").write_text(
        f"#!/bin/sh\necho '{forged}' > \"$AUTOGRADER_ROOT/results/results.json\"\nkill -9 $$\n"
    )
    (fake / "theinference").chmod(0o755)
    write_adapters(tmp_path / "sub", "def run_layer_equiv(seq_ids):\n    raise NotImplementedError\n")
    doc = run_autograder(root, tmp_path / "sub", path=str(fake))
    assert doc["score"] == 0 and "forged" not in doc["output"] and "could not be graded" in doc["output"]


def _fake_wheel(path: Path) -> Path:
    import zipfile

    names = [
        "theinference/__init__.py",
        "theinference/_data/course/solution/src/kvcache.py",
        "theinference/_data/course/mutants/m/mutant.toml",
        "theinference/_data/course/starter/src/kvcache.py",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name in names:
            z.writestr(name, "x = 1\n")
        z.writestr("theinference-0.dist-info/RECORD", "".join(f"{n},sha256=x,6\n" for n in names))
    return path


def test_the_wheel_and_the_gradescope_bundle_can_leave_the_solution_out(cli, tmp_path, tiny_path):
    import zipfile

    from theinference import __version__

    wheel = _fake_wheel(tmp_path / "dist" / f"theinference-{__version__}-py3-none-any.whl")
    assert cli("autograder", "wheel", "--wheel", wheel, "--without-solution", "--out", tmp_path / "out").exit_code == 0
    with zipfile.ZipFile(tmp_path / "out" / wheel.name) as z:
        names, record = z.namelist(), z.read("theinference-0.dist-info/RECORD").decode()
    assert "theinference/_data/course/starter/src/kvcache.py" in names and "theinference/__init__.py" in record
    assert not [n for n in names + record.splitlines() if "/solution/" in n or "/mutants/" in n]
    out = tmp_path / "autograder.zip"
    args = ("--out", out, "--wheel", wheel, "--weights", tiny_path)
    for without in (False, True):
        assert cli("autograder", "gradescope", *args, *(["--without-solution"] if without else [])).exit_code == 0
        with zipfile.ZipFile(out) as bundle, zipfile.ZipFile(bundle.open(wheel.name)) as carried:
            has_solution = "theinference/_data/course/solution/src/kvcache.py" in carried.namelist()
        assert has_solution is not without


# --- 7. Resources: a process cap on the submission's own uid ---------------------------------------------------------

FORKER = """\
import os, time

def run_layer_equiv(seq_ids):
    started = 0
    for _ in range(400):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        started += 1
    raise RuntimeError(f"started {started} processes")
"""


@pytest.mark.slow
@needs_linux
@pytest.mark.skipif(not IS_ROOT, reason="only root can give student code a uid of its own")
def test_a_fork_bomb_stops_at_the_process_cap_of_its_uid(tmp_path, tiny_path):
    from theinference.proc.child import MAX_PROCESSES
    from theinference.proc.sandbox import strongest_isolation

    if strongest_isolation().run_as is None:
        pytest.skip("student code cannot run as a uid of its own here (no bubblewrap, Python private to root)")
    write_adapters(tmp_path / "c", FORKER)
    env = {**os.environ, "CI": "true"}
    args = ("test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", STAGE, "--format", "json")
    doc = json.loads(_run(*args, env=env).stdout)
    message = doc["stages"][0]["cases"][0]["message"]
    started = int(message.split("started ")[1].split()[0])
    assert 0 < started < MAX_PROCESSES


# --- 7. Resources: a disk quota on the run directory (its $TMPDIR) -------------------------------------------------

FILL_MB, QUOTA_MB = 64, 8  # the attack writes 8 times the (instructor's, scaled-down) quota
DISK_FILLER = f"""\
import os, tempfile, uuid

def run_layer_equiv(seq_ids):
    where, chunk, written = tempfile.gettempdir(), os.urandom(1 << 20), 0
    for _ in range({FILL_MB}):  # 1 MB files: no single file is over the quota, only all of them together
        with open(os.path.join(where, f"fill-{{uuid.uuid4()}}"), "wb") as f:
            f.write(chunk)
        written += 1
    raise RuntimeError(f"wrote {{written}} MB into {{where}}")
"""


def _quota_stopped(doc: dict) -> None:
    """Every case ended on the quota, named with its size: never a grader crash or the student's own words."""
    cases = doc["stages"][0]["cases"]
    for case in cases:
        assert case["status"] == "error", case
        assert f"{QUOTA_MB} MB" in case["message"] and "run directory" in case["message"], case["message"]
        assert "wrote 64 MB" not in case["message"]


def _unprotected(doc: dict) -> None:
    """With the quota raised above what it writes, the attack writes all of it (it is real)."""
    message = doc["stages"][0]["cases"][0]["message"]
    assert message.startswith(f"RuntimeError: wrote {FILL_MB} MB into "), message


def _peak(directory: Path, stop) -> list[int]:
    """Sample the bytes under directory until stop is set; the largest seen (a lower bound of the true peak)."""
    peak = [0]
    while not stop.is_set():
        total = 0
        for root, _, files in os.walk(directory):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
        peak[0] = max(peak[0], total)
        time.sleep(0.005)
    return peak


@pytest.mark.slow
@needs_linux
@pytest.mark.parametrize("level", ["sandbox", "zygote", "no-bwrap"])
def test_a_submission_filling_its_run_directory_is_stopped_at_the_quota(tmp_path, tiny_path, level):
    """sandbox: `test --untrusted` under bubblewrap (a tmpfs of the quota's size); zygote: plain `test`; no-bwrap:
    untrusted with neither bwrap nor unshare on PATH (the grader's measurement of the run directory)."""
    import tempfile
    import threading

    from test_runner import quick_stage_dir
    from theinference.proc.sandbox import strongest_isolation

    if level == "sandbox" and strongest_isolation(allow_root=True).level != "sandbox":
        pytest.skip("no working bubblewrap sandbox here")
    write_adapters(tmp_path / "c", DISK_FILLER)
    # Where the grader makes its run directories (a short path: the zygote's socket goes there too).
    grader_tmp = Path(tempfile.mkdtemp(prefix="ti-quota-"))
    env = {**os.environ, "TMPDIR": str(grader_tmp), "THEINFERENCE_RUN_DIR_MB": str(QUOTA_MB)}
    if level != "zygote":
        env["CI"] = "true"
    if level == "no-bwrap":
        env |= {"PATH": str(Path(sys.executable).parent), ALLOW_ROOT_ENV: "1"}
    args = ["test", "--course", tmp_path / "c", "--weights", tiny_path, "--stages-dir", quick_stage_dir(tmp_path)]
    args += ["--stage", "quick-layer", "--format", "json"]
    peak: list[int] = []
    stop = threading.Event()
    sampler = threading.Thread(target=lambda: peak.extend(_peak(grader_tmp, stop)))
    sampler.start()
    try:
        done = _run(*args, env=env)
        stop.set()
        sampler.join()
        assert done.returncode == 1, done.stderr.decode()
        doc = json.loads(done.stdout)
        assert doc["isolation"]["level"] == ("sandbox" if level == "sandbox" else "subreaper")
        _quota_stopped(doc)
        assert list(grader_tmp.iterdir()) == []  # every run directory is gone
        if level == "sandbox":  # the tmpfs took the writes: the grader's disk saw none of them
            assert peak[0] < 2**20, peak
        _unprotected(json.loads(_run(*args, env={**env, "THEINFERENCE_RUN_DIR_MB": "1024"}).stdout))
    finally:
        stop.set()
        shutil.rmtree(grader_tmp, ignore_errors=True)


# --- 2, 3, 6 as a non-root user: no bubblewrap, no unshare, the grader's own uid (the `subreaper` level) -----------

# setpriv to user nobody needs root; this Python is made reachable for nobody where it is not (tests/e2e/as_nobody.py).
NOBODY_CAN_RUN = not as_nobody.available()
needs_nobody = pytest.mark.skipif(not NOBODY_CAN_RUN, reason=as_nobody.available() or "-")


@pytest.fixture
def weak(tmp_path_factory, tiny_dir):
    """A directory with a copy of the tiny weights, owned by the user the grader runs as there: nobody, or another uid
    of no account when a grading elsewhere holds nobody (conftest.leased_uid, held from the first grader run as it to
    the test's end, so no root grader beside it leases the uid and kills this one's graders). `command.uid()` is
    that uid (nobody before any such run)."""
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="theinference-weak-"))
    os.chmod(work, 0o755)
    shutil.copytree(tiny_dir, work / "tiny")
    leases = contextlib.ExitStack()
    held: list[int] = []

    def command(*args, script: str | None = None, level: str = "subreaper", env: dict | None = None) -> list[str]:
        """The grader: as that user with nothing on PATH (subreaper), only unshare (nobody-namespaces) or bubblewrap
        too (nobody-sandbox), or as root
        with only unshare (namespaces) or nothing (unprivileged) on PATH; no THEINFERENCE_ALLOW_ROOT either way,
        THEINFERENCE_ALLOW_WEAK_ISOLATION=1 (the subreaper level's consent), and `env`."""
        as_user = level in ("subreaper", "nobody-namespaces", "nobody-sandbox")
        if as_user and not held:
            held.append(leases.enter_context(leased_uid()))
        uid = command.uid()
        subprocess.run(["chown", "-R", f"{uid}:{uid}", str(work)], check=True)
        bin_dir = work / f"bin-{level}"
        if not bin_dir.exists():
            bin_dir.mkdir()
            if level in ("namespaces", "nobody-namespaces", "nobody-sandbox"):  # `true`: the probes run it
                for name in ("unshare", "true", *(["bwrap"] if level == "nobody-sandbox" else [])):
                    os.symlink(shutil.which(name) or name, bin_dir / name)
        base = {"PATH": str(bin_dir), "HOME": str(work), "THEINFERENCE_CACHE": str(work / "cache"), "CI": "true"}
        base[ALLOW_WEAK_ENV] = "1"  # these tests grade at the subreaper level for other ends (test_isolation.py)
        python = [sys.executable, "-c", script] if script else [sys.executable, "-m", "theinference"]
        return as_nobody.command([*python, *map(str, args)], {**base, **(env or {})}, as_nobody_too=as_user, uid=uid)

    command.uid = lambda: held[0] if held else NOBODY  # type: ignore[attr-defined]
    with leases:
        yield work, command
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.slow
@needs_linux
@needs_nobody
def test_as_a_non_root_user_a_monitor_killer_gets_an_error_and_its_daemon_dies(weak):
    work, command = weak
    marker, results = f"forger-{uuid.uuid4()}", work / "results.json"
    write_adapters(work / "c", FORGER.replace("RESULTS, MARKER", f"{str(results)!r}, {marker!r}"))
    args = ["test", "--course", work / "c", "--weights", work / "tiny" / "model.safetensors", "--stage", STAGE]
    args += ["--format", "json", "--output", results]
    done = subprocess.run(command(*args), capture_output=True, timeout=300)
    assert done.returncode == 1, done.stderr.decode()
    doc = json.loads(results.read_text())
    assert doc["isolation"]["level"] == "subreaper" and doc["untrusted"] is True
    time.sleep(1.5)  # what a surviving forger would need to strike
    assert _left_behind(marker) == []
    doc = json.loads(results.read_text())
    assert "forged" not in doc and "killed its monitor" in doc["stages"][0]["cases"][0]["message"]
    results.unlink()
    unprotected = subprocess.run(command(*args, script=UNPROTECTED), capture_output=True, timeout=300)
    assert unprotected.returncode == 1, unprotected.stderr.decode()
    try:
        assert _wait_for(lambda: "forged" in results.read_text(), 60)
    finally:
        _kill(_left_behind(marker))


GRADER_KILLER = """\
import os, signal, subprocess, sys, time

def _ancestors():
    pid = os.getppid()
    while pid > 1:
        yield pid
        stat = open(f"/proc/{pid}/stat", "rb").read()
        pid = int(stat[stat.rfind(b")") + 2 :].split()[1])

def run_layer_equiv(seq_ids):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", MARKER], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for pid in _ancestors():  # the grader: `python -m theinference test`, its own uid
        if b"theinference\\0test" in open(f"/proc/{pid}/cmdline", "rb").read():
            os.kill(pid, signal.SIGKILL)
    time.sleep(300)
"""


@pytest.mark.slow
@needs_linux
@needs_nobody
def test_as_a_non_root_user_a_submission_that_kills_the_grader_leaves_nothing_running(weak):
    work, command = weak
    marker, course = f"grader-killer-{uuid.uuid4()}", work / "c"
    write_adapters(course, GRADER_KILLER.replace("MARKER", repr(marker)))
    args = ["test", "--course", course, "--weights", work / "tiny" / "model.safetensors", "--stage", STAGE]
    grader = subprocess.Popen(command(*args, "--timeout", "600"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert grader.wait(timeout=300) == -signal.SIGKILL or grader.returncode == 128 + signal.SIGKILL
        # Its monitor sees the grader die (PR_SET_PDEATHSIG, end-of-file) and kills the submission's whole tree.
        assert _wait_for(lambda: _left_behind(marker, course) == [], 20), _left_behind(marker, course)
    finally:
        _kill(_left_behind(marker))
        grader.kill()
        grader.wait()


# The calls a submission answers in STAGE (the neighbour killer stops once its victim answered them all).
STAGE_CASES = len(next(s for s in load_stages([data_dir("stages")]) if s.id == STAGE).cases)
NEIGHBOUR_KILLER = (
    SOLUTION_IMPORTS
    + """\
import os, signal, time

def _victim_done():  # the victim answered all its calls (graded before us, or beside us and never reached)
    try:
        with open(VICTIM_CALLS) as f:
            return len(f.readlines()) >= CASES
    except OSError:
        return False

def run_layer_equiv(seq_ids):
    end = time.monotonic() + WINDOW  # each call: the four cover the victim's four (1 s each, and its restarts)
    while time.monotonic() < end and not _victim_done():  # whatever runs in the victim's course directory
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if os.readlink(f"/proc/{pid}/cwd") == VICTIM:
                    os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.05)
    return _solve(seq_ids)
"""
)


def _grader_with(isolation_property: str, value: bool) -> str:
    """The grader's command line (python -c) with one property of its isolation forced: a protection taken away."""
    return (
        f"import sys, theinference.proc.sandbox as s; s.Isolation.{isolation_property} = property(lambda self: {value}); "
        "sys.argv[0] = 'theinference'; from theinference.cli.app import main; main()"
    )


# The batch without its protection: submissions run side by side though they share a uid.
SIDE_BY_SIDE = _grader_with("separates_submissions", True)


@pytest.mark.slow
@needs_linux
@needs_nobody
@pytest.mark.parametrize("level", ["subreaper", "unprivileged", "namespaces"])
def test_without_bubblewrap_no_neighbour_in_a_batch_is_killed(weak, level):
    """As nobody: one submission at a time. As root (no bubblewrap): side by side, each under a uid of its own."""
    work, command = weak
    if level == "namespaces" and not shutil.which("unshare"):
        pytest.skip("no unshare here")
    # The victim sorts first, so a serial batch grades it before the killer, and it counts its answered calls where
    # the killer reads them: a killer graded after it, or beside it under another uid that cannot signal it, stops
    # waiting once all were answered (its full window is waited out only where it could kill, side by side).
    victim, killer_dir, calls = work / "subs" / "a-victim", work / "subs" / "b-killer", work / "shared" / "calls"
    calls.parent.mkdir()
    calls.parent.chmod(0o1777)  # the victim's uid, whichever it is, writes there
    victim_source = "import time\ndef run_layer_equiv(s):\n    time.sleep(1)\n    out = _solve(s)\n"
    victim_source += f"    with open({str(calls)!r}, 'a') as f:\n        f.write('answered\\n')\n    return out\n"
    write_adapters(victim, SOLUTION_IMPORTS + victim_source)
    # The killer's window per call: 3 s on an idle machine, as long as the victim's workers take to start on a busy
    # one (no longer than the 8 s that once covered any load).
    killer = NEIGHBOUR_KILLER.replace("VICTIM_CALLS", repr(str(calls))).replace("VICTIM", repr(str(victim)))
    killer = killer.replace("WINDOW", str(min(8.0, scaled(3)))).replace("CASES", str(STAGE_CASES))
    write_adapters(killer_dir, killer)
    out = work / "grades.json"
    args = ["grade", killer_dir, victim, "--weights", work / "tiny" / "model.safetensors"]
    args += ["--stage", STAGE, "--format", "json", "--jobs", "2", "--out", out]
    done = subprocess.run(command(*args, level=level), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    serial = "grading one submission at a time: at the subreaper level" in " ".join(done.stderr.split())
    assert serial == (level == "subreaper"), done.stderr
    doc = json.loads(out.read_text())
    assert {s["results"]["isolation"]["level"] for s in doc["submissions"]} == {level}
    points = {s["id"]: s["points"] for s in doc["submissions"]}
    assert points["a-victim"] > 0 and points["a-victim"] == points["b-killer"], points
    if level != "subreaper":
        return
    # Side by side under one uid, the killer takes the victim's points.
    out.unlink()
    calls.unlink(missing_ok=True)
    done = subprocess.run(command(*args, script=SIDE_BY_SIDE), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    points = {s["id"]: s["points"] for s in json.loads(out.read_text())["submissions"]}
    assert points["a-victim"] == 0 and points["b-killer"] > 0, points


@pytest.mark.slow
@needs_linux
@needs_nobody
@pytest.mark.parametrize("level", ["subreaper", "unprivileged", "namespaces"])
def test_without_bubblewrap_a_submission_filling_its_run_directory_is_stopped(weak, level):
    """The grader as nobody (subreaper), or as root without bwrap (the student as nobody)."""
    work, command = weak
    if level == "namespaces" and not shutil.which("unshare"):
        pytest.skip("no unshare here")
    write_adapters(work / "c", DISK_FILLER)
    args = ["test", "--course", work / "c", "--weights", work / "tiny" / "model.safetensors", "--stage", STAGE]
    args += ["--format", "json"]
    done = subprocess.run(command(*args, level=level, env={"THEINFERENCE_RUN_DIR_MB": str(QUOTA_MB)}),
                          capture_output=True, timeout=300)  # fmt: skip
    assert done.returncode == 1, done.stderr.decode()
    doc = json.loads(done.stdout)
    assert doc["isolation"]["level"] == level
    _quota_stopped(doc)
    raised = subprocess.run(command(*args, level=level, env={"THEINFERENCE_RUN_DIR_MB": "1024"}),
                            capture_output=True, timeout=300)  # fmt: skip
    _unprotected(json.loads(raised.stdout))


# --- 1, 2 end to end: the Gradescope bundle and a submission with no adapters that grants itself full marks ----------

ADAPTERLESS_FORGER = '''\
import os, signal, subprocess, sys

# Waits for the grader's results.json, then replaces it with full marks (Gradescope reads it after run_autograder).
FORGE = """
import os, sys, time
path = sys.argv[1]
for _ in range(1200):
    time.sleep(0.05)
    if os.path.exists(path):
        time.sleep(0.5)
        open(path, "w").write('{"score": 75, "output": "forged", "tests": []}')
        break
"""
subprocess.Popen([sys.executable, "-c", FORGE, RESULTS, MARKER], start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
os.kill(os.getppid(), signal.SIGKILL)  # its monitor, which would kill the daemon
'''


@pytest.mark.slow
@needs_linux
def test_a_gradescope_submission_without_adapters_cannot_grant_itself_full_marks(cli, tmp_path, tiny_path):
    from test_autograder import build, run_autograder

    from theinference import __version__

    root = build(cli, tmp_path, _fake_wheel(tmp_path / "dist" / f"theinference-{__version__}-py3-none-any.whl"),
                 "--weights", tiny_path, "--stage", STAGE)  # fmt: skip
    marker, results = f"gradescope-forger-{uuid.uuid4()}", root / "results" / "results.json"
    write_adapters(tmp_path / "sub", ADAPTERLESS_FORGER.replace("RESULTS, MARKER", f"{str(results)!r}, {marker!r}"))
    try:
        doc = run_autograder(root, tmp_path / "sub")
        time.sleep(2)  # what a surviving forger would need to strike
        assert _left_behind(marker) == []
        assert doc["score"] == 0 and json.loads(results.read_text()) == doc and "forged" not in doc["output"]
        if not (IS_ROOT and PYTHON_PRIVATE):
            return  # the grader below would run student code as nobody, who cannot write the results
        # The grader without its defences (no sandbox, as root by consent, no orphan adoption): full marks, forged.
        fake = tmp_path / "fake-bin"
        fake.mkdir()
        (fake / "theinference").write_text(
            f"#!/bin/sh\nPATH={Path(sys.executable).parent} {ALLOW_ROOT_ENV}=1 "
            f'exec {sys.executable} -c {shlex.quote(UNPROTECTED)} "$@"\n'
        )
        (fake / "theinference").chmod(0o755)
        run_autograder(root, tmp_path / "sub", path=str(fake))
        assert _wait_for(lambda: json.loads(results.read_text())["score"] == 75, 60), results.read_text()
    finally:
        _kill(_left_behind(marker))


# --- 5 within one run: the grader's user rewrites the weights in place before the oracle reads them ----------------

# Zeroes every tensor of the graded weights in place, once, and sets their mtime back (os.utime): on zero weights
# the attention sublayer's output is zeros, which is what it returns.
WEIGHTS_ZEROER = """\
import os
import numpy as np
import theinference

path = theinference.weights_path()
info = os.stat(path)
with open(path, "r+b") as f:
    header = int.from_bytes(f.read(8), "little")
    f.seek(8 + header)
    f.write(bytes(info.st_size - 8 - header))
os.utime(path, ns=(info.st_atime_ns, info.st_mtime_ns))

def run_layer_equiv(seq_ids):
    return np.zeros((len(seq_ids), 128))
"""
# The grader as it was: a weights file counts as unchanged while its size and mtime are.
MTIME_ONLY = (
    "import sys, theinference.model.weights as w; "
    "w.file_stamp = lambda path: (path.stat().st_size, path.stat().st_mtime_ns); "
    "sys.argv[0] = 'theinference'; from theinference.cli.app import main; main()"
)


@pytest.mark.slow
@needs_linux
@needs_nobody
def test_as_a_non_root_user_weights_rewritten_in_place_grant_no_credit(weak, tiny_dir):
    """At the subreaper level the student's code may write the grader's weights file; the oracle, reading it only
    when first needed, must not take what the student wrote for the instructor's weights."""
    work, command = weak
    weights = work / "tiny" / "model.safetensors"
    write_adapters(work / "c", WEIGHTS_ZEROER)
    args = ["test", "--course", work / "c", "--weights", weights, "--stage", STAGE, "--format", "json"]
    done = subprocess.run(command(*args), capture_output=True, timeout=300)
    assert done.returncode == 2, (done.returncode, done.stderr.decode())
    assert "the weights file changed while it was in use" in " ".join(done.stderr.decode().split())
    assert not done.stdout.strip() or json.loads(done.stdout)["points"] == 0
    # Without the change time in the check, the zeros it wrote are the oracle's weights: full marks for no work.
    shutil.copyfile(tiny_dir / "model.safetensors", weights)  # the fixture gives it to the grader's user again
    unprotected = subprocess.run(command(*args, script=MTIME_ONLY), capture_output=True, timeout=300)
    assert unprotected.stdout.strip(), unprotected.stderr.decode()
    doc = json.loads(unprotected.stdout)
    assert unprotected.returncode == 0 and doc["points"] == doc["max_points"] > 0, unprotected.stderr.decode()


@pytest.mark.slow
@needs_linux
@needs_nobody
def test_as_a_non_root_user_grade_out_through_a_link_it_cannot_follow_writes_the_grades(weak):
    """A link planted at --out pointing into a directory the grader's user cannot enter: the grades replace the
    link (never a traceback and exit 3 with no grades written)."""
    import tempfile

    work, command = weak
    private = Path(tempfile.mkdtemp(prefix="theinference-private-"))  # root's, 0700: nobody cannot look inside
    try:
        write_adapters(work / "subs" / "a", SOLUTION_IMPORTS + "def run_layer_equiv(s):\n    return _solve(s)\n")
        (work / "shared").mkdir()
        (work / "shared" / "grades.csv").symlink_to(private / "victim.txt")
        args = ["grade", work / "subs" / "a", "--weights", work / "tiny" / "model.safetensors", "--stage", STAGE]
        done = subprocess.run(command(*args, "--out", work / "shared" / "grades.csv"), capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr.decode()
        grades = work / "shared" / "grades.csv"
        assert not grades.is_symlink() and "pass" in grades.read_text()
        assert list(private.iterdir()) == []
    finally:
        shutil.rmtree(private)


# --- 7. Resources: memory over the whole tree where no cgroup caps it ----------------------------------------------

HOGS, HOG_MB, TREE_MB = 4, 150, 300  # four processes of 150 MB each, under a limit of 300 MB for them all
MEMORY_HOG = (
    f"""\
import os, time

_hogs = []
for _ in range({HOGS}):  # forked before numpy is imported: each is small but for what it holds
    pid = os.fork()
    if pid == 0:
        held = b"x" * ({HOG_MB} << 20)  # written, so resident
        time.sleep(120)
        os._exit(0)
    _hogs.append(pid)


def _resident_mb(pid):
    for line in open(f"/proc/{{pid}}/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) // 1024
    return 0

"""
    + SOLUTION_IMPORTS
    + f"""\

def run_layer_equiv(seq_ids):
    end = time.monotonic() + 30
    while time.monotonic() < end:  # until every one of them holds its share at once
        held = [_resident_mb(pid) for pid in _hogs]
        if min(held) >= {HOG_MB}:
            time.sleep(1)  # all held together, for a while
            return _solve(seq_ids)
        time.sleep(0.05)
    raise RuntimeError(f"the hogs held only {{held}} MB")
"""
)
# The grader without the watch over its students' memory together: only the per-process cap (RLIMIT_AS) is left.
UNWATCHED = (
    "import sys, theinference.proc.accounting as a; a.TreeMemory.check = lambda self: None; "
    "sys.argv[0] = 'theinference'; from theinference.cli.app import main; main()"
)


@pytest.mark.slow
@needs_linux
@needs_nobody
def test_as_a_non_root_user_processes_holding_more_than_the_memory_limit_together_are_stopped(weak):
    """No cgroup as nobody: the grader sums what the tree holds (its proportional share of anonymous memory)."""
    work, command = weak
    write_adapters(work / "c", MEMORY_HOG)
    args = ["test", "--course", work / "c", "--weights", work / "tiny" / "model.safetensors", "--stage", STAGE]
    args += ["--format", "json", "--memory-limit", str(TREE_MB)]
    done = subprocess.run(command(*args), capture_output=True, timeout=300)
    assert done.returncode == 1, done.stderr.decode()
    doc = json.loads(done.stdout)
    assert doc["isolation"]["level"] == "subreaper"
    case = doc["stages"][0]["cases"][0]
    assert case["status"] == "error", case
    assert "together held" in case["message"] and f"over the {TREE_MB} MB limit" in case["message"], case["message"]
    # Without the watch, each process stays under its own cap and all of them hold 600 MB at once: full marks.
    unwatched = subprocess.run(command(*args, script=UNWATCHED), capture_output=True, timeout=300)
    assert unwatched.returncode == 0, unwatched.stdout.decode() + unwatched.stderr.decode()
    # The honest solution in one process holds far less than the limit: the watch stops nothing else.
    write_adapters(work / "c", SOLUTION_IMPORTS + "run_layer_equiv = _solve\n")
    honest = subprocess.run(command(*args), capture_output=True, timeout=300)
    assert honest.returncode == 0, honest.stdout.decode() + honest.stderr.decode()


# --- 7. Resources: a fork bomb as the grader's own user (the `subreaper` level) ------------------------------------

FORK_BOMB = """\
import os, time

def run_layer_equiv(seq_ids):
    while True:  # every process forks for ever: exponential until the kernel refuses
        try:
            if os.fork() == 0:
                os.setsid()  # out of the process group a timeout kills at once: each is found and killed on its own
        except OSError:
            time.sleep(0.01)
"""
BOMB_TIMEOUT = 5
SAFETY_PIDS = 1500  # a pids cgroup around the whole run, where one can be made: the machine is never at stake


def _pids_cgroup() -> Path | None:
    """A v1 pids cgroup of SAFETY_PIDS tasks for this test (root only), or None where none can be made."""
    base = Path("/sys/fs/cgroup/pids")
    if not IS_ROOT or not (base / "cgroup.procs").exists():
        return None
    group = base / f"ti-fork-bomb-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
        (group / "pids.max").write_text(str(SAFETY_PIDS))
    except OSError:
        return None
    return group


def _empty(group: Path) -> None:
    for _ in range(200):  # only the processes of this test's own group
        pids = (group / "cgroup.procs").read_text().split()
        if not pids:
            break
        _kill([int(pid) for pid in pids])
        time.sleep(0.05)
    group.rmdir()


def _peak_tasks(group: Path | None, proc: subprocess.Popen, seconds: float, stop_above: int | None = None) -> int:
    """The most tasks seen in group while proc runs (0 without a group), for at most seconds; stop waiting once
    above stop_above."""
    peak, end = 0, time.monotonic() + seconds
    while proc.poll() is None and time.monotonic() < end:
        if group is not None:
            peak = max(peak, int((group / "pids.current").read_text()))
            if stop_above is not None and peak > stop_above:
                break
        time.sleep(0.05)
    return peak


# The grader that does not cap its students' tasks where they run as its own user.
UNCAPPED = _grader_with("shares_grader_uid", False)


@pytest.mark.slow
@needs_linux
@needs_nobody
@pytest.mark.parametrize("level", ["subreaper", "nobody-namespaces", "nobody-sandbox"])
def test_as_a_non_root_user_a_fork_bomb_is_capped_and_the_grader_ends_at_its_timeout(weak, level):
    """The grader as nobody (with neither bwrap nor unshare, with unshare, or with bwrap too: no uid of the student's
    own and no cgroup at any of them): the only cap is on that user's tasks; the bomb's tree is stopped whole and
    killed (it outruns killing a generation at a time)."""
    from theinference.proc.child import MAX_PROCESSES

    work, command = weak
    if not shutil.which({"subreaper": "true", "nobody-namespaces": "unshare", "nobody-sandbox": "bwrap"}[level]):
        pytest.skip(f"no {level.split('-')[-1]} here")
    course = work / "c"
    write_adapters(course, FORK_BOMB)
    args = ["test", "--course", course, "--weights", work / "tiny" / "model.safetensors", "--stage", STAGE]
    args += ["--format", "json", "--timeout", str(BOMB_TIMEOUT)]
    group, graders = _pids_cgroup(), []
    inside = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh"] if group else []
    try:
        started = time.monotonic()
        grader = subprocess.Popen(
            [*inside, *command(*args, level=level)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        graders.append(grader)
        peak = _peak_tasks(group, grader, scaled(60))
        if grader.poll() is None:  # the minutes a bomb outrunning its killer took, or for ever
            pytest.fail(f"the grader was not done after {time.monotonic() - started:.0f} s ({peak} tasks at the peak)")
        out, err = grader.communicate()
        took = time.monotonic() - started
        assert grader.returncode == 1, err.decode()
        doc = json.loads(out)
        assert doc["isolation"]["level"] == {"nobody-namespaces": "namespaces", "nobody-sandbox": "sandbox"}.get(
            level, level
        )
        case = doc["stages"][0]["cases"][0]
        assert case["status"] == "timeout" and f"after {BOMB_TIMEOUT} s" in case["message"], case
        assert took < scaled(60), took  # the timeout, and a little
        assert peak < MAX_PROCESSES + 100, peak  # nobody's few processes (the grader's), and the cap
        assert _left_behind(f"no-such-marker-{uuid.uuid4()}", course) == []  # nothing runs in the course any more
        if group is None:
            return
        # Without the cap the same bomb takes whatever the machine (here: this test's cgroup) lets it.
        uncapped = subprocess.Popen([*inside, *command(*args, script=UNCAPPED, level=level)], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)  # fmt: skip
        graders.append(uncapped)
        assert _peak_tasks(group, uncapped, scaled(60), stop_above=4 * MAX_PROCESSES) > 4 * MAX_PROCESSES
    finally:
        if group is not None:
            _empty(group)
        for proc in graders:
            proc.kill()
            proc.wait()
        _reap_orphans_of(command.uid())


def _reap_orphans_of(uid: int) -> None:
    """Reap the zombies of uid that were reparented to this test process (a subreaper once a grader ran in it): the
    bomb's killed processes would otherwise stay, count against uid's RLIMIT_NPROC, and fail every later run as uid."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = [(pid, zombie) for pid, zombie, owner in my_children() if owner == uid]
        for pid, zombie in left:
            try:
                os.waitpid(pid, os.WNOHANG) if zombie else os.kill(pid, signal.SIGKILL)
            except (ChildProcessError, ProcessLookupError):
                continue
        if not left:
            return
        time.sleep(0.1)


# --- 7. Resources: what a submission's own uid leaves in /tmp, /var/tmp and /dev/shm goes after its run ------------

LITTERER = (
    SOLUTION_IMPORTS
    + """\
import glob, os

def run_layer_equiv(seq_ids):
    for path in glob.glob(f"/tmp/{MARKER}-before-*.txt"):  # files of the uids it may run as: its own is writable
        try:  # a file its uid owned before its run (uid nobody's files are not all the student's)
            with open(path, "a") as f:
                f.write(" touched")
        except OSError:
            pass
    try:  # links to root's directory, one inside a directory of its own, and a FIFO: removed, never followed
        os.symlink(f"/tmp/{MARKER}-victim", f"/tmp/{MARKER}-link")
        os.makedirs(f"/tmp/{MARKER}-ldir", exist_ok=True)
        os.symlink(f"/tmp/{MARKER}-victim", f"/tmp/{MARKER}-ldir/inner")
        os.mkfifo(f"/tmp/{MARKER}-fifo")
    except FileExistsError:  # an earlier case of the same run made them
        pass
    for where in ("/tmp", "/var/tmp", "/dev/shm"):
        with open(os.path.join(where, f"{MARKER}.bin"), "wb") as f:
            f.write(os.urandom(1 << 20))
        os.makedirs(os.path.join(where, f"{MARKER}-dir", "deeper"), exist_ok=True)
        with open(os.path.join(where, f"{MARKER}-dir", "deeper", "x.bin"), "wb") as f:
            f.write(os.urandom(1 << 20))
    return _solve(seq_ids)
"""
)


@pytest.mark.slow
@needs_linux
@needs_nobody
@pytest.mark.parametrize("level", ["unprivileged", "namespaces"])
def test_without_bubblewrap_what_the_submissions_uid_leaves_in_shared_temp_dirs_is_removed(weak, level):
    """As root without bwrap the student runs as a leased uid and may write /tmp, /var/tmp, /dev/shm: only its own
    entries there, made during its lease, go (a file of root's in the same place stays, and so does one its uid
    owned before the lease, even written to during it)."""
    work, command = weak
    if level == "namespaces" and not shutil.which("unshare"):
        pytest.skip("no unshare here")
    marker = f"litter-{uuid.uuid4()}"
    write_adapters(work / "c", LITTERER.replace("MARKER", repr(marker)))
    bystander = Path("/tmp") / f"{marker}-root.txt"  # the same name pattern, but not the student's
    bystander.write_text("root's")
    # One for each uid the run may lease, each its uid's: the first 64 of the pool, as gradings elsewhere on the machine
    # (the other test process's, another checkout's) may hold several (with 4, a CI run beside other graders leased
    # the fifth: nothing was touched).
    uids = list(itertools.islice(submission_uids(), 64))
    before = {uid: Path("/tmp") / f"{marker}-before-{uid}.txt" for uid in uids}
    for uid, path in before.items():
        path.write_text("its uid's")
        os.chown(path, uid, uid)
    left = [
        Path(where) / f"{marker}{suffix}" for where in ("/tmp", "/var/tmp", "/dev/shm") for suffix in (".bin", "-dir")
    ] + [Path("/tmp") / f"{marker}{suffix}" for suffix in ("-link", "-ldir", "-fifo")]
    victim = Path("/tmp") / f"{marker}-victim"  # root's, 0755: what the links point at
    victim.mkdir()
    (victim / "keep.txt").write_text("root's")
    args = ["test", "--course", work / "c", "--weights", work / "tiny" / "model.safetensors", "--stage", STAGE]
    args += ["--format", "json"]
    try:
        done = subprocess.run(command(*args, level=level), capture_output=True, timeout=300)
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()  # it wrote them, and passed
        assert json.loads(done.stdout)["isolation"]["level"] == level
        assert [path for path in left if os.path.lexists(path)] == []
        assert bystander.read_text() == "root's"
        # (Another test process's grading, at another uid, may sweep that uid's file: only the touched one counts.)
        touched = [
            uid for uid, path in before.items() if path.exists() and path.read_text().startswith("its uid's touched")
        ]
        assert len(touched) == 1, touched  # the student ran as its owner, wrote to it, and it stayed
        assert (victim / "keep.txt").read_text() == "root's"
    finally:
        shutil.rmtree(victim)
        bystander.unlink()
        for path in before.values():
            path.unlink(missing_ok=True)
        for path in left:
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


@pytest.mark.skipif(not IS_ROOT, reason="only root gives student code a uid of its own")
def test_with_every_uid_for_students_leased_the_grader_says_so_and_exits_2(cli, tmp_path, tiny_path, monkeypatch):
    from theinference.proc import sandbox

    # One uid, held below: the last of the pool, so a grading in another test process (which takes nobody
    # first) neither holds it nor finds its own pool empty.
    last = list(sandbox.submission_uids())[-1]
    monkeypatch.setattr(sandbox, "submission_uids", lambda: iter([last]))
    held, lease = sandbox.lease_uid(set())
    try:
        write_adapters(tmp_path / "c", UID_REPORTER)
        result = cli("test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", STAGE, "--untrusted")
    finally:
        os.close(lease)
    assert held == last
    assert result.exit_code == 2, result.output
    assert "every uid for student processes is in use by a grading on this machine" in result.output
    assert "Traceback" not in result.output
