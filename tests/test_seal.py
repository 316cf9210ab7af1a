"""proc/seal.py: a sealed worker's processes cannot be reaped unseen, and the grader sees the seal from outside."""

import subprocess
import sys
import textwrap

import pytest

from theinference.proc.seal import program, tree_sealed

pytestmark = pytest.mark.skipif(sys.platform != "linux" or program() is None, reason="seccomp on x86_64 or aarch64")

SEALED = textwrap.dedent(
    """
    import ctypes, os, signal, sys, time
    from theinference.proc.seal import seal
    assert seal()
    def refused(what, call):
        try:
            call()
        except OSError as e:
            print(what, "refused", e.errno)
        else:
            print(what, "ALLOWED")
    refused("SIG_IGN", lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
    refused("handler", lambda: signal.signal(signal.SIGCHLD, lambda *a: None))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(16, os.getppid(), 0, 0) != 0:  # PTRACE_ATTACH
        print("ptrace refused", ctypes.get_errno())
    print("asked", signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    print("other signals", signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN)
    child = os.fork()
    if child == 0:  # the seal is inherited: a child cannot lift it for its own children
        refused("child SIG_IGN", lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN))
        os._exit(0)
    os.waitpid(child, 0)
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def test_a_sealed_process_and_its_children_cannot_have_sigchld_ignored_nor_trace():
    proc = subprocess.Popen([sys.executable, "-c", SEALED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.startswith("ready"):
            break
    assert tree_sealed([proc.pid])  # read from outside: /proc/PID/status
    proc.stdin.close()
    proc.wait()
    assert lines == [
        "SIG_IGN refused 1",
        "handler refused 1",
        "ptrace refused 1",
        "asked True",
        "other signals True",
        "child SIG_IGN refused 1",
        "ready",
    ]


def test_an_unsealed_process_is_not_a_sealed_tree():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert not tree_sealed([proc.pid])
        assert not tree_sealed([])  # no process at all proves nothing
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
