"""Two CPU burners per core, for a bench's loaded pass: the load the project's margins are proven beside.

    burners = busy.start() if loaded else []
    try:
        ...  # the pass
    finally:
        busy.stop(burners)

Or `with busy.Burners(): ...`. Each burner is a daemon process: a bench that dies leaves none behind. Runs of several
benches at once share the machine: run each loaded pass under whatever lock its users share for CPU burners.
"""

import multiprocessing
import os


def _burn() -> None:
    while True:
        pass


def start(per_core: int = 2) -> list[multiprocessing.Process]:
    """per_core burners for each CPU, started."""
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(per_core * (os.cpu_count() or 1))]
    for burner in burners:
        burner.start()
    return burners


def stop(burners: list[multiprocessing.Process]) -> None:
    for burner in burners:
        burner.kill()
        burner.join()


class Burners:
    """start() for the duration of a with block."""

    def __enter__(self) -> "Burners":
        self.procs = start()
        return self

    def __exit__(self, *_) -> None:
        stop(self.procs)


def bytecode_line() -> str:
    """Whether the runs write bytecode: with PYTHONDONTWRITEBYTECODE set (some sandboxes and CI images set it) every
    run compiles the package's modules again, a second or more of each run's grader time that a student's machine,
    which keeps its __pycache__, does not pay."""
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return "bytecode: not written (PYTHONDONTWRITEBYTECODE is set): every run compiles the package again"
    return "bytecode: written and reused, as on a student's machine"
