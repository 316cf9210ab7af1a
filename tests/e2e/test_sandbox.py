"""Confinement of student processes: descendants die, the sandbox hides the grader and the network."""

import json
import re
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import theinference
from conftest import write_adapters
from test_runner import SOLUTION_IMPORTS
from theinference.bundled import data_dir
from theinference.proc.sandbox import strongest_isolation

STAGE = "prove-one-layer"
SANDBOX = strongest_isolation()
needs_sandbox = pytest.mark.skipif(
    SANDBOX.level != "sandbox",
    reason=f"no working bubblewrap sandbox on this machine (strongest isolation: {SANDBOX.level})",
)
needs_linux = pytest.mark.skipif(sys.platform != "linux", reason="the subreaper monitor is Linux-only")


def _processes_with(marker: str) -> list[int]:
    """Live (non-zombie) processes whose command line holds marker."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


ESCAPER = (
    SOLUTION_IMPORTS
    + """\
import subprocess, sys, time
_started = []

# Waits for the grader to write its results, then rewrites them (a forged 55/55).
LURKER = '''
import os, sys, time
path = sys.argv[1]
for _ in range(600):
    time.sleep(0.05)
    if os.path.exists(path):
        time.sleep(0.5)
        open(path, "w").write('{"status": "pass", "forged": true}')
        break
'''

def run_layer_equiv(seq_ids):
    if not _started:
        p = subprocess.Popen([sys.executable, "-c", LURKER, RESULTS, MARKER], start_new_session=True,
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _started.append(p.pid)
        print("lurker started")
    return _solve(seq_ids)
"""
)


@pytest.mark.slow
@needs_linux
@pytest.mark.parametrize("mode", ["zygote", "subprocess", "untrusted"])
def test_an_escaped_descendant_dies_before_the_grader_exits_and_the_results_stay_intact(tmp_path, tiny_path, mode):
    marker, results = f"lurker-{uuid.uuid4()}", tmp_path / "results.json"
    write_adapters(tmp_path / "c", ESCAPER.replace("RESULTS, MARKER", f"{str(results)!r}, {marker!r}"))
    env = {
        **os.environ,
        "THEINFERENCE_LAUNCHER": "subprocess" if mode == "subprocess" else "zygote",
        "CI": "true" if mode == "untrusted" else "false",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "theinference",
            "test",
            "--course",
            tmp_path / "c",
            "--weights",
            tiny_path,
            "--stage",
            STAGE,
            "--format",
            "json",
            "--output",
            results,
        ],
        env=env,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()
    time.sleep(1.5)  # what a surviving lurker would need to strike
    assert _processes_with(marker) == []
    doc = json.loads(results.read_text())
    assert doc["status"] == "pass" and "forged" not in doc
    assert "lurker started" in doc["stages"][0]["cases"][0]["stdout"]


def _probe_adapter(course: Path, probe: str) -> None:
    """Adapters that pass only if `probe` (code that returns a breach description or None) finds no breach."""
    body = "\n".join("        " + line for line in probe.strip().splitlines())
    write_adapters(
        course,
        SOLUTION_IMPORTS
        + f"""\
def _breach():
    try:
{body}
    except Exception as e:
        return None
    return None

def run_layer_equiv(seq_ids):
    breach = _breach()
    if breach:
        raise RuntimeError(f"breach: {{breach}}")
    return _solve(seq_ids)
""",
    )


PROBES = {
    "oracle-import": """\
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "Guard" not in type(f).__name__]  # the guard falls to one line
import theinference.model.gpt2
return 'imported theinference.model.gpt2'""",
    "oracle-file": f"""\
