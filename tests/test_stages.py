"""Stage files: the built-in ones load; every kind of mistake is named with file and field."""

from pathlib import Path

import pytest

from theinference.bundled import data_dir
from theinference.course import Course
from theinference.grading.spec.stages import StageError, load_stage, load_stages, stage_dirs
from theinference.grading.spec.checks import RowsCheck, ScalingCheck, TokensCheck

VALID = """\
format_version = 1
id = "mlp-check"
title = "A valid stage"
order = 90
lesson = "lesson.md"
adapter = "run_layer_equiv"
oracle = "layer0-attn-sublayer"
compare = "rows"
timeout = 10
points = 5

[tolerance]
atol = 1e-4
rtol = 1e-3

[[case]]
name = "a"
seq = [1, 2, 3]
"""


def tokens_stage(tie: str | None = "[tie]\nrtol = 1e-4\n", tolerance: bool = False) -> str:
    """VALID made a greedy-tokens stage, with the given [tie] table (or none) and optionally [tolerance]."""
    text = VALID.replace('oracle = "layer0-attn-sublayer"', 'oracle = "greedy"').replace('"rows"', '"tokens"')
    text = text.replace("seq = [1, 2, 3]", "prompt = [1, 2]\nn_new = 3")
    if not tolerance:
        text = text.replace("[tolerance]\natol = 1e-4\nrtol = 1e-3\n", "")
    return text + ("\n" + tie if tie else "")


def write_stage(directory: Path, text: str, name: str = "stage.toml") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


def test_builtin_stages_follow_the_course():
    stages = {s.id: s for s in load_stages(stage_dirs(None))}
    assert list(stages) == [
        "forward",
        "single-step-attention",
        "prove-one-layer",
        "decode-step",
        "per-step-identity",
        "greedy",
        "cache-scaling",
    ]
    assert stages["single-step-attention"].check == RowsCheck(atol=1e-4, rtol=1e-3)
    assert stages["decode-step"].check == RowsCheck(atol=1e-3, rtol=1e-2)
    assert stages["prove-one-layer"].check == RowsCheck(atol=1e-4, rtol=1e-3)
    assert stages["per-step-identity"].check == RowsCheck(atol=1e-3, rtol=1e-2)
    assert stages["greedy"].check == TokensCheck(tie_rtol=1e-4)
    assert stages["per-step-identity"].adapter_names == ("run_per_step_logits", "runPerStepLogits")
    assert stages["cache-scaling"].adapter == stages["greedy"].adapter  # nothing new for students to write
    for stage in stages.values():
        if isinstance(stage.check, ScalingCheck):  # one timed generation; its lengths are what matter
            assert stage.check.params.lengths[-1] >= 7 * stage.check.params.lengths[0]
            continue
        assert len(stage.cases) >= 3
        lengths = [len(c.inputs.get("seq") or c.inputs["prompt"]) for c in stage.cases]
        assert 1 in lengths, f"{stage.id} needs a 1-token case"
        total = [len(c.inputs.get("seq") or c.inputs["prompt"]) + len(c.inputs.get("cont", [])) for c in stage.cases]
        assert max(total) >= 48, f"{stage.id} needs a case of at least 48 tokens"


def test_text_inputs_are_tokenized_and_kept_for_display(tmp_path):
    stage = load_stage(write_stage(tmp_path, VALID.replace("seq = [1, 2, 3]", 'seq = "Hello world"')))
    assert stage.cases[0].inputs["seq"] == [15496, 995]
    assert stage.cases[0].texts["seq"] == "Hello world"


def test_a_tokens_stage_has_a_tie_tolerance(tmp_path):
    stage = load_stage(write_stage(tmp_path, tokens_stage()))
    assert stage.check == TokensCheck(1e-4)


def test_default_alias_is_camel_case(tmp_path):
    assert load_stage(write_stage(tmp_path, VALID)).aliases == ("runLayerEquiv",)


