"""`stages check` through the real CLI: the solution passes, the starter is not started, every
mutant in the gallery fails exactly its manifest's stages with its manifest's diagnosis."""

import json
import shutil

import pytest

from conftest import write_quick_scaling_stage
from theinference.grading.tools.mutants import build_mutant, load_mutants
from theinference.bundled import data_dir
from theinference.grading.spec.stages import load_stages
from theinference.grading.spec.checks import ScalingCheck


# Output stages: the timed stage is checked below at test-sized lengths (a recompute of the
# built-in lengths costs half a minute per mutant on tiny weights; bench/cache_scaling.py runs them).
OUTPUT_STAGES = [s.id for s in load_stages([data_dir("stages")]) if not isinstance(s.check, ScalingCheck)]


def _table_rows(out: str) -> dict[str, str]:
    """The check table's rows by subject, each with the continuation lines its cells wrapped onto."""
    rows, subject = {}, None
    for line in out.splitlines():
        if "|" not in line:
            continue
        first = line.split("|")[0].strip()
        subject = first or subject
        if subject:
            rows[subject] = rows.get(subject, "") + " " + line
    return rows


@pytest.mark.slow
def test_gallery_is_caught_exactly_as_the_manifests_say(cli, tiny_path, tmp_path, gallery_cache, monkeypatch):
    monkeypatch.setenv("THEINFERENCE_CACHE", str(gallery_cache))  # the bug oracles' outputs, shared
    source = shutil.copytree(data_dir("course"), tmp_path / "course", ignore=shutil.ignore_patterns("BUNDLED"))
    result = cli(
        "stages",
        "check",
        "--source",
        source,
        "--weights",
        tiny_path,
        *(a for s in OUTPUT_STAGES for a in ("--stage", s)),
    )
    assert result.exit_code == 0, result.stdout
    out = result.stdout
    assert "stages check passed" in out and "0 mismatches, 0 problems" in out
    mutants = load_mutants(data_dir("course") / "mutants")
    assert len(mutants) >= 7
    rows = _table_rows(out)
    assert rows["solution"].count("✔ pass") == len(OUTPUT_STAGES)
    assert rows["starter"].count("✔ not-started") == len(OUTPUT_STAGES)
    for mutant in mutants:
        row = rows[mutant.name]
        # Every cell checked and as the manifest says: ✔ marks a cell whose shape (and fingerprint) the
        # manifest expects, ✘ one it does not (test_a_wrong_manifest_is_a_mismatch_and_exit_1 shows that
        # a wrong expectation turns the cell to ✘). Shape names wrap inside narrow cells, so only marks count.
        assert row.count("✔") == len(OUTPUT_STAGES) and "✘" not in row, row
    assert "✘" not in out


