"""The grader's temporary directories, each named for the grader that made it; the next grader removes a dead one's.

A grader that is SIGKILLed (the OOM killer, a cancelled CI job, `timeout -k`) cannot remove its run
directories, its zygote's socket directory or its sandbox's stub package, and a busy machine would keep them
for ever. So every grading process holds, for its whole life, an exclusive kernel lock (theinference.locks: flock,
or LockFileEx on Windows) on an owner file of its own in the temp directory, `theinference-owner-TOKEN`, and names
each directory it makes `theinference-KIND-TOKEN-XXXXXXXX`. The kernel releases the lock however the process ends
(and a forked copy of the grader holds it too). The first directory a grader makes starts a sweep: an owner file
whose lock can be taken belongs to a dead grader, and its directories go with it; a directory whose owner file is
gone has no live owner either (the owner file is in place before its first directory is made). A live grader's
lock cannot be taken, so its directories are never touched. Where the machine offers no kernel lock, a grader
names its directories without a token and sweeps nothing: nothing could tell it alive.

Nothing is followed through a link: only real directories (lstat) owned by this user (any, as root) are
removed, with shutil.rmtree (which never follows a link inside them), and owner files are opened with
O_NOFOLLOW (where it exists: not on Windows, where links need privileges to make). Directories from before this
naming (no token) are left alone: nothing tells whose they were. A grader that exits (normally, or by a signal it
handles) removes its owner file; a SIGKILLed one's is swept.
"""

import atexit
import functools
import os
import re
import shutil
import stat
import tempfile

from theinference import locks

PREFIX = "theinference-"
KINDS = ("run", "zygote", "stub", "probe")
_OWNER = f"{PREFIX}owner-"
_TOKEN = re.compile(r"g[0-9a-f]{12}")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # absent on Windows
_BINARY = getattr(os, "O_BINARY", 0)  # Windows opens a file in text mode without it (CRLF, 0x1A as the end)


def mkdtemp(kind: str) -> str:
    """A new private (0700) directory in the temp directory, named for this grader: theinference-KIND-TOKEN-… (where
    no kernel lock exists: theinference-KIND-…, which no sweep removes)."""
    assert kind in KINDS, kind
    token = _owner_token(os.getpid())
    return tempfile.mkdtemp(prefix=f"{PREFIX}{kind}-{token}-" if token else f"{PREFIX}{kind}-")


@functools.cache
def _owner_token(pid: int) -> str | None:
    """This grader's token (once per process: pid is the cache's key), its owner file locked and in place, and the
    leftovers of dead graders removed; None where the machine has no kernel lock to hold."""
    del pid
    where = tempfile.gettempdir()
    token = "g" + os.urandom(6).hex()
    owner = os.path.join(where, _OWNER + token)
    try:
        fd = _placed_owner(where, token)
    except locks.NoKernelLock:
        return None
    _held.append(fd)  # open for the process's life: the lock is released only when it ends
    atexit.register(_release, os.getpid(), owner)
    remove_leftovers(where, keep=token)
    return token


def _placed_owner(where: str, token: str) -> int:
    """The open descriptor of token's owner file, locked and in place."""
    owner = os.path.join(where, _OWNER + token)
    # Locked under a name no sweep looks at, then renamed into place: a sweep never finds it unlocked.
    pending = os.path.join(where, f".{_OWNER}{token}")
    fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY, 0o600)
    try:
        locks.lock(fd)
        os.rename(pending, owner)
    except PermissionError:  # Windows: a file open in a process can be neither renamed nor removed
        _discard(fd, pending)
        return _locked_in_place(owner)
    except BaseException:
        _discard(fd, pending)
        raise
    return fd


def _locked_in_place(owner: str) -> int:
    """The owner file made at its own name, then locked: where an open file cannot be removed (Windows), a sweep that
    finds it before the lock takes nothing (no directory of it exists yet, and the file stays); its probe's lock is
    brief, so this one waits it out."""
    fd = os.open(owner, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _BINARY, 0o600)
    try:
        locks.lock(fd)
    except BaseException:
        _discard(fd, owner)
        raise
    return fd


def _discard(fd: int, path: str) -> None:
    os.close(fd)
    try:
        os.unlink(path)
    except OSError:
        pass


