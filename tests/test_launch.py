"""The zygote launcher's lifetime (theinference.proc.launch.ZygoteLauncher)."""

import os
import time

import pytest

from theinference.proc.launch import ZygoteLauncher


@pytest.mark.linux  # fork, AF_UNIX and fd passing: where the zygote launcher is used
def test_a_zygote_closed_before_any_worker_is_killed_at_once_and_leaves_nothing():
    """A run that stops before its first student call (weights that do not load, a bad stage) closes the zygote
    while it may still be importing numpy: it has forked nothing, so it is killed, not waited on for up to 5 s."""
    launcher = ZygoteLauncher()
    launcher.warm()
    proc, directory = launcher._proc, launcher._dir
    assert proc is not None and directory is not None and proc.poll() is None
    started = time.process_time()
    launcher.close()
    assert proc.returncode is not None and proc.returncode < 0  # killed, not left to exit in its own time
    assert not os.path.exists(directory)
    assert proc.stdin is not None and proc.stdin.closed and proc.stdout is not None and proc.stdout.closed
    assert time.process_time() - started < 1.0  # no busy wait in the grader either
