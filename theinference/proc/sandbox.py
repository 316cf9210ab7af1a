"""Confinement of student processes: the strongest isolation this machine offers, and its name.

Levels, strongest first (the report header names the one in use):

- `sandbox`: bubblewrap (`bwrap`). The student's process gets its own PID namespace (every
  descendant dies with it), no network, and a filesystem that is read-only and holds only the
  system directories, Python and its site-packages, the course, the weights and the run's
  directory: a tmpfs the size of the run directory's quota (the only writable place, its job
  file bound in read-only; theinference.proc.rundir). The grader's package is hidden; a stub
  `theinference` package offers only `weights_path()` and the student-side runner.
- `namespaces`: no bubblewrap, but `unshare` (util-linux) works: own PID namespace and no
  network; the filesystem, the grader's package included, stays readable.
- `unprivileged`: no namespaces, but the grader runs as root: student processes run as nobody.
- `subreaper`: student processes run with the grader's rights; their monitor kills every
  descendant, whatever session it moved to, before results are accepted (Linux). A process that kills
  its monitor and the grader outlives the grading, and may change the grader's files.
- `process-group`: elsewhere (macOS): only the student's process group is killed.

The last two cannot promise that nothing of a submission survives its grading: untrusted grading refuses
them (WeakIsolationRefused, exit 2) unless the instructor sets THEINFERENCE_ALLOW_WEAK_ISOLATION=1 (or
consents to root), which every report then names. At every level but `sandbox` the student's uid could
write the grader's installed code: untrusted grading refuses an install that uid can write
(WritableInstall).

Run as root, the `sandbox` and `namespaces` levels also run the student as nobody (or, while another
grading on this machine holds nobody, an unused uid below it: `lease_uid`). Untrusted grading
never runs student code as root: where no level can drop to nobody, it refuses (RootRefused, exit 2)
unless the instructor sets THEINFERENCE_ALLOW_ROOT=1, which every report then names. After each submission every
process of its leased uid is killed (kill_processes_of). Untrusted modes (`grade`, CI) use the
strongest level available; `test` on a student's own machine keeps the fast zygote launcher.
"""

import functools
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from theinference.errors import ConfigError
from theinference.proc import tempdirs
from theinference.proc.rundir import TMPFS_SLACK, RunDir

NOBODY = 65534  # the uid and gid of `nobody` on Debian, Ubuntu, Fedora, Alpine
# The instructor's explicit consent to untrusted grading as root where nothing can drop to nobody.
ALLOW_ROOT_ENV = "THEINFERENCE_ALLOW_ROOT"
# The instructor's explicit consent to untrusted grading where student code runs as the grader's own user, in no
# namespace of its own (the subreaper and process-group levels).
ALLOW_WEAK_ENV = "THEINFERENCE_ALLOW_WEAK_ISOLATION"
_PACKAGE = Path(__file__).resolve().parents[1]
# The stub package the student sees: weights_path() and the student-side runner; they import only the standard library and each other at module level
# (tests/test_architecture.py checks it), so nothing else need be copied.
STUB_FILES = ("__init__.py", "sizes.py", "proc/__init__.py", "proc/child.py", "proc/protocol.py", "proc/seal.py")
NODE_HARNESS = "proc/harness.mjs"  # the TypeScript edition's worker (theinference.proc.node), copied beside them
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
_NAMESPACES = ("--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try")


class NoUidFree(ConfigError):
    """No uid for student processes can be leased here (exit 2): a private lease directory, or a free uid, is missing."""


class RootRefused(ConfigError):
    """Untrusted grading would run student code as root: refused unless the instructor insists (exit 2)."""


class WeakIsolationRefused(ConfigError):
    """Untrusted grading at a level whose student processes may outlive it: refused unless the instructor insists."""


class WritableInstall(ConfigError):
    """Untrusted grading from an install the student's uid could change: refused (exit 2)."""


