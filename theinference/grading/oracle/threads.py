"""How many BLAS threads the grader's own numpy work (the oracle's outputs, fingerprinting) uses: one on a busy machine.

Measured with bench/fingerprint_threads.py on two cores (cold fingerprinting, the fastest of the rounds): on a
quiet machine numpy's default (a thread per core) took 0.65-0.79x the wall time of one thread on the gpt2 shape
(two forward mistakes, two rounds) and 0.79-0.93x on tiny (four mistakes, three rounds); beside two CPU burners
per core it took 2.1x the wall time of one thread on the gpt2 shape, and 4.8x on tiny (one mistake, one round,
a test run beside the burners too): its threads wait on one another for cores they cannot get. The 1-minute
load average lags, and the student's own run just before counts in it: right after a long grading on a quiet
machine it may pick one thread, at a cost of up to ~1.5x in wall time.

The oracle's own outputs (OracleCache, asked from the main thread), measured with bench/oracle_threads.py on two
cores, every stage's cases computed cold (no quiet machine was to be had: other test runs kept the 1-minute load
at 8-17): on tiny (three rounds) one thread took 0.03-0.59x the default's wall time at load 8-11, and 0.00-0.89x
beside two CPU burners per core (load 11-15), greedy's continuation 0.10x and 0.16x: the default's threads spin on
small products. On the gpt2 shape (one round) it is no clear gain stage by stage: 0.85-1.87x at load 14-17,
0.80-1.18x beside the burners, but 0.91x and 0.86x of the default's wall time summed over the stages (greedy's
continuation, most of it, 0.85x and 0.80x).
"""

import os
from contextlib import AbstractContextManager, nullcontext

from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]


def busy_blas_limit(load: float | None = None, cores: int | None = None) -> int | None:
    """1 when the 1-minute load average is at least the number of cores, else None (numpy's default)."""
    if load is None:
        load = _load_average()
        if load is None:  # no load average here: leave numpy be
            return None
    cores = cores or os.cpu_count() or 1
    return 1 if load >= cores else None


def _load_average() -> float | None:
    """The 1-minute load average (the kernel's, else psutil's: Windows has no os.getloadavg), or None."""
    from theinference.proc.accounting import load_average

    return load_average()


_controller = None  # the BLAS libraries loaded, found once (finding them costs a millisecond or more)


def blas_threads_for_load() -> AbstractContextManager:
    """A block in which BLAS runs on one thread if the machine is busy now (busy_blas_limit).

    BLAS's thread count is the process's: with threadpoolctl >= 3.8 only one Python thread at a time may change it
    (another's limit is ignored while that one holds it), so blocks that overlap in several threads share one
    decision, and overlapping blocks that close out of order may leave one thread behind them."""
    global _controller
    limit = busy_blas_limit()
    if limit is None:
        return nullcontext()
    _controller = _controller or ThreadpoolController()
    return _controller.limit(limits=limit)
