"""A submission cannot grant itself credit: each exploit of issue 12, written as a submission, graded by the real CLI."""

import csv
import json
import re
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from safetensors.numpy import load_file, save_file

from conftest import scaled, slowdown, write_adapters
from test_runner import QUICK_STAGE, SOLUTION_IMPORTS
from theinference.bundled import data_dir
from theinference.grading.spec.stages import load_stages, stage_dirs
from theinference.trust import ENV_ALLOWED

BUILT_IN_POINTS = sum(s.points for s in load_stages(stage_dirs(None)))
PASSING = SOLUTION_IMPORTS + "def run_layer_equiv(seq_ids):\n    return _solve(seq_ids)\n"

BONUS_STAGE = """\
format_version = 1
id = "bonus"
title = "Free points"
order = 0
lesson = "none.md"
adapter = "run_bonus"
oracle = "layer0-attn-sublayer"
compare = "rows"
timeout = 30
points = 1000

[tolerance]
atol = 1e30
rtol = 1e30

[[case]]
name = "any"
seq = [464]
"""

# An instructor-style oracle that, once imported into the grader, makes every case pass.
PATCHING_ORACLE = """\
import dataclasses
import pathlib
import theinference.grading.judge.grade

pathlib.Path(__file__).with_name("IMPORTED").write_text("the grader imported me")
_real = theinference.grading.judge.grade.judge_case

def _always_pass(*args, **kwargs):
    judged = _real(*args, **kwargs)
    return dataclasses.replace(judged, case=dataclasses.replace(judged.case, status="pass"))

theinference.grading.judge.grade.judge_case = _always_pass

def identity(model, seq):
    return [0.0]
"""

SETUP_STAGE = BONUS_STAGE.replace('id = "bonus"', 'id = "setup"').replace(
    'oracle = "layer0-attn-sublayer"', 'oracle = "helpers.py:identity"\ninputs = ["seq"]'
)

# The grader's end of the result pipe, found the way the issue did: in the caller's frame.
PROTO = """\
import json, os, sys, time

def _proto():
    frame = sys._getframe(1)
    while "proto" not in frame.f_locals:
        frame = frame.f_back
    return frame.f_locals["proto"], frame.f_locals.get("index", 0)

def _send(line):
    proto, _ = _proto()
    proto.write(line + "\\n")
    proto.flush()
"""


def starter_course(path: Path) -> Path:
    """The untouched starter: every adapter raises NotImplementedError."""
    shutil.copytree(data_dir("course") / "starter", path)
    return path


def add_stage(course: Path, name: str, text: str, folder: str = "stages") -> None:
    (course / folder).mkdir(exist_ok=True)
    (course / folder / name).write_text(text)


def append_adapter(course: Path, source: str) -> None:
    path = course / "tests" / "adapters.py"
    path.write_text(path.read_text() + "\n\n" + textwrap.dedent(source))


def read_rows(path: Path) -> dict[str, dict]:
    with path.open(newline="") as f:
        return {row["id"]: row for row in csv.DictReader(f)}


def grade_json(cli, out: Path, *args) -> dict:
    result = cli("grade", *args, "--format", "json", "--out", out)
    assert result.exit_code == 0, result.output
    return {s["id"]: s for s in json.loads(out.read_text())["submissions"]}


# --- the submission's stages, oracles, weights and timeout -------------------------------------


@pytest.mark.slow
def test_course_oracle_is_never_imported_when_untrusted(cli, tmp_path, tiny_path):
    course = starter_course(tmp_path / "sub")
    add_stage(course, "00-setup.toml", SETUP_STAGE)
    (course / "stages" / "helpers.py").write_text(PATCHING_ORACLE)
    graded = grade_json(cli, tmp_path / "grades.json", course, "--weights", tiny_path)["sub"]["results"]
    assert graded["points"] == 0 and graded["max_points"] == BUILT_IN_POINTS
    assert "setup" not in [s["id"] for s in graded["stages"]]
    assert any("ignored the submission's stages/" in n for n in graded["notices"])
    tested = cli("test", "--untrusted", "--course", course, "--weights", tiny_path, "--format", "gradescope")
    document = json.loads(tested.stdout)
    assert tested.exit_code == 1 and document["score"] == 0 and document["extra_data"]["max_score"] == BUILT_IN_POINTS
    assert not (course / "stages" / "IMPORTED").exists()


