"""The CPU meters (theinference.proc.accounting): which one a run gets, psutil's bookkeeping, stale cgroups, and
the course graded end to end where /proc is hidden, as on macOS (no /proc at all).

/proc is hidden the way the brief of every portable path says: `bwrap --dev-bind / / --bind /proc R --tmpfs /proc`
(the real procfs bound at R first, then an empty tmpfs over /proc), and psutil alone is pointed at R
(THEINFERENCE_PSUTIL_PROCFS): any direct /proc read of the grader's finds nothing there.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from theinference.bundled import data_dir
from theinference.grading.tools.mutants import build_mutant, load_mutants
from theinference.proc import accounting
from theinference.proc.accounting import METER_ENV, PSUTIL_CHILDREN_ENV, PSUTIL_PROCFS_ENV, MeterUnavailable

REAL_PROC = "/run/realproc"
HIDE_PROC = ["bwrap", "--dev-bind", "/", "/", "--bind", "/proc", REAL_PROC, "--tmpfs", "/proc", "--"]
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="hiding /proc needs bubblewrap")


@pytest.fixture
def no_proc(tmp_path, monkeypatch):
    """Cgroup discovery and the /proc meter's test look at an empty directory, as where /proc is hidden."""
    empty = tmp_path / "no-proc"
    empty.mkdir()
    monkeypatch.setattr(accounting, "_PROC", empty)
    for name in (METER_ENV, PSUTIL_CHILDREN_ENV):
        monkeypatch.delenv(name, raising=False)


def test_without_proc_no_cgroup_is_found_and_the_psutil_meter_is_chosen(no_proc):
    assert accounting.Cgroup.create() is None
    assert accounting.run_cgroup() is None
    assert accounting.tree_kind() == "psutil"
    assert accounting.meter_name() == "process tree (psutil)"


def test_a_forced_meter_that_cannot_work_is_an_error_not_a_fallback(no_proc, monkeypatch):
    monkeypatch.setenv(METER_ENV, "proc")
    with pytest.raises(MeterUnavailable, match="THEINFERENCE_METER=proc, but /proc shows no processes here"):
        accounting.tree_kind(accounting.forced_meter())
    monkeypatch.setenv(METER_ENV, "cgroup")
    with pytest.raises(MeterUnavailable, match="THEINFERENCE_METER=cgroup, but this process may make no cgroup"):
        accounting.run_cgroup()
    monkeypatch.setenv(METER_ENV, "kernel")
    with pytest.raises(MeterUnavailable, match="names no CPU meter: it is one of cgroup, proc, psutil"):
        accounting.meter_name()
    monkeypatch.setenv(METER_ENV, "psutil")
    monkeypatch.setenv(PSUTIL_CHILDREN_ENV, "yes")
    with pytest.raises(MeterUnavailable, match="THEINFERENCE_PSUTIL_CHILDREN='yes': 0"):
        accounting.tree_kind(accounting.forced_meter())


def test_forcing_a_tree_meter_makes_no_cgroup_and_names_it(monkeypatch):
    monkeypatch.setenv(METER_ENV, "psutil")
    assert accounting.run_cgroup() is None and accounting.meter_name() == "process tree (psutil)"
    if not os.path.isdir("/proc/self"):  # macOS, Windows: forcing /proc is an error (the test above)
        return
    monkeypatch.setenv(METER_ENV, "proc")
    assert accounting.run_cgroup() is None and accounting.meter_name() == "process tree (/proc)"


# A monitor as the real one behaves for the meter: it works itself (the grader's CPU, not the student's), starts a
# child that burns CPU and says how much, waits for it (reaps it), says so, and lives on.
_CHILD = "import time\nwhile time.process_time() < 0.2: pass\nprint(time.process_time(), flush=True)\ntime.sleep(0.3)"
_MONITOR = textwrap.dedent(
    f"""
    import subprocess, sys, time
    while time.process_time() < 0.2:
        pass
    subprocess.run([sys.executable, "-c", {_CHILD!r}])
    print("reaped", flush=True)
    time.sleep(60)
    """
)


def _lines(stream, into: list[str]) -> None:
    for line in stream:
        into.append(line.strip())


