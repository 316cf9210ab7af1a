"""On PYTHONPATH, makes this interpreter one without what Python on Windows lacks: importing fcntl, resource, pwd, grp
or termios raises ImportError, and the os and signal modules have no POSIX-only names (os.fork, os.setsid,
os.killpg, os.getuid, os.getloadavg, os.O_NONBLOCK, os.fchmod before 3.13, signal.SIGKILL, signal.SIGXFSZ, ...), as
on Windows; and this package's os.open must say os.O_BINARY, without which Windows opens a file in text mode (CRLF
read as LF, a 0x1A byte as the end of the file: a returned array's .npy corrupted). tests/e2e/test_portable_imports.py
runs the CLI and the students' processes so.

The names go from the modules every other module sees; the standard library's POSIX internals that run here in
place of Windows' own (subprocess, shutil, tempfile) and psutil's Linux backend keep a copy of the whole modules, so
that what fails is this project's code reaching for what Windows does not have, never Linux's plumbing under it."""

import os
import signal
import sys
import types

# psutil has a backend of its own on each platform; its Linux one binds resource, which its Windows one never
# imports: it is loaded before resource goes, so that what runs here is what runs there.
import psutil  # type: ignore[import-untyped]  # noqa: F401
import shutil
import subprocess
import tempfile

for name in ("fcntl", "resource", "pwd", "grp", "termios"):
    sys.modules[name] = None  # type: ignore[assignment]

# Names that os and signal have on Linux and not on Windows (CPython 3.11-3.13), among those the package could reach.
# os.WNOHANG stays: subprocess.Popen.wait(timeout) looks it up on each call on POSIX (the project's code tests for it
# with hasattr).
NOT_ON_WINDOWS = {
    os: (
        "fork", "forkpty", "setsid", "setpgid", "getpgid", "getpgrp", "killpg", "getuid", "geteuid", "getgid",
        "getegid", "getgroups", "setuid", "setgid", "fchmod", "getloadavg", "sysconf", "sched_getaffinity", "wait3", "wait4",
        "O_CLOEXEC", "O_NOFOLLOW", "O_DIRECTORY", "O_PATH", "O_NONBLOCK", "pipe2", "chown", "fchown", "lchown",
        "fstatvfs", "statvfs", "mkfifo", "nice", "getpriority", "posix_spawn", "pidfd_open",
    ),
    signal: (
        "SIGKILL", "SIGSTOP", "SIGCONT", "SIGCHLD", "SIGCLD", "SIGXFSZ", "SIGHUP", "SIGPIPE", "SIGALRM", "SIGUSR1", "SIGUSR2",
        "SIGQUIT", "SIGXCPU", "pthread_sigmask", "pthread_kill", "setitimer", "alarm", "siginterrupt", "sigwait",
    ),
}  # fmt: skip


def _whole(module: types.ModuleType) -> types.SimpleNamespace:
    return types.SimpleNamespace(**vars(module))


# Linux's plumbing, which Windows replaces with its own: each keeps whole modules.
_PLUMBING = [subprocess, shutil, tempfile, *(m for n, m in sys.modules.items() if n.startswith("psutil") and m)]
for _module in _PLUMBING:
    for _name, _real in ((os.__name__, os), (signal.__name__, signal)):
        if getattr(_module, _name, None) is _real:
            setattr(_module, _name, _whole(_real))
    if getattr(_module, "_os", None) is os:  # tempfile's alias
        _module._os = _whole(os)  # type: ignore[attr-defined]

for _real, _names in NOT_ON_WINDOWS.items():
    for _name in _names:
        if hasattr(_real, _name):
            delattr(_real, _name)

# O_BINARY: a bit Linux does not have, taken off before the real os.open sees it; a call from this package without it
# fails loudly (RuntimeError, never an OSError a caller would take for a missing file).
os.O_BINARY = 1 << 30  # type: ignore[attr-defined]
_real_open = os.open


def _open(path, flags, mode=0o777, *, dir_fd=None):
    caller = sys._getframe(1).f_globals.get("__name__", "")
    if caller.startswith("theinference") and not flags & os.O_BINARY:  # type: ignore[attr-defined]
        raise RuntimeError(f"{caller} calls os.open({path!r}) without os.O_BINARY: Windows opens it in text mode")
    return _real_open(path, flags & ~os.O_BINARY, mode, dir_fd=dir_fd)  # type: ignore[attr-defined]


os.open = _open