@pytest.mark.slow
@pytest.mark.parametrize("where", ["stages", "extra"])
def test_course_bonus_stage_earns_nothing_when_untrusted(cli, tmp_path, tiny_path, where):
    course = starter_course(tmp_path / "sub")
    add_stage(course, "bonus.toml", BONUS_STAGE, folder=where)
    if where == "extra":
        (course / "theinference.toml").write_text('stages_dirs = ["extra"]\n')
    append_adapter(course, "def run_bonus(seq_ids):\n    return np.zeros((len(seq_ids), 128))\n")
    out = tmp_path / "grades.csv"
    assert cli("grade", course, "--weights", tiny_path, "--out", out).exit_code == 0
    row = read_rows(out)["sub"]
    assert (row["points"], row["max_points"]) == ("0", f"{BUILT_IN_POINTS:g}") and "bonus.status" not in row
    gradescope = json.loads(cli("test", "--course", course, "--weights", tiny_path, "--format", "gradescope").stdout)
    assert gradescope["score"] == 0 and gradescope["extra_data"]["max_score"] == BUILT_IN_POINTS
    assert all(not t["name"].startswith("bonus") for t in gradescope["tests"])
    asked = cli("test", "--untrusted", "--course", course, "--weights", tiny_path, "--stage", "bonus")
    assert asked.exit_code == 2 and "untrusted grading reads no stage files from the course directory" in asked.stderr


def test_plain_test_marks_course_stages_in_every_format(cli, tmp_path, tiny_path):
    course = starter_course(tmp_path / "sub")
    add_stage(course, "bonus.toml", BONUS_STAGE)
    append_adapter(course, "def run_bonus(seq_ids):\n    return np.zeros((len(seq_ids), 128))\n")
    args = ["test", "--course", course, "--weights", tiny_path, "--stage", "bonus"]
    mark = "stages from the course directory: bonus (1000 points)"

    rich = cli(*args).stdout
    assert f"not the instructor's: {mark}" in rich  # the header
    assert rich.rstrip().splitlines()[-1] == f"not the instructor's grading: {mark}"  # the closing summary
    assert re.search(r"bonus .*from the course directory", rich)

    document = json.loads(cli(*args, "--format", "json").stdout)
    assert document["stages"][0]["source"] == "course" and document["course_supplied"] == [mark]
    assert document["untrusted"] is False and document["points"] == 1000

    junit = cli(*args, "--format", "junit").stdout
    assert '<property name="source" value="course" />' in junit and mark in junit
    github = cli(*args, "--format", "github").stdout
    assert re.search(r"^::warning title=theinference%3A not the instructor::" + re.escape(mark), github, re.M)


def test_builtin_stages_are_marked_built_in(solution_run):
    from test_cli import JSON_DOCUMENT  # the solution's one shared grading as a JSON document

    document = json.loads((solution_run(*JSON_DOCUMENT).root / "results.json").read_text())
    assert document["stages"][0]["source"] == "built-in" and document["course_supplied"] == []


def _fake_hf_cache(hf_home: Path, tiny_dir: Path) -> None:
    """Put the tiny checkpoint where the grader looks for real GPT-2 (the instructor's machine)."""
    repo = hf_home / "hub" / "models--openai-community--gpt2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("rev")
    shutil.copytree(tiny_dir, repo / "snapshots" / "rev")


@pytest.mark.slow
def test_course_chosen_zero_weights_are_ignored_when_untrusted(cli, tmp_path, tiny_dir):
    _fake_hf_cache(tmp_path / "hf-home", tiny_dir)
    course = tmp_path / "sub"
    write_adapters(
        course, "import numpy as np\n\ndef run_layer_equiv(seq_ids):\n    return np.zeros((len(seq_ids), 128))\n"
    )
    (course / "zeros").mkdir()
    zeros = {k: v * 0 for k, v in load_file(tiny_dir / "model.safetensors").items()}
    save_file(zeros, course / "zeros" / "model.safetensors")
    shutil.copy(tiny_dir / "config.json", course / "zeros")
    (course / "theinference.toml").write_text('weights = "zeros/model.safetensors"\n')

    trusted = json.loads(cli("test", "--course", course, "--stage", "prove-one-layer", "--format", "json").stdout)
    assert trusted["status"] == "pass" and trusted["weights"]["source"] == "theinference.toml"
    assert any(line.startswith("weights from the course's theinference.toml") for line in trusted["course_supplied"])

    graded = grade_json(cli, tmp_path / "grades.json", course, "--stage", "prove-one-layer")["sub"]["results"]
    assert graded["status"] == "fail" and graded["weights"]["source"] == "huggingface-cache"
    assert any("`weights`" in n for n in graded["notices"])
    untrusted = json.loads(
        cli("test", "--untrusted", "--course", course, "--stage", "prove-one-layer", "--format", "json").stdout
    )
    assert untrusted["status"] == "fail" and untrusted["untrusted"] is True and untrusted["course_supplied"] == []