@pytest.mark.slow
def test_no_cache_mutants_pass_every_output_stage_and_fail_only_on_cost(
    cli, tiny_path, tmp_path, proof_cache, monkeypatch
):
    """The no-cache mutants alone (--mutant: the solution's pass of the cost stage is the control of the cache-proof
    batches, test_cache_proof.py). The recomputes at 160 tokens: one is stopped beyond (b) there as at 480, and the
    diagnostic calls still tell its cost's growth (a token after 160 costs over 4x one in the 8-token calls).
    lm-head-every-position at the stage's own 480: only its LM head grows with position, and after a 160-token
    prompt its marginal cost sits at the diagnostic threshold (2.5x; about 4.5x after the 384-token prompt of 480,
    scaling.py's table), so 160 tokens decided it by the machine's noise (too-slow in a CI run at load ~15)."""
    monkeypatch.setenv("THEINFERENCE_CACHE", str(proof_cache))
    mutants = [m for m in load_mutants(data_dir("course") / "mutants") if "cache-scaling" in m.expect]
    no_cache = {m.name for m in mutants if m.expect["cache-scaling"] == ("no-cache",)}
    assert {
        "decode-recomputes",
        "decode-recomputes-last-row",
        "cache-rebuilt-each-step",
        "lm-head-every-position",
    } <= no_cache
    assert all(set(m.expect) == {"cache-scaling"} for m in mutants if m.name in no_cache)  # every output stage passes
    at_full_length = {"lm-head-every-position"}
    source, stages = tmp_path / "course", tmp_path / "stages"
    shutil.copytree(data_dir("course") / "solution", source / "solution")
    for name in no_cache:
        shutil.copytree(data_dir("course") / "mutants" / name, source / "mutants" / name)
        if name not in at_full_length:
            manifest = source / "mutants" / name / "manifest.toml"
            manifest.write_text(manifest.read_text().replace("cache-scaling =", "quick-scaling ="))
    write_quick_scaling_stage(stages, longest=160)
    lines = {}
    for stage, names in (("quick-scaling", no_cache - at_full_length), ("cache-scaling", at_full_length)):
        result = cli(
            "stages", "check", "--source", source, "--stages-dir", stages, "--weights", tiny_path,
            "--stage", stage, *(a for name in sorted(names) for a in ("--mutant", name)),
        )  # fmt: skip
        assert result.exit_code == 0, result.stdout
        lines.update({line.split("|")[0].strip(): line for line in result.stdout.splitlines() if "|" in line})
    assert "solution" not in lines and set(lines) >= no_cache
    assert all("✔ no-cache" in lines[name] for name in no_cache)


def test_the_gallery_covers_the_classic_bugs():
    expected = {m.name: m.expect for m in load_mutants(data_dir("course") / "mutants")}
    shapes = {shape for expect in expected.values() for options in expect.values() for shape in options}
    assert {"error-grows", "all-rows-off", "first-ok-then-flat", "first-decode-row-off", "shifted-by-one"} <= shapes
    assert expected["missing-attn-scale"]["per-step-identity"] == ("all-rows-off", "no-pattern")
    assert expected["record-after-consume"] == {"per-step-identity": ("shifted-by-one",)}


GREEDY_LOOP_BUGS = (
    "greedy-position-off-by-one",
    "greedy-feeds-first-token",
    "greedy-feeds-prompt-token",
    "greedy-one-short",
    "greedy-runner-up-once",
    "greedy-stops-at-eot",
)


def test_the_greedy_loop_bugs_fail_greedy_only():
    expected = {m.name: m.expect for m in load_mutants(data_dir("course") / "mutants")}
    for name in GREEDY_LOOP_BUGS:
        # cache-scaling runs the same run_greedy and checks its tokens first
        assert set(expected[name]) == {"greedy", "cache-scaling"}, name
    assert expected["greedy-stops-at-eot"]["greedy"] == ("wrong-shape",)


@pytest.mark.slow
def test_the_runner_up_once_fails_every_greedy_case(cli, tiny_path, tmp_path):
    mutant = next(m for m in load_mutants(data_dir("course") / "mutants") if m.name == "greedy-runner-up-once")
    course = build_mutant(mutant, data_dir("course") / "solution", tmp_path / mutant.name)
    result = cli("test", "--course", course, "--weights", tiny_path, "--stage", "greedy", "--format", "json")
    assert result.exit_code == 1
    cases = json.loads(result.stdout)["stages"][0]["cases"]
    assert [(c["status"], c["steps"][-1]["step"]) for c in cases] == [("fail", 1)] * len(cases)


@pytest.mark.parametrize(
    "find, replace, mismatch",
    [
        (
            'prove-one-layer = "error-grows"',
            'prove-one-layer = "all-rows-off"',
            "expected all-rows-off, got error-grows",
        ),
        (
            'prove-one-layer = "position-zero"',
            'prove-one-layer = "wpe-off-by-one"',
            "expected fingerprint wpe-off-by-one, got position-zero",
        ),
    ],
)
@pytest.mark.slow
def test_a_wrong_manifest_is_a_mismatch_and_exit_1(cli, tiny_path, tmp_path, find, replace, mismatch):
    source = tmp_path / "course"
    shutil.copytree(data_dir("course") / "solution", source / "solution")
    shutil.copytree(data_dir("course") / "mutants" / "position-stuck", source / "mutants" / "position-stuck")
    manifest = source / "mutants" / "position-stuck" / "manifest.toml"
    manifest.write_text(manifest.read_text().replace(find, replace))
    result = cli("stages", "check", "--source", source, "--weights", tiny_path, "--stage", "prove-one-layer")
    assert result.exit_code == 1
    assert f"mismatch: position-stuck × prove-one-layer: {mismatch}" in result.stdout