# A monitor as the real one is (a child subreaper) with a tree below it: a child, and that child's child, which burns
# CPU, says how much, and lives on after its parent has ended (an orphan, reparented to the monitor).
_BURNER = "import time\nwhile time.process_time() < 0.3: pass\nprint(time.process_time(), flush=True)\ntime.sleep(60)"
_ORPHANING = f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {_BURNER!r}])"
_SUBREAPER = textwrap.dedent(
    f"""
    import ctypes, subprocess, sys, time
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    subprocess.run([sys.executable, "-c", {_ORPHANING!r}])
    time.sleep(60)
    """
)


@pytest.mark.slow
def test_a_look_at_a_process_tree_reads_its_own_processes_only_and_counts_an_orphans_cpu(monkeypatch):
    monitor = subprocess.Popen([sys.executable, "-c", _SUBREAPER], stdout=subprocess.PIPE, text=True)
    orphans: list[int] = []
    try:
        assert monitor.stdout is not None
        burned = float(monitor.stdout.readline())  # the orphan's CPU, once its parent has long ended
        read: list[int] = []
        real = accounting._stat_fields
        monkeypatch.setattr(accounting, "_stat_fields", lambda pid: read.append(pid) or real(pid))
        tree = accounting.ProcTree(monitor.pid)
        cpu = tree.cpu_seconds()
        orphans = tree.descendants()
        assert len(orphans) == 1 and cpu >= burned, (orphans, cpu, burned)
        # The stat of the monitor and the orphan, not of every process on the machine.
        assert set(read) == {monitor.pid, *orphans}, read
    finally:
        monitor.kill()
        monitor.wait()
        for pid in orphans:
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_psutil_keeps_an_exited_childs_cpu_without_children_fields_and_does_not_count_it_twice_with_them():
    monitor = subprocess.Popen([sys.executable, "-c", _MONITOR], stdout=subprocess.PIPE, text=True)
    said: list[str] = []
    threading.Thread(target=_lines, args=(monitor.stdout, said), daemon=True).start()
    try:
        without = accounting.PsutilTree(monitor.pid, children=False)  # as on macOS and Windows
        with_children = accounting.PsutilTree(monitor.pid, children=True)  # as on Linux
        deadline = time.monotonic() + 60
        while "reaped" not in said and time.monotonic() < deadline:
            without.cpu_seconds()  # polled while the child lives, as calls.py does while a call runs
            time.sleep(0.02)
        assert said[-1] == "reaped", said
        child_cpu = float(said[0])
        assert without.descendants() == []  # the child is gone: only its last reading is left
        kept, reaped = without.cpu_seconds(), with_children.cpu_seconds()
        # Clock ticks (10 ms) against the child's own precise count; the monitor's 0.2 s of its own work is left out.
        assert abs(kept - child_cpu) < 0.05, (kept, child_cpu)
        assert abs(reaped - child_cpu) < 0.05, (reaped, child_cpu)
    finally:
        monitor.kill()
        monitor.wait()


class _Times:
    def __init__(self, user: float):
        self.user, self.system, self.children_user, self.children_system = user, 0.0, 5.0, 5.0


class _Process:
    """A psutil.Process as PsutilTree reads it, with the reading it is given."""

    def __init__(self, pid: int, started: float, user: float):
        self.pid, self.started, self.user = pid, started, user

    def oneshot(self):
        return _NoContext()

    def cpu_times(self):
        return _Times(self.user)

    def create_time(self):
        return self.started


class _NoContext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_reused_pid_is_another_process_to_psutils_bookkeeping(monkeypatch):
    tree = accounting.PsutilTree(os.getpid(), children=False)
    looks = iter([[_Process(100, 1.0, 0.5)], [], [_Process(100, 2.0, 0.25)], [_Process(100, 2.0, 0.75)]])
    monkeypatch.setattr(tree, "_tree", lambda: next(looks))
    # First process 100 is seen, then has exited (its reading stays); a new process 100 (another start time) is
    # counted beside it, and its own later reading replaces its earlier one. Children fields are never counted.
    assert [tree.cpu_seconds() for _ in range(4)] == [0.5, 0.5, 0.75, 1.25]


