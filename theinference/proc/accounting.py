"""CPU time of a student's whole process tree, counted by the kernel and read from outside it.

Nothing the student's process says about itself is used: a cache-scaling verdict (and a CPU
budget) rests on what the grader reads here. Three meters, the first that works here (chosen by what
the machine offers, never by its platform's name; THEINFERENCE_METER=cgroup|proc|psutil forces one,
and a forced meter that cannot work is an error, not a fallback):

- `cgroup`: a control group made for the run (cgroup v2 `cpu.stat`, else v1 `cpuacct.usage`).
  The monitor joins it before it forks the worker, so every process and thread the submission
  ever runs is counted, reaped or not, detached or not, until the grader removes the group.
  Made where the grader may (root, or a delegated v2 subtree); a student process running as
  another user cannot leave it. The same group caps the tree's processes and memory (v2
  `pids.max`/`memory.max`, v1 `pids`/`memory` hierarchies) where those controllers exist.
- `proc` (`ProcTree`): /proc of the monitor and every descendant: each live thread's run time
  (schedstat, in ns), each process's dead threads and reaped children (stat's utime, stime,
  cutime, cstime, in clock ticks). The monitor is a child subreaper, so orphans stay in the
  tree and are reaped by it. A dead monitor ends the measurement: `MonitorGone`.
- `psutil` (`PsutilTree`): the same tree through psutil, where /proc shows no processes (macOS,
  Windows). Where psutil reports reaped children's CPU (Linux) it counts as ProcTree does; where it
  does not (those fields are 0), an exited process keeps the last reading seen of it.

The last two are not complete: a child the kernel reaps by itself (its parent ignores SIGCHLD) takes
its CPU out of their count, and so, with psutil where children's CPU is not reported, does the CPU a
process uses after the last look at it. Their readings are raw (never clamped): a count that shrinks
is for the verdict's side to judge.

Memory is capped the same ways: by the cgroup's memory controller where the group has one, else by
`TreeMemory`, the grader's own sum over the process tree of what each process holds (/proc: its proportional
share of anonymous and shared-memory pages, and its swap; psutil: its unique set size, else its resident set),
checked while the run goes on.
"""

import functools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from theinference.errors import ConfigError

_TICK = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
_PREFIX = "theinference-"
_PROC = Path("/proc")  # where cgroup discovery and the /proc meter's test look (a test points it elsewhere)

METER_ENV = "THEINFERENCE_METER"  # cgroup | proc | psutil: force one meter (trusted: the instructor's, for tests)
# 0: ignore psutil's reaped-children fields, as on macOS and Windows where they are 0 (1: count them); unset: probed
PSUTIL_CHILDREN_ENV = "THEINFERENCE_PSUTIL_CHILDREN"
# Test-only: the procfs psutil reads (on Linux), so that psutil works with /proc itself hidden and nothing of ours
# that reads /proc directly does
PSUTIL_PROCFS_ENV = "THEINFERENCE_PSUTIL_PROCFS"
MeterKind = Literal["cgroup", "proc", "psutil"]
TreeKind = Literal["proc", "psutil"]
KINDS: tuple[MeterKind, ...] = ("cgroup", "proc", "psutil")


class MeterUnavailable(ConfigError):
    """THEINFERENCE_METER names a meter that cannot work on this machine (or no meter at all)."""


class MemoryExceeded(Exception):
    """The student's processes together held more memory than the limit (that run's error)."""


class MonitorGone(Exception):
    """The process the tree hangs from is dead: what the tree did since cannot be counted."""


@dataclass(frozen=True)
class TreeLimits:
    """Caps over all of one run's processes together (applied where a controller is available)."""

    max_pids: int | None = None
    memory_bytes: int | None = None