_held: list[int] = []


def _release(pid: int, owner: str) -> None:
    """At a grader's exit (not a forked copy's), its owner file goes too: a temp directory is left as it was found.

    Its directories are gone by then; any left (a failed cleanup) have no owner file, so the next sweep takes them."""
    if os.getpid() != pid:
        return
    try:
        os.unlink(owner)
    except PermissionError:  # Windows: not while it is open; the process ends now, its lock may go first
        for fd in _held:
            os.close(fd)
        _held.clear()
        try:
            os.unlink(owner)
        except OSError:
            pass
    except OSError:
        pass


def _token_of(name: str) -> str | None:
    """The owner's token in one of our directory names, None for anything else (a name from before tokens)."""
    for kind in KINDS:
        rest = name.removeprefix(f"{PREFIX}{kind}-")
        if rest != name:
            token = rest.split("-", 1)[0]
            return token if "-" in rest and _TOKEN.fullmatch(token) else None
    return None


def _real_dir(path: str) -> os.stat_result | None:
    """path's lstat if it is a real directory (not a link to one), else None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info if stat.S_ISDIR(info.st_mode) else None


def _ours_to_remove(path: str) -> bool:
    """A real directory (not a link) that this user owns, or any as root (Windows has no uids: a user's temp
    directory is their own)."""
    info = _real_dir(path)
    if info is None or not hasattr(os, "geteuid"):
        return info is not None
    return info.st_uid == os.geteuid() or os.geteuid() == 0


def _lock_held(path: str) -> bool | None:
    """Whether a process holds the lock of the owner file at path: True; False if it is missing or free; None if
    it is not ours to judge (another user's, or not a regular file). Where no kernel lock exists, or it fails, it
    is held: only a lock taken proves its grader dead."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _BINARY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return False
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        try:
            return not locks.lock(fd, blocking=False)
        except OSError:
            return True
    finally:
        os.close(fd)


def _dead(where: str, token: str) -> bool:
    """Whether the grader of token is gone: its owner file is missing, or its flock can be taken."""
    return _lock_held(os.path.join(where, _OWNER + token)) is False


def a_live_graders(path: str) -> bool:
    """Whether path, an entry at the top of a temp directory, is a running grader's: its owner file (or the one it is
    about to rename into place), or a directory named for it. The sweep of a leased uid's leftovers keeps these:
    uid nobody's files in /tmp may be those of a grader that runs as nobody."""
    where, name = os.path.split(path)
    if name.startswith((_OWNER, "." + _OWNER)):
        return _lock_held(path) is True  # a regular file whose lock is held: not a name alone, nor a directory
    token = _token_of(name)
    return token is not None and _real_dir(path) is not None and not _dead(where, token)


def remove_leftovers(where: str, keep: str = "") -> list[str]:
    """Remove the directories and owner files that dead graders left in where (never keep's); what was removed."""
    try:
        names = os.listdir(where)
    except OSError:
        return []
    tokens = {_token_of(name) for name in names} | {n.removeprefix(_OWNER) for n in names if n.startswith(_OWNER)}
    removed = []
    for token in sorted(t for t in tokens if t and t != keep and _TOKEN.fullmatch(t)):
        if not _dead(where, token):
            continue
        for name in names:
            path = os.path.join(where, name)
            if _token_of(name) == token and _ours_to_remove(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        owner = os.path.join(where, _OWNER + token)
        try:
            if stat.S_ISREG(os.lstat(owner).st_mode):
                os.unlink(owner)
                removed.append(owner)
        except OSError:
            pass
    return removed


_SUN_PATH = 107  # bytes of an AF_UNIX socket's path, its NUL aside (Linux)


def unix_address(path: str) -> tuple[str, int | None]:
    """An address for the Unix socket at path that fits AF_UNIX: path itself, or, where the temp directory's path is
    too long for it (a deep $TMPDIR), path reached through an open descriptor of its directory
    (/proc/self/fd/N/NAME). The caller closes the descriptor (None: none was opened) once it has bound or connected."""
    if len(os.fsencode(path)) <= _SUN_PATH:
        return path, None
    fd = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{os.path.basename(path)}", fd