def _estimating_tree(monkeypatch, cpu: list[float], now: list[float], load: list[float]):
    """A PsutilTree whose one process has used cpu[0] seconds, on a 2-core machine at load[0], at time now[0]."""
    tree = accounting.PsutilTree(os.getpid(), children=False)
    monkeypatch.setattr(tree, "_tree", lambda: [_Process(100, 1.0, cpu[0])])
    monkeypatch.setattr(accounting.time, "monotonic", lambda: now[0])
    monkeypatch.setattr("theinference.proc.clock.time.monotonic", lambda: now[0])
    monkeypatch.setattr(accounting.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(accounting, "load_average", lambda: load[0])
    return tree


def test_psutil_estimates_a_busy_machines_wait_from_the_cpu_the_tree_got_and_a_step_is_charged_the_rest(
    monkeypatch,
):
    """Where the run-queue wait cannot be read (macOS, Windows), a busy laptop no longer eats a step's timeout: at
    load 8 on 2 cores a runnable thread gets a quarter of a core, so each second of CPU it got cost three waiting."""
    from theinference.proc.clock import StepClock

    cpu, now, load = [2.0], [1000.0], [8.0]
    tree = _estimating_tree(monkeypatch, cpu, now, load)
    assert tree.sample() == (2.0, 0.0)  # the first look: nothing to estimate from
    cpu[0], now[0] = 12.0, 1040.0
    assert tree.sample() == (12.0, 30.0)  # 10 s of CPU in 40 s: 30 s waited
    load[0] = 1.5  # fewer runnable than cores: nothing waited
    cpu[0], now[0] = 17.0, 1050.0
    assert tree.sample() == (17.0, 30.0)

    clock = StepClock.__new__(StepClock)  # the clock over that tree: charged wall-clock time less the estimate
    clock.tree, clock.timeout, clock.before, clock.knows_wait = tree, 120.0, 0.0, False
    clock._begin()
    load[0] = 8.0
    cpu[0], now[0] = 42.0, 1150.0
    reading = clock.reading()
    assert (reading.wall, reading.cpu, reading.waited, reading.charged) == (100.0, 25.0, 75.0, 25.0)
    assert "estimated from the load average" in clock.wall_note()


def test_a_tree_that_sleeps_on_a_busy_machine_waited_for_no_cpu_and_times_out_as_before(monkeypatch):
    """A hang that sleeps or blocks gets no CPU: the load takes nothing off its wall-clock time, so it is a timeout,
    never 'the machine was too busy' at the backstop."""
    cpu, now, load = [0.5], [1000.0], [20.0]
    tree = _estimating_tree(monkeypatch, cpu, now, load)
    tree.sample()
    now[0] += 120.0
    assert tree.sample() == (0.5, 0.0)
    cpu[0], now[0] = 0.7, now[0] + 10.0  # a little CPU in a long interval: its wait is at most the interval
    assert tree.sample() == (0.7, pytest.approx(0.2 * 9.0))
    cpu[0], now[0] = 100.7, now[0] + 10.0  # many threads' CPU in one interval: never more wait than the interval
    assert tree.sample()[1] == pytest.approx(0.2 * 9.0 + 10.0)


def test_no_load_average_is_no_wait(monkeypatch):
    assert accounting.wait_per_cpu_second(None, 2) == 0.0 and accounting.wait_per_cpu_second(2.0, 2) == 0.0
    assert accounting.wait_per_cpu_second(8.0, 2) == 3.0
    import psutil

    monkeypatch.delattr(os, "getloadavg", raising=False)
    monkeypatch.setattr(psutil, "getloadavg", lambda: (6.0, 1.0, 1.0))
    assert accounting.load_average() == 6.0
    monkeypatch.delattr(psutil, "getloadavg")
    assert accounting.load_average() is None


def test_psutil_sums_what_the_tree_holds(monkeypatch):
    monitor = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', " + repr(_HOLD) + "])"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert monitor.stdout is not None and monitor.stdout.readline().strip() == "holding"
        held = accounting.PsutilTree(monitor.pid, children=True).held()
        assert 100 * 2**20 <= held < 200 * 2**20, held  # the child's 100 MB, not the monitor's own
    finally:
        monitor.kill()
        monitor.wait()


_HOLD = "b = bytearray(100 * 2**20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('holding', flush=True)\nimport time; time.sleep(60)"


def _v2_base() -> Path | None:
    """Where this process may make cgroups (v2), or None."""
    mounts, own = accounting._mounts(), accounting._own_paths()
    if "v2" not in mounts or "v2" not in own:
        return None
    base = mounts["v2"] / own["v2"].lstrip("/")
    probe = base / f"probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return None
    probe.rmdir()
    return base


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


@pytest.mark.skipif(_v2_base() is None, reason="needs a cgroup v2 hierarchy this process may make groups in")
@pytest.mark.parametrize("kill_file", [True, False], ids=["cgroup.kill", "SIGKILL each"])
def test_a_killed_graders_group_is_emptied_by_killing_what_is_left_then_removed(monkeypatch, kill_file):
    base = _v2_base()
    assert base is not None
    if not kill_file:  # as on a kernel before 5.14, or cgroup v1: each process is sent SIGKILL
        real = accounting._write
        monkeypatch.setattr(accounting, "_write", lambda path, value: path.name != "cgroup.kill" and real(path, value))
    stale = base / f"theinference-{_dead_pid()}-{uuid.uuid4().hex[:8]}"
    live = base / f"theinference-{os.getpid()}-{uuid.uuid4().hex[:8]}"  # a grader still running: not touched
    leftovers = []
    for group in (stale, live):
        group.mkdir()
        leftover = subprocess.Popen(["sleep", "600"])
        (group / "cgroup.procs").write_text(str(leftover.pid))
        leftovers.append(leftover)
    try:
        accounting.remove_stale_groups()
        assert leftovers[0].wait(timeout=10) == -signal.SIGKILL
        assert not stale.exists()
        assert live.exists() and leftovers[1].poll() is None
    finally:
        accounting.Cgroup({"v2": live}, "v2").remove()
        for leftover in leftovers:
            leftover.kill()
            leftover.wait()
        for group in (stale, live):
            if group.exists():
                group.rmdir()


# --- the course through the real CLI, where /proc is hidden and where a tree meter is forced -------------------


def _grade(course: Path, proof_cache: Path, *args: str, hide: bool, **env: str) -> dict:
    """`theinference test` on the course (tiny weights; cache-scaling on the proof preset) as a JSON document."""
    environ = {**os.environ, "THEINFERENCE_CACHE": str(proof_cache), **env}
    command = [sys.executable, "-m", "theinference", "test", "--course", str(course), "--weights", "tiny"]
    command += [*args, "--format", "json"]
    if hide:
        environ[PSUTIL_PROCFS_ENV] = REAL_PROC
        command = HIDE_PROC + command
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=1800, cwd=course)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return json.loads(done.stdout)


