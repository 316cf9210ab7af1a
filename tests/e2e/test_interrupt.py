"""Ctrl-C and SIGTERM to the grader's commands: nothing of the student's left running, nothing lost."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import scaled, write_adapters

# Starts a descendant in its own session (out of reach of a process-group kill), then hangs.
SPAWN_AND_HANG = """\
import subprocess, sys, time
def run_layer_equiv(seq_ids):
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"], start_new_session=True)
    time.sleep(600)
"""
SLOW_UNFINISHED = "import time\ndef run_layer_equiv(seq_ids):\n    time.sleep(1)\n    raise NotImplementedError\n"
UNFINISHED = "def run_layer_equiv(seq_ids):\n    raise NotImplementedError\n"


def _with_marker(marker: str) -> list[int]:
    """Pids of processes whose command line holds marker."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rfind(b")") + 2 :].split()[1])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z"  # a zombie is dead, merely not yet reaped


def _grader(tmp_path: Path, *args) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.Popen(
        [sys.executable, "-m", "theinference", *map(str, args)],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,  # not the test runner's (a pytest-xdist worker's stdin is its channel)
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(condition, seconds: float = 60):
    deadline = time.monotonic() + scaled(seconds)  # the grader's start and the student's, on a busy machine
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("the grader never got there")


@pytest.mark.parametrize(("command", "exit_code"), [("test", 143), ("watch", 0), ("grade", 143)])
def test_sigterm_kills_every_student_process_and_removes_temp_dirs(tmp_path, tiny_path, command, exit_code):
    marker = f"theinference-test-marker-{os.getpid()}-{command}"
    course = tmp_path / "submissions" / "hangs"
    write_adapters(course, SPAWN_AND_HANG.format(marker=marker))
    args = {
        "test": ["test", "--course", course],
        "watch": ["test", "--watch", "--course", course],
        "grade": ["grade", course, "--out", tmp_path / "grades.csv"],
    }[command]
    grader = _grader(tmp_path, *args, "--weights", tiny_path, "--stage", "prove-one-layer")
    sleepers = _wait_for(lambda: _with_marker(marker))
    students = {pid for pid in (_parent(p) for p in sleepers) if pid != 1}
    grader.send_signal(signal.SIGTERM)
    _wait_for(lambda: not any(map(_alive, [*sleepers, *students])), seconds=2)
    grader.wait(timeout=30)
    assert grader.returncode == exit_code, grader.stderr.read()
    assert not list(tmp_path.glob("theinference-*"))


@pytest.mark.slow
def test_sigint_mid_batch_leaves_a_sorted_csv_marked_interrupted(cli, tmp_path, tiny_path):
    root = tmp_path / "submissions"
    write_adapters(root / "a-hangs", SPAWN_AND_HANG.format(marker=f"theinference-test-marker-{os.getpid()}-int"))
    write_adapters(root / "b-slow", SLOW_UNFINISHED)  # finishes after c: the CSV is written out of order
    write_adapters(root / "c-quick", UNFINISHED)
    out = tmp_path / "grades.csv"
    grader = _grader(
        tmp_path,
        "grade",
        *sorted(root.iterdir()),
        "--weights",
        tiny_path,
        "--stage",
        "prove-one-layer",
        "--jobs",
        "3",
        "--out",
        out,
    )
    _wait_for(lambda: out.exists() and len(out.read_text().splitlines()) == 3)
    grader.send_signal(signal.SIGINT)
    grader.wait(timeout=30)
    stderr = grader.stderr.read()
    assert grader.returncode == 130, stderr
    with out.open(newline="") as f:
        rows = list(csv.reader(f))
    assert [r[0] for r in rows[1:]] == ["b-slow", "c-quick", "# interrupted after 2 of 3 submissions"]
    assert "interrupted after 2 of 3 submissions" in stderr
    assert not list(tmp_path.glob("theinference-*"))
    merged = cli("grade", "merge", out, "--out", tmp_path / "all.csv")
    assert merged.exit_code == 2 and "interrupted after 2 of 3 submissions; grade that shard again" in merged.stderr
