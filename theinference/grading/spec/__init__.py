"""Stage specs: stage files read and validated, what each checks (a type), the inputs of their cases, and the
failure shapes hints may name.

Imports only the oracle room (a stage names its oracle and its bug oracles, which must exist).
"""

from theinference.grading.spec.checks import Check, RowsCheck, ScalingCheck, ScalingSpec, TokensCheck
from theinference.grading.spec.shapes import SHAPES
from theinference.grading.spec.stages import CaseSpec, StageError, StageSpec, load_stages, stage_dirs
from theinference.grading.spec.timeouts import Timeouts

__all__ = [
    "SHAPES",
    "CaseSpec",
    "Check",
    "RowsCheck",
    "ScalingCheck",
    "ScalingSpec",
    "StageError",
    "StageSpec",
    "Timeouts",
    "TokensCheck",
    "load_stages",
    "stage_dirs",
]
