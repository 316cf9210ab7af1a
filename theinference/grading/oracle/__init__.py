"""The oracle and its caches: what a stage's expected outputs are computed by, and where they are kept.

Imports no other room of grading (a stage spec is read through the fields the cache needs).
"""

from theinference.grading.oracle.bugs import BUILTIN_BUGS, Bug, resolve_bug
from theinference.grading.oracle.cache import OracleCache
from theinference.grading.oracle.registry import (
    BUILTIN_ORACLES,
    OracleError,
    OracleSpec,
    compute_expected,
    resolve_oracle,
)
from theinference.grading.oracle.store import OracleStore, default_store

__all__ = [
    "BUILTIN_BUGS",
    "BUILTIN_ORACLES",
    "Bug",
    "OracleCache",
    "OracleError",
    "OracleSpec",
    "OracleStore",
    "compute_expected",
    "default_store",
    "resolve_bug",
    "resolve_oracle",
]
