"""Isolation between gradings (issue 39, points 2 to 5), through the real CLI.

A level that cannot promise that nothing of a submission outlives its grading refuses untrusted grading; the
grader's own code is never writable by the student's uid; the cost stage never runs beside another submission's
processes (a pair of submissions, one serving the other's calls, in a `grade --jobs 2` batch); and the grader's
outputs cannot be blocked by a directory planted where they go.
"""

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import write_adapters, write_quick_scaling_stage
from test_integrity_levels import _kill, _left_behind, needs_linux, needs_nobody
from test_integrity_levels import weak  # noqa: F401 (a fixture)
from test_runner import SOLUTION_IMPORTS

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from scaling_subjects import _HEAD  # noqa: E402

from theinference.proc.sandbox import ALLOW_WEAK_ENV, strongest_isolation  # noqa: E402

STAGE = "prove-one-layer"
SOLVES = SOLUTION_IMPORTS + "def run_layer_equiv(seq_ids):\n    return _solve(seq_ids)\n"


# --- The subreaper level: refused unless the instructor consents, and then every format says what it gives up ------


@pytest.mark.slow
@needs_linux
@needs_nobody
def test_untrusted_grading_at_the_subreaper_level_is_refused_without_the_instructors_consent(weak):  # noqa: F811 (the fixture)
    work, command = weak
    write_adapters(work / "c", SOLVES)
    args = ["test", "--course", work / "c", "--weights", work / "tiny" / "model.safetensors", "--stage", STAGE]
    refused = subprocess.run(command(*args, env={ALLOW_WEAK_ENV: "0"}), capture_output=True, text=True, timeout=300)
    message = " ".join(refused.stderr.split())
    assert refused.returncode == 2, refused.stderr
    assert "refusing untrusted grading at the subreaper level" in message and "Traceback" not in message
    assert f"{ALLOW_WEAK_ENV}=1 grades here anyway" in message and "apt-get install bubblewrap" in message
    # With the consent it grades, and the header of every format says what the level cannot promise.
    consented = f"allowed by {ALLOW_WEAK_ENV}=1: a process it starts that kills the grader can outlive the grading"
    for fmt in ("json", "junit", "rich"):
        done = subprocess.run(command(*args, "--format", fmt), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert consented in " ".join(done.stdout.split()), done.stdout[:2000]


# --- The grader's own code, writable by the student's uid ------------------------------------------------------------

PATCHER = (
    SOLUTION_IMPORTS
    + """\
def run_layer_equiv(seq_ids):
    with open(SCALING, "a") as f:  # every later grading from this install: cache-scaling passes
        f.write("\\n_PATCHED_BY_A_STUDENT = True\\n")
    return _solve(seq_ids)
"""
)


@pytest.mark.slow
@needs_linux
@needs_nobody
@pytest.mark.parametrize("level", ["subreaper", "nobody-namespaces"])
def test_untrusted_grading_from_an_install_the_students_uid_can_write_is_refused(weak, level):  # noqa: F811 (the fixture)
    """The grader as nobody, from a copy of its package nobody owns (PYTHONPATH): the student runs as nobody too
    (its own uid at subreaper; mapped to root in a user namespace at nobody-namespaces) and could patch it."""
    work, command = weak
    if level == "nobody-namespaces" and not shutil.which("unshare"):
        pytest.skip("no unshare here")
    import theinference

    install = work / "install"
    shutil.copytree(Path(theinference.__file__).parent, install / "theinference")
    for data in ("stages", "course"):  # found beside the package, as in a checkout (theinference.bundled)
        (install / data).symlink_to(Path(theinference.__file__).parents[1] / data)
    scaling = install / "theinference" / "grading" / "judge" / "scaling.py"
    original = scaling.read_text()
    write_adapters(work / "c", PATCHER.replace("SCALING", repr(str(scaling))))
    args = ["test", "--course", work / "c", "--weights", work / "tiny" / "model.safetensors", "--stage", STAGE]
    env = {"PYTHONPATH": str(install)}
    refused = subprocess.run(command(*args, level=level, env=env), capture_output=True, text=True, timeout=300)
    message = " ".join(refused.stderr.split())
    assert refused.returncode == 2, refused.stderr
    assert f"student code runs as your own user, which can change the grader's own installed code ({install}" in message
    assert "Install theinference where that user cannot write" in message and "Traceback" not in message
    assert scaling.read_text() == original  # nothing of the submission ran
    # Without the check the submission patches the grader that grades every later submission.
    unchecked = (
        "import sys, theinference.proc.sandbox as s; s.writable_install = lambda uid: []; "
        "sys.argv[0] = 'theinference'; from theinference.cli.app import main; main()"
    )
    done = subprocess.run(command(*args, script=unchecked, level=level, env=env), capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    assert "_PATCHED_BY_A_STUDENT" in scaling.read_text()


# --- Two submissions of one batch: one serves the other's calls ---------------------------------------------------

# Each channel gives the server `_serve_forever(handle)` (handle(prompt, n) -> tokens) and the client `_ask(prompt, n)`
# (the tokens, or None when nobody answers within 10 s).
SOCKET_CHANNEL = """\
import json, signal, socket

SOCK = SOCKET


def _listen():
    try:
        os.unlink(SOCK)
    except OSError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(SOCK)
    os.chmod(SOCK, 0o777)  # the neighbour runs as another uid
    server.listen(8)
    return server


def _serve_forever(handle, server=None):
    server = server or _listen()
    if os.fork() == 0:  # a daemon of its own, out of the monitor's tree, serving as long as it lives
        os.setsid()
        if os.fork() == 0:
            _serve_forever(handle, _listen())
        os._exit(0)
    if os.getppid() > 1:  # its monitor, outside its PID namespace: refused to another uid
        try:
            os.kill(os.getppid(), signal.SIGKILL)
        except OSError:
            pass
    while True:
        conn, _ = server.accept()
        with conn, conn.makefile("rwb") as f:
            asked = json.loads(f.readline())
            f.write((json.dumps(handle(asked["prompt"], asked["n"])) + "\\n").encode())
            f.flush()


def _ask(prompt, n):
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(SOCK)
        except OSError:
            time.sleep(0.1)
            continue
        with conn, conn.makefile("rwb") as f:
            f.write((json.dumps({"prompt": [int(t) for t in prompt], "n": int(n)}) + "\\n").encode())
            f.flush()
            return json.loads(f.readline())
    return None
"""
# POSIX record locks on a file every sandbox binds in read-only (numpy's own): a read lock's offset is a message of
# 62 bits (tag, sequence number, a 48-bit word), read by the other side with F_GETLK; each word is echoed back.
FLOCK_CHANNEL = """\
import fcntl, struct
import numpy

_FD = os.open(os.path.join(os.path.dirname(numpy.__file__), "version.py"), os.O_RDONLY)
_FLOCK = "hhqqi4x"  # struct flock on 64-bit Linux: type, whence, start, len, pid
REQUEST, RESPONSE = 2, 4  # tags; each side echoes a word with its tag + 1


def _hold(value):
    fcntl.fcntl(_FD, fcntl.F_SETLK, struct.pack(_FLOCK, fcntl.F_UNLCK, 0, 0, 0, 0))
    if value:
        fcntl.fcntl(_FD, fcntl.F_SETLK, struct.pack(_FLOCK, fcntl.F_RDLCK, 0, value, 1, 0))


def _other():
    probe = struct.pack(_FLOCK, fcntl.F_WRLCK, 0, 0, 0, 0)
    kind, _, start, _, _ = struct.unpack(_FLOCK, fcntl.fcntl(_FD, fcntl.F_GETLK, probe))
    return 0 if kind == fcntl.F_UNLCK else start


def _send(words, tag, deadline=None):
    for i, word in enumerate(words):
        seq = i % 255 + 1
        _hold((tag << 56) | (seq << 48) | word)
        while True:
            got = _other()
            if (got >> 56 == tag + 1 and (got >> 48) & 0xFF == seq) or got >> 56 > tag + 1:
                break
            if deadline is not None and time.monotonic() > deadline:
                _hold(0)
                return False
            time.sleep(0.0005)
    return True


def _receive(tag, count):
    words, seq = [], 1
    while len(words) < count(words):
        got = _other()
        if got >> 56 == tag and (got >> 48) & 0xFF == seq:
            words.append(got & ((1 << 48) - 1))
            _hold(((tag + 1) << 56) | (seq << 48))
            seq = seq % 255 + 1
        else:
            time.sleep(0.0005)
    return words


def _serve_forever(handle):
    while True:
        asked = _receive(REQUEST, lambda words: 1 + (words[0] >> 16 if words else 0))
        prompt, n = asked[1:], asked[0] & 0xFFFF
        _send([int(t) for t in handle(prompt, n)], RESPONSE)
        _hold(0)


def _ask(prompt, n):
    if not _send([len(prompt) << 16 | int(n), *map(int, prompt)], REQUEST, time.monotonic() + 10):
        return None
    return _receive(RESPONSE, lambda words: int(n))
"""
SERVER = (
    _HEAD
    + """\
import threading
from src.kvcache import generate_cached
CHANNEL
_served, _last = [0], [0.0]


def _handle(prompt, n):
    params, n_head = _model()
    tokens = [int(t) for t in generate_cached(params, list(prompt), n, n_head)]
    _served[0] += 1
    _last[0] = time.monotonic()
    return tokens


threading.Thread(target=_serve_forever, args=(_handle,), daemon=True).start()
_waited = []


def run_greedy(prompt_ids, n_new):
    if not _waited:  # alive while the neighbour's calls come: until they stop, or nobody came
        _waited.append(time.monotonic())
        while time.monotonic() - _waited[0] < 8 and not (_served[0] and time.monotonic() - _last[0] > 5):
            time.sleep(0.1)
    params, n_head = _model()
    return generate_cached(params, prompt_ids, n_new, n_head)
"""
)
CLIENT = (
    _HEAD
    + """\
CHANNEL

def run_greedy(prompt_ids, n_new):
    served = _ask(list(prompt_ids), n_new)
    if served is None:
        raise RuntimeError("no neighbour to serve the call")  # a submission with no cache of its own
    print("served by the neighbour", flush=True)
    return served
"""
)
# The grader whose cost stage runs beside other stages: its exclusive hold is a shared one.
SIDE_BY_SIDE = (
    "import sys, theinference.grading.drive.costlock as c; c.CostLock.exclusive = c.CostLock.shared; "
    "sys.argv[0] = 'theinference'; from theinference.cli.app import main; main()"
)


def _pair(work: Path, channel: str, proof_cache: Path) -> list:
    """The server and the client with their channel, the proof preset readable by their uids, and `grade`'s
    arguments for both (the cost stage at short calls: who computed the client's tokens is the evidence here,
    not its cost's verdict)."""
    for name, source in (("a-server", SERVER), ("b-client", CLIENT)):
        write_adapters(work / "subs" / name, source.replace("CHANNEL", channel))
    shutil.copytree(proof_cache, work / "cache")
    subprocess.run(["chmod", "-R", "a+rX", str(work / "cache")], check=True)  # read by the students' uids
    stages = write_quick_scaling_stage(work / "stages", longest=16)
    args = ["grade", work / "subs" / "a-server", work / "subs" / "b-client", "--stages-dir", stages]
    return [*args, "--stage", "quick-scaling", "--format", "json", "--jobs", "2", "--out", work / "grades.json"]


def _client(work: Path, level: str) -> tuple[float, str]:
    """The client's points and what it printed, from the batch's results (both graded at level)."""
    doc = json.loads((work / "grades.json").read_text())
    assert all(s["results"] for s in doc["submissions"]), [s.get("error") for s in doc["submissions"]]
    assert {s["results"]["isolation"]["level"] for s in doc["submissions"]} == {level}
    client = next(s for s in doc["submissions"] if s["id"] == "b-client")
    return client["points"], client["results"]["stages"][0]["cases"][0].get("stdout", "")


@pytest.mark.slow
@needs_linux
@needs_nobody
def test_a_neighbour_in_the_batch_cannot_serve_a_no_cache_submissions_timed_calls(weak, proof_cache):  # noqa: F811 (the fixture)
    """`namespaces` as root (no bubblewrap): each submission runs as its own uid, in its own PID and network
    namespaces, but both see /tmp: the server listens on a unix socket there (and leaves a daemon doing the same),
    the client hands it every call. The cost stage runs while nothing else does: the client is never served."""
    work, command = weak
    if not shutil.which("unshare"):
        pytest.skip("no unshare here")
    marker = f"neighbour-{uuid.uuid4().hex[:12]}"
    args = _pair(work, SOCKET_CHANNEL.replace("SOCKET", repr(f"/tmp/{marker}.sock")), proof_cache)
    args += ["--weights", work / "tiny" / "model.safetensors"]
    try:
        done = subprocess.run(command(*args, level="namespaces"), capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, done.stderr
        points, stdout = _client(work, "namespaces")
        assert points == 0 and "served by the neighbour" not in stdout, stdout
        assert _left_behind(marker, work / "subs" / "a-server") == []  # its daemon died with its run
        # Side by side, the server answers the client's calls (the channel is real).
        side = subprocess.run(command(*args, script=SIDE_BY_SIDE, level="namespaces"), capture_output=True,
                              text=True, timeout=1200)  # fmt: skip
        assert side.returncode == 0, side.stderr
        assert "served by the neighbour" in _client(work, "namespaces")[1]
    finally:
        _kill(_left_behind(marker, work / "subs" / "a-server"))
        Path(f"/tmp/{marker}.sock").unlink(missing_ok=True)


@pytest.mark.slow
@needs_linux
@pytest.mark.skipif(strongest_isolation(allow_root=True).level != "sandbox", reason="bubblewrap does not run here")
def test_in_the_sandbox_a_neighbour_cannot_serve_a_no_cache_submission_through_file_locks(
    cli, tmp_path, tiny_path, proof_cache, monkeypatch
):
    """Two sandboxes share no writable place, but both see numpy's files read-only, and a lock on one is seen by
    the other: the server answers the client's calls through lock offsets. Never while the cost stage runs."""
    monkeypatch.setenv("THEINFERENCE_CACHE", str(tmp_path / "cache"))
    args = [*_pair(tmp_path, FLOCK_CHANNEL, proof_cache), "--weights", tiny_path]
    done = cli(*args)
    assert done.exit_code == 0, done.output
    points, stdout = _client(tmp_path, "sandbox")
    assert points == 0 and "served by the neighbour" not in stdout, stdout
    side = subprocess.run([sys.executable, "-c", SIDE_BY_SIDE, *map(str, args)], env=dict(os.environ),
                          capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert side.returncode == 0, side.stderr
    assert "served by the neighbour" in _client(tmp_path, "sandbox")[1]


# --- The grader's outputs: a directory planted where they go -------------------------------------------------------

PLANTER = (
    SOLUTION_IMPORTS
    + """\
import os

def run_layer_equiv(seq_ids):
    os.makedirs(OUTPUT, exist_ok=True)  # where the grader will write its results (read from its command line)
    return _solve(seq_ids)
"""
)


@pytest.mark.slow
def test_a_directory_planted_at_the_output_path_is_a_clear_exit_2_and_the_results_are_kept(cli, tmp_path, tiny_path):
    output = tmp_path / "shared" / "results.json"
    output.parent.mkdir()
    write_adapters(tmp_path / "c", PLANTER.replace("OUTPUT", repr(str(output))))
    args = ["test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", STAGE, "--format", "json"]
    # Planted during the run (plain `test`: the student's code runs as this user): exit 2, the results kept aside.
    planted = cli(*args, "--output", output)
    message = " ".join(planted.stderr.split())
    assert planted.exit_code == 2, planted.output
    assert f"{output} is a directory, not a file" in message and "Traceback" not in planted.output
    kept = Path(message.split("is kept in ")[1].split()[0])
    assert json.loads(kept.read_text())["status"] == "pass"
    assert kept.parent.parent == output.parent and oct(kept.parent.stat().st_mode & 0o777) == "0o700"
    # Already there when a later grading starts: refused before any grading.
    write_adapters(tmp_path / "c", SOLVES)
    later = cli(*args, "--output", output)
    assert later.exit_code == 2 and "is a directory, not a file" in later.stderr, later.output
    # Nothing but the results is left beside them: no temporary file or directory of the grader's.
    shutil.rmtree(output)
    assert cli(*args, "--output", output).exit_code == 0
    assert sorted(p.name for p in output.parent.iterdir()) == sorted(["results.json", kept.parent.name])


def test_a_results_file_is_written_through_a_private_directory_beside_it(tmp_path, monkeypatch):
    from theinference import files

    seen = []
    real_replace = os.replace

    def replace(src, dst):
        seen.append((Path(src), os.stat(Path(src).parent).st_mode & 0o777))
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", replace)
    (tmp_path / "out").mkdir()
    files.write_atomic(tmp_path / "out" / "grades.csv", "id,status\n")
    [(written, mode)] = seen
    assert (
        written.parent.parent == tmp_path / "out" and written.parent.name.startswith(".grades.csv.") and mode == 0o700
    )
    assert (tmp_path / "out" / "grades.csv").read_text() == "id,status\n"
    assert os.listdir(tmp_path / "out") == ["grades.csv"]


@pytest.mark.slow
@needs_linux
@needs_nobody
def test_without_bubblewrap_a_directory_planted_at_the_output_path_is_a_clear_exit_2(weak):  # noqa: F811 (the fixture)
    """`unprivileged`: the grader is root, the student a uid of its own, the output in a directory any user may
    write (as /tmp)."""
    work, command = weak
    output = work / "shared" / "results.json"
    output.parent.mkdir()
    output.parent.chmod(0o1777)
    write_adapters(work / "c", PLANTER.replace("OUTPUT", repr(str(output))))
    args = ["test", "--course", work / "c", "--weights", work / "tiny" / "model.safetensors", "--stage", STAGE]
    done = subprocess.run(command(*args, "--format", "json", "--output", output, level="unprivileged"),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    message = " ".join(done.stderr.split())
    assert done.returncode == 2 and "Traceback" not in message, done.stderr
    assert f"{output} is a directory, not a file" in message
    kept = Path(message.split("is kept in ")[1].split()[0])
    assert json.loads(kept.read_text())["isolation"]["level"] == "unprivileged"
    assert kept.parent.stat().st_uid == 0 and kept.parent.stat().st_mode & 0o777 == 0o700  # out of nobody's reach
