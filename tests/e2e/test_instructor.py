"""An instructor adds a stage with its own oracle, in a course of their own, without touching the package."""

import re
import shutil
import textwrap

import pytest

from theinference.bundled import data_dir
from conftest import write_adapters

MLP_STAGE = """\
format_version = 1
id = "mlp-sublayer"
title = "Layer 0's MLP sublayer on top of the cached attention"
order = 40
lesson = "lessons/mlp-sublayer.md"
adapter = "run_mlp_sublayer"
oracle = "oracles.py:mlp_sublayer"
inputs = ["seq"]
compare = "rows"
timeout = 30
points = 5

[tolerance]
atol = 1e-4
rtol = 1e-3

[hints]
all-rows-off = "Every row is off alike: check ln_2's bias and weight."

[[case]]
name = "one-token"
seq = [464]

[[case]]
name = "sentence"
seq = "The quick brown fox jumps over the lazy dog, and then it sleeps for a while."
"""

MLP_ORACLE = """\
from theinference.model import gpt2 as oracle


def mlp_sublayer(model, seq):
    \"\"\"Layer 0 through its MLP sublayer: h = x + attn(ln_1(x)); h + mlp(ln_2(h)).\"\"\"
    block = model.params["h"][0]
    h = oracle.layer0_attn_sublayer(model.params, seq, model.config.n_head)
    return h + oracle.ffn(oracle.layer_norm(h, **block["ln_2"]), **block["mlp"])
"""

MLP_ADAPTER = """

from src.gpt2 import ffn, layer_norm


def run_mlp_sublayer(seq_ids):
    params, n_head = _model()
    h = layer_attn_incremental(params, seq_ids, n_head)
    return h + ffn(layer_norm(h, **params["h"][0]["ln_2"]), **params["h"][0]["mlp"])
"""

MUTANT = """\
description = "ln_2 without its bias"

[[edit]]
file = "tests/adapters.py"
find = 'layer_norm(h, **params["h"][0]["ln_2"])'
replace = 'layer_norm(h, params["h"][0]["ln_2"]["weight"], 0.0)'

[expect]
mlp-sublayer = "all-rows-off"
"""


@pytest.fixture
def instructor_course(tmp_path):
    """course-src/{stages/, solution/, mutants/}: the instructor's own course source."""
    source = tmp_path / "course-src"
    stages = source / "stages"
    (stages / "lessons").mkdir(parents=True)
    (stages / "mlp.toml").write_text(MLP_STAGE)
    (stages / "oracles.py").write_text(MLP_ORACLE)
    (stages / "lessons" / "mlp-sublayer.md").write_text("# MLP sublayer\n\nAdd ln_2 and the MLP.\n")
    shutil.copytree(data_dir("course") / "solution", source / "solution")
    with (source / "solution" / "tests" / "adapters.py").open("a") as f:
        f.write(textwrap.dedent(MLP_ADAPTER))
    (source / "mutants" / "no-ln2-bias").mkdir(parents=True)
    (source / "mutants" / "no-ln2-bias" / "manifest.toml").write_text(MUTANT)
    return source


def test_new_stage_is_graded_by_test(cli, instructor_course, tiny_path):
    result = cli(
        "test",
        "--course",
        instructor_course / "solution",
        "--stages-dir",
        instructor_course / "stages",
        "--weights",
        tiny_path,
        "--stage",
        "mlp-sublayer",
    )
    assert result.exit_code == 0, result.stdout
    assert "✔ mlp-sublayer" in result.stdout


def test_new_stage_in_the_course_stages_directory_is_found(cli, instructor_course, tiny_path):
    shutil.copytree(instructor_course / "stages", instructor_course / "solution" / "stages")
    listing = cli("stages", "list", "--course", instructor_course / "solution")
    assert "mlp-sublayer" in listing.stdout
    result = cli("test", "--course", instructor_course / "solution", "--weights", tiny_path, "--stage", "mlp-sublayer")
    assert result.exit_code == 0