@pytest.mark.slow
def test_course_timeout_does_not_stretch_the_instructors(cli, tmp_path, tiny_path):
    stages = tmp_path / "instructor-stages"
    stages.mkdir()
    timeout = scaled(1)  # the instructor's: a fresh sandboxed interpreter starts within it, however busy the machine
    (stages / "quick.toml").write_text(QUICK_STAGE.replace("timeout = 30", f"timeout = {timeout}"))
    course = tmp_path / "sub"
    write_adapters(course, "import time\n\ndef run_layer_equiv(seq_ids):\n    time.sleep(600)\n")
    (course / "theinference.toml").write_text("timeout = 1e9\n")
    for args in (
        ["grade", course, "--format", "json", "--out", tmp_path / "g.json"],
        ["test", "--untrusted", "--course", course, "--format", "json"],
    ):
        result = cli(*args, "--weights", tiny_path, "--stages-dir", stages, "--stage", "quick-layer")
        document = (
            json.loads(result.stdout)
            if args[0] == "test"
            else json.loads((tmp_path / "g.json").read_text())["submissions"][0]["results"]
        )
        case = document["stages"][0]["cases"][0]
        assert case["status"] == "timeout" and case["message"] == f"timed out after {timeout:g} s while running"
        assert any("`timeout`" in n for n in document["notices"])


def test_adapters_outside_the_submission_are_refused_when_untrusted(cli, tmp_path, tiny_path):
    write_adapters(tmp_path / "other", PASSING)
    course = tmp_path / "sub"
    course.mkdir()
    (course / "theinference.toml").write_text('adapters = "../other/tests/adapters.py"\n')
    out = tmp_path / "grades.csv"
    assert cli("grade", course, "--weights", tiny_path, "--stage", "prove-one-layer", "--out", out).exit_code == 0
    row = read_rows(out)["sub"]
    assert row["status"] == "error" and "must be inside the submission" in row["error"]


# --- the result pipe ----------------------------------------------------------------------------