@pytest.mark.parametrize(
    "edit, field, words",
    [
        (lambda t: t.replace("points = 5", 'points = 5\ncolour = "blue"'), "colour", "unknown field"),
        (lambda t: t.replace('title = "A valid stage"\n', ""), "title", "missing required field"),
        (lambda t: t.replace("timeout = 10", 'timeout = "ten"'), "timeout", "expected int or float"),
        (lambda t: t.replace("timeout = 10", "timeout = true"), "timeout", "expected int or float"),
        (lambda t: t.replace("timeout = 10", "timeout = 0"), "timeout", "must be > 0"),
        (lambda t: t.replace("timeout = 10", "timeout = nan"), "timeout", "must be > 0 seconds (a finite number)"),
        (lambda t: t.replace("timeout = 10", "timeout = inf"), "timeout", "must be > 0 seconds (a finite number)"),
        (
            lambda t: t.replace('compare = "rows"', 'compare = "bytes"'),
            "compare",
            "must be one of rows, tokens, scaling",
        ),
        (
            lambda t: t.replace('oracle = "layer0-attn-sublayer"', 'oracle = "layer9"'),
            "oracle",
            "unknown oracle 'layer9'",
        ),
        (lambda t: t.replace('id = "mlp-check"', 'id = "MLP Check"'), "id", "lowercase"),
        (lambda t: t.replace("atol = 1e-4\n", ""), "tolerance.atol", "missing required field"),
        (lambda t: t.replace("rtol = 1e-3", "rtol = 1e-3\nbtol = 2"), "tolerance.btol", "unknown field"),
        (lambda t: t.replace("atol = 1e-4", "atol = nan"), "tolerance.atol", "must be a finite number > 0, not nan"),
        (lambda t: t.replace("rtol = 1e-3", "rtol = inf"), "tolerance.rtol", "must be a finite number >= 0, not inf"),
        (lambda t: t.replace("atol = 1e-4", "atol = -1e-4"), "tolerance.atol", "must be a finite number > 0"),
        # Two faults: the tolerance is told first, before the stray [scaling] table, as the loader always did.
        (
            lambda t: t.replace("atol = 1e-4", "atol = -1e-4") + "\n[scaling]\nrepeats = 1\n",
            "tolerance.atol",
            "must be a finite number > 0",
        ),
        (lambda t: t.replace("seq = [1, 2, 3]", "seq = [1, 2, 3]\nprompt = [4]"), "case[0].prompt", "unknown field"),
        (lambda t: t.replace("seq = [1, 2, 3]", "seq = []"), "case[0].seq", "non-empty list"),
        (lambda t: t.replace("seq = [1, 2, 3]", ""), "case[0].seq", "missing required field"),
        (lambda t: t + '\n[[case]]\nname = "a"\nseq = [4]\n', "case[1].name", "duplicate case name 'a'"),
        (lambda t: t + '\n[hints]\nwobbly = "x"\n', "hints.wobbly", "unknown failure shape"),
        (lambda t: t.replace("format_version = 1", "format_version = 2"), "format_version", "reads format_version 1"),
        (
            lambda t: t + "\n[tie]\nrtol = 1e-4\n",
            "tie",
            'only a stage that checks greedy tokens (compare "tokens" or "scaling") takes [tie]',
        ),
        (lambda t: tokens_stage(tie=None), "tie", "missing required field"),
        (lambda t: tokens_stage(tolerance=True), "tolerance", "takes [tie]"),
        (lambda t: tokens_stage("[tie]\nrtol = 1e-4\natol = 1e-3\n"), "tie.atol", "unknown field"),
        (lambda t: tokens_stage("[tie]\nrtol = -1.0\n"), "tie.rtol", "must be a finite number > 0"),
        (lambda t: tokens_stage("[tie]\nrtol = inf\n"), "tie.rtol", "must be a finite number > 0"),
        (lambda t: tokens_stage("[tie]\nrtol = nan\n"), "tie.rtol", "must be a finite number > 0"),
        (lambda t: tokens_stage('[tie]\nrtol = "small"\n'), "tie.rtol", "expected int or float"),
    ],
)
def test_invalid_stage_names_file_and_field(tmp_path, edit, field, words):
    path = write_stage(tmp_path, edit(VALID))
    with pytest.raises(StageError) as info:
        load_stage(path)
    message = str(info.value)
    assert str(path) in message
    assert f"field '{field}'" in message
    assert words in message


SCALING = """\
format_version = 1
id = "timed"
title = "A timed stage"
order = 60
lesson = "lesson.md"
adapter = "run_greedy"
oracle = "greedy"
compare = "scaling"
timeout = 60
points = 5

[tie]
rtol = 1e-4

[scaling]
weights = "proof"
lengths = [8, 64]
repeats = 2
prompt_tokens = 4
max_ratio = 2.0
max_fraction = 0.35

[[case]]
name = "a"
prompt = [464]
"""


def test_a_scaling_stage_takes_n_new_from_its_lengths(tmp_path):
    stage = load_stage(write_stage(tmp_path, SCALING))
    assert isinstance(stage.check, ScalingCheck) and stage.check.tie_rtol > 0
    params = stage.check.params
    assert params.lengths == (8, 64) and params.repeats == 2 and params.max_ratio == 2.0
    assert params.max_fraction == 0.35 and params.prompt_tokens == 4 and params.weights == "proof"
    assert stage.cases[0].inputs == {"prompt": [464], "n_new": 64}


