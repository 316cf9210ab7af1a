"""What runs many stages and many runs: the Grader, a course's Session, watch mode, batch grading, progress.

Imports the oracle, spec and judge rooms; the tools room is above it.
"""

from theinference.grading.drive.grader import Grader
from theinference.grading.drive.plan import CourseNeed, RunOptions, RunPlan, plan_run
from theinference.grading.drive.session import Session, open_session

__all__ = ["CourseNeed", "Grader", "RunOptions", "RunPlan", "Session", "open_session", "plan_run"]
