"""CPU time of a student's whole process tree, counted by the kernel and read from outside it.

Nothing the student's process says about itself is used: a cache-scaling verdict (and a CPU
budget) rests on what the grader reads here. Two ways, the first that works:

- `cgroup`: a control group made for the run (cgroup v2 `cpu.stat`, else v1 `cpuacct.usage`).
  The monitor joins it before it forks the worker, so every process and thread the submission
  ever runs is counted, reaped or not, detached or not, until the grader removes the group.
  Made where the grader may (root, or a delegated v2 subtree); a student process running as
  another user cannot leave it. The same group caps the tree's processes and memory (v2
  `pids.max`/`memory.max`, v1 `pids`/`memory` hierarchies) where those controllers exist.
- `process tree`: /proc of the monitor and every descendant: each live thread's run time
  (schedstat, in ns), each process's dead threads and reaped children (stat's utime, stime,
  cutime, cstime, in clock ticks). The monitor is a child subreaper, so orphans stay in the
  tree and are reaped by it. A dead monitor ends the measurement: `MonitorGone`.

Memory is capped the same two ways: by the cgroup's memory controller where the group has one, else by
`TreeMemory`, the grader's own sum over the process tree of what each process holds (its proportional
share of anonymous and shared-memory pages, and its swap), checked while the run goes on.
"""

import functools
import os
import signal
from collections.abc import Sequence
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

_TICK = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
_PREFIX = "theinference-"


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
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
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
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
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
        if os.environ.get("THEINFERENCE_METER") in ("proc", "psutil"):  # the instructor's switch: a weaker meter
            return None
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


def _live_threads_ns(pid: int, field: int = 0) -> int:
    """A schedstat field summed over a process's live threads: 0 time on a CPU, 1 time waiting for one (ns)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[field])
        except (OSError, ValueError, IndexError):
            pass
    return total


def _process_seconds(fields: list[bytes], pid: int, own: bool) -> float:
    """One process's CPU: its own (precise for live threads, ticks for dead ones) plus its reaped children's."""
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    children = (cutime + cstime) * _TICK
    if not own:  # the monitor: only what it reaped counts (its own work is the grader's)
        return children
    return max((utime + stime) * _TICK, _live_threads_ns(pid) / 1e9) + children


class ProcTree:
    """CPU of a monitor's descendants from /proc (the fallback where no cgroup can be made)."""

    name = "process tree (/proc)"
    # A child auto-reaped by the kernel (its parent ignores SIGCHLD) takes its CPU out of every count here.
    complete = False

    def __init__(self, monitor_pid: int):
        self.monitor = monitor_pid
        fields = _stat_fields(monitor_pid)
        if fields is None:
            raise MonitorGone(f"process {monitor_pid} is gone")
        self.started = fields[19]  # start time: a reused pid is not our monitor

    def _tree(self) -> dict[int, list[bytes]]:
        table: dict[int, list[bytes]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                fields = _stat_fields(int(entry))
                if fields is not None and len(fields) > 19:
                    table[int(entry)] = fields
        mine = table.get(self.monitor)
        if mine is None or mine[19] != self.started or mine[0] == b"Z":
            raise MonitorGone(f"the monitor (process {self.monitor}) is gone")
        children: dict[int, list[int]] = {}
        for pid, fields in table.items():
            children.setdefault(int(fields[1]), []).append(pid)
        tree, frontier = {self.monitor: mine}, [self.monitor]
        while frontier:  # one pass over the table: a fork bomb's hundreds of processes cost no more per look
            for pid in children.get(frontier.pop(), ()):
                if pid not in tree:
                    tree[pid] = table[pid]
                    frontier.append(pid)
        return tree

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
        cpu = sum(_process_seconds(fields, pid, pid != self.monitor) for pid, fields in tree.items())
        return cpu, sum(_live_threads_ns(pid, 1) for pid in tree if pid != self.monitor) / 1e9


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
    descendants hold (held_bytes), read from /proc, and the run stops once that is over the limit.

    Measured, so passed by what the tree allocates before the next look (each process is still held to the
    limit by its own address-space cap, RLIMIT_AS)."""

    def __init__(self, monitor_pid: int, limit: int):
        self.tree, self.limit = ProcTree(monitor_pid), limit

    def held(self) -> int:
        """Bytes the monitor's descendants hold together now (0 once the monitor is gone: the run is over)."""
        try:
            pids = self.tree.descendants()
        except MonitorGone:
            return 0
        return sum(held_bytes(pid) for pid in pids)

    def check(self) -> None:
        """MemoryExceeded if the tree holds more than the limit now."""
        held = self.held()
        if held > self.limit:
            raise MemoryExceeded(memory_message(held, self.limit))


def stale_groups() -> list[Path]:
    """Groups left by graders that were killed (their pid is gone): removable once empty."""
    mounts, own = _mounts(), _own_paths()
    found = []
    for key in ("v2", "cpuacct", "pids", "memory"):
        if key in mounts and key in own:
            base = mounts[key] / own[key].lstrip("/")
            try:
                entries = list(base.glob(f"{_PREFIX}*"))
            except OSError:
                continue
            for path in entries:
                pid = path.name.removeprefix(_PREFIX).split("-")[0]
                if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                    found.append(path)
    return found


@functools.cache
def _remove_stale_groups_once() -> None:
    """Remove the empty groups graders killed before their cleanup left behind (once per grader process)."""
    for path in stale_groups():
        try:
            path.rmdir()
        except OSError:
            pass