@dataclass(frozen=True)
class Isolation:
    """How student processes are confined: a level, and what it means in words."""

    level: str  # sandbox | namespaces | unprivileged | subreaper | process-group
    summary: str
    bwrap: str | None = None  # the bubblewrap executable, for the sandbox level
    unshare: tuple[str, ...] = ()  # the command prefix, for the namespaces level
    # uid (and gid) of student processes, when the grader is root; each other submission of a batch gets its own
    # unused uid below it (submission_uids)
    run_as: int | None = None

    @property
    def separates_submissions(self) -> bool:
        """Whether two submissions run at once cannot reach each other: a sandbox each (own PID namespace, own
        writable directory) or a uid each. Otherwise they share a user that may signal the other's processes
        and write into its run directory."""
        return self.bwrap is not None or self.run_as is not None

    @property
    def shares_grader_uid(self) -> bool:
        """Whether student processes count among the grader's user's own (no uid of their own, and no cgroup: a non-root
        grader, sandboxed, in a namespace made with unshare or neither), so that capping that user's tasks
        (RLIMIT_NPROC) is the one way to bound a fork bomb short of every pid of that user (or the machine)."""
        return self.run_as is None


def submission_uids() -> Iterator[int]:
    """Uids for student processes when the grader is root: nobody, then unused uids just below it (no passwd entry)."""
    import pwd  # Unix only; only root reaches here

    yield NOBODY
    for uid in range(NOBODY - 1, NOBODY - 1000, -1):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            yield uid


# Root's own directory of uid leases: one lock file per uid in use by a grader on this machine.
_LEASE_DIRS = ("/run/theinference-uids", os.path.join(tempfile.gettempdir(), "theinference-uids-root"))


def _lease_dir() -> str:
    """The lease directory, made by root (0700) and checked to be root's own real directory, not a planted link."""
    found = _private_dir(_LEASE_DIRS)
    if found is None:
        raise NoUidFree("no private directory for uid leases (tried " + ", ".join(_LEASE_DIRS) + ")")
    return found


def _private_dir(paths: tuple[str, ...]) -> str | None:
    """The first of paths that is (or is now made) a real directory of this user's that no other may write."""
    me = _own_uid()
    for path in paths:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and (me is None or info.st_uid == me) and not info.st_mode & 0o022:
            return path
    return None


def lock_dir() -> str:
    """A directory for the locks every grader of this user on this machine shares (root's is the lease directory),
    which no student process can write or replace; ConfigError if none can be made."""
    if _is_root():
        return _lease_dir()
    me = _own_uid()
    paths = (os.path.join(tempfile.gettempdir(), f"theinference-locks-{me if me is not None else 'user'}"),)
    found = _private_dir(paths)
    if found is None:
        raise ConfigError(f"no private directory for the grader's locks (tried {paths[0]}): remove what is there")
    return found