def test_new_stage_fails_a_wrong_adapter_with_its_hint(cli, instructor_course, tiny_path):
    adapters = instructor_course / "solution" / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text().replace("return h + ffn(", "return h - ffn("))
    result = cli(
        "test",
        "--course",
        instructor_course / "solution",
        "--stages-dir",
        instructor_course / "stages",
        "--weights",
        tiny_path,
        "--stage",
        "mlp-sublayer",
    )
    assert result.exit_code == 1
    assert "case sentence: failed" in result.stdout


def test_stages_check_covers_the_instructors_stage(cli, instructor_course, tiny_path):
    result = cli("stages", "check", "--source", instructor_course, "--stage", "mlp-sublayer", "--weights", tiny_path)
    assert result.exit_code == 0, result.stdout
    assert "no-ln2-bias" in result.stdout and "✔ all-rows-off" in result.stdout
    assert "stages check passed" in result.stdout


def test_a_broken_instructor_oracle_is_a_configuration_error(cli, instructor_course, tiny_path):
    (instructor_course / "stages" / "oracles.py").write_text(
        "def mlp_sublayer(model, seq):\n    raise KeyError('ln_3')\n"
    )
    result = cli(
        "test",
        "--course",
        instructor_course / "solution",
        "--stages-dir",
        instructor_course / "stages",
        "--weights",
        tiny_path,
        "--stage",
        "mlp-sublayer",
    )
    assert result.exit_code == 2
    assert (
        "stage 'mlp-sublayer': the oracle mlp_sublayer() failed at" in result.stderr
        and "KeyError: 'ln_3'" in result.stderr
    )


def test_an_oracle_failure_names_the_stage_the_file_the_line_and_shows_the_instructors_traceback(
    cli, instructor_course, tiny_path
):
    oracle_file = instructor_course / "stages" / "oracles.py"
    oracle_file.write_text(
        textwrap.dedent("""\
        def width(model):
            return model.config["n_embd"]


        def mlp_sublayer(model, seq):
            return [[0.0] * width(model)] * len(seq)
        """)
    )
    result = cli(
        "test",
        "--course",
        instructor_course / "solution",
        "--stages-dir",
        instructor_course / "stages",
        "--weights",
        tiny_path,
        "--stage",
        "mlp-sublayer",
    )
    assert result.exit_code == 2
    message = " ".join(result.stderr.split())  # the console wraps long lines
    assert f"stage 'mlp-sublayer': the oracle mlp_sublayer() failed at {oracle_file.resolve()}, line 2" in message
    assert "TypeError: 'GPT2Config' object is not subscriptable" in message and "model.config.n_layer" in message
    # the instructor's frames, outermost first, and none of the grader's
    assert message.index("line 6, in mlp_sublayer") < message.index("line 2, in width")
    assert "grade.py" not in result.stderr and 'oracles.py", line' in result.stderr


def test_a_failing_bug_oracle_names_the_bug_and_its_stage_file(cli, instructor_course, tiny_path):
    stage_file = instructor_course / "stages" / "mlp.toml"
    stage_file.write_text(stage_file.read_text().replace("points = 5\n", 'points = 5\nbugs = ["oracles.py:no_bias"]\n'))
    with (instructor_course / "stages" / "oracles.py").open("a") as f:
        f.write("\n\ndef no_bias(model, seq):\n    return model.config['n_embd']\n")
    adapters = instructor_course / "solution" / "tests" / "adapters.py"
    adapters.write_text(adapters.read_text().replace("return h + ffn(", "return h - ffn("))
    result = cli(
        "test",
        "--course",
        instructor_course / "solution",
        "--stages-dir",
        instructor_course / "stages",
        "--weights",
        tiny_path,
        "--stage",
        "mlp-sublayer",
    )
    assert result.exit_code == 2
    message = " ".join(result.stderr.split())
    assert (
        "bug 'oracles.py:no_bias' of mlp.toml: the oracle no_bias() failed at" in message
        and "oracles.py, line" in message
    )


