"""A student's first hour: init, progress from stage to stage, and the demo."""

import json
import shutil

from theinference.resources import data_dir

ALL_STAGES = ("single-step-attention", "prove-one-layer", "decode-step", "per-step-identity", "greedy")


def test_init_then_everything_is_not_started_then_the_solution_passes(cli, tmp_path, tiny_path):
    course = tmp_path / "my-course"
    result = cli("init", course)
    assert result.exit_code == 0
    assert (course / "tests" / "adapters.py").is_file() and (course / "theinference.toml").is_file()
    assert f"cd {course} && theinference" in result.stdout

    graded = cli("test", "--all", "--course", course, "--weights", tiny_path, "--format", "json")
    doc = json.loads(graded.stdout)
    assert graded.exit_code == 1
    assert [s["status"] for s in doc["stages"]] == ["not-started"] * 5
    assert [s["id"] for s in doc["stages"]] == list(ALL_STAGES)

    for part in ("src", "tests"):
        shutil.copytree(data_dir("course") / "solution" / part, course / part, dirs_exist_ok=True)
    solved = cli("test", "--all", "--course", course, "--weights", tiny_path)
    assert solved.exit_code == 0, solved.stdout
    assert "5 of 5 stage(s) passed" in solved.stdout


def test_init_refuses_a_non_empty_directory_without_force(cli, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    refused = cli("init", tmp_path / "taken")
    assert refused.exit_code == 2 and "not empty" in refused.stderr
    assert not (tmp_path / "taken" / "src").exists()
    assert cli("init", tmp_path / "taken", "--force").exit_code == 0
    assert (tmp_path / "taken" / "src" / "kvcache.py").is_file()
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_plain_test_moves_on_to_the_next_stage(cli, tmp_path, tiny_path):
    course = tmp_path / "course"
    cli("init", course)
    # Solve only the first stage: copy the solution's code, but keep the starter's later stubs failing.
    shutil.copytree(data_dir("course") / "solution" / "src", course / "src", dirs_exist_ok=True)
    adapters = course / "tests" / "adapters.py"
    text = adapters.read_text()
    adapters.write_text(text.replace("    return layer_attn_incremental(params, seq_ids, n_head)",
                                     "    raise NotImplementedError('run_layer_equiv')"))
    first = cli("test", "--course", course, "--weights", tiny_path)
    assert first.exit_code == 0 and "✔ single-step-attention" in first.stdout
    assert "grading single-step-attention, the first stage not yet passed" in first.stderr
    second = cli("test", "--course", course, "--weights", tiny_path)
    assert second.exit_code == 1 and "prove-one-layer" in second.stdout and "single-step" not in second.stdout
    listing = cli("stages", "list", "--course", course)
    rows = {line.split()[0]: line for line in listing.stdout.splitlines() if line.strip() and line.split()[0] in ALL_STAGES}
    assert "pass" in rows["single-step-attention"]
    assert "not-started" in rows["prove-one-layer"] and "◀ next" in rows["prove-one-layer"]


def test_demo_shows_a_pass_and_a_named_diagnosis(cli, tiny_path):
    result = cli("demo", "--weights", tiny_path)
    assert result.exit_code == 0, result.stdout
    assert "5 of 5 stage(s) passed" in result.stdout
    assert "shape: error-grows" in result.stdout and "hint: Only the first position matches" in result.stdout