BREAKS = {
    "not-json": ('_send("this is not JSON")', "a line that is not JSON"),
    "case-index": (
        '_send(json.dumps({"event": "done", "case": 10**6, "status": "ok", "output": [0, 0]}))',
        "case 1000000, out of range",
    ),
    "etc-passwd": (
        '_send(json.dumps({"event": "done", "case": _proto()[1], "status": "ok", "file": "/etc/passwd", '
        '"output": [0, 0]}))',
        "'/etc/passwd' is not case-0.npy in the run's directory",
    ),
    # A FIFO where the array should be: opening it to read would wait for a writer that never comes.
    "fifo-npy": (
        '_fifo = os.path.join(os.environ["TMPDIR"], f"case-{_proto()[1]}.npy")\n    os.mkfifo(_fifo)\n    '
        '_send(json.dumps({"event": "done", "case": _proto()[1], "status": "ok", "file": _fifo, "output": [0, 0]}))',
        "case-0.npy is not a regular file",
    ),
    "start-flood": (
        'while True:\n        _send(json.dumps({"event": "start"}))\n        time.sleep(0.5)',
        "an unexpected 'start' message",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", BREAKS)
def test_protocol_break_is_that_submissions_error_and_the_batch_goes_on(cli, tmp_path, tiny_path, kind):
    forge, words = BREAKS[kind]
    write_adapters(
        tmp_path / "a-breaker", PROTO + f"\ndef run_layer_equiv(seq_ids):\n    {forge}\n    time.sleep(600)\n"
    )
    write_adapters(tmp_path / "b-honest", PASSING)
    out = tmp_path / "grades.json"
    timeout = scaled(2)  # the honest submission starts and passes within it, however busy the machine
    graded = grade_json(
        cli,
        out,
        tmp_path / "a-breaker",
        tmp_path / "b-honest",
        "--weights",
        tiny_path,
        "--stage",
        "prove-one-layer",
        "--timeout",
        timeout,
    )
    assert graded["b-honest"]["status"] == "pass"
    case = graded["a-breaker"]["results"]["stages"][0]["cases"][0]
    assert case["status"] == "error" and case["message"].startswith("the adapter's process broke the result protocol: ")
    assert words in case["message"]
    # Plain `test` too: the student's error (exit 1), never the grader's (exit 3).
    tested = cli(
        "test",
        "--course",
        tmp_path / "a-breaker",
        "--weights",
        tiny_path,
        "--stage",
        "prove-one-layer",
        "--timeout",
        timeout,
    )
    assert tested.exit_code == 1 and "broke the result protocol" in tested.stdout


def test_bytes_on_the_pipe_do_not_extend_the_deadline(cli, tmp_path, tiny_path):
    # Half a message every 0.1 s, never a newline: the grader's clock runs on regardless.
    source = (
        PROTO + "\ndef run_layer_equiv(seq_ids):\n    proto, _ = _proto()\n    while True:\n"
        "        proto.write(' ')\n        proto.flush()\n        time.sleep(0.1)\n"
    )
    write_adapters(tmp_path / "sub", source)
    out = tmp_path / "grades.json"
    timeout = scaled(1)  # the adapter is running, writing, when it ends, however long its process took to start
    graded = grade_json(
        cli, out, tmp_path / "sub", "--weights", tiny_path, "--stage", "prove-one-layer", "--timeout", timeout
    )
    cases = graded["sub"]["results"]["stages"][0]["cases"]
    assert [c["status"] for c in cases] == ["timeout"] * len(cases)
    assert cases[0]["message"] == f"timed out after {timeout:g} s while running"


@pytest.mark.slow
def test_a_forged_done_cannot_pass_a_case(cli, tmp_path, tiny_path):
    # The file the forged message names holds zeros the grader still compares with the oracle.
    source = PROTO + textwrap.dedent("""
        import numpy as np

        def run_layer_equiv(seq_ids):
            proto, index = _proto()
            out = f"{sys._getframe(1).f_locals['out_dir']}/case-{index}.npy"
            np.save(out, np.zeros((len(seq_ids), 128)))
            _send(json.dumps({"event": "done", "case": index, "status": "ok", "file": out, "output": [0, 0]}))
            time.sleep(600)
    """)
    write_adapters(tmp_path / "sub", source)
    result = cli(
        "test",
        "--course",
        tmp_path / "sub",
        "--weights",
        tiny_path,
        "--stage",
        "prove-one-layer",
        "--format",
        "json",
        "--timeout",
        "2",
    )
    stage = json.loads(result.stdout)["stages"][0]
    assert result.exit_code == 1 and stage["points"] == 0 and stage["cases"][0]["status"] == "fail"


# --- secrets ------------------------------------------------------------------------------------

SECRETS = ("GITHUB_TOKEN", "DB_PASSWD", "GOOGLE_CREDENTIALS", "X_AUTH", "GH_PAT", "HARMLESS_LOOKING")

ENV_SPY = """\
import json, os

def _names(path):
    try:
        with open(path, "rb") as f:
            return sorted({entry.split(b"=", 1)[0].decode() for entry in f.read().split(b"\\0") if entry})
    except OSError as e:
        return [f"unreadable: {e.strerror}"]

def run_layer_equiv(seq_ids):
    seen = {"os.environ": sorted(os.environ), "/proc/self/environ": _names("/proc/self/environ"),
            "parent's environ": _names(f"/proc/{os.getppid()}/environ")}
    raise RuntimeError("ENV" + json.dumps(seen))
"""


def _seen_env(message: str) -> dict:
    return json.loads(message.split("ENV", 1)[1])


def _outside_allow_list(names: list[str]) -> list[str]:
    return [
        n
        for n in names
        if n not in ENV_ALLOWED
        and not re.fullmatch(r"LC_[A-Z]+", n)
        and n != "THEINFERENCE_PROTOCOL_FD"
        and not n.startswith("unreadable")
    ]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc (Linux) and forks a zygote")
@pytest.mark.parametrize("how", ["grade", "test --untrusted", "CI=true test"])
def test_student_environment_holds_only_allow_listed_names(cli, tmp_path, tiny_path, monkeypatch, how):
    monkeypatch.setenv("THEINFERENCE_LAUNCHER", "zygote")
    for name in SECRETS:
        monkeypatch.setenv(name, "s3cr3t")
    write_adapters(tmp_path / "sub", ENV_SPY)
    common = ["--weights", tiny_path, "--stage", "prove-one-layer"]
    if how == "grade":
        document = grade_json(cli, tmp_path / "g.json", tmp_path / "sub", *common)["sub"]["results"]
    else:
        if how.startswith("CI"):
            monkeypatch.setenv("CI", "true")
        flags = ["--untrusted"] if "--untrusted" in how else []
        document = json.loads(cli("test", *flags, "--course", tmp_path / "sub", *common, "--format", "json").stdout)
    case = document["stages"][0]["cases"][0]
    seen = _seen_env(case["message"])
    assert "PATH" in seen["os.environ"] and "THEINFERENCE_WEIGHTS" in seen["os.environ"]
    for where, names in seen.items():
        assert _outside_allow_list(names) == [], where


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_plain_test_on_the_students_machine_keeps_their_environment(cli, tmp_path, tiny_path, monkeypatch):
    monkeypatch.setenv("HARMLESS_LOOKING", "mine")
    write_adapters(tmp_path / "sub", ENV_SPY)
    document = json.loads(
        cli(
            "test",
            "--course",
            tmp_path / "sub",
            "--weights",
            tiny_path,
            "--stage",
            "prove-one-layer",
            "--format",
            "json",
        ).stdout
    )
    assert "HARMLESS_LOOKING" in _seen_env(document["stages"][0]["cases"][0]["message"])["os.environ"]


def test_watch_refuses_untrusted_grading(cli, solution_course, tiny_path):
    result = cli("test", "--course", solution_course, "--weights", tiny_path, "--watch", "--untrusted")
    assert result.exit_code == 2 and "cannot be combined with untrusted grading" in result.stderr


@pytest.mark.slow
def test_the_stage_has_a_budget_that_restarts_cannot_stretch(cli, tmp_path, tiny_path):
    # Each case imports for 0.7 T and runs 0.7 T before crashing: within the T per step, but with more
    # than two cases the restarts need more than the stage's budget of T x (cases + 1). T is 2 s, scaled by the
    # machine's load so the 0.3 T margin covers the processes' start however busy the machine.
    factor = slowdown()
    timeout, nap = round(2 * factor, 1), round(1.4 * factor, 2)
    source = (
        f"import os, time\ntime.sleep({nap})\n\ndef run_layer_equiv(seq_ids):\n    time.sleep({nap})\n    os._exit(1)\n"
    )
    write_adapters(tmp_path / "sub", source)
    # Plain `test` forks student processes from the zygote (milliseconds); under `grade`'s sandbox a fresh
    # interpreter's start would eat more of the margin. The budget is the runner's, alike in both.
    graded = json.loads(
        cli(
            "test",
            "--course",
            tmp_path / "sub",
            "--weights",
            tiny_path,
            "--stage",
            "prove-one-layer",
            "--timeout",
            timeout,
            "--format",
            "json",
        ).stdout
    )
    cases = graded["stages"][0]["cases"]
    budget = timeout * (len(cases) + 1)
    assert len(cases) > 2 and cases[0]["status"] == "crash"
    assert (cases[-1]["status"], cases[-1]["message"]) == (
        "timeout",
        f"timed out: the stage's time budget of {budget:g} s ran out",
    )


def test_links_planted_in_the_run_directory_neither_overwrite_nor_leak_files(cli, tmp_path, tiny_path):
    # Case 0 replaces its own capture file and the names the next process's files will get with links
    # to files outside, then crashes: the grader must neither write through the links nor read them back.
    target, secret = tmp_path / "target.txt", tmp_path / "secret.txt"
    target.write_text("intact")
    secret.write_text("TOP-SECRET")
    source = f"""
import os, sys

def run_layer_equiv(seq_ids):
    work = os.path.dirname(os.path.abspath(sys.argv[-1]))
    if len(seq_ids) == 1:
        print("planting")
        sys.stdout.flush()
        os.unlink(os.path.join(work, "stdout-0.txt"))
        os.symlink({str(secret)!r}, os.path.join(work, "stdout-0.txt"))
        for name in ("stdout-1.txt", "stderr-1.txt", "job-1.json"):
            os.symlink({str(target)!r}, os.path.join(work, name))
        os._exit(1)
    print("second process")
    return [[0.0]]
"""
    write_adapters(tmp_path / "sub", source)
    document = json.loads(
        cli(
            "test",
            "--course",
            tmp_path / "sub",
            "--weights",
            tiny_path,
            "--stage",
            "prove-one-layer",
            "--format",
            "json",
        ).stdout
    )
    cases = document["stages"][0]["cases"]
    assert target.read_text() == "intact"
    assert cases[0]["status"] == "crash" and "TOP-SECRET" not in json.dumps(document)
    assert "second process" in cases[1]["stdout"]  # the next process ran, with capture files of its own
