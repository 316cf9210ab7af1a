"""A student's first hour: init, progress from stage to stage, and the demo."""

import json
import shutil

import pytest

from theinference.bundled import data_dir
from theinference.grading.drive.advice import next_stage_line
from theinference.grading.drive.progress import read_progress
from theinference.grading.spec.stages import load_stages

ALL_STAGES = tuple(s.id for s in load_stages([data_dir("stages")]))


@pytest.mark.slow
def test_init_then_everything_is_not_started_then_the_solution_passes(cli, tmp_path, tiny_path):
    course = tmp_path / "my-course"
    result = cli("init", course)
    assert result.exit_code == 0
    assert (course / "tests" / "adapters.py").is_file() and (course / "theinference.toml").is_file()
    assert f"cd {course}" in result.stdout and f"theinference stages show {ALL_STAGES[0]}" in result.stdout

    graded = cli("test", "--all", "--course", course, "--weights", tiny_path, "--format", "json")
    doc = json.loads(graded.stdout)
    assert graded.exit_code == 1
    assert [s["status"] for s in doc["stages"]] == ["not-started"] * len(ALL_STAGES)
    assert [s["id"] for s in doc["stages"]] == list(ALL_STAGES)

    for part in ("src", "tests"):
        shutil.copytree(data_dir("course") / "solution" / part, course / part, dirs_exist_ok=True)
    # The reference solution passes every stage (the suite's one whole run of it in plain `test`).
    solved = cli("test", "--all", "--course", course, "--weights", tiny_path)
    assert solved.exit_code == 0, solved.stdout
    assert all(f"✔ {stage}" in solved.stdout for stage in ALL_STAGES), solved.stdout
    points = sum(s.points for s in load_stages([data_dir("stages")]))
    assert f"{len(ALL_STAGES)} of {len(ALL_STAGES)} stage(s) passed · {points:g}/{points:g} points" in solved.stdout
    assert f"weights: {tiny_path}" in solved.stdout and "given with --weights" in solved.stdout
    assert "next stage" not in solved.stdout
    # Passed on tiny weights: the footer says so, and what is left to certify on the full-size ones.
    left = [s for s in ALL_STAGES if s != "cache-scaling"]  # cache-scaling ran on its own (proof) weights
    assert (
        f"all {len(ALL_STAGES)} stages have passed, {len(left)} only on tiny weights ({', '.join(left)};"
        in " ".join(solved.stdout.split())
    )
    assert "`theinference test --all --weights gpt2`" in solved.stdout
    assert "the course is complete" not in solved.stdout


def test_init_names_the_first_stage_and_its_toml_chooses_the_tiny_preset(cli, tmp_path, monkeypatch):
    course = tmp_path / "my-course"
    result = cli("init", course)
    first = ALL_STAGES[0]
    assert f"theinference stages show {first}" in result.stdout and "tiny" in result.stdout
    monkeypatch.chdir(course)
    which = cli("weights")  # what `test` would grade on here, made or not
    assert which.exit_code == 0
    assert "weights = 'tiny', the synthetic tiny preset" in which.stdout and "not made yet" in which.stdout
    assert "synthetic-tiny-seed0" in which.stdout
    # --weights still wins over the course's choice.
    assert "synthetic-gpt2-seed0" in cli("weights", "--weights", "gpt2").stdout


def test_a_longer_path_ending_in_a_presets_name_is_a_path(cli, tmp_path, monkeypatch):
    # `weights = "tiny"` alone is the preset; `models/tiny` names a file the course does not have.
    course = tmp_path / "my-course"
    assert cli("init", course).exit_code == 0
    toml = course / "theinference.toml"
    toml.write_text(toml.read_text().replace('weights = "tiny"', 'weights = "models/tiny"'))
    monkeypatch.chdir(course)
    which = cli("weights")
    assert which.exit_code == 2 and f"{course / 'models' / 'tiny'}: no such weights file" in which.stderr
    graded = cli("test", "--stage", ALL_STAGES[0])
    assert graded.exit_code == 2 and "no such weights file" in graded.stderr and "synthetic" not in graded.output


