"""A solution whose arrays come back float64 (a NumPy float64 scalar promoting float32 under NumPy 2) is told so
from the first stage it grades, once per run, with the usual cause: a note, not a failure."""

import json
import shutil

import numpy as np
import pytest

from theinference.bundled import data_dir
from theinference.grading.judge.compare import promoted

# The attention scale as a NumPy float64 scalar: every activation after the first attention is float64.
SCALE = "math.sqrt(q.shape[-1])"
PROMOTING = "np.float64(math.sqrt(q.shape[-1]))"


@pytest.fixture
def promoting_course(tmp_path):
    course = tmp_path / "promoting"
    shutil.copytree(data_dir("course") / "solution", course)
    source = course / "src" / "gpt2.py"
    text = source.read_text()
    assert text.count(SCALE) == 1, "the solution's attention scale moved: update SCALE"
    source.write_text(text.replace(SCALE, PROMOTING))
    return course


def test_promoted_is_float64_where_the_oracle_is_float32():
    expected = np.zeros(3, np.float32)
    assert promoted(expected, np.zeros(3, np.float64))
    assert not promoted(expected, np.zeros(3, np.float32))
    assert not promoted(np.zeros(3, np.float64), np.zeros(3, np.float64))  # an oracle in float64 says nothing


@pytest.mark.slow
def test_a_promoting_solution_passes_forward_with_the_float64_note_said_once(cli, promoting_course, tiny_path):
    args = ("test", "--course", promoting_course, "--weights", tiny_path)
    result = cli(*args, "--stage", "forward", "--stage", "prove-one-layer")
    assert result.exit_code == 0, result.output  # the numbers are right: a note, not a failure
    text = " ".join(result.stdout.split())
    assert text.count("returned float64 arrays") == 1, result.stdout  # once in the run, though both stages show it
    assert "run_forward() returned float64 arrays (all " in text  # said at the first stage, forward
    assert "`1.0 / np.sqrt(d)`" in text and "`x.astype(np.float32)`" in text and "not a failure" in text
    doc = json.loads(cli(*args, "--stage", "forward", "--format", "json").stdout)
    [forward] = doc["stages"]
    assert forward["status"] == "pass" and forward["float64_cases"] == [c["name"] for c in forward["cases"]]


@pytest.mark.slow
def test_the_reference_solution_gets_no_float64_note(solution_run):
    result = solution_run("--stage", "forward")
    assert result.exit_code == 0 and "float64" not in result.stdout
    doc = json.loads(solution_run("--stage", "forward", "--format", "json").stdout)
    assert doc["stages"][0]["float64_cases"] == []
