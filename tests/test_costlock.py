"""The cost stage's lock (grading/drive/costlock.py): exclusive against every other stage, in a batch and across
graders of one machine, with or without fcntl."""

import subprocess
import sys
import textwrap
import threading
import time

from theinference.grading.drive import costlock
from theinference.grading.drive.costlock import CostLock

MODULE = costlock.__file__


def _taken(context, events: list, name: str, release: threading.Event) -> threading.Thread:
    def hold():
        with context:
            events.append(name)
            release.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    return thread


def test_the_cost_stage_waits_for_every_other_stage_and_goes_before_those_that_come_after_it(tmp_path):
    lock, events = CostLock(tmp_path / "cost.lock"), []
    gates = {name: threading.Event() for name in ("reader", "writer", "later")}
    reader = _taken(lock.shared(), events, "reader", gates["reader"])
    while events != ["reader"]:
        time.sleep(0.001)
    writer = _taken(lock.exclusive(), events, "writer", gates["writer"])
    while not lock._writers_waiting:  # the cost stage is waiting for the reader
        time.sleep(0.001)
    later = _taken(lock.shared(), events, "later", gates["later"])
    writer.join(0.3)
    assert events == ["reader"]  # neither the cost stage nor a stage after it runs beside the first
    gates["reader"].set()
    reader.join()
    while len(events) < 2:
        time.sleep(0.001)
    assert events == ["reader", "writer"]  # the cost stage first, alone
    gates["writer"].set()
    writer.join()
    gates["later"].set()
    later.join()
    assert events == ["reader", "writer", "later"]


HOLDER = """\
import importlib.util, sys

# The module alone, by its file: the rest of the package is not all fcntl-free yet (the oracle store).
spec = importlib.util.spec_from_file_location("costlock", sys.argv[2])
costlock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(costlock)
CostLock = costlock.CostLock

with CostLock(sys.argv[1]).exclusive():
    print("held", flush=True)
    sys.stdin.readline()
"""
NO_FCNTL = "import sys\nsys.modules['fcntl'] = None\n"  # as on Windows


def _other_grader(path, without_fcntl: bool) -> subprocess.Popen:
    script = (NO_FCNTL if without_fcntl else "") + HOLDER
    grader = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), str(path), MODULE], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert grader.stdout is not None and grader.stdout.readline() == "held\n"
    return grader


def test_another_graders_cost_stage_holds_off_this_ones_stages(tmp_path):
    path = tmp_path / "cost.lock"
    grader = _other_grader(path, without_fcntl=False)
    events: list[str] = []
    done = threading.Event()
    stage = _taken(CostLock(path).shared(), events, "stage", done)
    stage.join(0.3)
    assert events == []  # waits for the other grader's cost stage
    assert grader.stdin is not None
    grader.stdin.write("\n")
    grader.stdin.close()
    grader.wait()
    done.set()
    stage.join()
    assert events == ["stage"]


def test_without_fcntl_the_lock_still_holds_off_another_grader(tmp_path):
    """Where fcntl is missing (Windows), both graders use filelock's exclusive lock for the machine's half."""
    path = tmp_path / "cost.lock"
    grader = _other_grader(path, without_fcntl=True)
    waiter = subprocess.Popen(
        [sys.executable, "-c", NO_FCNTL + HOLDER, str(path), MODULE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiter.stdout is not None and grader.stdin is not None
        ready = threading.Thread(target=lambda: waiter.stdout.readline())  # type: ignore[union-attr]
        ready.start()
        ready.join(0.5)
        assert ready.is_alive()  # the second cannot take it while the first holds it
        grader.stdin.write("\n")
        grader.stdin.close()
        grader.wait()
        ready.join(30)
        assert not ready.is_alive()
    finally:
        for proc in (grader, waiter):
            proc.kill()
            proc.wait()
