"""The CLI end to end: the reference solution passes, reports and exit codes are right."""

import json
import shutil

import pytest
from safetensors.numpy import load_file

from theinference.model import weights_choice as sources
from theinference.bundled import data_dir
from theinference.grading.spec.stages import load_stages
from theinference.model.synth import SYNTH_VERSION


# One grading of the solution's prove-one-layer as a JSON document written with --output, shared (solution_run).
JSON_DOCUMENT = ("--stage", "prove-one-layer", "--format", "json", "--output", "results.json")


def test_json_document(solution_run, tiny_path):
    result = solution_run(*JSON_DOCUMENT)
    assert result.exit_code == 0
    doc = json.loads((result.root / "results.json").read_text())
    assert (doc["schema"], doc["schema_version"], doc["status"]) == ("theinference.results", 1, "pass")
    assert doc["weights"]["path"] == str(tiny_path) and doc["weights"]["synthetic"] == "tiny preset, seed 0"
    [stage] = doc["stages"]
    assert (stage["id"], stage["status"], stage["points"], stage["max_points"]) == ("prove-one-layer", "pass", 10, 10)
    case = stage["cases"][2]
    assert case["name"] == "long-paragraph" and len(case["rows"]) == len(case["inputs"]["seq"]) >= 48
    assert all(row["ok"] and row["max_abs"] < 1e-4 for row in case["rows"])


def test_stage_is_found_from_a_subdirectory_of_the_course(cli, solution_course, tiny_path, monkeypatch):
    monkeypatch.chdir(solution_course / "src")
    result = cli("test", "--stage", "prove-one-layer", "--weights", tiny_path)
    assert result.exit_code == 0
    assert f"grading {solution_course}" in result.stdout


def test_unknown_stage_suggests_the_closest(cli, solution_course, tiny_path):
    result = cli("test", "--stage", "per-step-identiy", "--course", solution_course, "--weights", tiny_path)
    assert result.exit_code == 2
    assert "unknown stage 'per-step-identiy'. Did you mean 'per-step-identity'?" in result.stderr
    assert (
        "forward, single-step-attention, prove-one-layer, decode-step, per-step-identity, greedy, cache-scaling"
        in result.stderr
    )


def test_no_course_directory(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("test")
    assert result.exit_code == 2
    assert "no course directory here" in result.stderr


def test_adapters_file_missing(cli, tmp_path):
    (tmp_path / "theinference.toml").write_text("")
    result = cli("test", "--course", tmp_path)
    assert result.exit_code == 2
    assert "adapters file not found" in result.stderr


def test_adapters_path_that_is_not_a_file_says_so(cli, tmp_path):
    (tmp_path / "tests" / "adapters.py").mkdir(parents=True)  # a FIFO or /dev/zero would say the same
    result = cli("test", "--course", tmp_path)
    assert result.exit_code == 2 and "adapters.py: not a regular file" in result.stderr


@pytest.mark.parametrize("content, words", [(None, "no such weights file"), (b"garbage", "not a safetensors file")])
def test_unreadable_weights(cli, solution_course, tmp_path, content, words):
    path = tmp_path / "model.safetensors"
    if content is not None:
        path.write_bytes(content)
    result = cli("test", "--course", solution_course, "--weights", path)
    assert result.exit_code == 2
    assert words in result.stderr and "Traceback" not in result.stderr


def test_invalid_course_stage_file(cli, solution_course, tiny_path):
    (solution_course / "stages").mkdir()
    (solution_course / "stages" / "bad.toml").write_text('format_version = 1\nid = "x"\n')
    result = cli("test", "--course", solution_course, "--weights", tiny_path)
    assert result.exit_code == 2
    assert "bad.toml: field 'title': missing required field" in result.stderr


def test_stage_file_with_nan_tolerance_is_refused(cli, solution_course, tiny_path):
    builtin = (data_dir("stages") / "prove-one-layer.toml").read_text()
    (solution_course / "stages").mkdir()
    (solution_course / "stages" / "nan.toml").write_text(
        builtin.replace('id = "prove-one-layer"', 'id = "nan-tolerance"').replace("atol = 1e-4", "atol = nan")
    )
    result = cli("test", "--course", solution_course, "--weights", tiny_path)
    assert result.exit_code == 2
    assert "nan.toml: field 'tolerance.atol': must be a finite number > 0, not nan" in result.stderr


def test_theinference_toml_weights_and_bad_field(cli, solution_course, tiny_path):
    (solution_course / "theinference.toml").write_text(f'weights = "{tiny_path}"\n')
    result = cli("test", "--stage", "prove-one-layer", "--course", solution_course)
    assert result.exit_code == 0
    assert "set in the course's theinference.toml" in result.stdout
    (solution_course / "theinference.toml").write_text('wieghts = "x"\n')
    result = cli("test", "--course", solution_course)
    assert result.exit_code == 2 and "field 'wieghts': unknown field" in result.stderr


def test_default_synthetic_weights_are_made_on_first_use(cli, solution_course, monkeypatch, tmp_path):
    monkeypatch.setattr(sources, "DEFAULT_SYNTH", ("tiny", 0))  # the gpt2 shape is 500 MB; the flow is the same
    result = cli("test", "--stage", "prove-one-layer", "--course", solution_course)
    assert result.exit_code == 0
    made = tmp_path / "user-cache" / f"synthetic-tiny-seed0-v{SYNTH_VERSION}" / "model.safetensors"
    assert made.is_file()
    assert "made the synthetic tiny weights" in result.stderr and "hf download openai-community/gpt2" in result.stderr
    assert "no weights configured: synthetic GPT-2-shape weights" in result.stdout
    again = cli("test", "--stage", "prove-one-layer", "--course", solution_course)
    assert again.exit_code == 0 and "made synthetic" not in again.stderr


def test_weights_synth_and_info(cli, tmp_path, tiny_path):
    result = cli("weights", "synth", "--preset", "tiny", "--seed", "0", "--out", tmp_path / "w")
    assert result.exit_code == 0
    assert (tmp_path / "w" / "model.safetensors").read_bytes() == tiny_path.read_bytes()
    assert json.loads((tmp_path / "w" / "config.json").read_text())["n_head"] == 2
    info = cli("weights", "info", tmp_path / "w")
    assert info.exit_code == 0
    assert "n_vocab 50257 · n_ctx 256 · n_embd 128 · n_head 2 · n_layer 2" in info.stdout
    assert "h.1.mlp.c_proj.weight" in info.stdout and "[512, 128]" in info.stdout
    assert "tiny preset, seed 0" in info.stdout
    assert len(load_file(str(tmp_path / "w" / "model.safetensors"))) == 4 + 2 * 12


def test_weights_without_subcommand_says_which_and_why(cli, tiny_path, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("THEINFERENCE_WEIGHTS", str(tiny_path))
    result = cli("weights")
    assert result.exit_code == 0
    assert f"weights:   {tiny_path}" in result.stdout and "$THEINFERENCE_WEIGHTS is set" in result.stdout


def test_stages_list(cli, solution_course):
    result = cli("stages", "list", "--course", solution_course)
    assert result.exit_code == 0
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    stages = (
        "forward",
        "single-step-attention",
        "prove-one-layer",
        "decode-step",
        "per-step-identity",
        "greedy",
        "cache-scaling",
    )
    order = [line.split()[0] for line in lines if line.split()[0] in stages]  # each stage's row starts with its id
    assert order == list(stages)


def test_an_internal_error_says_it_is_a_grader_bug(monkeypatch, capsys, solution_course, tiny_path):
    import sys

    from theinference.cli import app as cli_module
    from theinference.grading.judge import grade as grade_module

    def broken(*args, **kwargs):
        raise ZeroDivisionError("oops")

    monkeypatch.setattr(grade_module, "compare_rows", broken)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "theinference",
            "test",
            "--stage",
            "prove-one-layer",
            "--course",
            str(solution_course),
            "--weights",
            str(tiny_path),
        ],
    )
    with pytest.raises(SystemExit) as exit_info:
        cli_module.main()
    assert exit_info.value.code == 3
    err = capsys.readouterr().err
    assert "internal error" in err and "bug in the grader, not in your code" in err and "ZeroDivisionError" in err