def _scaling(doc: dict) -> dict:
    stage = next(s for s in doc["stages"] if s["id"] == "cache-scaling")
    return stage["cases"][0]


@pytest.mark.slow
@needs_bwrap
@pytest.mark.parametrize(
    "hide, env, source",
    [
        (True, {PSUTIL_CHILDREN_ENV: "0"}, "process tree (psutil)"),  # as on macOS and Windows; no meter forced
        (False, {METER_ENV: "proc"}, "process tree (/proc)"),  # as root here a cgroup would be chosen
    ],
    ids=["psutil-no-children-proc-hidden", "proc-forced"],
)
def test_the_reference_solution_passes_every_stage_counted_by_a_tree_meter(
    solution_course, proof_cache, hide, env, source
):
    doc = _grade(solution_course, proof_cache, "--all", hide=hide, **env)
    statuses = {stage["id"]: stage["status"] for stage in doc["stages"]}
    assert set(statuses.values()) == {"pass"} and "cache-scaling" in statuses, statuses
    assert _scaling(doc)["scaling"]["accounting"].startswith(source)  # /proc: ", sealed: ..." (proc/seal.py)


@pytest.mark.slow
@needs_bwrap
def test_a_recompute_fails_cache_scaling_as_no_cache_where_proc_is_hidden(tmp_path, proof_cache):
    mutant = next(m for m in load_mutants(data_dir("course") / "mutants") if m.name == "decode-recomputes")
    assert mutant.expect.get("cache-scaling") == ("no-cache",)
    course = build_mutant(mutant, data_dir("course") / "solution", tmp_path / mutant.name)
    doc = _grade(course, proof_cache, "--stage", "cache-scaling", hide=True, **{PSUTIL_CHILDREN_ENV: "0"})
    case = _scaling(doc)
    assert case["status"] == "fail" and case["diagnosis"]["shape"] == "no-cache", case
    assert case["scaling"]["accounting"] == "process tree (psutil)"


def test_a_forced_meter_that_cannot_work_stops_the_run_with_exit_2(cli, solution_course, tiny_path, monkeypatch):
    monkeypatch.setenv(METER_ENV, "kernel")
    result = cli("test", "--course", solution_course, "--weights", tiny_path, "--stage", "forward")
    assert result.exit_code == 2
    assert "THEINFERENCE_METER='kernel' names no CPU meter: it is one of cgroup, proc, psutil" in result.output
