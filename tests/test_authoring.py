"""Authoring without guessing or hand edits, and the small things that were false (issue 38, points 4 and 5)."""

import re
import shlex
import shutil
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import write_adapters
from test_instructor import MLP_STAGE
from theinference.bundled import BUNDLED_MARK, bundled_course_dir, data_dir
from theinference.course import load_course
from theinference.grading.judge.results import CheckCell, CheckResult
from theinference.grading.spec.stages import StageError, load_stage
from theinference.grading.tools.check import proposals
from theinference.grading.tools.mutants import load_mutant, write_proposals

GUIDE = Path(__file__).parent.parent / "docs" / "authoring.md"


def stage_file(tmp_path: Path, text: str, name: str = "stage.toml") -> Path:
    (tmp_path / "lessons").mkdir(exist_ok=True)
    (tmp_path / "lessons" / "mlp-sublayer.md").write_text("# MLP\n")
    (tmp_path / "oracles.py").write_text("def mlp_sublayer(model, seq):\n    return None\n")
    path = tmp_path / name
    path.write_text(text)
    return path


# --- built-in bugs: the refusal says which would work -----------------------------------------------------------


def test_a_built_in_bug_refused_for_a_built_in_oracle_lists_the_bugs_that_can_be_computed(tmp_path):
    text = (data_dir("stages") / "forward.toml").read_text()  # oracle "logits"
    text = re.sub(r"bugs = \[[^\]]*\]", 'bugs = ["position-stuck"]', text)
    path = tmp_path / "forward.toml"
    path.write_text(text.replace('lesson = "', 'lesson = "' + str(data_dir("stages")) + "/", 1))
    with pytest.raises(StageError) as refused:
        load_stage(path)
    message = str(refused.value)
    assert "field 'bugs[0]'" in message and "cannot be computed for oracle 'logits'" in message
    assert "built-in bugs that can: missing-scale" in message and "mask-off-by-one" in message
    assert "position-stuck," not in message  # only those that can


def test_a_built_in_bug_refused_for_an_oracle_of_ones_own_says_none_can_and_what_to_write(tmp_path):
    path = stage_file(tmp_path, MLP_STAGE.replace("[tolerance]", 'bugs = ["missing-scale"]\n\n[tolerance]'))
    with pytest.raises(StageError) as refused:
        load_stage(path)
    message = str(refused.value)
    assert "oracle 'oracles.py:mlp_sublayer': no built-in bug can" in message
    assert "'file.py:function' beside the stage file, function(model, **inputs)" in message


# --- tolerances: the guide says what the loader does ------------------------------------------------------------


def test_the_guide_states_the_tolerance_bounds_the_loader_applies(tmp_path):
    row = next(line for line in GUIDE.read_text().splitlines() if line.startswith("| `[tolerance]`"))
    assert "`atol` > 0" in row and "`rtol` ≥ 0" in row
    tie = next(line for line in GUIDE.read_text().splitlines() if line.startswith("| `[tie]`"))
    assert "> 0" in tie
    assert load_stage(stage_file(tmp_path, MLP_STAGE.replace("rtol = 1e-3", "rtol = 0"))).check.rtol == 0
    with pytest.raises(StageError, match=r"field 'tolerance.atol': must be a finite number > 0"):
        load_stage(stage_file(tmp_path, MLP_STAGE.replace("atol = 1e-4", "atol = 0")))


# --- hints a stage's kind can never show --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, hint, kind",
    [
        ("mlp", "token-mismatch", "rows"),
        ("greedy", "all-rows-off", "tokens"),
        ("cache-scaling", "no-pattern", "scaling"),
    ],
)
def test_a_hint_for_a_shape_the_stage_kind_never_shows_is_refused(tmp_path, source, hint, kind):
    if source == "mlp":
        path = stage_file(tmp_path, MLP_STAGE.replace("[hints]\n", f'[hints]\n{hint} = "never shown"\n'))
    else:
        text = (data_dir("stages") / f"{source}.toml").read_text()
        text = text.replace('lesson = "', 'lesson = "' + str(data_dir("stages")) + "/", 1)
        path = tmp_path / f"{source}.toml"
        path.write_text(text.replace("[hints]\n", f'[hints]\n{hint} = "never shown"\n'))
    with pytest.raises(StageError) as refused:
        load_stage(path)
    assert f"field 'hints.{hint}': a \"{kind}\" stage never fails with this shape (its shapes: " in str(refused.value)


