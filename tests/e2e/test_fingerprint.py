"""Fingerprinting through the real CLI: a failing output that equals GPT-2 with a known bug is
reported as that bug, with its numbers; anything else keeps the shape's suspects, stated as such."""

import json
import re
import shutil

import pytest

from conftest import write_adapters
from theinference.grading.tools.mutants import build_mutant, load_mutant
from theinference.bundled import data_dir
from theinference.grading.spec.stages import load_stage

MUTANTS = data_dir("course") / "mutants"


def mutant_course(name: str, tmp_path):
    mutant = load_mutant(MUTANTS / name / "manifest.toml")
    return mutant, build_mutant(mutant, data_dir("course") / "solution", tmp_path / name)


def diagnosis_text(out: str) -> str:
    """The report's diagnosis lines (shape, finding, known bugs, hint), joined."""
    keep = ("shape:", "finding:", "known bugs:", "hint:")
    lines, current = [], None
    for line in out.splitlines():
        stripped = line.strip()
        if stripped.startswith(keep):
            current = stripped
            lines.append(current)
        elif current and stripped and not line.startswith(("  case", "✘", "✔")) and "|" not in line:
            lines[-1] += " " + stripped  # a wrapped continuation
        else:
            current = None
    return "\n".join(lines)


def assert_no_unproven_cause(text: str) -> None:
    """Without a finding, a hint lists suspects or says how to look; it never states one cause."""
    if "finding:" in text:
        return
    for hint in re.findall(r"hint: (.*)", text):
        assert hint.startswith(("Suspects", "Dump", "Compare", "NaN", "A row holds")), hint


@pytest.mark.parametrize(
    "name, stage",
    [
        ("missing-attn-scale", "prove-one-layer"),
        ("wpe-base-off-by-one", "prove-one-layer"),
        ("c-proj-transposed", "prove-one-layer"),
        ("kv-appended-after-attention", "prove-one-layer"),
        ("mask-off-by-one", "per-step-identity"),
        ("decode-position-reset", "per-step-identity"),
        ("decode-step-position-zero", "decode-step"),
        # issue 34: once "not one of the known bugs", or named only partly
        ("no-mlp-residual", "forward"),
        ("softmax-over-queries", "forward"),
        ("no-attn-residual", "per-step-identity"),
        ("prefill-first-row", "per-step-identity"),
    ],
)
def test_a_known_bug_is_named_with_its_evidence(cli, tiny_path, tmp_path, name, stage):
    mutant, course = mutant_course(name, tmp_path)
    result = cli("test", "--course", course, "--weights", tiny_path, "--stage", stage)
    assert result.exit_code == 1
    text = diagnosis_text(result.stdout)
    finding = re.search(r"finding: (.*?) — your output equals GPT-2 with", text)
    assert finding, text
    named = finding.group(1).split(", ")
    # `test` stops screening at the first exact match: of bugs giving the very same output (the manifest lists
    # every one; `stages check` proves the list), the first the stage lists is named, alone.
    ties = set(mutant.fingerprint[stage])
    listed = load_stage(data_dir("stages") / f"{stage}.toml").bugs
    assert named == [next(bug for bug in listed if bug in ties)]
    assert "at every position" in text
    findings = "\n".join(
        line.split("the correct output")[0] for line in text.splitlines() if line.startswith("finding:")
    )
    distances = [float(x) for x in re.findall(r"\bto ([0-9][0-9.e+-]*)", findings)]
    off = float(re.search(r"the correct output differs by up to ([0-9.e+-]+)", text).group(1))
    assert distances and max(distances) < off / 10


def test_the_solution_gets_no_diagnosis(solution_run):
    result = solution_run("--stage", "prove-one-layer")
    assert result.exit_code == 0
    assert "finding" not in result.stdout and "shape:" not in result.stdout


