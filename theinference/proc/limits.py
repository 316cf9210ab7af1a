"""What a student process may use: decided once (on the command line) and passed unchanged to the worker."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from theinference.proc import protocol
from theinference.proc.accounting import TreeLimits

DEFAULT_MEMORY_MB = 6144  # address space per student process: room for 124M weights, copies and BLAS
MAX_PIDS = 512  # processes and threads of one run together, where a cgroup can count them


@dataclass(frozen=True)
class Limits:
    timeout: float | None = None  # seconds per adapter call, overriding the stage's and the course's; None: theirs
    memory_mb: int | None = DEFAULT_MEMORY_MB  # address-space cap per student process; None: no cap
    untrusted: bool = False  # the student's process gets only the allow-listed environment (theinference.trust)
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # extra environment (BLAS threads)

    def for_worker(self, file_bytes: int) -> protocol.Limits:
        """The caps the worker applies with setrlimit before any student code runs."""
        return protocol.Limits(memory_bytes=self.memory_mb * 2**20 if self.memory_mb else None, file_bytes=file_bytes)

    def tree(self) -> TreeLimits:
        """The caps over the run's whole process tree (its cgroup): processes, and memory in use together."""
        return TreeLimits(max_pids=MAX_PIDS, memory_bytes=self.memory_mb * 2**20 if self.memory_mb else None)
