"""CI output formats on a passing and a failing course: JUnit, Gradescope, GitHub, JSON."""

import json
import xml.etree.ElementTree as ET

import pytest
from markdown_it import MarkdownIt

from conftest import write_adapters

FAILING = """\
import numpy as np
from src.gpt2 import load_weights
from src.kvcache import layer_attn_incremental
import theinference

def run_layer_equiv(seq_ids):
    params, n_head = load_weights(theinference.weights_path())
    return layer_attn_incremental(params, seq_ids, n_head) + 0.5

def run_per_step_logits(prompt_ids, cont_ids):
    raise NotImplementedError

def run_greedy(prompt_ids, n_new):
    raise RuntimeError("boom")
"""


@pytest.fixture
def courses(solution_course, tmp_path):
    failing = tmp_path / "failing"
    write_adapters(failing, FAILING)
    return {"passing": solution_course, "failing": failing}


CORE = ["--stage", "prove-one-layer", "--stage", "per-step-identity", "--stage", "greedy"]


def run(cli, course, tiny_path, fmt, *extra):
    stages = [] if "--stage" in extra else CORE
    result = cli("test", "--course", course, "--weights", tiny_path, "--format", fmt, *stages, *extra)
    return result.exit_code, result.stdout


def test_junit_counts(cli, courses, tiny_path):
    code, text = run(cli, courses["passing"], tiny_path, "junit")
    root = ET.fromstring(text)
    assert code == 0
    assert (root.get("tests"), root.get("failures"), root.get("errors"), root.get("points")) == (
        "12",
        "0",
        "0",
        "40/40",
    )
    assert [s.get("name") for s in root.iter("testsuite")] == ["prove-one-layer", "per-step-identity", "greedy"]

    code, text = run(cli, courses["failing"], tiny_path, "junit")
    root = ET.fromstring(text)
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert code == 1
    assert (suites["prove-one-layer"].get("failures"), suites["prove-one-layer"].get("errors")) == ("4", "0")
    assert (suites["per-step-identity"].get("failures"), suites["greedy"].get("errors")) == ("4", "4")
    failure = suites["prove-one-layer"].find("testcase[@name='sentence']/failure")
    assert failure.get("type") == "fail" and "every row is off" in failure.get("message")
    assert "rows outside atol=0.0001 rtol=0.001" in failure.text
    assert suites["greedy"].find("testcase/error").get("type") == "error"
    assert root.get("points") == "0/40"


@pytest.mark.slow
def test_gradescope_scores(cli, courses, tiny_path, tmp_path):
    out = tmp_path / "results.json"
    code, _ = run(cli, courses["passing"], tiny_path, "gradescope", "--output", out)
    doc = json.loads(out.read_text())
    assert code == 0 and doc["score"] == 40 and doc["extra_data"]["max_score"] == 40
    assert set(doc) <= GRADESCOPE_KEYS
    assert isinstance(doc["execution_time"], float)
    for test in doc["tests"]:
        assert set(test) >= {"name", "score", "max_score", "status", "output", "visibility"}
        assert test["status"] == "passed" and test["score"] == test["max_score"]

    code, text = run(cli, courses["failing"], tiny_path, "gradescope")
    doc = json.loads(text)
    assert code == 1 and doc["score"] == 0
    assert [t["status"] for t in doc["tests"]] == ["failed", "failed", "failed"]
    assert "shape: all-rows-off" in doc["tests"][0]["output"]


def test_per_case_credit_gives_partial_points(cli, courses, tiny_path, tmp_path):
    stages = tmp_path / "stages"
    stages.mkdir()
    from theinference.bundled import data_dir

    text = (data_dir("stages") / "prove-one-layer.toml").read_text()
    text = text.replace('id = "prove-one-layer"', 'id = "partial-layer"').replace(
        "points = 10", 'points = 8\ncredit = "per-case"'
    )
    (stages / "partial.toml").write_text(text.replace('lesson = "../course', 'lesson = "../../course'))
    adapters = courses["passing"] / "tests" / "adapters.py"
    adapters.write_text(
        adapters.read_text().replace(
            "    return layer_attn_incremental(params, seq_ids, n_head)",
            "    out = layer_attn_incremental(params, seq_ids, n_head)\n    return out if len(seq_ids) > 9 else out + 1",
        )
    )
    code, text = run(
        cli, courses["passing"], tiny_path, "gradescope", "--stages-dir", stages, "--stage", "partial-layer"
    )
    doc = json.loads(text)
    assert code == 1
    assert doc["tests"][0]["score"] == 4.0  # 2 of 4 cases (10 and 55 tokens) pass: half of 8 points


