"""Judging one stage: its cases run, compared with the oracle, the failure diagnosed and fingerprinted.

Imports the oracle and spec rooms, never the drivers (drive, tools): a judge is told what to grade.
"""

from theinference.grading.judge.context import GradeContext
from theinference.grading.judge.grade import GradeError
from theinference.grading.judge.results import CaseResult, Diagnosis, RunResult, StageResult, Status

# grade(stage, ctx) itself is not exported here: the name is its module's (theinference.grading.judge.grade).
__all__ = ["CaseResult", "Diagnosis", "GradeContext", "GradeError", "RunResult", "StageResult", "Status"]
