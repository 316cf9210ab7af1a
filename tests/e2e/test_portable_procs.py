"""The portable process mechanisms (macOS, Windows), proven on Linux by forcing them through the CLI.

Each run is a real `python -m theinference test` in a subprocess, with the trusted switches that force the portable
mechanism (reaper.SWITCHES), or with /proc hidden under bubblewrap (psutil then reads the real procfs mounted at
another path: THEINFERENCE_PSUTIL_PROCFS). Every process of a run carries a marker variable in its environment, so
the test can ask psutil afterwards whether anything the run started is still alive.
"""

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import scaled, write_adapters
from theinference.proc import launch, protocol, reaper

FORCED = {"THEINFERENCE_SPAWN": "popen", "THEINFERENCE_KILL": "psutil"}
# What macOS offers: fork, no subreaper (so no zygote: launch._can_fork_a_zygote), no PR_SET_PDEATHSIG, no /proc.
# Windows: no fork either.
LIKE_MACOS = {"THEINFERENCE_ORPHANS": "watch", "THEINFERENCE_GRADER_DEATH": "eof", "THEINFERENCE_KILL": "psutil"}
LIKE_WINDOWS = {**LIKE_MACOS, "THEINFERENCE_SPAWN": "popen"}

# The solution's adapter, run after starting a process that outlives the call: a setsid daemon by a double fork
# (its parent exits at once), or a process in a session of its own that the worker leaves behind when it exits.
DAEMON = """
import os, subprocess, sys, time
import importlib.util
_spec = importlib.util.spec_from_file_location("solution_adapters", os.path.join(os.path.dirname(__file__), "solution_adapters.py"))
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_solution = _module.run_layer_equiv

PIDS = {pids!r}
LOOP = {loop!r}


def _double_fork():
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            with open(PIDS, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            while True:
                time.sleep(3600)
        os._exit(0)
    os.wait()


def _left_behind():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
    with open(PIDS, "a") as f:
        f.write(f"{{sleeper.pid}}\\n")


def run_layer_equiv(seq_ids):
    with open(PIDS + ".workers", "a") as f:  # for the test's cleanup: a forked worker does not carry its marker
        f.write(f"{{os.getpid()}}\\n")
    _double_fork()
    _left_behind()
    while LOOP:
        pass
    return _solution(seq_ids)
"""


def _course(solution_course: Path, tmp_path: Path, loop: bool = False) -> tuple[Path, Path]:
    """The reference solution, its adapter starting a daemon (and looping forever if loop); the daemons' pid file."""
    pids = tmp_path / "daemons.pid"
    tests = solution_course / "tests"
    shutil.move(tests / "adapters.py", tests / "solution_adapters.py")
    write_adapters(solution_course, DAEMON.format(pids=str(pids), loop=loop))
    return solution_course, pids