def test_an_unknown_bug_falls_back_to_the_shape_and_says_so(cli, tiny_path, tmp_path):
    course = tmp_path / "noisy"
    shutil.copytree(data_dir("course") / "solution", course)
    adapters = course / "tests" / "adapters.py"
    adapters.write_text(
        adapters.read_text().replace(
            "return layer_attn_incremental(params, seq_ids, n_head)",
            "out = layer_attn_incremental(params, seq_ids, n_head)\n"
            "    return out + 0.01 * np.random.default_rng(0).standard_normal(out.shape)",
        )
    )
    result = cli("test", "--course", course, "--weights", tiny_path, "--stage", "prove-one-layer")
    assert result.exit_code == 1
    text = diagnosis_text(result.stdout)
    assert "known bugs: not one of the known bugs" in text and "finding:" not in text
    assert_no_unproven_cause(text)


@pytest.mark.slow
def test_the_issues_five_cases_state_no_cause_without_a_match(cli, tiny_path, tmp_path):
    """The five reports that once stated a wrong cause as fact (issue 11)."""
    for name, stage in [
        ("missing-attn-scale", "prove-one-layer"),
        ("c-proj-transposed", "per-step-identity"),
        ("mask-off-by-one", "prove-one-layer"),
        ("kv-appended-after-attention", "prove-one-layer"),
    ]:
        _, course = mutant_course(name, tmp_path)
        text = diagnosis_text(cli("test", "--course", course, "--weights", tiny_path, "--stage", stage).stdout)
        assert "finding:" in text, (name, text)
        # The verdict streams first with the shape's suspects; what follows the finding names no other cause.
        assert "re-applied" not in text.split("finding:", 1)[1], (name, text)
        if stage == "prove-one-layer":  # a stage without decode gets no decode hint
            assert "decode" not in text.replace("first-decode-row-off", ""), (name, text)
    # A cross-case stage whose one-token case errors: the rest are read, and the report says so.
    course = tmp_path / "errors-on-one-token"
    write_adapters(
        course,
        """
        import numpy as np
        import theinference
        from src.gpt2 import load_weights
        from src.kvcache import decode_step, prefill

        def run_decode_step(prompt_ids, next_id):
            if len(prompt_ids) == 1:
                raise ValueError("one token")
            params, n_head = load_weights(theinference.weights_path())
            out = decode_step(params, prefill(params, prompt_ids, n_head)[1], next_id, len(prompt_ids), n_head)
            return out + 0.05 * np.random.default_rng(len(prompt_ids)).standard_normal(out.shape)
    """,
    )
    result = cli("test", "--course", course, "--weights", tiny_path, "--stage", "decode-step")
    text = diagnosis_text(result.stdout)
    assert "read across the 9 of 10 cases that returned numbers" in text
    assert "one-token case included" not in result.stdout
    assert "not one of the known bugs" in text
    assert_no_unproven_cause(text)


def test_json_carries_the_fingerprint(cli, tiny_path, tmp_path):
    _, course = mutant_course("wpe-base-off-by-one", tmp_path)
    out = tmp_path / "results.json"
    result = cli(
        "test",
        "--course",
        course,
        "--weights",
        tiny_path,
        "--stage",
        "prove-one-layer",
        "--format",
        "json",
        "--output",
        out,
    )
    assert result.exit_code == 1
    stage = json.loads(out.read_text())["stages"][0]
    assert stage["diagnosis"]["bug"] == "wpe-off-by-one"
    assert "wpe[pos + 1]" in stage["diagnosis"]["evidence"]
    failing = [c for c in stage["cases"] if c["status"] == "fail"]
    assert failing and all(c["diagnosis"]["bug"] == "wpe-off-by-one" for c in failing)


def test_a_stage_naming_an_unknown_bug_is_rejected(cli, tiny_path, solution_course, tmp_path):
    stages = tmp_path / "stages"
    stages.mkdir()
    text = (data_dir("stages") / "prove-one-layer.toml").read_text()
    text = text.replace('id = "prove-one-layer"', 'id = "prove-two"').replace('"missing-scale",', '"no-such-bug",', 1)
    text = text.replace('lesson = "../course/lessons/', f'lesson = "{data_dir("course")}/lessons/')
    (stages / "two.toml").write_text(text)
    result = cli("test", "--course", solution_course, "--weights", tiny_path, "--stages-dir", stages)
    assert result.exit_code == 2
    assert "two.toml: field 'bugs[0]': unknown bug 'no-such-bug'" in result.output