def test_github_annotations_point_at_the_adapter_or_the_raising_line(cli, courses, tiny_path, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(courses["failing"]))
    code, text = run(cli, courses["failing"], tiny_path, "github")
    assert code == 1
    errors = [line for line in text.splitlines() if line.startswith("::error ")]
    assert len(errors) == 3
    assert errors[0].startswith("::error file=tests/adapters.py,line=6,title=theinference prove-one-layer%3A fail::")
    assert "line=14" in errors[2]  # raise RuntimeError("boom"): the traceback's line, not def run_greedy's
    # Four cases raise the same error: it is told once.
    assert errors[2].count('raise RuntimeError("boom")') == 1 and "same error in 3 more cases" in errors[2]
    assert "::notice title=theinference::0 of 3 stages passed, 0/40 points" in text
    md = summary.read_text()
    assert "## theinference: 0/40 points" in md and "| `greedy` | ❌ error | 0/4 | 0/10 |" in md


def test_json_records_the_seed_and_random_cases(cli, courses, tiny_path):
    code, text = run(cli, courses["passing"], tiny_path, "json", "--seed", "11", "--stage", "prove-one-layer")
    doc = json.loads(text)
    assert code == 0 and doc["seed"] == 11
    names = [c["name"] for c in doc["stages"][0]["cases"]]
    assert names[-2:] == ["random-1", "random-2"]
    again = json.loads(run(cli, courses["passing"], tiny_path, "json", "--seed", "11", "--stage", "prove-one-layer")[1])
    assert again["stages"][0]["cases"][-1]["inputs"] == doc["stages"][0]["cases"][-1]["inputs"]
    chosen = json.loads(
        run(cli, courses["passing"], tiny_path, "json", "--seed", "random", "--stage", "prove-one-layer")[1]
    )
    assert isinstance(chosen["seed"], int)
    bad = cli("test", "--course", courses["passing"], "--weights", tiny_path, "--seed", "lots")
    assert bad.exit_code == 2 and "--seed takes an integer or 'random'" in bad.stderr


def test_hard_coded_answers_fail_the_random_cases(cli, courses, tiny_path, tmp_path):
    from theinference.grading.tools.export import oracle_arrays
    from theinference.grading.spec.stages import load_stages, stage_dirs
    from theinference.model.weights import load_model

    stage = next(s for s in load_stages(stage_dirs(None)) if s.id == "prove-one-layer")
    arrays = oracle_arrays(stage, load_model(tiny_path), list(stage.cases))
    table = {tuple(arrays[f"{c.name}.seq"].tolist()): arrays[f"{c.name}.expected"].tolist() for c in stage.cases}
    write_adapters(
        tmp_path / "cheat", f"TABLE = {table!r}\n\ndef run_layer_equiv(seq_ids):\n    return TABLE[tuple(seq_ids)]\n"
    )
    code, text = run(cli, tmp_path / "cheat", tiny_path, "json", "--stage", "prove-one-layer")
    assert code == 0, [(c["name"], c["message"]) for c in json.loads(text)["stages"][0]["cases"]]
    code, text = run(cli, tmp_path / "cheat", tiny_path, "json", "--stage", "prove-one-layer", "--seed", "3")
    cases = json.loads(text)["stages"][0]["cases"]
    assert code == 1 and [c["status"] for c in cases[-2:]] == ["error", "error"]


# Raises text meant to clear the screen, break out of the summary's code block and forge a heading.
HOSTILE_IMPL = """\
import sys


def run_layer_equiv(seq_ids):
    print("\\x1b[2J\\x1b[Hall clear")
    raise ValueError("\\x1b[2J\\n```\\n## ✅ 55/55 points\\n```` 100% \\r")
"""