def test_weights_tiny_names_the_tiny_preset_made_on_first_use(cli, solution_course, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("test", "--stage", "prove-one-layer", "--course", solution_course, "--weights", "tiny")
    assert result.exit_code == 0, result.stdout
    made = tmp_path / "user-cache" / f"synthetic-tiny-seed0-v{SYNTH_VERSION}" / "model.safetensors"
    words = " ".join(result.stdout.split())  # a long path puts the header's next part on a line of its own
    assert f"weights: {made}" in words and "synthetic (tiny preset, seed 0)" in words
    assert "--weights tiny: the synthetic tiny preset" in words
    (tmp_path / "tiny").mkdir()  # a directory so named is a path, as before
    assert (
        f"{tmp_path / 'tiny' / 'model.safetensors'}: no such weights file"
        in cli("test", "--course", solution_course, "--weights", "tiny").stderr
    )


@pytest.mark.slow
def test_after_a_pass_the_report_names_the_next_stage_and_its_lesson(cli, solution_run, tiny_path, tmp_path):
    # (After every stage has passed there is no next stage: tests/e2e/test_course.py, the solution's whole run.)
    stages = [s.id for s in load_stages([data_dir("stages")])]
    first = solution_run("--stage", stages[0])
    assert first.exit_code == 0
    assert f"next stage: {stages[1]} (" in first.stdout and f"`theinference stages show {stages[1]}`" in first.stdout
    course = shutil.copytree(first.course, tmp_path / "passed-once")  # its progress records the pass
    assert (course / ".theinference" / "progress.json").is_file()
    (course / "src" / "gpt2.py").write_text("raise SyntaxError('broken')\n")
    failed = cli("test", "--course", course, "--weights", tiny_path, "--stage", stages[0])
    assert failed.exit_code == 1 and "next stage" not in failed.stdout and "complete" not in failed.stdout


def test_a_course_that_cannot_keep_progress_still_names_the_next_stage(cli, solution_course, tiny_path):
    (solution_course / ".theinference").write_text("a file where progress.json's directory would be\n")
    stages = [s.id for s in load_stages([data_dir("stages")])]
    result = cli("test", "--course", solution_course, "--weights", tiny_path, "--stage", stages[0])
    assert result.exit_code == 0 and f"next stage: {stages[1]} (" in result.stdout
    notice = " ".join(result.stderr.split())
    assert f"progress not kept: cannot write {solution_course / '.theinference' / 'progress.json'} (" in notice


def test_version_command_and_option_print_the_same_line(cli):
    command, option = cli("version"), cli("--version")
    assert command.exit_code == option.exit_code == 0
    assert command.output == option.output and command.output.startswith("theinference ")