@pytest.mark.parametrize(
    "text, field, words",
    [
        (
            SCALING[: SCALING.index("[scaling]")] + SCALING[SCALING.index("[[case]]") :],
            "scaling",
            "needs a [scaling] table",
        ),
        (SCALING.replace("repeats = 2", "repeats = 2\nwarmup = 1"), "scaling.warmup", "unknown field"),
        (SCALING.replace("lengths = [8, 64]", "lengths = [64, 8]"), "scaling.lengths", "ascending"),
        (SCALING.replace("lengths = [8, 64]", "lengths = [64]"), "scaling.lengths", "at least two"),
        (SCALING.replace("lengths = [8, 64]", 'lengths = [8, "64"]'), "scaling.lengths[1]", "expected int"),
        (SCALING.replace("repeats = 2", "repeats = 0"), "scaling.repeats", "must be >= 1"),
        (SCALING.replace("max_ratio = 2.0", "max_ratio = 1"), "scaling.max_ratio", "must be > 1"),
        (SCALING.replace("max_ratio = 2.0\n", ""), "scaling.max_ratio", "missing required field"),
        (SCALING.replace("max_fraction = 0.35", "max_fraction = 1.5"), "scaling.max_fraction", "between 0 and 1"),
        (SCALING.replace("max_fraction = 0.35\n", ""), "scaling.max_fraction", "missing required field"),
        (SCALING.replace("prompt_tokens = 4", "prompt_tokens = 0"), "scaling.prompt_tokens", "must be >= 1"),
        (SCALING.replace('weights = "proof"', 'weights = "tiny"'), "scaling.weights", '"proof" or "graded"'),
        (SCALING.replace("prompt = [464]", "prompt = [464]\nn_new = 3"), "case[0].n_new", "unknown field"),
        (
            SCALING.replace("[tie]\nrtol = 1e-4\n", "[tolerance]\natol = 1e-3\nrtol = 1e-2\n"),
            "tolerance",
            "takes [tie]",
        ),
        (SCALING.replace('oracle = "greedy"', 'oracle = "per-step-logits"'), "oracle", 'must be "greedy"'),
        (VALID + "\n[scaling]\nlengths = [1, 2]\n", "scaling", "only a stage with compare"),
    ],
)
def test_invalid_scaling_names_file_and_field(tmp_path, text, field, words):
    path = write_stage(tmp_path, text)
    with pytest.raises(StageError) as info:
        load_stage(path)
    assert str(path) in str(info.value) and f"field '{field}'" in str(info.value) and words in str(info.value)


def test_toml_syntax_error_names_the_file(tmp_path):
    path = write_stage(tmp_path, VALID.replace('title = "A valid stage"', "title = "))
    with pytest.raises(StageError, match=rf"{path}: not valid TOML"):
        load_stage(path)


def test_duplicate_ids_across_directories(tmp_path):
    write_stage(tmp_path / "a", VALID)
    second = write_stage(tmp_path / "b", VALID)
    with pytest.raises(
        StageError, match=rf"{second}: field 'id': duplicate stage id 'mlp-check' \(also in .*a/stage.toml\)"
    ):
        load_stages([tmp_path / "a", tmp_path / "b"])


def test_course_stages_directory_is_discovered(tmp_path):
    write_stage(tmp_path / "course" / "stages", VALID)
    course = Course(root=tmp_path / "course", adapters=tmp_path / "course" / "tests" / "adapters.py")
    ids = [s.id for s in load_stages(stage_dirs(course))]
    assert ids == [
        "forward",
        "single-step-attention",
        "prove-one-layer",
        "decode-step",
        "per-step-identity",
        "greedy",
        "cache-scaling",
        "mlp-check",
    ]
    assert stage_dirs(course)[0] == data_dir("stages")
    assert stage_dirs(course, trusted=False) == [data_dir("stages")]  # untrusted grading reads no course stages


def test_stage_dirs_include_the_courses_own_stages_dirs_before_the_instructors(tmp_path):
    root = tmp_path / "course"
    course = Course(root=root, adapters=root / "tests" / "adapters.py", stages_dirs=(root / "extra",))
    extra = tmp_path / "instructor"
    assert stage_dirs(course, [extra]) == [data_dir("stages"), root / "extra", extra]
    assert stage_dirs(course, [extra], trusted=False) == [data_dir("stages"), extra]