def test_editing_the_oracle_file_invalidates_cached_outputs(instructor_course, tiny_model):
    import numpy as np

    from theinference.grading.oracle.cache import OracleCache
    from theinference.grading.oracle.registry import resolve_oracle
    from theinference.grading.spec.stages import load_stage

    stage = load_stage(instructor_course / "stages" / "mlp.toml")
    cache = OracleCache()
    first = cache.get(tiny_model, stage, resolve_oracle(stage.oracle, stage.source), stage.cases[0])
    assert resolve_oracle(stage.oracle, stage.source) is resolve_oracle(stage.oracle, stage.source)  # imported once
    oracle_file = instructor_course / "stages" / "oracles.py"
    oracle_file.write_text(oracle_file.read_text().replace("return h + oracle.ffn(", "return 2 * h + oracle.ffn("))
    second = cache.get(tiny_model, stage, resolve_oracle(stage.oracle, stage.source), stage.cases[0])
    assert not np.allclose(first, second)


def test_an_instructors_bug_oracle_names_the_bug(cli, instructor_course, tiny_path):
    stages = instructor_course / "stages"
    (stages / "mlp.toml").write_text(
        MLP_STAGE.replace("[tolerance]", 'bugs = ["oracles.py:no_ln2_bias"]\n\n[tolerance]')
        + '\n[bug_hints]\n"oracles.py:no_ln2_bias" = "ln_2 has a bias: add it."\n'
    )
    (stages / "oracles.py").write_text(
        MLP_ORACLE
        + textwrap.dedent("""

        def no_ln2_bias(model, seq):
            block = model.params["h"][0]
            h = oracle.layer0_attn_sublayer(model.params, seq, model.config.n_head)
            return h + oracle.ffn(oracle.layer_norm(h, block["ln_2"]["weight"], 0.0), **block["mlp"])
    """)
    )
    adapters = instructor_course / "solution" / "tests" / "adapters.py"
    adapters.write_text(
        adapters.read_text().replace(
            'layer_norm(h, **params["h"][0]["ln_2"])', 'layer_norm(h, params["h"][0]["ln_2"]["weight"], 0.0)'
        )
    )
    result = cli(
        "test",
        "--course",
        instructor_course / "solution",
        "--stages-dir",
        stages,
        "--weights",
        tiny_path,
        "--stage",
        "mlp-sublayer",
    )
    assert result.exit_code == 1
    assert "finding: oracles.py:no_ln2_bias — your output equals GPT-2 with oracles.py:no_ln2_bias" in result.stdout
    assert "hint: ln_2 has a bias: add it." in result.stdout