def _mounts() -> dict[str, Path]:
    """Where each cgroup hierarchy is mounted: 'v2' -> the unified mount, a v1 controller name -> its mount."""
    found: dict[str, Path] = {}
    try:
        lines = (_PROC / "self" / "mountinfo").read_text().splitlines()
    except (OSError, UnicodeError):  # no /proc (hidden, or none on this platform): no cgroup
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, kind = left.split(), right.split()
        if len(fields) < 5 or not kind:
            continue
        if kind[0] == "cgroup2":
            found.setdefault("v2", Path(fields[4]))
        elif kind[0] == "cgroup" and len(kind) >= 3:
            for option in kind[2].split(","):
                if option in ("cpuacct", "pids", "memory"):
                    found.setdefault(option, Path(fields[4]))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path in each hierarchy: 'v2' and the v1 controller names."""
    found: dict[str, str] = {}
    try:
        lines = (_PROC / "self" / "cgroup").read_text().splitlines()
    except (OSError, UnicodeError):
        return found
    for line in lines:
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            found["v2"] = path
        for name in controllers.split(","):
            found[name] = path
    return found


def _make_group(mount: Path, own: str) -> Path | None:
    """A new, empty cgroup below ours in one hierarchy, or None where we may not make one."""
    path = mount / own.lstrip("/") / f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir(mode=0o755)
    except OSError:
        return None
    return path


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
    except OSError:
        return False
    return True


class Cgroup:
    """One run's control groups (one per hierarchy used): made, joined by the monitor, read, removed."""

    def __init__(self, groups: dict[str, Path], cpu_key: str):
        self.groups = groups  # 'v2' or a v1 controller name -> its directory
        self.cpu_key = cpu_key  # which of them counts CPU: 'v2' or 'cpuacct'
        self.name = "cgroup v2 cpu.stat" if cpu_key == "v2" else "cgroup v1 cpuacct.usage"
        # Every process ever in the group is counted, however it ended and whoever reaped it (or nobody did).
        self.complete = True
        self.caps_memory = False  # whether the kernel holds the tree to the memory limit (else TreeMemory does)

    @classmethod
    def create(cls, limits: TreeLimits = TreeLimits()) -> "Cgroup | None":
        """Make the run's groups where this process may; None where CPU cannot be counted this way."""
        _remove_stale_groups_once()
        mounts, own = _mounts(), _own_paths()
        groups: dict[str, Path] = {}
        for key in ("v2", "cpuacct", "pids", "memory"):
            if key in mounts and key in own:
                made = _make_group(mounts[key], own[key])
                if made is not None:
                    groups[key] = made
        cpu_key = "v2" if "v2" in groups and (groups["v2"] / "cpu.stat").exists() else "cpuacct"
        if cpu_key not in groups:
            cls(groups, cpu_key).remove()
            return None
        group = cls(groups, cpu_key)
        group._limit(limits)
        return group

    def _limit(self, limits: TreeLimits) -> None:
        v2 = self.groups.get("v2")
        if limits.max_pids:
            for where in (v2, self.groups.get("pids")):
                if where is not None:
                    _write(where / "pids.max", str(limits.max_pids))
        if limits.memory_bytes:
            if v2 is not None and _write(v2 / "memory.max", str(limits.memory_bytes)):
                self.caps_memory = True
                _write(v2 / "memory.swap.max", "0")
            if "memory" in self.groups:
                if _write(self.groups["memory"] / "memory.limit_in_bytes", str(limits.memory_bytes)):
                    self.caps_memory = True

    @property
    def procs_files(self) -> list[str]:
        """The files the monitor writes its pid into (every group: it joins them all)."""
        return [str(path / "cgroup.procs") for path in self.groups.values()]

    def cpu_seconds(self) -> float:
        """CPU seconds used by every process that was ever in the group."""
        path = self.groups[self.cpu_key]
        if self.cpu_key == "v2":
            for line in (path / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            raise OSError(f"{path / 'cpu.stat'} has no usage_usec")
        return int((path / "cpuacct.usage").read_text()) / 1e9

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.groups.values():
            try:
                found |= {int(p) for p in (path / "cgroup.procs").read_text().split()}
            except OSError:
                pass
        return sorted(found)

    def kill_all(self) -> None:
        """SIGKILL every process still in the groups (a leftover the monitor did not reach)."""
        v2 = self.groups.get("v2")
        if v2 is not None and _write(v2 / "cgroup.kill", "1"):
            return
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def remove(self) -> None:
        """Kill whatever is left in the groups and remove them (a group with live processes cannot go)."""
        for _ in range(50):
            if not self.pids():
                break
            self.kill_all()
            time.sleep(0.02)
        for path in self.groups.values():
            try:
                path.rmdir()
            except OSError:
                pass


def join(procs_files: Sequence[str]) -> None:
    """Move the calling process into the run's groups (the monitor, before it forks the worker)."""
    for path in procs_files:
        with open(path, "w") as f:
            f.write("0")


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields resume after the last ')'.
    return stat[stat.rfind(b")") + 2 :].split()


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _live_threads_ns(pid: int, tids: list[str] | None = None) -> tuple[int, int]:
    """schedstat summed over a process's live threads: (time on a CPU, time waiting for one), in ns."""
    run = wait = 0
    for tid in _threads(pid) if tids is None else tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                fields = f.read().split()
            run, wait = run + int(fields[0]), wait + int(fields[1])
        except (OSError, ValueError, IndexError):
            pass
    return run, wait


def _children(pid: int, tids: list[str]) -> list[int]:
    """The children of every thread of a process (each thread's /proc/PID/task/TID/children)."""
    found: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(child) for child in f.read().split())
        except (OSError, ValueError):
            pass  # the thread has ended: its children are another thread's now (or the subreaper's)
    return found