def test_init_refuses_a_non_empty_directory_without_force(cli, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    refused = cli("init", tmp_path / "taken")
    assert refused.exit_code == 2 and "not empty" in refused.stderr
    assert not (tmp_path / "taken" / "src").exists()
    assert cli("init", tmp_path / "taken", "--force").exit_code == 0
    assert (tmp_path / "taken" / "src" / "kvcache.py").is_file()
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


@pytest.mark.slow
def test_plain_test_moves_on_to_the_next_stage(cli, tmp_path, tiny_path):
    course = tmp_path / "course"
    cli("init", course)
    # Solve only the first stage: copy the solution's code, but keep the starter's later stubs failing.
    shutil.copytree(data_dir("course") / "solution" / "src", course / "src", dirs_exist_ok=True)
    adapters = course / "tests" / "adapters.py"
    text = adapters.read_text()
    adapters.write_text(
        text.replace(
            "    return layer_attn_incremental(params, seq_ids, n_head)",
            "    raise NotImplementedError('run_layer_equiv')",
        )
    )
    for solved in ALL_STAGES[: ALL_STAGES.index("prove-one-layer")]:
        first = cli("test", "--course", course, "--weights", tiny_path)
        assert first.exit_code == 0 and f"✔ {solved}" in first.stdout
        assert f"grading {solved}, the first stage not yet passed" in first.stderr
    second = cli("test", "--course", course, "--weights", tiny_path)
    assert second.exit_code == 1 and "prove-one-layer" in second.stdout and "single-step" not in second.stdout
    listing = cli("stages", "list", "--course", course)
    rows = {
        line.split()[0]: line for line in listing.stdout.splitlines() if line.strip() and line.split()[0] in ALL_STAGES
    }
    assert "pass" in rows["single-step-attention"]
    assert "not-started" in rows["prove-one-layer"] and "◀ next" in rows["prove-one-layer"]


@pytest.mark.parametrize(
    "content, why",
    [
        ('{"stages": ["pass"]}', "no 'stages' object"),
        ("{not json", "not readable JSON"),
        ("[1, 2]", "no 'stages' object"),
        ('{"stages": {"greedy": "pass"}}', "entry 'greedy'"),
    ],
)
def test_a_corrupt_progress_file_is_read_as_none_and_says_why(tmp_path, content, why):
    progress = tmp_path / ".theinference" / "progress.json"
    progress.parent.mkdir()
    progress.write_text(content)
    assert read_progress(tmp_path)[0] == {} and why in read_progress(tmp_path)[1]


@pytest.mark.slow
def test_corrupt_progress_file_is_ignored_with_a_notice_and_rewritten(cli, solution_course, tiny_path):
    """Whatever is wrong with it (test_a_corrupt_progress_file_is_read_as_none_and_says_why), a run says so and
    writes the file anew."""
    content, why = '{"stages": {"greedy": "pass"}}', "entry 'greedy'"
    progress = solution_course / ".theinference" / "progress.json"
    progress.parent.mkdir()
    progress.write_text(content)
    result = cli("test", "--course", solution_course, "--weights", tiny_path)
    assert result.exit_code == 0, result.output
    assert f"✔ {ALL_STAGES[0]}" in result.stdout
    [notice] = [line for line in result.stderr.splitlines() if "progress.json" in line]
    assert notice.startswith("notice: ignored") and why in notice and "wrote it anew" in notice
    assert json.loads(progress.read_text())["stages"][ALL_STAGES[0]]["status"] == "pass"


@pytest.mark.slow
def test_demo_shows_a_pass_and_a_named_diagnosis(cli, tiny_path):
    result = cli("demo", "--weights", tiny_path)
    assert result.exit_code == 0, result.stdout
    shown = [s for s in ALL_STAGES if s != "cache-scaling"]  # the slowest on tiny weights: left out, and said so
    assert f"{len(shown)} of {len(shown)} stage(s) passed" in result.stdout
    assert all(f"✔ {stage}" in result.stdout for stage in shown) and "✔ cache-scaling" not in result.stdout
    assert "(cache-scaling, the proof of the cache by its CPU cost, is left out here" in result.stdout
    assert (
        "shape: error-grows" in result.stdout and "finding: position-zero — your output equals GPT-2" in result.stdout
    )


@pytest.mark.slow
def test_progress_records_the_weights_and_timeout_of_each_pass_and_stages_list_shows_them(
    cli, solution_course, tiny_path
):
    first, second = ALL_STAGES[:2]
    assert cli("test", "--course", solution_course, "--weights", tiny_path).exit_code == 0
    assert cli("test", "--course", solution_course, "--weights", tiny_path, "--timeout", "30").exit_code == 0
    entries = json.loads((solution_course / ".theinference" / "progress.json").read_text())["stages"]
    assert entries[first]["weights"] == "tiny" and entries[first]["timeout"] is None
    assert entries[second]["weights"] == "tiny" and entries[second]["timeout"] == 30
    listing = cli("stages", "list", "--course", solution_course).stdout
    rows = {line.split()[0]: line for line in listing.splitlines() if line.strip() and line.split()[0] in ALL_STAGES}
    assert "pass (tiny weights)" in rows[first] and "--timeout" not in rows[first]
    assert "pass (tiny weights, --timeout 30)" in rows[second]


def test_progress_written_before_weights_were_recorded_still_reads(cli, solution_course):
    progress = solution_course / ".theinference" / "progress.json"
    progress.parent.mkdir()
    progress.write_text(
        json.dumps({"format_version": 1, "stages": {ALL_STAGES[0]: {"status": "pass", "at": "2026-01-01T00:00:00"}}})
    )
    listing = cli("stages", "list", "--course", solution_course)
    assert listing.exit_code == 0
    [row] = [line for line in listing.stdout.splitlines() if line.split() and line.split()[0] == ALL_STAGES[0]]
    assert "pass" in row and "weights" not in row
    assert (
        "◀ next"
        in [line for line in listing.stdout.splitlines() if line.split() and line.split()[0] == ALL_STAGES[1]][0]
    )


def test_stages_list_shows_a_hostile_progress_entry_as_text(cli, solution_course):
    progress = solution_course / ".theinference" / "progress.json"
    progress.parent.mkdir()
    entry = {"status": "pass\x1b[2J", "at": 5, "weights": "[bold]tiny[/bold]\x1b]0;title\x07", "timeout": "soon"}
    huge = {"status": "pass", "timeout": 10**400}  # JSON's integers have no limit; a float's do
    progress.write_text(json.dumps({"format_version": 1, "stages": {ALL_STAGES[0]: entry, ALL_STAGES[1]: huge}}))
    listing = cli("stages", "list", "--course", solution_course)
    assert listing.exit_code == 0
    assert "\x1b" not in listing.stdout and "\x07" not in listing.stdout
    assert "[bold]tiny[/bold]" in listing.stdout


def test_the_course_is_complete_only_once_certified_on_full_size_weights():
    stages = load_stages([data_dir("stages")])
    on = lambda weights: {s.id: {"status": "pass", "weights": weights} for s in stages}  # noqa: E731
    assert "the course is complete" in next_stage_line(stages, on("gpt2"))
    tiny = next_stage_line(stages, on("tiny"))
    assert "complete" not in tiny and "on tiny weights" in tiny and "--weights gpt2" in tiny
    # cache-scaling runs on its own weights (the proof preset): it is not left to certify, and the line says why.
    left = [s.id for s in stages if s.id != "cache-scaling"]
    assert f"{len(left)} only on tiny weights ({', '.join(left)}; cache-scaling runs on its own weights" in tiny
    mixed = {**on("gpt2"), stages[0].id: {"status": "pass", "weights": "tiny"}}
    assert f"1 only on tiny weights ({stages[0].id}; cache-scaling" in next_stage_line(stages, mixed)
    # Only cache-scaling passed on tiny weights: nothing is left to certify.
    assert "the course is complete" in next_stage_line(stages, {**on("gpt2"), "cache-scaling": on("tiny")["forward"]})
