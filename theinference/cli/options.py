"""Options several commands share, declared once: the same name, type, bounds and help everywhere.

(`autograder`'s --weights, --timeout and --memory-limit differ on purpose: they configure the
bundle's grading, not this run, and are declared in cli/autograder.py.)
"""

import os
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer


class IsolationLevel(str, Enum):
    """The confinement levels, strongest first (plan.ISOLATION_LEVELS, proc/sandbox.py)."""

    sandbox = "sandbox"
    namespaces = "namespaces"
    unprivileged = "unprivileged"
    subreaper = "subreaper"
    process_group = "process-group"


WeightsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--weights",
        metavar="PATH",
        help="model.safetensors (or its directory) to grade against, or tiny / gpt2 for the synthetic presets (default: see `theinference weights`).",
    ),
]
CourseOpt = Annotated[
    Optional[Path],
    typer.Option(
        "--course",
        metavar="DIR",
        help="Course directory (default: the nearest ancestor holding theinference.toml or tests/adapters.py).",
    ),
]
StagesDirOpt = Annotated[
    Optional[list[Path]],
    typer.Option("--stages-dir", metavar="DIR", help="Another directory of stage files (repeatable)."),
]
TimeoutOpt = Annotated[
    Optional[float],
    typer.Option(
        "--timeout", metavar="SECONDS", min=0.001, help="Seconds each adapter call may take, overriding the stage's."
    ),
]
MemoryLimitOpt = Annotated[
    int,
    typer.Option(
        "--memory-limit",
        metavar="MB",
        min=0,
        help="Memory cap, MB: per student process (address space), and for all of its processes together (0: none).",
    ),
]
JobsOpt = Annotated[
    int,
    typer.Option("--jobs", metavar="N", min=1, help="Submissions (or, for `stages check`, subjects) graded at once."),
]

DEFAULT_JOBS = os.cpu_count() or 1

NoDiagnosisOpt = Annotated[
    bool,
    typer.Option(
        "--no-diagnosis",
        help="Do not match failing outputs against known bugs (verdicts, tables and shapes only).",
    ),
]
AllowRootOpt = Annotated[
    bool,
    typer.Option(
        "--allow-root",
        help="DANGEROUS: where no confinement can drop to user nobody (no bubblewrap, a Python nobody cannot read), "
        "run student code as root anyway instead of refusing (as THEINFERENCE_ALLOW_ROOT=1). Every report says so.",
    ),
]
RequireIsolationOpt = Annotated[
    Optional[IsolationLevel],
    typer.Option(
        "--require-isolation",
        metavar="LEVEL",
        help="Refuse to grade (exit 2) unless student code runs at this confinement level or a stronger one: "
        "sandbox (bubblewrap), namespaces, unprivileged, subreaper, process-group.",
    ),
]