def _grader(course: Path, weights: Path, env: dict, *options: str, hide_proc: Path | None = None) -> subprocess.Popen:
    command = [sys.executable, "-m", "theinference", "test", "--stage", "prove-one-layer", "--format", "json"]
    command += ["--weights", str(weights), "--course", str(course), *options]
    # No cgroups, as on a laptop: a run's cgroup would kill what the monitor left, and hide a monitor that left some.
    wrap = ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/sys/fs/cgroup"]
    if hide_proc is not None:  # /proc an empty tmpfs; the real procfs at hide_proc, for psutil only
        wrap += ["--bind", "/proc", str(hide_proc), "--tmpfs", "/proc"]
        env = {**env, "THEINFERENCE_PSUTIL_PROCFS": str(hide_proc)}
    return subprocess.Popen([*wrap, "--", *command], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _marked(marker: str) -> list[psutil.Process]:
    """Every live process (not a zombie) whose environment carries the run's marker."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and process.environ().get("PORTABLE_TEST_RUN") == marker:
                found.append(process)
        except psutil.Error:
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _env(switches: dict) -> tuple[dict, str]:
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in reaper.PASSED_ON}
    return {**env, **switches, "PORTABLE_TEST_RUN": marker, "THEINFERENCE_LAUNCHER": ""}, marker


def _cleanup(marker: str, pids: Path) -> None:
    """A failed test leaves nothing running either: the run's marked processes, and the workers and daemons it
    started (a worker forked from the zygote shows the zygote's environment, not the marker)."""
    for process in _marked(marker):
        process.kill()
    for path in (pids, Path(f"{pids}.workers")):
        for pid in path.read_text().split() if path.exists() else []:
            if _alive(int(pid)):
                os.kill(int(pid), signal.SIGKILL)


def _stage(out: str) -> dict:
    return json.loads(out)["stages"][0]


HIDDEN = "hidden-proc"
MODES = {
    "popen+psutil": FORCED,
    "like-macos": LIKE_MACOS,
    "like-windows": LIKE_WINDOWS,
    "eof-only": {"THEINFERENCE_GRADER_DEATH": "eof"},  # the zygote's monitors without PR_SET_PDEATHSIG
    HIDDEN: {},
}


def _run(mode: str, course: Path, weights: Path, tmp_path: Path, *options: str) -> tuple[subprocess.Popen, str]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    env, marker = _env(MODES[mode])
    hide = tmp_path / "real-proc" if mode == HIDDEN else None
    if hide is not None:
        hide.mkdir()
    return _grader(course, weights, env, *options, hide_proc=hide), marker


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["popen+psutil", "like-macos", "like-windows", HIDDEN])
def test_the_solution_passes_and_its_daemons_die(mode, solution_course, tiny_path, tmp_path):
    course, pids = _course(solution_course, tmp_path)
    grader, marker = _run(mode, course, tiny_path, tmp_path)
    try:
        out, err = grader.communicate(timeout=scaled(60))
        stage = _stage(out)
        assert (grader.returncode, stage["status"]) == (0, "pass"), err
        started = [int(line) for line in pids.read_text().split()]
        assert len(started) == 2 * stage["total_cases"]  # both daemons of each case were started, and each is dead
        assert [pid for pid in started if _alive(pid)] == []
        assert _marked(marker) == []  # nor is any other process of the run (monitors, zygote, workers) left
    finally:
        _cleanup(marker, pids)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["popen+psutil", "like-macos", HIDDEN])
def test_an_endless_loop_times_out_with_nothing_left(mode, solution_course, tiny_path, tmp_path):
    course, pids = _course(solution_course, tmp_path, loop=True)
    grader, marker = _run(mode, course, tiny_path, tmp_path, "--timeout", str(scaled(1)))
    try:
        out, err = grader.communicate(timeout=scaled(60))
        stage = _stage(out)
        assert (grader.returncode, stage["status"]) == (1, "timeout"), err
        assert stage["cases"][0]["status"] == "timeout"
        started = [int(line) for line in pids.read_text().split()]
        assert started and [pid for pid in started if _alive(pid)] == []
        assert _marked(marker) == []
    finally:
        _cleanup(marker, pids)


def _looping(grader: subprocess.Popen, pids: Path) -> list[int]:
    """Once the adapter loops: its daemons' pids (both alive)."""
    deadline = time.monotonic() + scaled(30)
    while (not pids.exists() or len(pids.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = [int(line) for line in pids.read_text().split()]
    assert len(started) == 2 and all(_alive(pid) for pid in started)  # the loop runs, its daemons live
    return started


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["like-macos", "like-windows", HIDDEN])
def test_ctrl_c_kills_the_whole_tree(mode, solution_course, tiny_path, tmp_path):
    course, pids = _course(solution_course, tmp_path, loop=True)
    grader, marker = _run(mode, course, tiny_path, tmp_path, "--timeout", "600")
    try:
        started = _looping(grader, pids)
        psutil.Process(grader.pid).children()[0].send_signal(signal.SIGINT)  # the grader, under bwrap
        _, err = grader.communicate(timeout=scaled(30))
        assert grader.returncode == 130, err
        assert [pid for pid in started if _alive(pid)] == []
        assert _marked(marker) == []
    finally:
        _cleanup(marker, pids)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["eof-only", "like-macos", "like-windows", HIDDEN])
def test_the_tree_dies_with_a_sigkilled_grader(mode, solution_course, tiny_path, tmp_path):
    course, pids = _course(solution_course, tmp_path, loop=True)
    grader, marker = _run(mode, course, tiny_path, tmp_path, "--timeout", "600")
    try:
        started = _looping(grader, pids)
        psutil.Process(grader.pid).children()[0].kill()  # no cleanup runs: the monitors see the grader go
        grader.wait(timeout=scaled(30))  # bwrap, once the grader is dead
        deadline = time.monotonic() + scaled(20)
        while (_marked(marker) or any(map(_alive, started))) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in started if _alive(pid)] == []
        assert _marked(marker) == []
    finally:
        _cleanup(marker, pids)