# --- a byte-order mark (Windows Notepad) ------------------------------------------------------------------------


def test_files_saved_with_a_byte_order_mark_load(tmp_path):
    path = stage_file(tmp_path, "\ufeff" + MLP_STAGE)
    assert path.read_bytes()[:3] == b"\xef\xbb\xbf"
    assert load_stage(path).id == "mlp-sublayer"
    course = shutil.copytree(data_dir("course") / "solution", tmp_path / "course")
    (course / "theinference.toml").write_text("\ufefftimeout = 30\n", encoding="utf-8")
    assert load_course(course).timeout == 30
    manifest = tmp_path / "mutant" / "manifest.toml"
    manifest.parent.mkdir()
    manifest.write_text("\ufeff" + (data_dir("course") / "mutants" / "gelu-erf" / "manifest.toml").read_text())
    assert load_mutant(manifest).name == "mutant"


# --- a copied bundled course is the instructor's own --------------------------------------------------------------


def test_a_copy_of_the_bundled_course_is_not_the_bundled_course(tmp_path):
    bundled = data_dir("course")
    assert bundled_course_dir(bundled / "solution") == bundled.resolve()
    copy = shutil.copytree(bundled, tmp_path / "my-course-src", ignore=shutil.ignore_patterns("ts"))
    assert (copy / BUNDLED_MARK).is_file()  # `cp -r` brings the marker along
    assert bundled_course_dir(copy / "solution") is None
    checkout = tmp_path / "checkout"  # another source checkout's course is still a bundled one
    shutil.copytree(bundled, checkout / "course", ignore=shutil.ignore_patterns("ts", "mutants"))
    (checkout / "theinference").mkdir()
    (checkout / "theinference" / "bundled.py").write_text("")
    assert bundled_course_dir(checkout / "course" / "solution") == (checkout / "course").resolve()


def test_the_guide_copies_the_course_without_its_marker():
    command = next(line for line in GUIDE.read_text().splitlines() if line.strip().startswith("cp -r"))
    assert f"rm my-course-src/{BUNDLED_MARK}" in command


# --- the scaffold prints commands that run as printed -------------------------------------------------------------


def test_the_scaffold_prints_a_check_command_for_the_course_source_it_is_in(cli, tmp_path):
    source = tmp_path / "my course"  # a space: the printed command quotes it
    shutil.copytree(data_dir("course") / "solution", source / "solution")
    result = cli("stages", "new", "mlp-sublayer", "--stages-dir", source / "stages")
    assert result.exit_code == 0, result.output
    assert "COURSE_SOURCE" not in result.output
    commands = [
        line.strip().removeprefix("Then:") for line in result.output.splitlines() if "theinference stages" in line
    ]
    show, check = (shlex.split(c)[1:] for c in commands)
    assert check == ["stages", "check", "--source", str(source.resolve()), "--stage", "mlp-sublayer"]
    shown = cli(*show)
    assert shown.exit_code == 0, shown.output


def test_outside_a_course_source_the_scaffold_says_the_check_runs_on_the_bundled_course(cli, tmp_path):
    result = cli("stages", "new", "mlp-sublayer", "--stages-dir", tmp_path / "stages")
    line = next(x for x in result.output.splitlines() if "stages check" in x)
    assert "COURSE_SOURCE" not in line and "(against the bundled course;" in line
    args = shlex.split(line.split("(")[0])[1:]
    assert args == ["stages", "check", "--stages-dir", str(tmp_path / "stages"), "--stage", "mlp-sublayer"]


# --- a new stage's expectations for existing mutants: proposed, never hand-edited -----------------------------------


