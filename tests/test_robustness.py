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
from theinference.grading.stages import load_stages, stage_dirs

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
    stage = _stage(out)
    assert [c["status"] for c in stage["cases"]] == ["fail", "fail"]
    assert stage["cases"][1]["message"] == "returned 629.1 MB (shape [78643200], float64); expected [3, 128]"
    peak = int(done.stderr.split("maxrss_kb")[-1]) * 1024
    print(f"grader peak RSS {peak / 1e6:.0f} MB")
    assert peak < tiny_path.stat().st_size + 2**30, f"grader peak RSS {peak / 1e9:.2f} GB"
    assert not list(tmp_path.glob("theinference-run-*"))


def test_output_over_the_file_cap_is_the_students_without_grader_frames(
    cli, tmp_path, tiny_path, quick_stages, monkeypatch
):
    monkeypatch.setattr("theinference.proc.runner.FILE_CAP", 16 * 2**20)  # the 1 GB cap, scaled down to save the disk
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
