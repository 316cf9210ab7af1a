"""errors.py: the errors a user fixes by changing their command line or files (the CLI exits 2 on each)."""

import importlib

import pytest

from theinference.errors import ConfigError

# Each layer's own subclass, as errors.py's docstring lists them, and where it lives.
LAYERS = {
    "CourseError": "theinference.course",
    "WeightsError": "theinference.model.weights",
    "StageError": "theinference.grading.spec.stages",
    "OracleError": "theinference.grading.oracle.registry",
    "GradeError": "theinference.grading.judge.grade",
    "ConfinementError": "theinference.proc.launch",
    "MutantError": "theinference.grading.tools.mutants",
    "BatchError": "theinference.grading.drive.batch",
    "AutograderError": "theinference.grading.tools.autograder",
    "UsageError": "theinference.errors",
}


@pytest.mark.parametrize("name, module", LAYERS.items())
def test_each_layers_error_is_a_config_error(name, module):
    error = getattr(importlib.import_module(module), name)
    assert issubclass(error, ConfigError)
    assert f"{name}" in importlib.import_module("theinference.errors").__doc__
