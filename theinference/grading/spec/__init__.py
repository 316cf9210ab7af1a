"""Stage specs: stage files read and validated, the inputs of their cases, the failure shapes hints may name.

Imports only the oracle room (a stage names its oracle and its bug oracles, which must exist).
"""

from theinference.grading.spec.shapes import SHAPES
from theinference.grading.spec.stages import CaseSpec, ScalingSpec, StageError, StageSpec, load_stages, stage_dirs

__all__ = ["SHAPES", "CaseSpec", "ScalingSpec", "StageError", "StageSpec", "load_stages", "stage_dirs"]