def test_mechanisms_name_linux_own_unless_a_switch_forces_the_portable_one(monkeypatch):
    for name in reaper.PASSED_ON:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("THEINFERENCE_LAUNCHER", raising=False)
    linux = launch.mechanisms()
    assert linux["launcher"].startswith("zygote") and linux["spawn"] == "fork" and linux["group"] == "setsid"
    assert linux["orphans"] == "PR_SET_CHILD_SUBREAPER" and linux["kill"] == "/proc scan: stopped, then killed"
    assert linux["grader-death"].startswith("PR_SET_PDEATHSIG") and linux["interrupt"] == "killpg"
    assert linux["limits"].startswith("setrlimit")
    assert launch.mechanisms(untrusted=True)["launcher"] == "a fresh interpreter per run"
    for name, value in LIKE_WINDOWS.items():
        monkeypatch.setenv(name, value)
    portable = launch.mechanisms()
    assert portable["launcher"] == "a fresh interpreter per run" and portable["spawn"] == "subprocess (no fork)"
    assert portable["orphans"].endswith("and the run's mark in its processes' environment")
    assert portable["orphans"].startswith("the monitor's watch") and portable["kill"].startswith("psutil")
    assert portable["grader-death"] == "end-of-file on the status socket"
    assert isinstance(launch.default_launcher(), launch.SubprocessLauncher)
    monkeypatch.delenv("THEINFERENCE_SPAWN")
    assert launch.mechanisms()["launcher"] == "a fresh interpreter per run"  # fork, but no subreaper: no zygote
    monkeypatch.setenv("THEINFERENCE_LAUNCHER", "zygote")  # forced: what it marks is said
    assert launch.mechanisms()["orphans"].endswith("the run's mark in the environment of the processes it executes")
    monkeypatch.setenv("THEINFERENCE_KILL", "psutils")
    with pytest.raises(launch.SwitchError, match="THEINFERENCE_KILL=psutils"):
        launch.mechanisms()


def test_limits_say_what_bounds_memory_without_the_resource_module(monkeypatch):
    assert launch.mechanisms()["memory"].startswith("the worker's address-space limit")
    monkeypatch.setitem(sys.modules, "resource", None)  # as on Windows: `import resource` raises ImportError
    without = launch.mechanisms()
    assert without["limits"] == "none in the worker (no resource module)"
    assert without["memory"] == "the run's cgroup or else the grader's watch over the tree"
    assert without["hangs"].startswith("the grader's timeouts")


TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(3600)
"""


def test_kill_group_without_killpg_kills_the_tree(monkeypatch):
    """Where there is no killpg (Windows) the process and its descendants die, whatever group they moved to."""
    from theinference.proc import interrupt

    parent = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        monkeypatch.delattr(os, "killpg")
        interrupt.kill_group(parent.pid)
        assert parent.wait(timeout=scaled(10)) == -signal.SIGKILL
        deadline = time.monotonic() + scaled(10)
        while _alive(child) and time.monotonic() < deadline:  # our grandchild: reaped by init, or a zombie
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        parent.kill()
        parent.wait()


# The adapter that kills its monitor the moment it is imported, after starting a daemon in a session of its own.
MONITOR_KILLER = """
import os, signal, subprocess, sys
sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
with open({pids!r}, "a") as f:
    f.write(f"{{sleeper.pid}}\\n")
with open({pids!r} + ".workers", "a") as f:
    f.write(f"{{os.getpid()}}\\n")
os.kill(os.getppid(), signal.SIGKILL)  # the monitor (the worker's parent), which would have killed the daemon

