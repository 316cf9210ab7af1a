"""grading/drive/progress.py: which stages a course has passed, kept in .theinference/progress.json."""

import json
import os

import pytest

from theinference.bundled import data_dir
from theinference.grading.drive.progress import (
    PROGRESS_FILE,
    describe_entry,
    load_progress,
    next_stage,
    read_progress,
    record_progress,
    stage_weights_name,
    weights_name,
)
from theinference.grading.judge.results import Status
from theinference.grading.spec.checks import ScalingCheck, ScalingSpec
from theinference.model.synth import PRESETS

from .builders import SCALING, case, run, scaling, stage, stage_spec


def test_no_file_is_no_progress_and_no_problem(tmp_path):
    assert read_progress(tmp_path) == ({}, "")


def test_a_run_is_recorded_and_read_back(tmp_path):
    result = run([stage("forward"), stage("greedy", Status.FAIL, [case(status=Status.FAIL)])])
    progress, notice = record_progress(tmp_path, result, timeout=5.0)
    assert notice == ""
    assert load_progress(tmp_path) == progress
    assert {k: (v["status"], v["weights"], v["timeout"]) for k, v in progress.items()} == {
        "forward": ("pass", "tiny", 5.0),
        "greedy": ("fail", "tiny", 5.0),
    }
    doc = json.loads((tmp_path / PROGRESS_FILE).read_text())
    assert doc["format_version"] == 1 and set(doc["stages"]) == {"forward", "greedy"}


def test_a_later_run_keeps_the_other_stages(tmp_path):
    record_progress(tmp_path, run([stage("forward")]))
    progress, _ = record_progress(tmp_path, run([stage("greedy", Status.FAIL, [case(status=Status.FAIL)])]))
    assert {k: v["status"] for k, v in progress.items()} == {"forward": "pass", "greedy": "fail"}


@pytest.mark.parametrize(
    "content, why",
    [
        ("{not json", "not readable JSON"),
        ("[1, 2]", "no 'stages' object in it"),
        ('{"stages": {"forward": "pass"}}', "entry 'forward' is not a {\"status\": ...} object"),
        ('{"stages": {"forward": {"status": 1}}}', "entry 'forward' is not a {\"status\": ...} object"),
        (b"\xff\xfe", "not readable JSON"),
    ],
)
def test_a_corrupt_file_is_ignored_with_why_and_written_anew(tmp_path, content, why):
    path = tmp_path / PROGRESS_FILE
    path.parent.mkdir()
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    stages, problem = read_progress(tmp_path)
    assert stages == {} and problem.startswith(why)
    progress, notice = record_progress(tmp_path, run([stage("forward")]))
    assert notice.startswith(f"notice: ignored {PROGRESS_FILE} ({why}") and notice.endswith("and wrote it anew")
    assert read_progress(tmp_path) == (progress, "")


def test_the_bundled_course_keeps_no_progress():
    solution = data_dir("course") / "solution"
    progress, notice = record_progress(solution, run([stage("forward")]))
    assert progress["forward"]["status"] == "pass"  # this run's, told though not kept
    assert notice.startswith(f"progress not kept: {solution} belongs to the course bundled with theinference")
    assert not (solution / PROGRESS_FILE).exists()
    assert read_progress(solution) == ({}, "")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes anywhere")
def test_a_course_that_cannot_be_written_says_why(tmp_path):
    tmp_path.chmod(0o500)
    try:
        progress, notice = record_progress(tmp_path, run([stage("forward")]))
    finally:
        tmp_path.chmod(0o700)
    assert progress and notice.startswith(f"progress not kept: cannot write {tmp_path / PROGRESS_FILE}")


def test_a_course_whose_progress_path_is_blocked_says_why(tmp_path):
    """Even as root: .theinference is a file, so nothing can be written under it."""
    (tmp_path / ".theinference").write_text("")
    progress, notice = record_progress(tmp_path, run([stage("forward")]))
    assert progress["forward"]["status"] == "pass"
    assert notice.startswith(f"progress not kept: cannot write {tmp_path / PROGRESS_FILE}")


def test_weights_names():
    assert weights_name(run()) == "tiny"
    assert weights_name(run(synthetic=None, config=PRESETS["gpt2"].as_dict())) == "gpt2"
    assert weights_name(run(synthetic=None, config={"n_layer": 6, "n_embd": 512})) == "6-layer, 512-wide"


def test_cache_scaling_is_recorded_on_its_own_preset():
    result = run(synthetic=None, config=PRESETS["gpt2"].as_dict())
    assert stage_weights_name(result, stage("cache-scaling", check=SCALING)) == "proof"
    graded = ScalingCheck(1e-4, ScalingSpec(lengths=(8, 480), repeats=3, max_ratio=2.0, weights="graded"))
    on_graded = stage("cache-scaling", check=graded, cases=[case(scaling=scaling())])
    assert stage_weights_name(result, on_graded) == "gpt2"
    moved = stage("cache-scaling", check=graded, cases=[case(scaling=scaling(weights_note="the graded weights..."))])
    assert stage_weights_name(result, moved) == "proof"


@pytest.mark.parametrize(
    "entry, text",
    [
        ({"status": "pass"}, "pass"),  # written before weights were recorded
        ({"status": "pass", "weights": "tiny", "timeout": None}, "pass (tiny weights)"),
        ({"status": "fail", "weights": "gpt2", "timeout": 5.0}, "fail (gpt2 weights, --timeout 5)"),
        ({"status": "pass", "weights": "tiny", "timeout": 2.5}, "pass (tiny weights, --timeout 2.5)"),
        ({"status": "pass", "timeout": 10**400}, f"pass (--timeout {10**400})"),  # an int too large for a float
        ({"status": "pass", "weights": 3, "timeout": "soon"}, "pass"),  # wrong types are left out
        ({"status": "pass", "timeout": True}, "pass"),  # a boolean is not a number of seconds
    ],
)
def test_describe_entry(entry, text):
    assert describe_entry(entry) == text


def test_next_stage_is_the_first_not_passed_in_course_order():
    stages = [stage_spec("forward"), stage_spec("greedy"), stage_spec("cache-scaling")]
    assert next_stage(stages, {}).id == "forward"
    assert next_stage(stages, {"forward": {"status": "pass"}, "greedy": {"status": "fail"}}).id == "greedy"
    assert next_stage(stages, {s.id: {"status": "pass"} for s in stages}) is None
