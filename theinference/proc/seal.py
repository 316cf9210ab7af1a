"""A seal on a student's process tree: no process of it can be reaped by the kernel unseen (Linux, seccomp).

A process whose parent ignores SIGCHLD (or sets SA_NOCLDWAIT) is reaped by the kernel the moment it exits, and
its CPU is added to nobody's children's time: it leaves every count that sums a process tree (/proc, psutil),
so a no-cache submission could run its recompute in short-lived forked children and look cheap. Only a cgroup
counts such a process. Where none can be made (the grader not root, a container's read-only cgroup file
system), the worker seals itself before it imports the student's code: a seccomp filter, which every process it
ever starts inherits and none can remove, refuses (EPERM) every change of SIGCHLD's action (asking what it is
stays allowed), ptrace (a tracer could reap, or hide, a process) and every system call of another ABI (x32,
32-bit: their numbers differ). Then every process of the tree that exits stays a zombie until a process of the
tree (or its monitor, the subreaper that adopts its orphans) waits for it, and its CPU moves into that waiter's
children's time, which the count reads: nothing leaves it.

The worker imports only the standard library (this module is copied into the sandbox's stub package). Whether a
tree is sealed is read by the grader from outside (`tree_sealed`: /proc/PID/status), never taken from the worker's
word. A Node.js worker is not sealed, and cannot be with this filter (tried: sealed, then exec'd, Node 20 runs a
script that starts no process): libuv's first uv_spawn installs its SIGCHLD handler (rt_sigaction, refused), and
its forked child resets every signal to SIG_DFL before exec (refused, which libuv takes as fatal: exit 127), so
every child_process call fails with EPERM. tsx's loader starts esbuild that way, so no .ts adapter loads; nor can
the harness find a syntax error's line (`node --check`). A BPF filter cannot read the sigaction struct the call
points to, so it cannot tell SIG_DFL or a handler (harmless) from SIG_IGN or SA_NOCLDWAIT (the kernel's reaping).
"""

import ctypes
import os
import platform
import signal
import struct

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | 1  # SECCOMP_RET_ERRNO with EPERM
_X32_BIT = 0x40000000
# machine -> (AUDIT_ARCH_*, rt_sigaction's number, ptrace's number)
_ABIS = {"x86_64": (0xC000003E, 13, 101), "aarch64": (0xC00000B7, 134, 117)}
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, ...|BPF_JGE, BPF_RET
# seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 * i (little-endian: the low word first)
_NR, _ARCH, _ARG0, _ARG1_LOW, _ARG1_HIGH = 0, 4, 16, 24, 28


def _op(code: int, k: int, true: int = 0, false: int = 0) -> bytes:
    return struct.pack("HBBI", code, true, false, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter's BPF instructions for this machine's ABI; None where it has none here."""
    abi = _ABIS.get(machine or platform.machine())
    if abi is None or not hasattr(signal, "SIGCHLD"):  # Windows: no SIGCHLD
        return None
    arch, sigaction, ptrace = abi
    return b"".join(
        [
            _op(_LD_ABS, _ARCH),
            _op(_JEQ, arch, 1, 0),
            _op(_RET, _RET_EPERM),  # another ABI
            _op(_LD_ABS, _NR),
            _op(_JGE, _X32_BIT, 0, 1),
            _op(_RET, _RET_EPERM),  # x32
            _op(_JEQ, ptrace, 0, 1),
            _op(_RET, _RET_EPERM),
            _op(_JEQ, sigaction, 1, 0),
            _op(_RET, _RET_ALLOW),  # any other call
            _op(_LD_ABS, _ARG0),
            _op(_JEQ, signal.SIGCHLD, 1, 0),
            _op(_RET, _RET_ALLOW),  # another signal's action
            _op(_LD_ABS, _ARG1_LOW),
            _op(_JEQ, 0, 1, 0),
            _op(_RET, _RET_EPERM),  # SIGCHLD's action changed
            _op(_LD_ABS, _ARG1_HIGH),
            _op(_JEQ, 0, 1, 0),
            _op(_RET, _RET_EPERM),
            _op(_RET, _RET_ALLOW),  # SIGCHLD's action asked, not changed
        ]
    )


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def seal() -> bool:
    """Seal this process and all it will start (see the module); False where this kernel or machine cannot."""
    # What it needs first (Linux's /proc and SIGCHLD), then this machine's ABI: Windows has neither.
    if not hasattr(signal, "SIGCHLD") or not hasattr(ctypes, "CDLL") or not os.path.exists("/proc/self/status"):
        return False
    code = program()
    if code is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return False
    buffer = ctypes.create_string_buffer(code, len(code))
    filter_ = _Program(len(code) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(filter_), 0, 0) == 0


def _status(pid: int) -> dict[bytes, bytes]:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            return dict(line.split(b":\t", 1) for line in f.read().splitlines() if b":\t" in line)
    except OSError:
        return {}


def _is_wrapper(pid: int) -> bool:
    """Whether pid is a confinement command the launcher runs the worker in (started before the seal)."""
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")) in ("bwrap", "unshare")
    except OSError:
        return False


def tree_sealed(pids: list[int]) -> bool:
    """Whether these processes (a monitor's descendants, read by the grader after the worker loaded) are a sealed
    tree: some process is sealed, and every live one that is not is a confinement wrapper started before the seal.
    A process the student starts inherits the seal, so one that lacks it says the worker never had it."""
    found = False
    for pid in pids:
        status = _status(pid)
        if not status or status.get(b"State", b"").startswith((b"Z", b"X")):
            continue  # gone, or a zombie: it runs nothing
        if status.get(b"Seccomp", b"").strip() == b"2":
            found = True
        elif not _is_wrapper(pid):
            return False
    return found