@pytest.fixture
def hostile(tmp_path):
    course = tmp_path / "hostile"
    write_adapters(course, "from mylib.impl import run_layer_equiv\n")
    (course / "mylib").mkdir()
    (course / "mylib" / "impl.py").write_text(HOSTILE_IMPL)
    return course


def test_student_text_cannot_drive_the_terminal(cli, hostile, tiny_path):
    for fmt in ("rich", "junit"):
        code, text = run(cli, hostile, tiny_path, fmt, "--stage", "prove-one-layer")
        assert code == 1
        assert "\x1b" not in text and "\r" not in text
        assert "\\x1b[2J" in text


def test_github_output_escapes_student_text_and_points_at_the_raising_line(
    cli, hostile, tiny_path, tmp_path, monkeypatch
):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(hostile))
    code, text = run(cli, hostile, tiny_path, "github", "--stage", "prove-one-layer")
    error = next(line for line in text.splitlines() if line.startswith("::error "))
    assert error.startswith("::error file=mylib/impl.py,line=6,title=")  # the raise, in the module the adapters import
    assert "\\x1b[2J%0A```" in error and "100%25" in error and "\r" not in error
    tokens = MarkdownIt().parse(summary.read_text())
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert not [h for h in headings if "55/55" in h], headings
    assert any("## ✅ 55/55 points" in t.content for t in tokens if t.type == "fence")


RAISES_IN_SRC = """\
from src.kvcache import check_ids

def run_layer_equiv(seq_ids):
    return check_ids(seq_ids)
"""
# A forged frame in the message names a file outside the course: it must not become the annotation.
CHECK_IDS = """

def check_ids(seq_ids):
    raise ValueError('ids rejected\\n  File "/etc/passwd", line 1, in forged')
"""


@pytest.fixture
def raises_in_src(tmp_path):
    course = tmp_path / "raises"
    write_adapters(course, RAISES_IN_SRC)
    source = course / "src" / "kvcache.py"
    line = len((source.read_text() + CHECK_IDS).splitlines())  # the raise is the last line
    source.write_text(source.read_text() + CHECK_IDS)
    return course, line


def test_annotations_point_at_the_students_line_in_src(cli, raises_in_src, tiny_path, monkeypatch):
    course, line = raises_in_src
    monkeypatch.setenv("GITHUB_WORKSPACE", str(course))
    code, text = run(cli, course, tiny_path, "github", "--stage", "prove-one-layer")
    error = next(line for line in text.splitlines() if line.startswith("::error "))
    assert code == 1 and error.startswith(f"::error file=src/kvcache.py,line={line},title=")
    code, text = run(cli, course, tiny_path, "gradescope", "--stage", "prove-one-layer")
    output = json.loads(text)["tests"][0]["output"]
    assert f"at src/kvcache.py:{line}" in output
    assert output.count("raise ValueError") == 1 and "same error in 3 more cases" in output
    code, text = run(cli, course, tiny_path, "json", "--stage", "prove-one-layer")
    assert json.loads(text)["stages"][0]["cases"][0]["at"] == {"file": "src/kvcache.py", "line": line}


# The top-level keys of Gradescope's documented results.json ("Autograder Specifications", Output format).
GRADESCOPE_KEYS = {
    "score",
    "execution_time",
    "output",
    "output_format",
    "test_output_format",
    "test_name_format",
    "visibility",
    "stdout_visibility",
    "extra_data",
    "tests",
    "leaderboard",
}


def test_an_ungraded_results_json_keeps_to_gradescopes_keys():
    from theinference.bundled import data_dir
    from theinference.grading.spec.stages import load_stages
    from theinference.report.gradescope import render_gradescope_ungraded

    stages = load_stages([data_dir("stages")])
    doc = json.loads(render_gradescope_ungraded(stages, "adapters file not found", "0.1.0"))
    assert set(doc) <= GRADESCOPE_KEYS and doc["score"] == 0
    assert doc["extra_data"]["max_score"] == sum(s.points for s in stages) == sum(t["max_score"] for t in doc["tests"])
