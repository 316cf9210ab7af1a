"""The errors a user fixes by changing their command line or files: the CLI reports them once, exit code 2.

Each layer raises its own subclass (CourseError, WeightsError, StageError, OracleError, GradeError,
ConfinementError, MutantError, BatchError, AutograderError, UsageError), whose message names the file,
field or option to change. Faults of student code are never ConfigErrors: they become results.
"""


class ConfigError(Exception):
    """A usage or configuration error (exit code 2)."""


class UsageError(ConfigError):
    """The command line asks for something that does not exist."""