def runs_processes(uid: int) -> bool:
    """Whether any process on this machine now runs as uid (the owner of its /proc entry)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    return True
            except OSError:
                continue  # it ended meanwhile
    return False


def lease_path(uid: int, directory: str | None = None) -> str:
    """The lock file whose exclusive flock is uid's lease: whoever holds it (a grader, or anything root runs as uid
    under `flock`) keeps every root grader on this machine from leasing uid, and so from killing uid's processes
    after its run (kill_processes_of)."""
    return os.path.join(directory or _lease_dir(), f"{uid}.lock")


def lease_uid(taken: set[int]) -> tuple[int, int]:
    """A uid no other grading on this machine is using, and the open lock file that holds it (close it to release).

    Two graders at once (two `grade` runs, a CI job beside a `test --untrusted`) would otherwise both run their
    first submission as nobody, and each could signal the other's processes and write into its run directory.
    The lease is an exclusive flock, so the kernel releases it when this process ends, however it ends. A uid
    that runs processes is in use too, though no lease says so: a grader running as nobody takes none (it cannot
    write root's lease directory), and a student sharing its uid could signal it and write into its run directory."""
    directory = _lease_dir()
    for uid in submission_uids():
        if uid in taken:
            continue
        fd = os.open(lease_path(uid, directory), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            import fcntl  # Unix only; only root leases uids

            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if runs_processes(uid):  # checked under the lease: no other root grader starts students as it meanwhile
            os.close(fd)
            continue
        return uid, fd
    raise NoUidFree("every uid for student processes is in use by a grading on this machine; try again when one ends")


# Where any user may write outside the sandbox: what a student's uid leaves there is removed after each run (with the
# grader's own $TMPDIR, shared_tmp), and in the world-writable directories within them (/tmp/.X11-unix, ...).
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")
_SHARED_DEPTH = 3  # how deep world-writable directories within them are searched


def shared_tmp() -> tuple[str, ...]:
    """SHARED_TMP and the grader's temporary directory, each once (/var/lock is often a link to /run/lock)."""
    found: dict[str, str] = {}
    for path in (*SHARED_TMP, tempfile.gettempdir()):
        found.setdefault(os.path.realpath(path), path)
    return tuple(found)


def _entries_of(uid: int, where: tuple[str, ...] | None, depth: int = _SHARED_DEPTH):
    """(entry, its lstat) for each entry uid owns in the shared temp directories, or in a world-writable directory
    of another's within them (never through a link)."""
    for directory in shared_tmp() if where is None else where:
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if info.st_uid == uid:
                yield entry, info
            elif depth > 1 and stat.S_ISDIR(info.st_mode) and info.st_mode & 0o002:
                yield from _entries_of(uid, (entry.path,), depth - 1)


def files_of(uid: int, where: tuple[str, ...] | None = None) -> frozenset[tuple[int, int]]:
    """(device, inode) of what uid owns in the shared temp directories now: taken when its lease begins, so that
    only what appeared during the lease is removed after (uid nobody may own files there of somebody else's)."""
    return frozenset((info.st_dev, info.st_ino) for _, info in _entries_of(uid, where))


def kill_processes_of(uid: int) -> None:
    """SIGKILL every process that runs as uid (a submission's leased uid, after its run): a daemon it started that
    left its monitor's tree (setsid, double fork, its monitor killed) would serve the next submission.

    kill(-1) from a process running as uid reaches every process of uid at once (the kernel signals them under one
    lock of its task list, so none forks away meanwhile); repeated until /proc shows none alive (one of uid that
    was just being started). Zombies are left to their parents: they run nothing. Only a root grader kills, and
    never root's own processes or its own uid's: kill(-1) as root would end every process on the machine."""
    if not _is_root() or uid in (0, _own_uid()):
        return
    kill = shutil.which("kill")
    for _ in range(50):
        live = _live_pids_of(uid)
        if not live:
            return
        try:  # user=: the grader's subprocess drops to uid after its fork, before the exec
            if not kill:
                raise OSError("no kill executable")
            subprocess.run([kill, "-KILL", "-1"], user=uid, group=uid, extra_groups=[], capture_output=True)
        except (OSError, subprocess.SubprocessError):  # one at a time, then: what forks meanwhile is found next round
            for pid in live:
                try:
                    os.kill(pid, 9)
                except OSError:
                    continue
        time.sleep(0.02)


def _live_pids_of(uid: int) -> list[int]:
    """The processes of uid that are not zombies, from /proc."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and entry.stat(follow_symlinks=False).st_uid == uid:
                with open(os.path.join(entry.path, "stat"), "rb") as f:
                    if f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                        found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found


def remove_files_of(uid: int, before: frozenset[tuple[int, int]], where: tuple[str, ...] | None = None) -> list[str]:
    """Remove what uid (a submission's leased uid) left in the shared temp directories: each entry there it owns that
    was not there when its lease began (before, from files_of) and is no running grader's (tempdirs.a_live_graders),
    whole; never through a link (lstat; rmtree follows none). What was removed.

    Every process of uid is killed first: one still running (a daemon that left its monitor's tree) would make its
    files, or a socket the next submission could reach, again."""
    kill_processes_of(uid)
    removed = []
    for entry, info in _entries_of(uid, where):
        if (info.st_dev, info.st_ino) in before or tempdirs.a_live_graders(entry.path):
            continue
        try:
            if stat.S_ISDIR(info.st_mode):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            continue
        removed.append(entry.path)
    return removed


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@functools.cache
def _working_bwrap() -> str | None:
    """The bwrap executable, if a sandbox actually starts here (containers often forbid namespaces)."""
    bwrap = shutil.which("bwrap")
    if not bwrap or sys.platform != "linux":
        return None
    probe = [
        bwrap,
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--die-with-parent",
        *_NAMESPACES,
        "true",
    ]
    try:
        done = subprocess.run(probe, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return bwrap if done.returncode == 0 else None


@functools.cache
def tmpfs_reachable(bwrap: str) -> bool:
    """Whether the grader reaches a tmpfs made inside a sandbox through /proc (theinference.proc.rundir): where it
    cannot (a setuid bwrap), the run's directory on the grader's disk is bound in instead, and measured there."""
    probe, size = tempdirs.mkdtemp("probe"), 1 << 20
    command = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--die-with-parent", *_NAMESPACES]
    command += ["--size", str(size), "--tmpfs", probe, "--", "cat"]  # cat: alive until its stdin closes
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        os.rmdir(probe)
        return False
    run_dir = RunDir(Path(probe), size, (proc.pid, size))
    try:
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if run_dir.tmpfs() is not None:
                return True
            time.sleep(0.01)
        return False
    finally:
        run_dir.close()
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
        os.rmdir(probe)


@functools.cache
def _working_unshare() -> tuple[str, ...]:
    """The unshare command prefix (new PID and network namespaces), if it works here; () if not."""
    unshare = shutil.which("unshare")
    if not unshare or sys.platform != "linux":
        return ()
    user = () if _is_root() else ("--user", "--map-root-user")
    prefix = (unshare, *user, "--pid", "--fork", "--kill-child", "--net", "--mount-proc")
    try:
        done = subprocess.run([*prefix, "true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return prefix if done.returncode == 0 else ()


def reachable_by_others(path: Path) -> bool:
    """Whether a user other than the owner can reach path (x on every parent directory, r on it)."""
    path = path.resolve()
    try:
        parents_ok = all(os.stat(p).st_mode & 0o001 for p in path.parents)
        return parents_ok and bool(os.stat(path).st_mode & 0o004)
    except OSError:
        return False


def basic_isolation() -> Isolation:
    """What every launcher gives without a sandbox: the subreaper monitor where the kernel keeps orphans in its tree
    (Linux), else the monitor's watch over its tree (macOS, Windows: theinference.proc.trees), chosen as the monitor
    chooses (reaper.plan)."""
    from theinference.proc.reaper import plan  # light: ctypes and the standard library

    if plan().orphans == "subreaper":
        return Isolation(
            "subreaper",
            "no sandbox: student code runs with your rights; "
            "every process it starts is killed before results are accepted",
        )
    return Isolation(
        "process-group",
        "no sandbox: student code runs with your rights; its process group, and every process of its tree its "
        "monitor saw (psutil) or marked, is killed after each run (one that leaves the tree unseen may outlive it)",
    )


def strongest_isolation(allow_root: bool = False) -> Isolation:
    """The strongest isolation available on this machine (for untrusted submissions).

    Never student code as root: RootRefused where only that is left, unless allow_root (--allow-root) or
    THEINFERENCE_ALLOW_ROOT=1 says otherwise. Never a level whose student processes may outlive the grading
    (WeakIsolationRefused) unless THEINFERENCE_ALLOW_WEAK_ISOLATION=1 (or the consent to root) says otherwise.
    Never from an install the student's uid could write (WritableInstall)."""
    isolation = _strongest(allow_root)
    if isolation.bwrap is None:  # the sandbox binds the install in read-only
        student = isolation.run_as if isolation.run_as is not None else _own_uid()
        # Root (by the instructor's consent) can change anything anyway, as its report says.
        if student not in (None, 0) and (found := writable_install(student)):
            raise WritableInstall(_writable_message(found, isolation))
    return isolation


def _own_uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def _strongest(allow_root: bool) -> Isolation:
    bwrap = _working_bwrap()
    if bwrap:
        as_nobody = f" as user nobody ({NOBODY})" if _is_root() else ""
        return Isolation(
            "sandbox",
            f"bubblewrap sandbox{as_nobody}: own PID namespace, no network, read-only "
            "filesystem but for the run's directory (a tmpfs of its quota), grader's package hidden",
            bwrap=bwrap,
            run_as=NOBODY if _is_root() else None,
        )
    basic, unshare = basic_isolation(), _working_unshare()
    run_as = NOBODY if _is_root() and reachable_by_others(Path(sys.executable)) else None
    allow_root = allow_root or os.environ.get(ALLOW_ROOT_ENV) == "1"
    if _is_root() and run_as is None:
        if not allow_root:
            raise RootRefused(
                f"refusing to run student code as root: bubblewrap is unavailable and this Python "
                f"({Path(sys.executable).resolve()}) is not readable by user nobody, whom student code would run as. "
                "Install bubblewrap (apt-get install bubblewrap), or grade with a Python that nobody can read "
                f"(e.g. /usr/bin/python3 and a virtualenv outside /root). --allow-root (or {ALLOW_ROOT_ENV}=1) runs it "
                "as root anyway: "
                "it can then write anything on this machine, the grader and its results included."
            )
    who = (
        f" as user nobody ({NOBODY})"
        if run_as
        else " AS ROOT (allowed by --allow-root: it can change anything on this machine, grades included)"
        if _is_root()
        else ""
    )
    if unshare:
        return Isolation(
            "namespaces",
            f"unshare{who}, bubblewrap unavailable: own PID namespace, no network; "
            "the filesystem, the grader's package included, stays readable",
            unshare=unshare,
            run_as=run_as,
        )
    if run_as:
        return Isolation(
            "unprivileged",
            f"no sandbox (bubblewrap unavailable): student code runs{who}; every process of that user is killed "
            "after each submission",
            run_as=run_as,
        )
    if not allow_root and os.environ.get(ALLOW_WEAK_ENV) != "1":
        raise WeakIsolationRefused(
            f"refusing untrusted grading at the {basic.level} level: neither bubblewrap nor unshare works here, so "
            "student code would run as your own user in no namespace of its own. A process it starts that kills its "
            "monitor and the grader outlives the grading: it can serve the next submission's calls, change the "
            "grader's files and overwrite results. Install bubblewrap (apt-get install bubblewrap), or grade as root "
            f"so that student code runs as user nobody. {ALLOW_WEAK_ENV}=1 grades here anyway, and every report "
            "says so."
        )
    root = "; AS ROOT (allowed by --allow-root), since Python is not readable by nobody" if _is_root() else ""
    consent = "allowed by --allow-root" if allow_root else f"allowed by {ALLOW_WEAK_ENV}=1"
    return Isolation(
        basic.level,
        f"{basic.summary} (bubblewrap unavailable{root}); {consent}: a process it starts that kills the grader "
        "can outlive the grading and change the grader's files",
    )


def _writable_by(uid: int, info: os.stat_result) -> bool:
    """Whether uid may write the file or directory info describes (its mode bits: owner, its own group, others)."""
    if info.st_uid == uid:
        return bool(info.st_mode & 0o200)
    groups = {uid} if uid != _own_uid() or not hasattr(os, "getgroups") else {os.getgid(), *os.getgroups()}
    if info.st_gid in groups:  # nobody's group is nogroup, numbered as nobody on the systems NOBODY names
        return bool(info.st_mode & 0o020)
    return bool(info.st_mode & 0o002)


def _replaceable_by(uid: int, path: Path) -> bool:
    """Whether uid could change path (a file or directory) or put another in its place: it may write path, or a
    directory on the way to it, where the sticky bit does not keep it from renaming another user's entry."""
    try:
        chain = [os.lstat(path), *(os.lstat(p) for p in path.parents)]
    except OSError:
        return False
    if _writable_by(uid, chain[0]):
        return True
    for child, parent in zip(chain, chain[1:]):
        if _writable_by(uid, parent) and not (parent.st_mode & stat.S_ISVTX and child.st_uid != uid):
            return True
    return False


def _install_paths() -> list[Path]:
    """What the grader runs as code: its package (every file of it), the standard library, each site-packages and
    the entries directly in it (a package directory uid could write, or a .pth file it could add)."""
    import sysconfig

    paths = [_PACKAGE, *(Path(root) / name for root, dirs, files in os.walk(_PACKAGE) for name in dirs + files)]
    paths.append(Path(sysconfig.get_paths()["stdlib"]))
    for site in {p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and os.path.isdir(p)}:
        paths.append(Path(site))
        try:
            paths += [Path(entry.path) for entry in os.scandir(site)]
        except OSError:
            continue
    return paths


def writable_install(uid: int) -> list[Path]:
    """The parts of the grader's install (its package, the standard library, its site-packages) that uid could change
    (at most a few); [] if none. Student code as uid would change the grader itself for every later grading."""
    found: list[Path] = []
    for path in _install_paths():
        if _replaceable_by(uid, path):
            found.append(path)
            if len(found) == 3:
                break
    return found


def _writable_message(found: list[Path], isolation: Isolation) -> str:
    who = f"user nobody ({isolation.run_as})" if isolation.run_as is not None else "your own user"
    return (
        f"refusing untrusted grading at the {isolation.level} level: student code runs as {who}, which can change the "
        f"grader's own installed code ({', '.join(map(str, found))}), and with it every later grading. Install "
        "theinference where that user cannot write (a virtualenv or system install owned by another user, e.g. "
        "root, with no directory on its way writable by it), or install bubblewrap (apt-get install bubblewrap): "
        "its sandbox shows the install read-only."
    )


def _python_dirs() -> list[str]:
    """Directories the student's interpreter needs: its prefixes and every site-packages on sys.path."""
    dirs = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        str(Path(sys.executable).resolve().parent.parent),
    }
    # os.path.isdir, not Path.is_dir: False where this user may not look (a non-root grader, a private sys.path entry)
    dirs |= {p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and os.path.isdir(p)}
    return sorted(d for d in dirs if not any(d != o and d.startswith(o.rstrip("/") + "/") for o in dirs))


def _hidden_dirs(visible: list[str]) -> list[str]:
    """Where the grader's package (or its data) would be visible through the bound directories."""
    candidates = {str(_PACKAGE), *(str(Path(p) / "theinference") for p in sys.path if p)}
    return sorted(c for c in candidates if os.path.isdir(c) and any(c.startswith(v.rstrip("/") + "/") for v in visible))


def _parents(paths: list[str]) -> list[str]:
    """Every proper ancestor directory of paths (but /), shallowest first."""
    found = {str(p) for path in paths for p in Path(path).parents if str(p) != "/"}
    return sorted(found, key=lambda p: (p.count("/"), p))


class Sandbox:
    """A bubblewrap command line per run, and the stub package the student sees as `theinference`."""

    def __init__(self, isolation: Isolation):
        self.isolation = isolation
        self.hidden: list[str] = []  # results files: not readable even where the course's tree shows them
        self.stub_root = tempdirs.mkdtemp("stub")
        os.chmod(self.stub_root, 0o755)  # readable by nobody
        stub = Path(self.stub_root) / "theinference"
        stub.mkdir(mode=0o755)
        (stub / "proc").mkdir(mode=0o755)
        for name in (*STUB_FILES, NODE_HARNESS):
            shutil.copyfile(_PACKAGE / name, stub / name)
            os.chmod(stub / name, 0o644)
        self.child_script = str(stub / "proc" / "child.py")
        self.node_harness = str(stub / NODE_HARNESS)

    @property
    def tmpfs(self) -> bool:
        """Whether the run's directory is a tmpfs in the sandbox (else the grader's own directory, bound in)."""
        assert self.isolation.bwrap is not None, "a Sandbox is made only where bubblewrap runs"
        return tmpfs_reachable(self.isolation.bwrap)

    def command(
        self,
        argv: list[str],
        course_root: str,
        job: str,
        weights: str,
        extra: tuple[str, ...] = (),
        quota: int | None = None,
    ) -> list[str]:
        """argv (run inside the sandbox) wrapped in bwrap, seeing only what the run needs (and `extra`, read-only).

        The job file's directory is the run's: with a quota, a tmpfs of that size (and TMPFS_SLACK) at its path,
        the job file bound in read-only; without, the directory itself."""
        assert self.isolation.bwrap is not None, "a Sandbox is made only where bubblewrap runs"
        run_dir = os.path.dirname(job)
        python = _python_dirs()
        # The weights file and its config.json, not their directory: it may be private, or hold more than they need.
        config = Path(weights).parent / "config.json"
        readable = [*python, course_root, weights, *([str(config)] if config.exists() else []), self.stub_root]
        readable += [p for p in extra if p not in readable and not any(p.startswith(d + "/") for d in _SYSTEM_DIRS)]
        args = [
            self.isolation.bwrap,
            "--die-with-parent",
            "--new-session",
            *_NAMESPACES,
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--remount-ro",  # its /dev/shm would be a tmpfs of half the RAM, writable without the grader's root
            "/dev",
        ]
        for parent in _parents([*readable, run_dir]):  # bwrap would make them 0700: the student's user must pass
            args += ["--perms", "0755", "--dir", parent]
        for path in _SYSTEM_DIRS:
            args += ["--ro-bind-try", path, path]
        for path in sorted(readable, key=lambda p: p.count("/")):  # outer first: a later bind would cover an inner one
            args += ["--ro-bind", path, path]
        for path in _hidden_dirs([*python, *_SYSTEM_DIRS]):
            args += ["--tmpfs", path, "--remount-ro", path]
        for path in self.hidden:
            if os.path.isfile(path):
                args += ["--ro-bind", "/dev/null", path]
        if quota is not None and self.tmpfs:
            args += ["--perms", "0777", "--size", str(quota + TMPFS_SLACK), "--tmpfs", run_dir]
            args += ["--ro-bind", job, job]
        else:
            args += ["--bind", run_dir, run_dir]
        args += ["--chdir", course_root, "--remount-ro", "/", "--", *argv]
        return args

    def close(self) -> None:
        shutil.rmtree(self.stub_root, ignore_errors=True)