import importlib.util
spec = importlib.util.spec_from_file_location("o", {str(Path(theinference.__file__).parent / "model" / "gpt2.py")!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
return 'loaded oracle.py by path'""",
    "oracle-subprocess": """\
import subprocess, sys
done = subprocess.run([sys.executable, "-c", "from theinference.model import gpt2 as oracle"], capture_output=True)
return 'a subprocess imported the oracle' if done.returncode == 0 else None""",
    "solution-source": f"open({str(data_dir('course') / 'solution' / 'src' / 'kvcache.py')!r}).read()\nreturn 'read the reference solution'",
    "network": """\
import socket
socket.create_connection(("127.0.0.1", PORT), timeout=2).close()
return 'connected to the grader host'""",
    "write-course": "open('written-by-student.txt', 'w').write('x')\nreturn 'wrote into the course directory'",
    "write-tmp": "import tempfile\nopen('/tmp/written-by-student.txt', 'w').write('x')\nreturn 'wrote into /tmp'",
    "grader-environ": """\
data = open("/proc/GRADER_PID/environ", "rb").read()
return 'read the grader environment' if b"PATH=" in data else None""",
}


@pytest.fixture
def listener():
    """A TCP port on this host that accepts connections while the test runs."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.mark.slow
@needs_sandbox
@pytest.mark.parametrize("probe", list(PROBES))
def test_sandbox_hides_the_grader_network_and_filesystem(cli, tmp_path, tiny_path, monkeypatch, listener, probe):
    source = PROBES[probe].replace("PORT", str(listener)).replace("GRADER_PID", str(os.getpid()))
    _probe_adapter(tmp_path / "c", source)
    monkeypatch.setenv("CI", "true")
    confined = cli("test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", STAGE, "--format", "json")
    case = json.loads(confined.stdout)["stages"][0]["cases"][0]
    assert confined.exit_code == 0, case["message"]
    assert not (tmp_path / "c" / "written-by-student.txt").exists()
    # The probe is real: run trusted (no sandbox), the same breach succeeds.
    monkeypatch.setenv("CI", "false")
    monkeypatch.setenv("THEINFERENCE_LAUNCHER", "subprocess")
    open_run = cli("test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", STAGE, "--format", "json")
    case = json.loads(open_run.stdout)["stages"][0]["cases"][0]
    assert open_run.exit_code == 1 and case["message"].startswith("RuntimeError: breach"), case
    Path("/tmp/written-by-student.txt").unlink(missing_ok=True)


@needs_sandbox
def test_under_the_sandbox_weights_path_and_scratch_files_work_and_the_student_is_not_root(
    cli, tmp_path, tiny_path, monkeypatch
):
    write_adapters(
        tmp_path / "c",
        SOLUTION_IMPORTS
        + """\
import os
def run_layer_equiv(seq_ids):
    assert os.path.exists(theinference.weights_path()), theinference.weights_path()
    assert os.getuid() != 0 and os.geteuid() != 0, "running as root"
    import tempfile
    with tempfile.TemporaryFile() as f:  # scratch space works, inside the run's own directory
        f.write(b"x")
    return _solve(seq_ids)
""",
    )
    monkeypatch.setenv("CI", "true")
    result = cli("test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", STAGE, "--format", "json")
    assert result.exit_code == 0, json.loads(result.stdout)["stages"][0]["cases"][0]["message"]


@pytest.mark.slow
@needs_sandbox
def test_the_solution_passes_every_stage_under_the_sandbox_and_the_header_says_so(
    cli, solution_course, tiny_path, monkeypatch
):
    monkeypatch.setenv("CI", "true")
    as_json = cli("test", "--all", "--course", solution_course, "--weights", tiny_path, "--format", "json")
    doc = json.loads(as_json.stdout)
    assert as_json.exit_code == 0 and all(s["status"] == "pass" for s in doc["stages"])
    assert doc["isolation"]["level"] == "sandbox" and "no network" in doc["isolation"]["summary"]
    text = cli("test", "--stage", STAGE, "--course", solution_course, "--weights", tiny_path).stdout
    # the header folds a long isolation summary onto its own line under the level
    assert re.search(r"isolation: sandbox( · |\n\s+)bubblewrap sandbox", text), text


def test_a_students_own_loop_says_it_is_not_sandboxed(solution_run):
    text = solution_run("--stage", STAGE).stdout  # not in CI: solution_run's environment has no CI
    level = "subreaper" if sys.platform == "linux" else "process-group"
    assert f"isolation: {level} · no sandbox: student code runs with your rights" in text


@needs_linux
@pytest.mark.parametrize("missing", ["bwrap", "bwrap+unshare"])
def test_without_bubblewrap_untrusted_runs_fall_back_and_say_so(
    cli, tmp_path, tiny_path, monkeypatch, listener, missing
):
    from theinference.proc import sandbox

    monkeypatch.setattr(sandbox, "_working_bwrap", lambda: None)
    if missing == "bwrap+unshare":
        monkeypatch.setattr(sandbox, "_working_unshare", lambda: ())
    isolation = sandbox.strongest_isolation()
    assert isolation.level != "sandbox" and "bubblewrap unavailable" in isolation.summary
    _probe_adapter(tmp_path / "c", PROBES["network"].replace("PORT", str(listener)))
    monkeypatch.setenv("CI", "true")
    result = cli("test", "--stage", STAGE, "--course", tmp_path / "c", "--weights", tiny_path, "--format", "json")
    if result.exit_code == 2:  # as root, student code runs as nobody, who cannot read a private temporary directory
        assert isolation.level in ("namespaces", "unprivileged") and "is not readable by user nobody" in result.stderr
        return
    doc = json.loads(result.stdout)
    assert doc["isolation"] == {"level": isolation.level, "summary": isolation.summary}
    # Only namespaces cut the network.
    assert doc["status"] == ("pass" if isolation.level == "namespaces" else "fail")


@needs_linux
@pytest.mark.parametrize("launcher", ["zygote", "subprocess"])
def test_killing_its_monitor_is_the_students_error_not_the_graders(cli, tmp_path, tiny_path, monkeypatch, launcher):
    write_adapters(
        tmp_path / "c",
        SOLUTION_IMPORTS + "import os, signal\n_killed = []\ndef run_layer_equiv(seq_ids):\n"
        "    if not _killed:\n        os.kill(os.getppid(), signal.SIGKILL)\n        _killed.append(1)\n"
        "    return _solve(seq_ids)\n",
    )
    monkeypatch.setenv("THEINFERENCE_LAUNCHER", launcher)
    result = cli("test", "--course", tmp_path / "c", "--weights", tiny_path, "--stage", STAGE, "--format", "json")
    stage = json.loads(result.stdout)["stages"][0]
    # Correct numbers count for nothing once the process that confines them is gone.
    assert result.exit_code == 1 and stage["status"] == "error"
    assert all("killed its monitor" in case["message"] for case in stage["cases"])


@needs_linux
def test_a_held_worker_runs_nothing_before_its_release_and_nothing_if_its_monitor_dies(tmp_path):
    from theinference.proc.reaper import fork_held

    def fork_writer(mark: Path):
        pid, release = fork_held()
        if pid == 0:
            mark.write_text("ran")
            os._exit(0)
        return pid, release

    pid, release = fork_writer(tmp_path / "released")
    time.sleep(0.3)
    held = (tmp_path / "released").exists()
    release()
    os.waitpid(pid, 0)
    assert not held and (tmp_path / "released").read_text() == "ran"
    # A monitor killed before its release: the parent's end of the hold closes, and the worker exits unrun.
    monitor = os.fork()
    if monitor == 0:
        fork_writer(tmp_path / "orphan")
        os._exit(0)
    os.waitpid(monitor, 0)
    time.sleep(0.3)
    assert not (tmp_path / "orphan").exists()


@needs_sandbox
def test_the_results_file_is_hidden_even_inside_the_course(cli, tmp_path, tiny_path, monkeypatch):
    results = tmp_path / "c" / "results.json"
    _probe_adapter(
        tmp_path / "c", f"return 'read the results file' if 'grades' in open({str(results)!r}).read() else None"
    )
    monkeypatch.setenv("CI", "true")
    for trusted in (False, True):
        results.write_text('{"earlier": "grades"}')
        if trusted:
            monkeypatch.setenv("CI", "false")
        code = cli(
            "test",
            "--course",
            tmp_path / "c",
            "--weights",
            tiny_path,
            "--stage",
            STAGE,
            "--format",
            "json",
            "--output",
            results,
        ).exit_code
        doc = json.loads(results.read_text())
        assert (code, doc["status"]) == ((1, "fail") if trusted else (0, "pass"))


@pytest.mark.parametrize("fmt", ["junit", "gradescope", "github"])
def test_every_ci_format_names_the_isolation_level(cli, solution_course, tiny_path, monkeypatch, fmt):
    monkeypatch.setenv("CI", "false")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    out = cli("test", "--stage", STAGE, "--course", solution_course, "--weights", tiny_path, "--format", fmt).stdout
    # Gradescope output is always graded as untrusted, so it runs at the strongest level there is.
    trusted_level = "subreaper" if sys.platform == "linux" else "process-group"
    level = strongest_isolation().level if fmt == "gradescope" else trusted_level
    assert (f'name="isolation" value="{level}: ' if fmt == "junit" else f"isolation: {level}") in out