def run_layer_equiv(seq_ids):
    return []
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["popen+psutil", "like-windows"])
def test_a_worker_without_fork_that_kills_its_monitor_at_import_is_an_error_with_nothing_left(
    mode, solution_course, tiny_path, tmp_path
):
    """Started without fork, the worker runs the student's code only once its pid is reported (popen_held): the grader
    knows whose tree to kill however early the monitor dies. Where the grader is a subreaper (Linux) the daemon comes
    back to it and dies too; without one (like-windows) the grader kills what carries the mark its monitor reported
    before any student code ran (a process that removes the mark from its environment escapes that: only Linux
    guarantees nothing outlives a grading, as the README says)."""
    pids = tmp_path / "daemons.pid"
    write_adapters(solution_course, MONITOR_KILLER.format(pids=str(pids)))
    grader, marker = _run(mode, solution_course, tiny_path, tmp_path)
    try:
        out, err = grader.communicate(timeout=scaled(60))
        stage = _stage(out)
        assert (grader.returncode, stage["status"]) == (1, "error"), err
        assert all("killed its monitor" in case["message"] for case in stage["cases"])
        workers = [int(line) for line in Path(f"{pids}.workers").read_text().split()]
        assert workers and [pid for pid in workers if _alive(pid)] == []
        daemons = [int(line) for line in pids.read_text().split()]
        assert daemons and [pid for pid in daemons if _alive(pid)] == []
        assert _marked(marker) == []
    finally:
        _cleanup(marker, pids)


def _held_worker(tmp_path: Path, command: list[str], adapters: Path, monkeypatch) -> tuple[subprocess.Popen, int]:
    """A worker started as the monitor starts it without fork (reaper.popen_held): (it, the hold's write end)."""
    job = {
        "course_root": str(tmp_path),
        "adapters": str(adapters),
        "names": ["run_single_step", "runSingleStep"],
        "calls": [],
        "start": 0,
        "out_dir": str(tmp_path),
        "interactive": False,
        "limits": {"memory_bytes": None, "file_bytes": None, "shares_uid": False, "seal": False},
    }
    (tmp_path / "job.json").write_text(json.dumps(job))
    events, proto = os.pipe()
    monkeypatch.setenv(protocol.PROTOCOL_FD_ENV, protocol.token(proto))
    try:
        worker, release = reaper.popen_held([*command, str(tmp_path / "job.json")])
    finally:
        os.close(proto)
        os.close(events)  # the worker's first event breaks its pipe: it has run by then, which is what is asked
    assert isinstance(release, functools.partial)
    return worker, release.args[0]


def _python_worker(tmp_path: Path) -> tuple[list[str], Path]:
    adapters = write_adapters(tmp_path, f"open({str(tmp_path / 'ran')!r}, 'w').write('ran')\n")
    return [sys.executable, "-P", "-m", "theinference.proc.child"], adapters


def _node_worker(tmp_path: Path) -> tuple[list[str], Path]:
    from theinference.proc.node import HARNESS, node_executable

    node = node_executable()
    if node is None:
        pytest.skip("Node.js is not installed")
    if os.name == "nt":  # the harness is told "go" over its socket there (channels.NodeSocket), never by a handle
        pytest.skip("on Windows the TypeScript worker is held by its socket")
    (tmp_path / "tests").mkdir(exist_ok=True)
    adapters = tmp_path / "tests" / "adapters.mjs"
    adapters.write_text(f'import fs from "node:fs";\nfs.writeFileSync({json.dumps(str(tmp_path / "ran"))}, "ran");\n')
    return [node, str(HARNESS)], adapters


@pytest.mark.parametrize("worker", [_python_worker, _node_worker], ids=["python", "node"])
def test_a_worker_without_fork_runs_nothing_before_its_release_and_nothing_if_its_monitor_dies(
    worker, tmp_path, monkeypatch
):
    command, adapters = worker(tmp_path)
    held, hold = _held_worker(tmp_path, command, adapters, monkeypatch)
    try:
        time.sleep(scaled(1))  # long enough to start an interpreter and import the adapters, were it not held
        assert held.poll() is None and not (tmp_path / "ran").exists()
        reaper._release(hold)
        held.wait(timeout=scaled(30))
        assert (tmp_path / "ran").read_text() == "ran"
    finally:
        held.kill()
        held.wait()
    (tmp_path / "ran").unlink()
    # The monitor gone before its release: the hold's end closes without the byte, and the worker exits unrun.
    orphan, hold = _held_worker(tmp_path, command, adapters, monkeypatch)
    try:
        os.close(hold)
        assert orphan.wait(timeout=scaled(30)) == 1
        assert not (tmp_path / "ran").exists()
    finally:
        orphan.kill()
        orphan.wait()
