"""What Python on Windows lacks, one name at a time: the code that reaches for it takes the portable way.

Windows' os has no getloadavg, O_NONBLOCK, fchmod (before 3.13) nor st_blocks in a stat; its signal module no
SIGXFSZ, SIGKILL or SIGCHLD; and os.open opens a file in text mode unless O_BINARY is given. Each was reached on
every grading (tests/portable/sitecustomize.py found them by removing the names, as tests/e2e/test_portable_imports.py
runs the CLI). Proven here on Linux by taking each name away."""

import os
import signal
import subprocess
import sys
import types
from pathlib import Path

from theinference.files import atomic_file
from theinference.grading.oracle.threads import busy_blas_limit
from theinference.proc import rundir, seal
from theinference.proc.worker import exit_message

PORTABLE = Path(__file__).parent / "portable"


def test_a_crash_is_told_without_sigxfsz(monkeypatch):
    monkeypatch.delattr(signal, "SIGXFSZ", raising=False)
    assert exit_message(3) == "the adapter's process exited with code 3 before returning a result"  # abort()
    assert exit_message(-9) == "the adapter's process was killed by SIGKILL"  # the grader's kill, as Popen says it


def test_without_os_getloadavg_the_load_is_psutils_and_a_busy_machine_still_gets_one_blas_thread(monkeypatch):
    import psutil

    monkeypatch.delattr(os, "getloadavg", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(psutil, "getloadavg", lambda: (4.0, 3.0, 2.0))  # Windows: psutil's own sampling
    assert busy_blas_limit() == 1
    monkeypatch.setattr(psutil, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert busy_blas_limit() is None


def test_numpy_keeps_its_threads_where_there_is_no_load_average_at_all(monkeypatch):
    import psutil

    monkeypatch.delattr(os, "getloadavg", raising=False)
    monkeypatch.delattr(psutil, "getloadavg", raising=False)
    assert busy_blas_limit() is None
    assert busy_blas_limit(load=4.0, cores=2) == 1  # where it is read, a busy machine still gets one thread


def test_the_run_directory_is_measured_and_read_without_o_nonblock_or_st_blocks(tmp_path, monkeypatch):
    (tmp_path / "case-0.npy").write_bytes(b"x" * 10_000)
    real_scandir = os.scandir

    class Entry:  # a DirEntry whose stat has no st_blocks, as on Windows
        def __init__(self, entry):
            self.entry, self.path = entry, entry.path

        def stat(self, follow_symlinks=True):
            info = self.entry.stat(follow_symlinks=follow_symlinks)
            return types.SimpleNamespace(st_size=info.st_size, st_dev=info.st_dev, st_ino=info.st_ino)

        def is_dir(self, follow_symlinks=True):
            return self.entry.is_dir(follow_symlinks=follow_symlinks)

    monkeypatch.setattr(rundir.os, "scandir", lambda path: [Entry(e) for e in real_scandir(path)])
    monkeypatch.delattr(os, "O_NONBLOCK", raising=False)
    run = rundir.RunDir(tmp_path, quota=1 << 20)
    assert run.usage() >= 10_000  # its size, where the blocks it takes cannot be read
    fd = run.open_output("case-0.npy")
    try:
        assert os.read(fd, 3) == b"xxx"
    finally:
        os.close(fd)


def test_no_seal_is_tried_without_sigchld(monkeypatch):
    monkeypatch.delattr(signal, "SIGCHLD", raising=False)
    assert seal.seal() is False


def test_an_atomic_write_needs_no_fchmod(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "fchmod", raising=False)
    with atomic_file(tmp_path / "report.json") as f:
        f.write("{}\n")
    assert (tmp_path / "report.json").read_text() == "{}\n"


# The files the grader opens with os.open, each opened with O_BINARY (sitecustomize fails a call without it): the
# captured output, a returned array, an atomic write (a report, the oracle store's arrays), a temp directory's owner.
O_BINARY_USERS = """
import os, sys
from pathlib import Path
from theinference.files import atomic_file
from theinference.proc import rundir, tempdirs, worker
where = Path(sys.argv[1])
fd, identity = worker._create(where / "stdout-0.txt")
os.write(fd, b"line\\r\\nmore\\x1a")
os.close(fd)
assert worker._read_capped(where / "stdout-0.txt", identity) == "line\\r\\nmore\\x1a"
(where / "case-0.npy").write_bytes(b"\\r\\n\\x1a")
fd = rundir.RunDir(where, 1 << 20).open_output("case-0.npy")
assert os.read(fd, 10) == b"\\r\\n\\x1a"
os.close(fd)
with atomic_file(where / "out.bin", binary=True) as f:
    f.write(b"\\n")
assert os.path.isdir(tempdirs.mkdtemp("probe"))  # its owner file, made and locked
print("ok")
"""


def test_every_file_the_grader_opens_is_opened_binary_as_windows_needs(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PORTABLE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", O_BINARY_USERS, str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert (done.returncode, done.stdout) == (0, "ok\n"), done.stderr
