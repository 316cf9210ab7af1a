"""A built-in oracle's shape rule, which sets the byte cap of a returned array before the student's process runs,
must be the shape the oracle computes: for every case of every built-in stage, on tiny weights."""

import pytest

from theinference.bundled import data_dir
from theinference.grading.oracle.registry import BUILTIN_ORACLES, compute_expected
from theinference.grading.spec.checks import ScalingCheck
from theinference.grading.spec.stages import load_stages
from theinference.model.weights import load_model

# cache-scaling's oracle is greedy's, whose rule the greedy stage's cases check (its own 480-token case costs
# half a minute of recompute): left out.
STAGES = [s for s in load_stages([data_dir("stages")]) if not isinstance(s.check, ScalingCheck)]
CASES = [(s.oracle, c) for s in STAGES for c in s.cases]


def test_every_built_in_oracle_has_a_shape_rule():
    assert [name for name, spec in BUILTIN_ORACLES.items() if spec.shape is None] == []


@pytest.mark.parametrize("oracle, case", CASES, ids=[f"{o}-{c.name}" for o, c in CASES])
@pytest.mark.slow
def test_the_shape_rule_is_the_shape_the_oracle_computes(tiny_path, oracle, case):
    model = load_model(tiny_path)
    spec = BUILTIN_ORACLES[oracle]
    assert spec.shape is not None
    assert spec.shape(model.config, case.inputs) == compute_expected(spec, model, case.inputs).shape