@functools.cache
def _children_files() -> bool:
    """Whether the kernel lists a thread's children (CONFIG_PROC_CHILDREN): a tree is then walked from its root,
    reading its own processes only, instead of the stat of every process on the machine."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


@dataclass(frozen=True)
class _Look:
    """One process as one look at a tree saw it."""

    fields: list[bytes]  # /proc/PID/stat after the command name
    run_ns: int  # its live threads' time on a CPU
    wait_ns: int  # their time waiting for one


def _process_seconds(look: _Look, own: bool) -> float:
    """One process's CPU: its own (precise for live threads, ticks for dead ones) plus its reaped children's."""
    utime, stime, cutime, cstime = (int(v) for v in look.fields[11:15])
    children = (cutime + cstime) * _TICK
    if not own:  # the monitor: only what it reaped counts (its own work is the grader's)
        return children
    return max((utime + stime) * _TICK, look.run_ns / 1e9) + children


class ProcTree:
    """CPU of a monitor's descendants from /proc (where no cgroup can be made and /proc shows processes)."""

    name = "process tree (/proc)"
    # A child auto-reaped by the kernel (its parent ignores SIGCHLD) takes its CPU out of every count here, unless
    # the tree is sealed (theinference.proc.seal: none can be), which the grader reads from outside (seal()).
    complete = False

    def __init__(self, monitor_pid: int):
        self.monitor = monitor_pid
        fields = _stat_fields(monitor_pid)
        if fields is None:
            raise MonitorGone(f"process {monitor_pid} is gone")
        self.started = fields[19]  # start time: a reused pid is not our monitor

    def _tree(self) -> dict[int, _Look]:
        tree = self._walk() if _children_files() else self._scan()
        mine = tree.get(self.monitor)
        if mine is None or mine.fields[19] != self.started or mine.fields[0] == b"Z":
            raise MonitorGone(f"the monitor (process {self.monitor}) is gone")
        return tree

    def _walk(self) -> dict[int, _Look]:
        """The tree from its root down, each process's children listed before its stat is read, and its stat read
        after its children's: a child reaped meanwhile is in its parent's reaped-children time, read last, so no
        process's CPU falls between two reads (it may be counted twice in that one look, never missed)."""
        tree: dict[int, _Look] = {}
        seen = {self.monitor}
        stack: list[tuple[int, list[str] | None]] = [(self.monitor, None)]  # (pid, its threads once listed)
        while stack:  # a stack, not recursion: a chain of thousands of forks is walked like a short one
            pid, tids = stack.pop()
            if tids is None:
                tids = _threads(pid)
                stack.append((pid, tids))  # its stat is read once every child above it on the stack is done
                children = [child for child in _children(pid, tids) if child not in seen]
                seen.update(children)
                stack.extend((child, None) for child in children)
                continue
            fields = _stat_fields(pid)
            if fields is not None and len(fields) > 19:
                tree[pid] = _Look(fields, *_live_threads_ns(pid, tids))
        return tree

    def _scan(self) -> dict[int, _Look]:
        """The tree from the stat of every process on the machine (a kernel without children files)."""
        table: dict[int, list[bytes]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                fields = _stat_fields(int(entry))
                if fields is not None and len(fields) > 19:
                    table[int(entry)] = fields
        if self.monitor not in table:
            return {}
        children: dict[int, list[int]] = {}
        for pid, fields in table.items():
            children.setdefault(int(fields[1]), []).append(pid)
        tree, frontier = {self.monitor: table[self.monitor]}, [self.monitor]
        while frontier:  # one pass over the table: a fork bomb's hundreds of processes cost no more per look
            for pid in children.get(frontier.pop(), ()):
                if pid not in tree:
                    tree[pid] = table[pid]
                    frontier.append(pid)
        return {pid: _Look(fields, *_live_threads_ns(pid)) for pid, fields in tree.items()}

    def descendants(self) -> list[int]:
        """The monitor's descendants now (not the monitor: its memory and work are the grader's)."""
        return [pid for pid in self._tree() if pid != self.monitor]

    def cpu_seconds(self) -> float:
        return self.sample()[0]

    def waiting_seconds(self) -> float:
        """Time the tree's live threads spent runnable but waiting for a CPU: the machine's load, not theirs."""
        return self.sample()[1]

    def sample(self) -> tuple[float, float]:
        """(cpu_seconds, waiting_seconds) from one look at the tree."""
        tree = self._tree()
        cpu = sum(_process_seconds(look, pid != self.monitor) for pid, look in tree.items())
        return cpu, sum(look.wait_ns for pid, look in tree.items() if pid != self.monitor) / 1e9

    def seal(self) -> None:
        """The tree is sealed (theinference.proc.seal.tree_sealed, read by the grader): every process of it that exits
        is waited for by another of it, or by the monitor, so its CPU stays in the count: complete."""
        self.complete = True
        self.name = "process tree (/proc), sealed: no process of it can be reaped unseen"

    def held(self) -> int:
        """Bytes the monitor's descendants hold together now (held_bytes of each)."""
        return sum(held_bytes(pid) for pid in self.descendants())


def _psutil() -> Any:
    """psutil, reading the procfs THEINFERENCE_PSUTIL_PROCFS names where that is set (a test's real /proc, bound
    elsewhere while /proc itself is hidden)."""
    import psutil  # type: ignore[import-untyped]

    procfs = os.environ.get(PSUTIL_PROCFS_ENV)
    if procfs and hasattr(psutil, "PROCFS_PATH"):
        psutil.PROCFS_PATH = procfs
    return psutil


_BURN = "import time\nwhile time.process_time() < 0.03: pass"  # 3 clock ticks: a reaped child's CPU shows


@functools.cache
def _children_reported() -> bool:
    """Whether psutil reports a process's reaped children's CPU here: a child that burned 30 ms is reaped, and our
    children's CPU must have grown (on macOS and Windows psutil gives 0 for them, on Linux the kernel's count)."""
    me = _psutil().Process()
    before = me.cpu_times()
    subprocess.run([sys.executable, "-c", _BURN], check=False, stdin=subprocess.DEVNULL, capture_output=True)
    after = me.cpu_times()
    return after.children_user + after.children_system > before.children_user + before.children_system


def _children_forced() -> bool | None:
    """THEINFERENCE_PSUTIL_CHILDREN: 0 or 1, None where unset."""
    value = os.environ.get(PSUTIL_CHILDREN_ENV, "").strip()
    if value in ("0", "1"):
        return value == "1"
    if value:
        raise MeterUnavailable(f"{PSUTIL_CHILDREN_ENV}={value!r}: 0 (ignore reaped children's CPU) or 1 (count it)")
    return None


def psutil_children() -> bool:
    """Whether PsutilTree counts reaped children's CPU (else each exited process's last reading):
    THEINFERENCE_PSUTIL_CHILDREN=0 or 1, else what psutil reports here."""
    forced = _children_forced()
    return _children_reported() if forced is None else forced


class PsutilTree:
    """CPU of a monitor's descendants through psutil (where /proc shows no processes: macOS, Windows).

    With `children` (psutil reports reaped children's CPU: Linux) a look counts as ProcTree's does: every live
    descendant's user and system time and its reaped children's, and the monitor's reaped children (the orphans
    it adopted). Without (macOS, Windows: those fields are 0), a process that has exited keeps the last reading
    seen of it, keyed by pid and start time so that a reused pid is another process: what it used after that
    look is not counted, so the reading must be taken often while a call runs (calls.py does). Run-queue wait
    cannot be read: sample() gives 0 for it (StepClock then charges wall-clock time)."""

    name = "process tree (psutil)"
    complete = False  # as ProcTree; and without children, what a process used after the last look is lost too

    def __init__(self, monitor_pid: int, children: bool | None = None):
        if not _psutil_works():  # not this run's fault: say what is missing, not that the run ended
            raise MeterUnavailable(
                "no CPU meter can count the adapter's processes here: no cgroup may be made, /proc shows no "
                "processes, and psutil cannot read them"
            )
        self.ps = _psutil()
        self.children = psutil_children() if children is None else children
        try:
            self.monitor = self.ps.Process(monitor_pid)
        except self.ps.Error as e:
            raise MonitorGone(f"process {monitor_pid} is gone ({e})") from None
        self.last: dict[tuple[int, float], float] = {}  # without children: (pid, started) -> last CPU seen
        self.looked: tuple[float, float] | None = None  # when sample() last looked, and the CPU it read then
        self.waited = 0.0  # the wait estimated until then

    def _tree(self) -> list[Any]:
        """The monitor's descendants now; MonitorGone once it is dead (or its pid is another process)."""
        try:
            if not self.monitor.is_running() or self.monitor.status() == self.ps.STATUS_ZOMBIE:
                raise MonitorGone(f"the monitor (process {self.monitor.pid}) is gone")
            return self.monitor.children(recursive=True)
        except self.ps.Error as e:
            raise MonitorGone(f"the monitor (process {self.monitor.pid}) is gone ({e})") from None

    def descendants(self) -> list[int]:
        """The monitor's descendants now (not the monitor: its memory and work are the grader's)."""
        return [p.pid for p in self._tree()]

    def cpu_seconds(self) -> float:
        tree = self._tree()
        if not self.children:
            for process in tree:
                try:
                    with process.oneshot():
                        times, started = process.cpu_times(), process.create_time()
                except self.ps.Error:
                    continue  # gone since: its last reading stands
                self.last[(process.pid, started)] = times.user + times.system
            return sum(self.last.values())
        try:
            mine = self.monitor.cpu_times()  # only what it reaped counts: its own work is the grader's
        except self.ps.Error as e:
            raise MonitorGone(f"the monitor (process {self.monitor.pid}) is gone ({e})") from None
        total = mine.children_user + mine.children_system
        for process in tree:
            try:
                times = process.cpu_times()
            except self.ps.Error:
                continue  # gone since: reaped into its parent's children's time, as in ProcTree
            total += times.user + times.system + times.children_user + times.children_system
        return total

    def sample(self) -> tuple[float, float]:
        """(cpu_seconds, an estimate of the run-queue wait so far): the wait cannot be read here (StepClock charges
        wall-clock time less it). Where the 1-minute load average is over the cores, a runnable thread gets
        cores/load of a core, so each CPU second the tree got between two looks cost load/cores - 1 seconds of
        waiting (at most the time between them); a tree that sleeps or blocks got no CPU and waited for none."""
        now, cpu = time.monotonic(), self.cpu_seconds()
        if self.looked is not None:
            got = max(0.0, cpu - self.looked[1])
            self.waited += min(now - self.looked[0], got * wait_per_cpu_second(load_average(), os.cpu_count() or 1))
        self.looked = (now, cpu)
        return cpu, self.waited

    def held(self) -> int:
        """Bytes the monitor's descendants hold together now: each one's unique set size where psutil reads it,
        else its resident set (which counts shared and mapped pages too: an overcount, never an undercount)."""
        return sum(self._held(process) for process in self._tree())

    def _held(self, process: Any) -> int:
        try:
            info = process.memory_full_info()  # no uss where psutil cannot read the maps: rss
        except self.ps.Error:
            try:
                info = process.memory_info()
            except self.ps.Error:
                return 0  # gone meanwhile
        return getattr(info, "uss", info.rss)


def wait_per_cpu_second(load: float | None, cores: int) -> float:
    """Seconds a runnable thread waits for a CPU for each second it runs on a machine this loaded (an estimate: 0
    where the load is unknown or the cores are enough for it)."""
    if load is None or load <= cores:
        return 0.0
    return load / cores - 1.0


def load_average() -> float | None:
    """The 1-minute load average: the kernel's, else psutil's (Windows: sampled by a thread of psutil's from its
    first call, 0.0 until then), else None."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        pass
    try:
        return float(_psutil().getloadavg()[0])
    except (OSError, AttributeError, RuntimeError, ImportError):
        return None


def _kb_fields(text: bytes) -> dict[bytes, int]:
    """The 'Name:  123 kB' lines of a /proc file, as {name: kB}."""
    found = {}
    for line in text.splitlines():
        name, _, rest = line.partition(b":")
        value = rest.split()
        if value and value[0].isdigit():
            found[name] = int(value[0])
    return found


def held_bytes(pid: int) -> int:
    """Memory one process holds that the kernel cannot take back but by killing it: its proportional share of
    anonymous and shared-memory pages (a page shared by forked copies counts once over them all) and of swap.

    Mapped files (libraries, the weights) are not counted: the kernel reclaims those under pressure. Where the
    detailed count cannot be read (a process the grader may not trace: non-dumpable, another uid without root)
    or the kernel is too old for it, its whole resident anonymous and shared memory counts."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            rollup = _kb_fields(f.read())
        if b"Pss_Anon" in rollup:
            return (rollup[b"Pss_Anon"] + rollup.get(b"Pss_Shmem", 0) + rollup.get(b"SwapPss", 0)) * 1024
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            status = _kb_fields(f.read())
    except OSError:
        return 0  # gone meanwhile
    return (status.get(b"RssAnon", 0) + status.get(b"RssShmem", 0) + status.get(b"VmSwap", 0)) * 1024


def memory_message(held: int, limit: int) -> str:
    return (
        f"the adapter's processes together held {held / 2**20:.0f} MB of memory, over the {limit / 2**20:g} MB "
        "limit (--memory-limit, for all of them at once): stopped there"
    )


class TreeMemory:
    """The memory limit over a monitor's whole process tree where no cgroup sets one: the grader sums what its
    descendants hold (ProcTree.held from /proc, else PsutilTree.held), and the run stops once that is over the
    limit.

    Measured, so passed by what the tree allocates before the next look (each process is still held to the
    limit by its own address-space cap, RLIMIT_AS, where the platform has one)."""

    def __init__(self, monitor_pid: int, limit: int, kind: TreeKind | None = None):
        self.tree, self.limit = tree_meter(monitor_pid, kind), limit

    def held(self) -> int:
        """Bytes the monitor's descendants hold together now (0 once the monitor is gone: the run is over)."""
        try:
            return self.tree.held()
        except MonitorGone:
            return 0

    def check(self) -> None:
        """MemoryExceeded if the tree holds more than the limit now."""
        held = self.held()
        if held > self.limit:
            raise MemoryExceeded(memory_message(held, self.limit))


def forced_meter() -> MeterKind | None:
    """The meter THEINFERENCE_METER forces, None where it is unset."""
    value = os.environ.get(METER_ENV, "").strip()
    if not value:
        return None
    for kind in KINDS:
        if value == kind:
            return kind
    raise MeterUnavailable(f"{METER_ENV}={value!r} names no CPU meter: it is one of {', '.join(KINDS)}")


def proc_shows_processes() -> bool:
    """Whether /proc is there and shows this process (where it does not, the /proc meter cannot work)."""
    try:
        with open(_PROC / str(os.getpid()) / "stat", "rb") as f:
            return bool(f.read())
    except OSError:
        return False


def _psutil_works() -> bool:
    try:
        _psutil().Process().cpu_times()
    except Exception:  # noqa: BLE001 - not installed, or nothing readable here: the meter cannot work
        return False
    return True


def tree_kind(forced: MeterKind | None = None) -> TreeKind:
    """Which tree meter a run without a cgroup uses: /proc where it shows processes, else psutil (or the one
    forced: MeterUnavailable where it cannot work here; a forced cgroup leaves the choice to the machine). Also
    what StepClock and TreeMemory read the tree with, beside a cgroup too."""
    if forced == "proc" and not proc_shows_processes():
        raise MeterUnavailable(f"{METER_ENV}=proc, but /proc shows no processes here")
    if forced == "psutil" and not _psutil_works():
        raise MeterUnavailable(f"{METER_ENV}=psutil, but psutil cannot read this machine's processes")
    kind: TreeKind = forced if forced in ("proc", "psutil") else "proc" if proc_shows_processes() else "psutil"
    if kind == "psutil":
        _children_forced()  # a wrong value is an error now, before a run starts
    return kind


Meter = Cgroup | ProcTree | PsutilTree  # each has name, complete and cpu_seconds()


def tree_meter(monitor_pid: int, kind: TreeKind | None = None) -> ProcTree | PsutilTree:
    """The tree meter of that kind (by default the one tree_kind chooses) over the monitor's descendants."""
    if kind is None:
        kind = tree_kind(forced_meter())
    return ProcTree(monitor_pid) if kind == "proc" else PsutilTree(monitor_pid)


def run_cgroup(limits: TreeLimits = TreeLimits()) -> Cgroup | None:
    """The run's cgroup where the meter is one (THEINFERENCE_METER unset or cgroup); MeterUnavailable where a
    cgroup is forced and cannot be made here."""
    forced = forced_meter()
    if forced not in (None, "cgroup"):
        return None
    group = Cgroup.create(limits)
    if group is None and forced == "cgroup":
        raise MeterUnavailable(f"{METER_ENV}=cgroup, but this process may make no cgroup here")
    return group


NO_METER = "none: no cgroup may be made, /proc shows no processes and psutil cannot read them"


def meter_name() -> str:
    """The name of the meter a run started now would count its CPU with (for the report's header): what its
    readings are printed as (NO_METER where none can count here: cache-scaling cannot be judged). Makes and
    removes a probe cgroup where one may be made."""
    group = run_cgroup()
    if group is not None:
        group.remove()
        return group.name
    if tree_kind(forced_meter()) == "proc":
        return ProcTree.name
    return PsutilTree.name if _psutil_works() else NO_METER


def _alive(pid: int) -> bool:
    """Whether a process of this pid exists (signal 0: asks the kernel, needs no /proc)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, as another user's
        return True
    return True


def stale_groups() -> list[tuple[str, Path]]:
    """(hierarchy, group) of each group left by a grader that was killed (its pid is gone): what is still in it
    was that grader's students' (its monitor died with it; they need not have)."""
    mounts, own = _mounts(), _own_paths()
    found: list[tuple[str, Path]] = []
    for key in ("v2", "cpuacct", "pids", "memory"):
        if key in mounts and key in own:
            base = mounts[key] / own[key].lstrip("/")
            try:
                entries = list(base.glob(f"{_PREFIX}*"))
            except OSError:
                continue
            for path in entries:
                pid = path.name.removeprefix(_PREFIX).split("-")[0]
                if pid.isdigit() and not _alive(int(pid)):
                    found.append((key, path))
    return found


def remove_stale_groups() -> None:
    """Kill the processes still in the groups killed graders left behind, then remove the groups."""
    for key, path in stale_groups():
        Cgroup({key: path}, key).remove()


@functools.cache
def _remove_stale_groups_once() -> None:
    """remove_stale_groups, once per grader process (before its first group is made)."""
    remove_stale_groups()
