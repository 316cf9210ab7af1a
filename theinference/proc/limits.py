"""What a student process may use: decided once (on the command line) and passed unchanged to the worker."""

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from theinference.errors import ConfigError
from theinference.proc import protocol
from theinference.proc.accounting import TreeLimits

DEFAULT_MEMORY_MB = 6144  # address space per student process: room for 124M weights, copies and BLAS
MAX_PIDS = 512  # processes and threads of one run together, where a cgroup can count them
# What a student process may hold in its run directory ($TMPDIR, its captured output, its returned arrays): the
# instructor's to change, in the grader's environment (never the course's theinference.toml).
RUN_DIR_MB_ENV = "THEINFERENCE_RUN_DIR_MB"
DEFAULT_RUN_DIR_MB = 256
# THEINFERENCE_SEAL=0 leaves the worker unsealed (theinference.proc.seal): the instructor's switch, for tests.
SEAL_ENV = "THEINFERENCE_SEAL"


def run_dir_mb() -> int:
    """The run directory's quota in MB: $THEINFERENCE_RUN_DIR_MB, else DEFAULT_RUN_DIR_MB."""
    text = os.environ.get(RUN_DIR_MB_ENV, "").strip()
    if not text:
        return DEFAULT_RUN_DIR_MB
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{RUN_DIR_MB_ENV} takes a whole number of megabytes, at least 1, not {text!r}")
    return int(text)


@dataclass(frozen=True)
class Limits:
    memory_mb: int | None = DEFAULT_MEMORY_MB  # address-space cap per student process; None: no cap
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # extra environment (BLAS threads)
    run_dir_mb: int = field(default_factory=run_dir_mb)  # the run directory's quota (theinference.proc.rundir)

    @property
    def run_dir_bytes(self) -> int:
        return self.run_dir_mb * 2**20

    def for_worker(self, file_bytes: int, shares_uid: bool = False) -> protocol.Limits:
        """The caps the worker applies with setrlimit before any student code runs: no file over the quota either.

        shares_uid: its processes count as the grader's user's, and nothing else caps how many there are."""
        return protocol.Limits(
            memory_bytes=self.memory_mb * 2**20 if self.memory_mb else None,
            file_bytes=min(file_bytes, self.run_dir_bytes),
            shares_uid=shares_uid,
            seal=os.environ.get(SEAL_ENV, "1") != "0",
        )

    def tree(self) -> TreeLimits:
        """The caps over the run's whole process tree (its cgroup): processes, and memory in use together."""
        return TreeLimits(max_pids=MAX_PIDS, memory_bytes=self.memory_mb * 2**20 if self.memory_mb else None)
