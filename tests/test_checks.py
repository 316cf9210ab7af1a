"""What a stage checks is a type (theinference.grading.spec.checks): the loader's choice, and mypy's guard."""

import shutil
import tomllib
import subprocess
import sys
from pathlib import Path

import pytest

from theinference.bundled import data_dir
from theinference.grading.spec import checks, keys
from theinference.grading.spec.checks import RowsCheck, ScalingCheck, ScalingSpec, TokensCheck
from theinference.grading.spec.stages import load_stages

BUILTIN = {s.id: s for s in load_stages([data_dir("stages")])}


def test_each_built_in_stage_file_makes_the_check_its_compare_names():
    kinds = {s.id: type(s.check) for s in BUILTIN.values()}
    assert kinds["greedy"] is TokensCheck and kinds["cache-scaling"] is ScalingCheck
    assert {kinds[i] for i in ("forward", "per-step-identity", "prove-one-layer", "decode-step")} == {RowsCheck}
    for stage in BUILTIN.values():  # JSON's "compare" is the kind's name, the stage file's word
        assert stage.check.kind == tomllib.loads(stage.source.read_text())["compare"]


@pytest.mark.parametrize(
    "check, tolerance, tokens",
    [
        (RowsCheck(atol=1e-3, rtol=1e-2), {"atol": 1e-3, "rtol": 1e-2}, False),
        (TokensCheck(tie_rtol=1e-4), {"tie_rtol": 1e-4}, True),
        (
            ScalingCheck(tie_rtol=1e-4, params=ScalingSpec(lengths=(8, 64), repeats=1, max_ratio=2.0)),
            {"tie_rtol": 1e-4},
            True,
        ),
    ],
)
def test_each_kind_gives_its_own_tolerance(check, tolerance, tokens):
    assert checks.tolerance(check) == tolerance
    assert checks.checks_tokens(check) is tokens


_MATCH = """
from typing import assert_never
from theinference.grading.spec.checks import Check, RowsCheck, ScalingCheck, TokensCheck

def name(check: Check) -> str:
    match check:
        case RowsCheck():
            return "rows"
        case TokensCheck():
            return "tokens"
{scaling}        case _:
            assert_never(check)
"""


@pytest.mark.slow  # two mypy runs: 7 s
def test_mypy_names_the_kind_a_match_leaves_out(tmp_path):
    # checks.py and the one module it imports (keys.py) use the standard library only: mypy reads the two alone,
    # from their package path under tmp_path, not from the installed package (which has no py.typed)
    spec = tmp_path / "theinference" / "grading" / "spec"
    spec.mkdir(parents=True)
    for module in (checks, keys):
        shutil.copy(Path(module.__file__), spec / Path(module.__file__).name)

    def mypy(scaling: str) -> subprocess.CompletedProcess:
        (tmp_path / "use.py").write_text(_MATCH.format(scaling=scaling))
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--no-incremental", "--strict", "use.py"],
            cwd=tmp_path, capture_output=True, text=True,
        )  # fmt: skip

    complete = mypy('        case ScalingCheck():\n            return "scaling"\n')
    assert complete.returncode == 0, complete.stdout
    missing = mypy("")
    assert missing.returncode == 1 and "ScalingCheck" in missing.stdout, missing.stdout