def gallery(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    for name in ("gelu-erf", "missing-attn-scale"):
        shutil.copytree(data_dir("course") / "mutants" / name, source / "mutants" / name)
    return source


def test_check_proposes_what_a_stage_the_manifest_is_silent_about_showed_and_writes_it_for_review(tmp_path):
    source = gallery(tmp_path)
    cells = [
        CheckCell("gelu-erf", "mlp-sublayer", ("pass",), "error-grows", got_bugs=frozenset({"gelu-erf"})),
        CheckCell("gelu-erf", "forward", ("fail", "pass"), "no-pattern"),  # named by the manifest: no proposal
        CheckCell("missing-attn-scale", "mlp-sublayer", ("pass",), "timeout"),  # a person looks first
        CheckCell("missing-attn-scale", "greedy-two", ("pass",), "error"),
        CheckCell("gelu-erf", "unproven-stage", ("pass",), "error"),  # the solution failed it too: not the mutant
        *(CheckCell("solution", s, ("pass",), "pass") for s in ("mlp-sublayer", "forward", "greedy-two")),
        CheckCell("solution", "unproven-stage", ("pass",), "error"),
    ]
    result = CheckResult(stages=["mlp-sublayer", "forward", "greedy-two"], subjects=[], cells=cells)
    found = proposals(result, source)
    assert [(p.mutant.name, p.stage, p.expect, p.bugs) for p in found] == [
        ("gelu-erf", "mlp-sublayer", "error-grows", ("gelu-erf",)),
        ("missing-attn-scale", "greedy-two", "error", ()),
    ]
    written = write_proposals(found)
    assert written == sorted(source / "mutants" / n / "manifest.toml" for n in ("gelu-erf", "missing-attn-scale"))
    mutant = load_mutant(written[0])
    assert mutant.expect["mlp-sublayer"] == ("error-grows",) and mutant.fingerprint["mlp-sublayer"] == {"gelu-erf"}
    assert load_mutant(written[1]).expect["greedy-two"] == ("error",)
    text = written[0].read_text()
    assert 'mlp-sublayer = "error-grows"  # proposed by `stages check --propose`: review it' in text
    assert tomllib.loads(text)["description"]  # the rest of the manifest as it was


def test_a_manifest_without_a_fingerprint_table_gets_one(tmp_path):
    source = tmp_path / "src"
    shutil.copytree(data_dir("course") / "mutants" / "decode-recomputes", source / "mutants" / "decode-recomputes")
    path = source / "mutants" / "decode-recomputes" / "manifest.toml"
    assert "[fingerprint]" not in path.read_text()
    cell = CheckCell("decode-recomputes", "mlp-sublayer", ("pass",), "all-rows-off", got_bugs=frozenset({"gelu-erf"}))
    passed = CheckCell("solution", "mlp-sublayer", ("pass",), "pass")
    write_proposals(proposals(CheckResult(stages=["mlp-sublayer"], subjects=[], cells=[passed, cell]), source))
    mutant = load_mutant(path)
    assert mutant.expect["mlp-sublayer"] == ("all-rows-off",) and mutant.fingerprint == {"mlp-sublayer": {"gelu-erf"}}


# --- JUnit: no seed="None", and the line -------------------------------------------------------------------------


@pytest.mark.slow
def test_junit_names_the_line_and_writes_a_seed_only_when_there_is_one(cli, tmp_path, tiny_path):
    course = tmp_path / "course"
    write_adapters(
        course,
        """\
        import numpy as np


        def run_layer_equiv(seq_ids):
            return np.zeros((len(seq_ids), 3)) + undefined_name
        """,
    )
    out = cli("test", "--course", course, "--weights", tiny_path, "--stage", "prove-one-layer", "--format", "junit")
    root = ET.fromstring(out.stdout)
    assert not [p for p in root.iter("property") if p.get("name") == "seed"]
    case = next(root.iter("testcase"))
    assert case.get("file") == str(course.resolve() / "tests" / "adapters.py") and case.get("line") == "5"
    seeded = cli(
        "test",
        "--course",
        course,
        "--weights",
        tiny_path,
        "--stage",
        "prove-one-layer",
        "--format",
        "junit",
        "--seed",
        "7",
    )
    seeds = {p.get("value") for p in ET.fromstring(seeded.stdout).iter("property") if p.get("name") == "seed"}
    assert seeds == {"7"}


@pytest.mark.slow
def test_a_new_stage_that_an_old_mutant_fails_gets_its_expectation_proposed_and_then_passes(cli, tmp_path, tiny_path):
    from test_instructor import instructor_course

    source = instructor_course.__wrapped__(tmp_path)
    shutil.copytree(data_dir("course") / "mutants" / "gelu-erf", source / "mutants" / "gelu-erf")  # silent on mlp
    args = ["stages", "check", "--source", source, "--stage", "mlp-sublayer", "--weights", tiny_path]
    first = cli(*args, "--propose")
    assert first.exit_code == 1, first.output
    manifest = source / "mutants" / "gelu-erf" / "manifest.toml"
    assert f"{manifest}: [expect] mlp-sublayer = " in " ".join(first.output.split())
    assert "mlp-sublayer" in load_mutant(manifest).expect
    again = cli(*args)
    assert again.exit_code == 0, again.output
    assert "proposed lines" not in again.output