def test_stages_new_scaffolds_a_stage_that_loads_and_refuses_to_overwrite(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    made = cli("stages", "new", "my-stage")
    assert made.exit_code == 0, made.output
    for name in ("my-stage.toml", "my_stage_oracle.py", "lessons/my-stage.md"):
        assert (tmp_path / "stages" / name).is_file()
    assert "def run_my_stage(seq_ids):" in made.stdout and "NotImplementedError" in made.stdout
    listing = cli("stages", "list", "--stages-dir", tmp_path / "stages")
    assert listing.exit_code == 0 and "run_my_stage" in listing.stdout
    shown = cli("stages", "show", "my-stage", "--stages-dir", tmp_path / "stages")
    assert shown.exit_code == 0 and "adapter run_my_stage()" in shown.stdout

    lesson = tmp_path / "stages" / "lessons" / "my-stage.md"
    lesson.write_text("# mine\n")
    again = cli("stages", "new", "my-stage")
    assert again.exit_code == 2 and "already exists" in again.stderr
    assert lesson.read_text() == "# mine\n"


@pytest.mark.parametrize("stage_id, why", [("My_Stage", "is not a stage id"), ("forward", "already exists")])
def test_stages_new_refuses_a_bad_or_taken_id(cli, tmp_path, stage_id, why):
    result = cli("stages", "new", stage_id, "--stages-dir", tmp_path / "stages")
    assert result.exit_code == 2 and why in result.stderr
    assert not (tmp_path / "stages").exists()


def test_stages_new_into_an_unwritable_place_is_a_usage_error(cli, tmp_path):
    in_the_way = tmp_path / "stages"
    in_the_way.write_text("a file, not a directory\n")
    result = cli("stages", "new", "my-stage", "--stages-dir", in_the_way)
    assert result.exit_code == 2 and f"cannot write the stage into {in_the_way}" in result.stderr


def test_a_scaffolded_stage_with_the_printed_adapters_passes_stages_check(cli, tmp_path, tiny_path):
    source = tmp_path / "course-src"
    for part in ("solution", "starter"):
        shutil.copytree(data_dir("course") / part, source / part)
    made = cli("stages", "new", "my-stage", "--stages-dir", source / "stages").stdout
    solution = made.split("computes):\n\n")[1].split("\nand to the starter")[0]
    starter = made.split("starter's tests/adapters.py:\n\n")[1].split("\nThen:")[0]
    for part, snippet in (("solution", solution), ("starter", starter)):
        with (source / part / "tests" / "adapters.py").open("a") as f:
            f.write("\n\n" + snippet)
    result = cli("stages", "check", "--source", source, "--stage", "my-stage", "--weights", tiny_path)
    assert result.exit_code == 0, result.stdout
    assert "✔ pass" in result.stdout and "✔ not-started" in result.stdout


# --- instructor mistakes fail loudly: exit 2, naming the file and the field ---


@pytest.mark.parametrize(
    "returned, words",
    [
        ("np.full((len(seq), model.config.n_embd), np.nan)", "non-finite value(s) (NaN or inf)"),
        ("np.where(np.arange(len(seq))[:, None] > 0, np.inf, np.zeros((len(seq), 4)))", "non-finite value(s)"),
        ("None", "returned None"),
        ("'the answer'", "returned a str"),
        ("np.float64(1.5)", "a 0-d value"),
        ("[['a'] * 4] * len(seq)", "not numbers"),
        ("np.zeros((0, 4))", "an empty array"),
    ],
)
def test_an_oracle_output_that_judges_nothing_is_refused(cli, instructor_course, tiny_path, returned, words):
    oracle_file = instructor_course / "stages" / "oracles.py"
    oracle_file.write_text(f"import numpy as np\n\n\ndef mlp_sublayer(model, seq):\n    return {returned}\n")
    result = cli(
        "test",
        *("--course", instructor_course / "solution", "--stages-dir", instructor_course / "stages"),
        *("--weights", tiny_path, "--stage", "mlp-sublayer"),
    )
    message = " ".join(result.stderr.split())
    assert result.exit_code == 2, result.output
    assert re.search(r"stage 'mlp-sublayer', case '(one-token|sentence)': the oracle mlp_sublayer\(\) in ", message)
    assert f"mlp_sublayer() in {oracle_file.resolve()}" in message
    assert "field 'oracle'" in message and words in message


def test_an_all_nan_oracle_stops_a_batch_before_any_grade(cli, instructor_course, tiny_path, tmp_path):
    """Compared with NaN nothing is outside tolerance: a student returning zeros would get every point."""
    (instructor_course / "stages" / "oracles.py").write_text(
        "import numpy as np\n\n\ndef mlp_sublayer(model, seq):\n    return np.full((len(seq), 128), np.nan)\n"
    )
    zeros = tmp_path / "subs" / "zeros"
    write_adapters(
        zeros, "import numpy as np\n\ndef run_mlp_sublayer(seq_ids):\n    return np.zeros((len(seq_ids), 128))\n"
    )
    out = tmp_path / "grades.csv"
    result = cli(
        "grade",
        zeros,
        *("--stages-dir", instructor_course / "stages", "--stage", "mlp-sublayer"),
        *("--weights", tiny_path, "--out", out),
    )
    assert result.exit_code == 2 and "non-finite" in result.stderr
    assert not out.exists() or "zeros" not in out.read_text()


@pytest.mark.parametrize(
    "find, replace, field, bound",
    [
        ("atol = 1e-4", "atol = 0", "tolerance.atol", "> 0"),
        ("rtol = 1e-3", "rtol = -1e-3", "tolerance.rtol", ">= 0"),
    ],
)
def test_a_tolerance_of_zero_or_below_is_refused(cli, instructor_course, find, replace, field, bound):
    stage_file = instructor_course / "stages" / "mlp.toml"
    stage_file.write_text(stage_file.read_text().replace(find, replace))
    result = cli("stages", "list", "--stages-dir", instructor_course / "stages")
    assert result.exit_code == 2
    assert f"{stage_file}: field '{field}': must be a finite number {bound}" in " ".join(result.stderr.split())


def test_an_absolute_tolerance_alone_is_accepted(cli, instructor_course):
    """rtol = 0 beside a positive atol is a plain absolute tolerance, not a mistake."""
    stage_file = instructor_course / "stages" / "mlp.toml"
    stage_file.write_text(stage_file.read_text().replace("rtol = 1e-3", "rtol = 0"))
    result = cli("stages", "list", "--stages-dir", instructor_course / "stages")
    assert result.exit_code == 0, result.stderr


def test_a_tie_tolerance_of_zero_is_refused(cli, tmp_path):
    stages = tmp_path / "stages"
    stages.mkdir()
    text = (data_dir("stages") / "greedy.toml").read_text()
    (stages / "greedy2.toml").write_text(
        text.replace('id = "greedy"', 'id = "greedy-two"').replace("rtol = 1e-4", "rtol = 0")
    )
    result = cli("stages", "list", "--stages-dir", stages)
    assert result.exit_code == 2 and "field 'tie.rtol': must be a finite number > 0" in " ".join(result.stderr.split())


BROKEN_MANIFESTS = {
    "stage-typo": (
        MUTANT + '\n[fingerprint]\nmlp-sublayr = "missing-scale"\n',
        "field 'fingerprint.mlp-sublayr': unknown stage 'mlp-sublayr'",
    ),
    "bug-typo": (
        MUTANT.replace("[expect]", '[expect]\nprove-one-layer = "fail"')
        + '\n[fingerprint]\nprove-one-layer = "wpe-of-by-one"\n',
        "field 'fingerprint.prove-one-layer': bug 'wpe-of-by-one' is not among the bugs stage 'prove-one-layer' fingerprints",
    ),
    "expect-typo": (MUTANT.replace("mlp-sublayer =", "mlp-sublayr ="), "field 'expect.mlp-sublayr': unknown stage"),
    "not-toml": ("description = \n", "cannot read"),
}


def test_broken_manifests_are_named_and_the_other_mutants_still_run(cli, instructor_course, tiny_path):
    for name, (text, _) in BROKEN_MANIFESTS.items():
        (instructor_course / "mutants" / name).mkdir()
        (instructor_course / "mutants" / name / "manifest.toml").write_text(text)
    result = cli("stages", "check", "--source", instructor_course, "--stage", "mlp-sublayer", "--weights", tiny_path)
    out = " ".join(result.stdout.split())
    assert result.exit_code == 2, result.stdout
    for name, (_, words) in BROKEN_MANIFESTS.items():
        assert f"error: {instructor_course / 'mutants' / name / 'manifest.toml'}: " in out and words in out, name
    # the good mutant and the solution were still checked
    assert "no-ln2-bias" in result.stdout and "✔ all-rows-off" in result.stdout and "✔ pass" in result.stdout
    assert "4 broken manifest field(s)" in out


def test_stages_check_mutant_checks_only_that_mutant(cli, instructor_course, tiny_path):
    shutil.copytree(instructor_course / "mutants" / "no-ln2-bias", instructor_course / "mutants" / "other")
    result = cli(
        "stages",
        "check",
        "--source",
        instructor_course,
        "--stage",
        "mlp-sublayer",
        "--weights",
        tiny_path,
        "--mutant",
        "no-ln2-bias",
    )
    assert result.exit_code == 0, result.stdout
    rows = [line.split()[0] for line in result.stdout.splitlines() if "all-rows-off" in line or "✔ pass" in line]
    assert rows == ["no-ln2-bias"]
    assert "1 checks, 0 mismatches" in result.stdout
    result = cli("stages", "check", "--source", instructor_course, "--weights", tiny_path, "--mutant", "no-ln2-bais")
    assert result.exit_code == 2 and "--mutant no-ln2-bais: no such mutant" in result.stderr
    assert "no-ln2-bias, other" in result.stderr