def test_a_stale_edit_is_reported(cli, tiny_path, tmp_path):
    source = tmp_path / "course"
    shutil.copytree(data_dir("course") / "solution", source / "solution")
    (source / "mutants" / "stale").mkdir(parents=True)
    (source / "mutants" / "stale" / "manifest.toml").write_text(
        'description = "x"\n[[edit]]\nfile = "src/kvcache.py"\nfind = "no such text"\nreplace = "y"\n[expect]\n'
    )
    result = cli("stages", "check", "--source", source, "--weights", tiny_path, "--stage", "prove-one-layer")
    assert result.exit_code == 1
    assert "the text to find occurs 0 times in src/kvcache.py" in result.stdout


def test_oracle_export(cli, tiny_path, tiny_model, solution_course, tmp_path):
    import numpy as np

    from theinference.model import gpt2 as oracle

    out = tmp_path / "expected.npz"
    result = cli(
        "oracle",
        "--stage",
        "per-step-identity",
        "--case",
        "sentence",
        "--course",
        solution_course,
        "--weights",
        tiny_path,
        "--out",
        out,
    )
    assert result.exit_code == 0
    data = np.load(out)
    assert sorted(data) == ["meta", "sentence.cont", "sentence.expected", "sentence.prompt"]
    expected = oracle.per_step_logits(
        tiny_model.params, list(data["sentence.prompt"]), list(data["sentence.cont"]), tiny_model.config.n_head
    )
    np.testing.assert_array_equal(data["sentence.expected"], expected)
    bad = cli(
        "oracle",
        "--stage",
        "per-step-identity",
        "--case",
        "nope",
        "--course",
        solution_course,
        "--weights",
        tiny_path,
        "--out",
        out,
    )
    assert bad.exit_code == 2 and "has no case 'nope'" in bad.stderr


def test_stages_show_renders_the_lesson(cli, solution_course):
    result = cli("stages", "show", "per-step-identity", "--course", solution_course)
    assert result.exit_code == 0
    assert "Stage: per-step-identity" in result.stdout and "shifted-by-one" in result.stdout
    assert "atol 0.001 rtol 0.01" in result.stdout
    assert cli("stages", "show", "nope", "--course", solution_course).exit_code == 2


def test_progress_moves_in_a_log_one_line_per_cell(cli, tiny_path, tmp_path):
    source = tmp_path / "course"
    shutil.copytree(data_dir("course") / "solution", source / "solution")
    shutil.copytree(data_dir("course") / "mutants" / "position-stuck", source / "mutants" / "position-stuck")
    stages = ["forward", "prove-one-layer"]
    result = cli(
        "stages", "check", "--source", source, "--weights", tiny_path, *(a for s in stages for a in ("--stage", s))
    )
    assert result.exit_code == 0, result.stdout
    # stderr is not a terminal here, as in CI: one plain line per finished subject × stage, none on stdout.
    lines = [line for line in result.stderr.splitlines() if line.startswith("checking [")]
    total = 2 * len(stages)
    assert [line.split("]")[0] for line in lines] == [f"checking [{i}/{total} cells" for i in range(1, total + 1)]
    assert {line.split(": ", 1)[1].split(":")[0] for line in lines} == {
        f"{subject} × {stage}" for subject in ("solution", "position-stuck") for stage in stages
    }
    assert "position-stuck × prove-one-layer: error-grows" in result.stderr
    assert "checking [" not in result.stdout
