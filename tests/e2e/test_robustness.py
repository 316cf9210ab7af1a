"""What a hostile or broken submission costs the grader: memory, disk, time — through the real CLI."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import scaled, write_adapters
from test_runner import quick_stage_dir
from theinference.grading.spec.stages import load_stages, stage_dirs

HUGE = "import numpy as np\ndef run_layer_equiv(seq_ids):\n    return np.ones(600 * 2**20 // 8)\n"
HANG = "import time\ndef run_layer_equiv(seq_ids):\n    time.sleep(600)\n"
# Prints its RSS high-water mark after running the CLI in this very process: the grader's own peak.
MEASURE = """\
import resource, sys
from theinference.cli.app import main
sys.argv = ["theinference", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print("maxrss_kb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


# Tries to lift the grader's caps, then reports what they are: the attempt must fail.
LIFT_CAPS = """\
import resource
def run_layer_equiv(seq_ids):
    for which in (resource.RLIMIT_AS, resource.RLIMIT_FSIZE):
        try:
            resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        except (ValueError, OSError):
            pass
    raise RuntimeError(f"caps {resource.getrlimit(resource.RLIMIT_AS)} {resource.getrlimit(resource.RLIMIT_FSIZE)}")
"""


@pytest.mark.parametrize("untrusted", [False, True])
def test_student_code_cannot_lift_the_memory_and_file_caps(cli, tmp_path, tiny_path, untrusted):
    course = tmp_path / "course"
    write_adapters(course, LIFT_CAPS)
    args = ["test", "--course", course, "--weights", tiny_path, "--stage", "prove-one-layer", "--format", "json"]
    args += ["--memory-limit", "2048"] + (["--untrusted"] if untrusted else [])
    message = _stage_of(cli(*args).stdout)["cases"][0]["message"]
    caps = message.split("caps ", 1)[1]
    assert f"({2048 << 20}, {2048 << 20})" in caps, message  # RLIMIT_AS: soft and hard both at the cap
    assert caps.count("-1") == 0, message  # neither cap was lifted to unlimited


@pytest.fixture
def quick_stages(tmp_path) -> Path:
    return quick_stage_dir(tmp_path)


def _stage(path: Path) -> dict:
    return _stage_of(path.read_text())


def _stage_of(text: str) -> dict:
    return json.loads(text)["stages"][0]


@pytest.mark.slow
def test_huge_output_is_refused_unread_and_grader_memory_stays_bounded(tmp_path, tiny_path, quick_stages):
    course = tmp_path / "course"
    write_adapters(course, HUGE)
    out = tmp_path / "report.json"
    # A run directory that holds the 629 MB array (over the default quota, where the student's side refuses it).
    env = {**os.environ, "TMPDIR": str(tmp_path), "THEINFERENCE_RUN_DIR_MB": "1024"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            MEASURE,
            "test",
            "--course",
            course,
            "--weights",
            tiny_path,
            "--stages-dir",
            quick_stages,
            "--stage",
            "quick-layer",
            "--format",
            "json",
            "--output",
            out,
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.exists(), f"exit {done.returncode}, no report written:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    stage = _stage(out)
    assert [c["status"] for c in stage["cases"]] == ["fail", "fail"], stage
    assert stage["cases"][1]["message"] == "returned 600 MB (shape [78643200], float64); expected [3, 128]"
    peak = int(done.stderr.split("maxrss_kb")[-1]) * 1024
    print(f"grader peak RSS {peak / 1e6:.0f} MB")
    assert peak < tiny_path.stat().st_size + 2**30, f"grader peak RSS {peak / 1e9:.2f} GB"
    assert not list(tmp_path.glob("theinference-run-*"))


def test_output_over_the_file_cap_is_the_students_without_grader_frames(
    cli, tmp_path, tiny_path, quick_stages, monkeypatch
):
    monkeypatch.setattr("theinference.proc.worker.FILE_CAP", 16 * 2**20)  # the 1 GB cap, scaled down to save the disk
    course = tmp_path / "course"
    write_adapters(course, "import numpy as np\ndef run_layer_equiv(seq_ids):\n    return np.ones(5 * 2**20)\n")
    result = cli(
        "test",
        "--course",
        course,
        "--weights",
        tiny_path,
        "--stages-dir",
        quick_stages,
        "--stage",
        "quick-layer",
        "--format",
        "json",
    )
    case = json.loads(result.stdout)["stages"][0]["cases"][0]
    assert result.exit_code == 1
    assert case["status"] == "error"
    assert case["message"].startswith(
        "the adapter's output exceeded 16 MB (it returned 40 MB, shape [5242880], float64)"
    )
    assert "Traceback" not in result.stdout and "numpy" not in case["traceback"] + case["stderr"]


@pytest.mark.slow
def test_after_a_timeout_the_stage_s_other_cases_are_skipped(cli, tmp_path, tiny_path):
    course = tmp_path / "course"
    write_adapters(course, HANG)
    # The timeout covers the student's process starting too: scaled, so the case is running when it ends.
    timeout = scaled(0.5)
    args = [
        "test",
        "--course",
        course,
        "--weights",
        tiny_path,
        "--stage",
        "prove-one-layer",
        "--timeout",
        timeout,
        "--format",
        "json",
    ]
    cases = json.loads(cli(*args).stdout)["stages"][0]["cases"]
    assert [c["status"] for c in cases] == ["timeout"] * len(cases)
    assert cases[0]["message"] == f"timed out after {timeout:g} s while running"
    assert {c["message"] for c in cases[1:]} == {
        f"skipped after a timeout in case {cases[0]['name']} (--all-cases runs every case)"
    }
    every = json.loads(cli(*args, "--all-cases").stdout)["stages"][0]["cases"]
    assert every[0]["message"] == f"timed out after {timeout:g} s while running"
    # Every case is run, none skipped; on a loaded machine the restarts' imports may use up the stage's budget
    # (timeout × (cases + 1)) before the last case, which then says so instead.
    assert all(c["status"] == "timeout" and "skipped" not in c["message"] for c in every)
    assert {c["message"] for c in every} <= {
        f"timed out after {timeout:g} s while running",
        f"timed out: the stage's time budget of {timeout * (len(every) + 1):g} s ran out",
    }


@pytest.mark.slow
def test_a_batch_with_a_hung_submission_costs_one_timeout_per_stage(cli, tmp_path, tiny_path):
    root = tmp_path / "submissions"
    for name in ("a", "b", "c"):
        write_adapters(root / name, "def run_layer_equiv(seq_ids):\n    raise NotImplementedError\n")
    adapters = {stage.adapter for stage in load_stages(stage_dirs(None, []))}
    write_adapters(
        root / "hung",
        "import time\n" + "".join(f"def {name}(*args):\n    time.sleep(600)\n" for name in sorted(adapters)),
    )
    out = tmp_path / "grades.json"
    # Each stage's first timeout must find the adapter imported and running (a hang while importing is every
    # case's): the timeout covers a fresh sandboxed interpreter's start, scaled by the machine's load.
    timeout = scaled(0.5)
    result = cli(
        "grade",
        *sorted(root.iterdir()),
        "--weights",
        tiny_path,
        "--timeout",
        timeout,
        "--jobs",
        "2",
        "--format",
        "json",
        "--out",
        out,
    )
    assert result.exit_code == 0
    hung = {s["id"]: s["results"] for s in json.loads(out.read_text())["submissions"]}["hung"]
    for stage in hung["stages"]:
        messages = [c["message"] for c in stage["cases"]]
        ran = [m for m in messages if not m.startswith("skipped after a timeout")]
        assert len(ran) == 1 and ran[0].startswith(f"timed out after {timeout:g} s while running"), (
            stage["id"],
            messages,
        )


FIRST_CASE_ONLY = """\
import time
calls = 0

def run_layer_equiv(seq_ids):
    global calls
    calls += 1
    if calls > 1:  # every case after the first outlasts any budget
        time.sleep(600)
    return [[0.0]]
"""


@pytest.mark.slow
def test_the_submission_budget_ends_a_slow_submission(cli, tmp_path, tiny_path):
    # The budget must outlast the first case, which includes the submission's start (a fresh sandboxed
    # interpreter: 0.5 s idle, seconds on a busy machine): it is twice what grading a quick submission takes
    # on this machine now, then the first case finishes, the second hangs, and the budget ends it.
    quick = tmp_path / "submissions" / "quick"
    write_adapters(quick, "def run_layer_equiv(seq_ids):\n    return [[0.0]]\n")
    args = ["--weights", tiny_path, "--stage", "prove-one-layer", "--format", "json"]
    started = time.monotonic()
    assert cli("grade", quick, *args, "--out", tmp_path / "quick.json").exit_code == 0
    budget = max(1.5, round(2 * (time.monotonic() - started), 1))
    slow = tmp_path / "submissions" / "slow"
    write_adapters(slow, FIRST_CASE_ONLY)
    out = tmp_path / "grades.json"
    cli("grade", slow, *args, "--submission-timeout", budget, "--out", out)
    cases = json.loads(out.read_text())["submissions"][0]["results"]["stages"][0]["cases"]
    assert len(cases) > 1 and [c["status"] for c in cases] == ["fail"] + ["timeout"] * (len(cases) - 1)
    assert cases[-1]["message"] == f"timed out: the submission's time budget of {budget:g} s ran out"


SPIN = """\
import time
def run_layer_equiv(seq_ids):
    started = time.process_time()
    while time.process_time() - started < 600:
        pass
"""


def _first_case(cli, course, tiny_path, timeout):
    args = ["test", "--course", course, "--weights", tiny_path, "--stage", "prove-one-layer", "--timeout", timeout]
    return json.loads(cli(*args, "--format", "json").stdout)["stages"][0]["cases"][0]


def _timed_out(cli, tmp_path, tiny_path, source: str, seconds: float) -> tuple[dict, float]:
    """The first case of a course whose adapter is source, at a timeout of seconds (scaled to cover the student's
    process starting): it timed out on its charged clock, not at the backstop. (case, the timeout given)"""
    course = tmp_path / "course"
    write_adapters(course, source)
    timeout = scaled(seconds)
    case = _first_case(cli, course, tiny_path, timeout)
    assert case["status"] == "timeout" and case["message"] == f"timed out after {timeout:g} s while running"
    return case, timeout


def _starve(monkeypatch, accounting) -> None:
    """The kernel's count as on a starved machine: the tree's CPU as it is, every moment waited for a CPU."""
    real = accounting.ProcTree.sample
    monkeypatch.setattr(accounting.ProcTree, "sample", lambda self: (real(self)[0], time.monotonic()))


@pytest.mark.slow
def test_at_the_backstop_the_report_says_the_machine_was_too_busy_and_the_cpu_used(
    cli, tmp_path, tiny_path, monkeypatch
):
    # A machine starved by load, as the kernel reports it: the student's processes waited for a CPU all the
    # time, so none of it is charged and only the wall-clock backstop (4x the timeout, plus its slack) ends the
    # case. The same sleeper on this machine's own count is charged its sleep: "timed out", the code waited.
    from theinference.proc import accounting, clock

    course = tmp_path / "course"
    write_adapters(course, HANG)
    timeout = scaled(0.5)  # covers the student's process starting, however busy the machine
    waited = _first_case(cli, course, tiny_path, timeout)
    assert waited["status"] == "timeout" and waited["message"] == f"timed out after {timeout:g} s while running"
    assert waited["clock"]["charged_seconds"] >= timeout and waited["clock"]["cpu_seconds"] < timeout

    monkeypatch.setattr(clock, "BACKSTOP_SLACK", 5.0)
    _starve(monkeypatch, accounting)
    starved = _first_case(cli, course, tiny_path, 0.5)  # nothing is charged: the process's start needs no cover
    assert starved["status"] == "timeout"
    assert starved["message"].startswith("the machine was too busy: after ")
    assert "s of wall-clock time the adapter's processes had had " in starved["message"]
    assert "s of CPU in all" in starved["message"] and "not a verdict on the code" in starved["message"]
    assert starved["clock"]["wall_seconds"] >= 4 * 0.5 + 5.0 > 0.5 > starved["clock"]["charged_seconds"]


@pytest.mark.slow
def test_code_that_computes_past_its_timeout_is_too_slow_with_its_cpu_in_the_report(cli, tmp_path, tiny_path):
    # Time on a CPU is always charged, however busy the machine: a spinner times out, never "too busy".
    case, timeout = _timed_out(cli, tmp_path, tiny_path, SPIN, 0.5)
    clock = case["clock"]
    # Read as the case is killed, a moment after the check: the run-queue wait summed over threads may have
    # grown a little faster than the wall clock since, so the figure is near the timeout, not above it.
    assert clock["timeout"] == timeout and clock["charged_seconds"] > timeout / 2
    assert clock["cpu_seconds"] > 0 and clock["wall_seconds"] == pytest.approx(
        clock["charged_seconds"] + clock["waited_seconds"]
    )


@pytest.mark.slow
def test_at_the_backstop_code_that_used_its_timeout_in_cpu_is_too_slow_not_too_busy(
    cli, tmp_path, tiny_path, monkeypatch
):
    # Run-queue wait is summed over threads: several runnable ones can hide a step's time from its charged
    # clock on a loaded machine (as the fake count does here), but the CPU they used shows the code is slow.
    from theinference.proc import accounting, clock

    # Nothing is charged, so the timeout need not cover the process's start; a backstop of 20x lets the spinner
    # use its 0.5 s of CPU first on a machine that gives it a twentieth of a CPU.
    monkeypatch.setattr(clock, "BACKSTOP", 20.0)
    monkeypatch.setattr(clock, "BACKSTOP_SLACK", 1.0)
    _starve(monkeypatch, accounting)
    monkeypatch.setattr(clock, "_CORES", 10**6)  # the charged clock's CPU floor off (see the next test)
    course = tmp_path / "course"
    write_adapters(course, SPIN)
    timeout = 0.5
    case = _first_case(cli, course, tiny_path, timeout)
    assert case["status"] == "timeout"
    assert case["message"].startswith(f"timed out after {timeout:g} s while running (it had used ")
    assert "too busy" not in case["message"] and case["clock"]["cpu_seconds"] >= timeout


FORK_SPIN = """\
import os, time
def run_layer_equiv(seq_ids):
    for _ in range(3 * (os.cpu_count() or 1)):  # runnable processes of its own: their run-queue wait sums with its own
        if os.fork() == 0:
            while True:
                pass
    started = time.process_time()
    while time.process_time() - started < 600:
        pass
"""


@pytest.mark.slow
def test_runnable_processes_of_the_students_own_cannot_stretch_its_timeout(cli, tmp_path, tiny_path):
    # Three spinners per core wait for a CPU most of the time, so their summed wait outgrows the wall
    # clock: charged as wall less wait alone, the case never reached its timeout and ran to the backstop (4x the
    # timeout + 10 s, "it had used ... of CPU"). The CPU they use, spread over the cores, is charged at least.
    case, _ = _timed_out(cli, tmp_path, tiny_path, FORK_SPIN, 1.0)
    assert case["clock"]["waited_seconds"] > case["clock"]["wall_seconds"] > 0  # the wait alone hides it all
